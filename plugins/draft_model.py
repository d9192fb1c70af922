"""``draft-model``: a small causal LM drafts a chain autoregressively (Leviathan et al. 2022; Chen et al. 2023;
transformers' assisted generation; vLLM's ``draft_model``).

The draft keeps its own KV cache across steps: at the next ``propose`` after a verification it is rolled back to the
longest prefix it shares with the committed tokens (lazily there, not in ``on_verified``: a router may leave it out
of steps, and the committed tokens are what counts), so each step feeds only the tokens it has not seen. A draft
forward that raises leaves the cache afresh (the next ``propose`` prefills the context again). Under sampling, draft
tokens are drawn from the draft's warped distribution q (same temperature / top-k / top-p as the target) with
the request's generator, and q is returned as ``draft_probs`` for exact rejection sampling (Leviathan et al.
2022, Algorithm 1). Under greedy decoding the draft takes its argmax and no probabilities are built.

Draft length can be dynamic: drafting stops early when the draft's top probability falls below
``min_confidence``, and with ``schedule: heuristic`` the length adapts to acceptance (transformers' assisted
generation heuristic: +2 after a fully accepted draft, -1 otherwise, within ``[1, max_k]``). The defaults
(constant ``k = 4``, no confidence stop) measured best for the shipped SmolLM2 draft on held-out prompts
(bf16, 2-core CPU: τ 1.76 / 28.6 tok/s vs heuristic + confidence 0.3: τ 1.61 / 26.2 tok/s; docs/training.md).

Which drafts work:

- any transformers causal LM sharing the target's tokenizer (``model: DIR``). A vocabulary padded beyond the
  target's is tolerated (the extra logits are dropped); tokens whose text differs from the target's are refused
  with an error naming the first one;
- a specframe small draft (``specframe train draft``), which reads the target's own embeddings and drafts over
  a frequent-token subset (:mod:`specframe.learned.small_draft`);
- by default, the small draft shipped for the target (``specframe_plugins/weights/<target>/draft-model/``).

A context longer than the draft's ``max_position_embeddings`` turns speculation off for the rest of the request
(target-only steps, output unchanged).

**Parallel drafting (PARD, An et al. 2025, arXiv 2504.18583).** A draft fine-tuned with a mask token drafts ``k``
positions in one forward: it is fed the tokens its cache has not seen (at least the newest) followed by ``k - 1``
copies of the mask token, at consecutive positions under its ordinary causal attention; the last real position's
logits give the first draft token and mask ``j``'s the token ``j + 1`` ahead. Greedy: each position's argmax;
sampling: each position drawn from its own warped distribution (which does not depend on the tokens drawn at the
positions before it, so it is the conditional the verifier needs), returned as ``draft_probs``. The mask positions'
keys and values are dropped from the draft's cache right after the forward: it holds the real tokens only, and the
next step feeds the tokens the target committed. The mode is on when the draft's ``config.json`` declares a mask
token (``pard_token``, AMD's published layout: :mod:`specframe.learned.pard`), or with ``parallel: true`` and
``mask_token_id``; ``parallel: false`` drafts one token per forward with the same checkpoint. The draft reads no
target state, so it runs on the llama.cpp engine as well.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any, Literal, Optional

import torch
from pydantic import Field, model_validator
from torch import Tensor

from specframe import (
    ConfigError,
    DecodeState,
    DraftTree,
    ProposerBase,
    ProposerConfig,
    TargetInfo,
    VerifyOutcome,
    hookimpl,
)
from specframe.services import (
    PARD_MASK_FIELD,
    cache_length,
    folder_key,
    is_small_draft,
    load_small_draft,
    new_cache,
    pard_mask_token,
    probs_from_logits,
    rollback,
    shared,
)

from .weights import shipped, weights_folder

log = logging.getLogger("specframe")


class ChainDraftConfig(ProposerConfig):
    """Options of a proposer that drafts a chain with a causal LM of its own, one token per forward (draft-model,
    and the target drafting with part of itself: :mod:`specframe_plugins.self_draft`)."""

    k: int = Field(4, ge=1, le=64, description="Draft length of the first step (and of every step when constant).")
    max_k: int = Field(8, ge=1, le=64, description="Longest draft the heuristic schedule may grow to.")
    schedule: Literal["heuristic", "constant"] = Field(
        "constant", description="heuristic: +2 after a fully accepted draft, -1 otherwise; constant: always k."
    )
    min_confidence: float = Field(
        0.0, ge=0.0, le=1.0, description="Stop drafting when the draft's top probability is below this (0 = never)."
    )

    @model_validator(mode="after")
    def _order(self) -> "ChainDraftConfig":
        if self.k > self.max_k:
            raise ValueError(f"{self.name}: k ({self.k}) must be <= max_k ({self.max_k})")
        return self


class DraftModelConfig(ChainDraftConfig):
    name: Literal["draft-model"] = "draft-model"
    model: Optional[str] = Field(None, description="Draft model folder; default: the draft shipped for the target.")
    parallel: Optional[bool] = Field(
        None, description="Draft k positions in one forward over k - 1 mask tokens (PARD). Default: when the draft's "
        "config.json declares a mask token (pard_token); true needs one (there or mask_token_id); false: one token "
        "per forward.")
    mask_token_id: Optional[int] = Field(
        None, ge=0, description="The mask token of a parallel draft (default: the draft's pard_token); implies "
        "parallel.")

    @model_validator(mode="after")
    def _mask_needs_parallel(self) -> "DraftModelConfig":
        if self.mask_token_id is not None and self.parallel is False:
            raise ValueError(f"{self.name}: mask_token_id is for parallel drafting: drop it or set parallel: true")
        return self


def check_vocabularies(target_tok: Any, draft_tok: Any) -> None:
    """Refuse a draft whose tokenizer gives any target token another id.

    Raises:
        ConfigError: names the first token whose id differs (or that the draft lacks).
    """
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    for token, i in sorted(tv.items(), key=lambda kv: kv[1]):
        j = dv.get(token)
        if j != i:
            where = "is missing from the draft's vocabulary" if j is None else f"is id {j} in the draft"
            raise ConfigError(
                f"the draft model does not share the target's tokenizer: token {token!r} is id {i} in the target "
                f"and {where}; use a draft with the target's tokenizer, or proposer cross-draft for a draft with another "
                "tokenizer"
            )


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class _HFDraft:
    """A plain transformers causal LM as a draft: logits over its own vocabulary, mapped to the target's."""

    def __init__(self, directory: Path, target: TargetInfo) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(directory, dtype=target.dtype).to(target.device).eval()
        if "cache" not in inspect.signature(self.model.forward).parameters:  # (RWKV: a state of its own)
            raise ConfigError(f"draft model {directory} ({self.model.config.model_type}) takes no KV cache: a draft "
                              "model must be a transformers causal LM that does (RWKV keeps its own state)")
        tok = None  # no tokenizer files: only the vocabulary sizes can be checked
        if any((directory / f).is_file() for f in _TOKENIZER_FILES):
            tok = AutoTokenizer.from_pretrained(directory)
        if tok is not None and target.tokenizer is not None:
            check_vocabularies(target.tokenizer, tok)
        self.checked_against = target.tokenizer  # (keeps it, whose id is part of the sharing key, alive)
        self.vocab = int(self.model.get_output_embeddings().weight.shape[0])
        self.embed_rows = int(self.model.get_input_embeddings().weight.shape[0])
        self.token_map: Tensor | None = None
        self.config = self.model.config

    def __call__(self, ids: Tensor, cache: Any) -> Tensor:
        return self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]

    def block(self, ids: Tensor, cache: Any, k: int) -> Tensor:
        """Logits ``[k, Vd]`` at the last ``k`` of ``ids``."""
        return self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=k).logits[0, -k:]


class _SmallDraft:
    def __init__(self, directory: Path, target: TargetInfo) -> None:
        self.model = load_small_draft(directory, target.model, target.dtype, target.device)
        self.target_model = target.model  # (keeps it, whose id is part of the sharing key, alive)
        self.token_map = self.model.token_map
        self.vocab = int(self.token_map.numel())
        self.embed_rows = int(target.model.get_input_embeddings().weight.shape[0])  # (it reads the target's)
        self.config = self.model.config

    def __call__(self, ids: Tensor, cache: Any) -> Tensor:
        return self.model(ids, cache)[0, -1]

    def block(self, ids: Tensor, cache: Any, k: int) -> Tensor:
        return self.model(ids, cache)[0, -k:]


def _common_prefix(a: list[int], b: list[int], start: int) -> int:
    n = min(len(a), len(b))
    i = start
    while i < n and a[i] == b[i]:
        i += 1
    return i


def standalone_draft(folder: Path, target: TargetInfo) -> Path:
    """The transformers-model folder of a specframe small draft for a target without torch weights (engine
    llama.cpp): the draft shipped for a built-in target, exported once (``<target>-draft``).

    Raises:
        ConfigError: the draft is not the one shipped for a built-in target (a trained one needs the target's
            embeddings: use engine transformers, or export it with scripts/export_draft.py and set ``model:``).
    """
    from specframe.services import DRAFT_SUFFIX, model_directory, resolve_model

    own = shipped(target.name, "draft-model")
    if own is None or own.resolve() != Path(folder).resolve():
        raise ConfigError(f"draft model {folder} is a specframe small draft, which needs the target model's "
                          f"embeddings, and this target (engine {target.engine}) gives none: export it as a "
                          "transformers model (scripts/export_draft.py) and set `model:` to that folder")
    return model_directory(resolve_model(target.name + DRAFT_SUFFIX))


class ChainDrafter(ProposerBase):
    """Drafts a chain with ``self.draft`` (a causal LM called as ``draft(ids [1, n] int64, cache) -> [Vd] logits``
    after the last of ``ids``, with ``token_map`` (``[Vd]`` target ids, or None when its ids are the target's),
    ``vocab`` and ``config``), keeping the draft's KV cache across steps (see the module docstring). A subclass
    sets ``self.draft`` in its ``__init__`` and then calls :meth:`_init_drafting`; with ``mask_token`` (a parallel
    draft) the draft also has ``block(ids [1, n], cache, k) -> [k, Vd]`` logits at the last ``k`` of ``ids``, and
    the chain comes from one forward over the unseen tokens and ``k - 1`` mask tokens."""

    needs_hidden_states = False
    produces_trees = False
    provides_draft_probs = True
    draft: Any

    def _init_drafting(self, mask_token: int | None = None) -> None:
        self.mask_token = mask_token  # None: one token per forward; else the mask token of a parallel draft
        # a parallel draft is a block proposer (Capabilities.block_size): one forward fills up to max_k drafts
        self.block_size = self.config.max_k + 1 if mask_token is not None else 0
        self.max_context = int(getattr(self.draft.config, "max_position_embeddings", 0) or 1 << 30)
        tm = self.draft.token_map
        self._token_map_list = None if tm is None else tm.tolist()
        self.k = self.config.k
        self.speculating = True
        self._cache: Any = None
        self._seen: list[int] = []  # the token ids whose keys/values are in the draft's cache, in order

    # --- per request ---------------------------------------------------------------------------------------
    def start(self, state: DecodeState) -> None:
        self._cache = new_cache(self.draft.config)
        self._seen = []
        self.k = self.config.k
        self.speculating = True

    def _to_target_logits(self, logits: Tensor) -> Tensor:
        """Draft logits ``[Vd]`` -> ``[V]`` float32 over the target's vocabulary (-inf where the draft has none)."""
        v = self.target.vocab_size
        if self.draft.token_map is not None:
            full = torch.full((v,), float("-inf"), dtype=torch.float32, device=logits.device)
            return full.index_copy_(0, self.draft.token_map.to(logits.device), logits.float())
        if self.draft.vocab >= v:
            return logits[:v].float()  # a padded vocabulary: the extra rows are never target tokens
        pad = torch.full((v - self.draft.vocab,), float("-inf"), dtype=torch.float32, device=logits.device)
        return torch.cat([logits.float(), pad])

    @torch.inference_mode()
    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        batch = state.tokens.shape[0]
        if not self.speculating or self._cache is None:
            return DraftTree.empty(batch)
        tokens = state.tokens[0].tolist()
        k = min(self.k, budget, self.max_context - len(tokens))  # the draft must hold context + k - 1 positions
        if k < 1:
            self.speculating = False  # the draft cannot see this context: target-only steps from here on
            log.info("draft-model: context of %d tokens exceeds the draft's %d positions; speculation off",
                     len(tokens), self.max_context)
            return DraftTree.empty(batch)
        if self.draft.token_map is None and max(tokens) >= self.draft.vocab:
            return DraftTree.empty(batch)  # a token the draft cannot embed (draft vocabulary smaller than target's)
        keep = min(_common_prefix(self._seen, tokens, 0), len(tokens) - 1)
        if cache_length(self._cache) > 0:  # (an empty cache has no layers to crop yet)
            rollback(self._cache, keep)
        device = self.target.device
        feed = torch.tensor([tokens[keep:]], dtype=torch.int64, device=device)
        self._seen = tokens[:]
        try:
            if self.mask_token is not None:
                return self._draft_block(state, feed, k)
            return self._draft_chain(state, feed, k)
        except BaseException:
            # a forward that raised may have stored some layers' keys and values and not others': the cache no
            # longer matches _seen. Start it afresh (the next propose prefills the context again); the engine
            # counts the fault and this step goes on without the draft
            self._cache, self._seen = new_cache(self.draft.config), []
            raise

    def _draft_chain(self, state: DecodeState, feed: Tensor, k: int) -> DraftTree:
        """Up to ``k`` draft tokens after feeding ``feed [1, n]`` int64 (the tokens the cache has not seen)."""
        device = feed.device
        greedy = state.sampling.is_greedy
        drafted: list[int] = []
        probs: list[Tensor] = []
        for i in range(k):
            logits = self.draft(feed, self._cache)
            if greedy:  # argmax in the draft's own vocabulary, then mapped to a target id
                own = logits[: self.target.vocab_size].float()  # (drops padding rows)
                best = int(own.argmax())
                top = best if self.draft.token_map is None else int(self._token_map_list[best])
                conf = float(torch.softmax(own, -1)[best]) if self.config.min_confidence > 0 and i > 0 else 1.0
            else:
                q = probs_from_logits(self._to_target_logits(logits), state.sampling)
                top = int(torch.multinomial(q.to(state.generator.device), 1, generator=state.generator))
                conf = float(q.max()) if self.config.min_confidence > 0 and i > 0 else 1.0
            if conf < self.config.min_confidence:
                break
            drafted.append(top)
            if not greedy:
                probs.append(q)
            if i + 1 < k:
                feed = torch.tensor([[top]], dtype=torch.int64, device=device)
                self._seen.append(top)
        if not drafted:
            return DraftTree.empty(state.tokens.shape[0])
        q_all = torch.stack(probs).cpu() if probs else None
        return DraftTree.chain(drafted, q_all)

    def _draft_block(self, state: DecodeState, feed: Tensor, k: int) -> DraftTree:
        """Up to ``k`` draft tokens from one forward over ``feed [1, n]`` and ``k - 1`` mask tokens; the cache keeps
        the ``n`` real positions only."""
        masks = torch.full((1, k - 1), self.mask_token, dtype=torch.int64, device=feed.device)
        real = cache_length(self._cache) + feed.shape[1]
        logits = self.draft.block(torch.cat([feed, masks], 1), self._cache, k)  # [k, Vd]
        rollback(self._cache, real)  # drop the masks' keys and values: the next step feeds the committed tokens
        greedy = state.sampling.is_greedy
        drafted: list[int] = []
        probs: list[Tensor] = []
        for i in range(k):  # position i's distribution does not depend on the tokens drafted before it
            if greedy:
                own = logits[i, : self.target.vocab_size].float()  # (drops padding rows)
                best = int(own.argmax())
                top = best if self.draft.token_map is None else int(self._token_map_list[best])
                conf = float(torch.softmax(own, -1)[best]) if self.config.min_confidence > 0 and i > 0 else 1.0
            else:
                q = probs_from_logits(self._to_target_logits(logits[i]), state.sampling)
                conf = float(q.max()) if self.config.min_confidence > 0 and i > 0 else 1.0
                if conf >= self.config.min_confidence:
                    top = int(torch.multinomial(q.to(state.generator.device), 1, generator=state.generator))
            if conf < self.config.min_confidence:
                break  # (decided on the distribution alone, never on the token drawn)
            drafted.append(top)
            if not greedy:
                probs.append(q)
        q_all = torch.stack(probs).cpu() if probs else None
        return DraftTree.chain(drafted, q_all)

    def on_verified(self, outcome: VerifyOutcome) -> None:
        if self.config.schedule != "heuristic":
            return
        drafted = outcome.draft.num_nodes
        if drafted == 0:
            return
        if outcome.num_accepted == drafted:
            self.k = min(self.k + 2, self.config.max_k)
        else:
            self.k = max(self.k - 1, 1)


class DraftModelProposer(ChainDrafter):
    """A small LM drafts a chain with its own KV cache (see the module docstring)."""

    name = "draft-model"
    Config = DraftModelConfig

    def __init__(self, config: DraftModelConfig, target: TargetInfo) -> None:
        super().__init__(config, target)
        folder = weights_folder(
            config.model, target.name, "draft-model", "draft model is",
            "set `model: DIR` (a transformers model folder sharing the target's tokenizer, or "
            "`specframe train draft` output)",
        )
        if not (folder / "config.json").is_file():
            raise ConfigError(f"draft model folder {folder} has no config.json")
        # the draft's weights are loaded once per folder and placement and shared by every option set (k, schedule,
        # ...) and every request: this object only holds the draft's KV cache and the request's schedule state
        placement = (str(target.dtype), str(target.device))
        if is_small_draft(folder) and target.model is None:
            # an engine without torch weights (llama.cpp): the same draft exported as a standalone transformers
            # model (its embeddings copied from the target), built once into the model cache
            folder = standalone_draft(folder, target)
        if is_small_draft(folder):
            key = ("draft-model/small", folder_key(folder), *placement, id(target.model))
            self.draft: Any = shared(key, lambda: _SmallDraft(folder, target))
        else:
            key = ("draft-model/hf", folder_key(folder), *placement, id(target.tokenizer))
            self.draft = shared(key, lambda: _HFDraft(folder, target))
        self._init_drafting(self._mask_token(config, folder))

    def _mask_token(self, config: DraftModelConfig, folder: Path) -> int | None:
        """The mask token of parallel drafting, or None (one token per forward).

        Raises:
            ConfigError: ``parallel: true`` without a mask token; a mask token outside the draft's embedding; a
                parallel draft whose vocabulary does not cover the target's tokens.
        """
        if config.parallel is False:
            return None
        declared = pard_mask_token(self.draft.config)
        mask = config.mask_token_id if config.mask_token_id is not None else declared
        if mask is None:
            if config.parallel:
                raise ConfigError(f"draft-model: parallel: true needs a mask token, and the draft {folder} declares "
                                  f"none (config.json field {PARD_MASK_FIELD}): set mask_token_id")
            return None
        field = "mask_token_id" if config.mask_token_id is not None else f"{folder}/config.json field {PARD_MASK_FIELD}"
        if not 0 <= mask < self.draft.embed_rows:
            raise ConfigError(f"draft-model: {field} is {mask}, outside the draft's {self.draft.embed_rows} embedding "
                              "rows: the mask token must be a token the draft embeds")
        if self.draft.token_map is None:
            tokens = self.target.vocab_size
            try:
                tokens = min(tokens, len(self.target.tokenizer)) if self.target.tokenizer is not None else tokens
            except TypeError:  # (a tokenizer without a length: the target's logits rows count)
                pass
            if self.draft.vocab < tokens:
                raise ConfigError(f"draft-model: the parallel draft {folder} does not fit the target: its vocab_size "
                                  f"is {self.draft.vocab}, the target has {tokens} tokens (a PARD draft shares the "
                                  "target's vocabulary)")
        return int(mask)


@hookimpl
def specframe_register_proposers(register) -> None:
    register(DraftModelProposer)
