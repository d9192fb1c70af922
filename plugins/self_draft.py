"""``layer-skip`` and ``early-exit``: the target drafts with part of itself (self-speculative decoding), no second
model.

- ``layer-skip`` (Zhang et al. 2024, "Draft & Verify", ACL; SWIFT, Xia et al. 2025): the draft is the target with
  some decoder layers skipped. Training-free: which layers is searched once per model, dtype and machine on a few
  calibration prompts and cached beside the machine profile (:mod:`specframe.target.skip_search`), unless ``skip:``
  names them.
- ``early-exit`` (Elhoushi et al. 2024, "LayerSkip", ACL; transformers' ``assistant_early_exit``): the draft runs
  the first ``exit_layer`` layers and leaves through the model's final norm and LM head. It drafts well only for a
  model trained for it (LayerSkip's early-exit loss, e.g. the ``facebook/layerskip-*`` checkpoints); the final
  layers of a model trained without it are what turns its residual stream into next-token logits, so exits much
  before the last layers agree with the target rarely (SmolLM2-135M-Instruct, bf16: docs/self-drafting.md).

Both draft a chain autoregressively as ``draft-model`` does (same options, same rules under sampling: q returned
for exact rejection sampling), through the target's own weights with layers skipped in the drafting thread only
(:mod:`specframe.target.layer_skip`), so the target's forwards are never changed.

The KV cache: the draft keeps its own, for the layers it runs. Where the math allows sharing — the layers before the
first skipped one see the same inputs as the target's, so their keys and values for the committed tokens equal the
target's (all of early-exit's layers) — the target's cache would do; specframe does not share it: the draft's own
costs one prefill of its layers per request and nothing per step (the tokens committed since the last step ride in
the first draft forward, which runs anyway). After the first skipped layer the residual stream differs from the
target's, so no layer there may reuse the target's keys and values.

Engine transformers only (the draft runs the target's torch module; llama.cpp has none to run).
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field
from torch import Tensor

from specframe import (
    ConfigError,
    DecodeState,
    DraftTree,
    TargetInfo,
    hookimpl,
)
from specframe.services import (
    cached_skip_choice,
    check_skip,
    decoder_layers,
    shared,
    skipping,
)

from .draft_model import ChainDraftConfig, ChainDrafter


class LayerSkipConfig(ChainDraftConfig):
    name: Literal["layer-skip"] = "layer-skip"
    skip: Optional[list[int]] = Field(
        None, description="Decoder layers to skip (1 .. layers - 1); default: searched on calibration prompts, cached "
                          "(with k, unless k is given).")
    max_skip_fraction: float = Field(0.5, gt=0.0, lt=1.0, description="The search skips at most this share of layers.")


class EarlyExitConfig(ChainDraftConfig):
    name: Literal["early-exit"] = "early-exit"
    exit_layer: Optional[int] = Field(
        None, ge=1, description="Layers the draft runs before the LM head (default: three quarters of them).")


class _SelfDraft:
    """The target's module with ``skip`` layers skipped, called as a draft (``ChainDrafter``'s contract)."""

    def __init__(self, model: Any, skip: frozenset[int]) -> None:
        self.model, self.config, self.token_map = model, model.config, None
        self.skip = check_skip(skip, len(decoder_layers(model)))
        self.vocab = int(model.get_output_embeddings().weight.shape[0])

    def __call__(self, ids: Tensor, cache: Any) -> Tensor:
        with skipping(self.model, self.skip):
            return self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]


def _model(target: TargetInfo, name: str) -> Any:
    if target.model is None:
        raise ConfigError(f"{name} drafts with the target's own torch layers, which engine {target.engine} does not "
                          "have: use engine transformers")
    return target.model


class LayerSkipProposer(ChainDrafter):
    """The target with some layers skipped drafts a chain (see the module docstring)."""

    name = "layer-skip"
    Config = LayerSkipConfig

    def __init__(self, config: LayerSkipConfig, target: TargetInfo) -> None:
        super().__init__(config, target)
        model = _model(target, self.name)
        self.chosen_k = None  # the searched k, used unless the config gives k
        if config.skip is not None:
            skip = frozenset(config.skip)
        else:
            longest = config.k if "k" in config.model_fields_set else config.max_k
            choice = shared(("layer-skip/choice", id(model), longest, config.max_skip_fraction),
                            lambda: cached_skip_choice(target, longest, config.max_skip_fraction))
            skip = frozenset(choice.skip)
            if "k" not in config.model_fields_set:
                self.chosen_k = min(choice.k, config.max_k)
        self.draft = _SelfDraft(model, skip)
        self._init_drafting()

    def start(self, state: DecodeState) -> None:
        super().start(state)
        if self.chosen_k is not None:
            self.k = self.chosen_k

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        if not self.draft.skip:  # no set that pays was found: the draft would be the target itself
            return DraftTree.empty(state.tokens.shape[0])
        return super().propose(state, budget)


class EarlyExitProposer(ChainDrafter):
    """The target's first ``exit_layer`` layers and its LM head draft a chain (see the module docstring)."""

    name = "early-exit"
    Config = EarlyExitConfig

    def __init__(self, config: EarlyExitConfig, target: TargetInfo) -> None:
        super().__init__(config, target)
        model = _model(target, self.name)
        n = len(decoder_layers(model))
        exit_layer = config.exit_layer if config.exit_layer is not None else max(1, (3 * n) // 4)
        if exit_layer >= n:
            raise ConfigError(f"early-exit: exit_layer must be below the model's {n} layers (1..{n - 1}), "
                              f"got {exit_layer}")
        self.exit_layer = exit_layer
        self.draft = _SelfDraft(model, frozenset(range(exit_layer, n)))
        self._init_drafting()


@hookimpl
def specframe_register_proposers(register) -> None:
    register(LayerSkipProposer)
    register(EarlyExitProposer)
