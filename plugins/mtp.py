"""``mtp``: draft with the multi-token-prediction layers a target checkpoint carries (DeepSeek-V3/R1, GLM-4.5:
``num_nextn_predict_layers`` modules after the decoder layers; DeepSeek-AI 2024, "DeepSeek-V3 Technical Report",
§2.2; Qwen3-Next / Qwen3.5's ``mtp.*`` and MiMo's ``model.mtp_layers.*``). See :mod:`specframe.learned.mtp` for the
computation and the layouts.

The MTP modules read the target's last hidden state (after its final norm) at every committed position, taken from
the verification forward the engine already runs (``feature_layers``: the last ``hidden_states`` entry): no extra
target forward. They keep their own KV cache over the committed positions and, each step, catch up on the positions
committed since the last one, then draft a chain of ``depth`` tokens, module ``k mod D`` at step ``k`` (vLLM's
``num_speculative_tokens`` for ``method: mtp``). Greedy: the argmax chain (one-hot q). Sampling: each token is drawn
from the module's warped distribution q (the request's temperature / top-k / top-p, its generator), with q as
``draft_probs`` (Leviathan et al. 2022, Algorithm 1).

Weights: the target's own checkpoint folder (the one it was loaded from), or ``checkpoint: DIR``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal, Optional

import torch
from pydantic import Field

from specframe import (
    ConfigError,
    DecodeState,
    DraftTree,
    ProposerBase,
    ProposerConfig,
    TargetInfo,
    hookimpl,
)
from specframe.services import (
    folder_key,
    load_mtp,
    mtp_layer_count,
    probs_from_logits,
    shared,
)


class MtpConfig(ProposerConfig):
    name: Literal["mtp"] = "mtp"
    depth: Optional[int] = Field(None, ge=1, le=16, description="Tokens drafted per step; default: the number of "
                                 "MTP modules the checkpoint carries (later steps reuse them cyclically).")
    checkpoint: Optional[str] = Field(None, description="Folder holding the MTP weights; default: the folder the "
                                      "target was loaded from.")


class MtpProposer(ProposerBase):
    """The target's MTP modules -> a draft chain (see the module docstring)."""

    name = "mtp"
    Config = MtpConfig
    needs_hidden_states = False
    reads_features = True
    produces_trees = False
    provides_draft_probs = True

    def __init__(self, config: MtpConfig, target: TargetInfo) -> None:
        super().__init__(config, target)
        if target.model is None:
            raise ConfigError(f"mtp needs the target model (its hidden states, embedding and decoder-layer class), "
                              f"which this target (engine {target.engine}) does not give: use engine transformers")
        if mtp_layer_count(target.model.config) < 1:
            raise ConfigError(f"target {target.name!r} carries no MTP layers (its config has no "
                              f"num_nextn_predict_layers or mtp_num_hidden_layers): mtp drafts only for models trained "
                              f"with them, such as DeepSeek-V3/R1, GLM-4.5, Qwen3-Next, Qwen3.5 and MiMo")
        folder = Path(config.checkpoint).expanduser() if config.checkpoint else None
        key = ("mtp", folder_key(folder) if folder else None, id(target.model), str(target.dtype))
        self.drafter = shared(key, lambda: load_mtp(target.model, folder))
        self.modules = len(self.drafter.mtp)
        self.depth = config.depth or self.modules
        cfg = target.model.config.get_text_config()
        self.feature_layers = (int(cfg.num_hidden_layers),)  # the last hidden_states entry: after the final norm
        self._cache = self.drafter.new_cache()
        self._done = 0
        self._last = None  # [1, 1, H] module-0 output at the last committed entry

    def start(self, state: DecodeState) -> None:
        self._cache, self._done, self._last = self.drafter.new_cache(), 0, None

    def _catch_up(self, state: DecodeState) -> bool:
        feats = state.features
        if feats is None or feats.shape[1] == 0:
            return False
        t_f = int(feats.shape[1])
        if self._done > t_f:
            self.start(state)
        if self._done < t_f:
            col = state.feature_layers.index(self.feature_layers[0])
            dev = self.target.device
            h = feats[:1, self._done : t_f, col].to(dev)
            nxt = state.tokens[:1, self._done + 1 : t_f + 1].to(dev)
            pos = torch.arange(self._done, t_f, device=dev)[None]
            a = self.drafter.step(h, nxt, pos, self._cache, 0)
            self._done, self._last = t_f, a[:, -1:]
        return self._last is not None

    @torch.inference_mode()
    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        batch = state.tokens.shape[0]
        if not self._catch_up(state):
            return DraftTree.empty(batch)
        length = int(state.tokens.shape[1])
        depth = min(self.depth, budget, self.target.max_context - length)
        if depth < 1:
            return DraftTree.empty(batch)
        greedy = state.sampling.is_greedy
        dev = self.target.device
        lengths = [int(layer.get_seq_length()) for layer in self._cache.layers]
        a, drafted, probs = self._last, [], []
        for k in range(depth):
            module = k % self.modules
            if k > 0:  # the previous draft token, fed with the previous output, one position on
                tok = torch.tensor([[drafted[-1]]], dtype=torch.int64, device=dev)
                pos = torch.tensor([[length - 2 + k]], dtype=torch.int64, device=dev)
                a = self.drafter.step(a, tok, pos, self._cache, module)
            logits = self.drafter.logits(a[0, -1], module).float()
            if greedy:
                drafted.append(int(logits.argmax()))
                continue
            q = probs_from_logits(logits, state.sampling)
            if not bool(torch.isfinite(q).all()) or not math.isclose(float(q.sum()), 1.0, rel_tol=1e-3):
                break
            drafted.append(int(torch.multinomial(q.to(state.generator.device), 1, generator=state.generator)))
            probs.append(q.cpu())
        for i, layer in enumerate(self._cache.layers):  # the drafted entries leave the cache
            keep = lengths[i] if i < len(lengths) else 0
            extra = int(layer.get_seq_length()) - keep
            if extra > 0:
                layer.crop(-extra)
        if not drafted:
            return DraftTree.empty(batch)
        return DraftTree.chain(drafted, torch.stack(probs) if probs else None)


@hookimpl
def specframe_register_proposers(register) -> None:
    register(MtpProposer)

