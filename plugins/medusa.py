"""``medusa``: Medusa-1 heads on the target's last hidden state, expanded into a token tree
(Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads").

The hidden state comes from the verification forward the engine already ran (``needs_hidden_states``): no extra
target pass. Head ``i`` proposes the ``top_k`` most likely tokens at draft depth ``i + 1``; the tree grows
best-first by the product of the heads' probabilities along a path (a dynamic tree, as EAGLE-2 grows its own)
up to ``max_nodes`` nodes, and the target verifies all of it in one forward. Drafts are deterministic
(one-hot q), so exactness holds under greedy and sampling alike. On a target that cannot take tree masks
(sliding-window attention) the draft is the chain of each head's top-1.

Feedback: no ``on_verified`` (``ProposerBase``'s no-op): the heads keep no state between steps; the engine sets
``DecodeState.hidden`` from each verification forward (the row of the last accepted node) before the next ``propose``.

Heads trained over a frequent-token subset (``specframe train medusa`` keeps the 8 192 most frequent response
tokens, FR-Spec, Zhao et al. 2025) score only those rows of the LM head: ``[L, H] @ [H, S]`` (L heads, one per
depth) instead of ``[H, V]``: 0.7 ms instead of 6.0 ms per proposal for SmolLM2 (V = 49 152; measured with S = 8 192,
bf16, 2 CPU cores; the shipped heads use S = 5 492, every token their training answers contained).
Tokens outside the subset are never drafted; the target still verifies every token, so output is unchanged.

Weights: ``heads: DIR`` (written by ``specframe train medusa``), or by default the heads shipped for the
target (see ``specframe_plugins/weights/<target>/medusa/README.md``). ``checkpoint: DIR`` reads published heads
(FasterDecoding's or vLLM's layout, :mod:`specframe.learned.medusa_published`), each with its own LM head.
"""

from __future__ import annotations

import heapq
from pathlib import Path
from typing import Any, Literal, Optional

import torch
from pydantic import Field
from torch import Tensor

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
    MedusaHeads,
    folder_key,
    load_medusa,
    shared,
)

from .weights import weights_folder


class MedusaConfig(ProposerConfig):
    name: Literal["medusa"] = "medusa"
    heads: Optional[str] = Field(None, description="Folder of trained heads; default: the heads shipped for the target.")
    checkpoint: Optional[str] = Field(
        None, description="Folder of published Medusa heads (FasterDecoding's medusa_lm_head layout or vLLM's), each "
        "with its own LM head; e.g. a local download of FasterDecoding/medusa-vicuna-7b-v1.3.")
    num_heads: Optional[int] = Field(None, ge=1, description="Use only the first N heads (default: all).")
    top_k: int = Field(3, ge=1, le=32, description="Candidates per head.")
    max_nodes: int = Field(6, ge=1, le=256, description="Most tree nodes per step (the verification width).")
    full_vocab: bool = Field(
        False, description="Score the whole vocabulary even when the heads were trained over a frequent-token subset "
        "(slower; by default only the subset's LM-head rows are scored).",
    )


def grow_tree(top_ids: list[list[int]], top_probs: list[list[float]], max_nodes: int) -> tuple[list[int], list[int]]:
    """Best-first token tree over independent per-depth candidates.

    Args:
        top_ids: ``[L][top_k]`` candidate tokens per depth, best first (row ``d``: head ``d``, depth ``d + 1``).
        top_probs: ``[L][top_k]`` their probabilities.
        max_nodes: node budget.

    Returns:
        ``(token_ids [N], parent [N])`` in topological order: a path's score is the product of its nodes'
        probabilities, and nodes are taken highest score first (a child never outscores its parent, so parents
        come first).
    """
    ids: list[int] = []
    parents: list[int] = []
    heap = [(-top_probs[0][r], r, 0, -1) for r in range(len(top_ids[0]))]  # (-score, rank, depth, parent node)
    heapq.heapify(heap)
    while heap and len(ids) < max_nodes:
        neg, rank, depth, parent = heapq.heappop(heap)
        node = len(ids)
        ids.append(top_ids[depth][rank])
        parents.append(parent)
        if depth + 1 < len(top_ids):
            for r, p in enumerate(top_probs[depth + 1]):
                heapq.heappush(heap, (neg * p, r, depth + 1, node))
    return ids, parents


class _MedusaWeights:
    """Read-only after loading: the heads, and (unless ``full_vocab``) the LM-head rows of their token subset."""

    def __init__(self, folder: Any, hidden: int, lm_head: Any, target: TargetInfo, full_vocab: bool) -> None:
        heads = MedusaHeads.load(folder, hidden)
        self.heads = heads.to(device=target.device, dtype=target.dtype)
        self.lm_head = lm_head  # (keeps the target model, whose id is part of the sharing key, alive)
        self.token_map = None if full_vocab else heads.token_map
        self.w_sub = self.b_sub = None
        if self.token_map is not None:  # [S, H] rows (and bias) of the LM head, in the target's dtype and device
            self.w_sub = lm_head.weight.detach()[self.token_map.to(lm_head.weight.device)].contiguous()
            bias = getattr(lm_head, "bias", None)
            self.b_sub = None if bias is None else bias.detach()[self.token_map.to(bias.device)]


class MedusaProposer(ProposerBase):
    """Medusa-1 heads -> best-first token tree (see the module docstring)."""

    name = "medusa"
    Config = MedusaConfig
    needs_hidden_states = True
    produces_trees = True
    provides_draft_probs = False

    def __init__(self, config: MedusaConfig, target: TargetInfo) -> None:
        super().__init__(config, target)
        if target.model is None:
            raise ConfigError(f"medusa needs the target model (its hidden states and LM head), which this target "
                              f"(engine {target.engine}) does not give: use engine transformers for medusa")
        if config.heads and config.checkpoint:
            raise ConfigError("medusa takes `heads` or `checkpoint`, not both (both name the heads' folder)")
        lm_head = target.model.get_output_embeddings()
        hidden = int(lm_head.weight.shape[1])
        self.trees = bool(target.supports_trees)
        self.published = None
        if config.checkpoint:
            folder = Path(config.checkpoint).expanduser()
            key = ("medusa-published", folder_key(folder), hidden, str(target.dtype), str(target.device))
            path = str(getattr(target.model.config, "_name_or_path", "") or "")
            self.published = shared(key, lambda: load_medusa(folder, hidden, target.vocab_size, target.name, path).to(
                device=target.device, dtype=target.dtype))
            self.num_heads = min(config.num_heads or self.published.num_heads, self.published.num_heads)
            self.token_map = self.published.token_map
            return
        folder = weights_folder(
            config.heads, target.name, "medusa", "Medusa heads are",
            "train them with `specframe train medusa` and set `heads: DIR`, or point `checkpoint: DIR` at "
            "downloaded Medusa heads",
        )
        # the heads and LM-head rows are loaded once per folder and placement, shared by every option set
        key = ("medusa", folder_key(folder), hidden, str(target.dtype), str(target.device), id(target.model),
               config.full_vocab)
        self._weights = w = shared(key, lambda: _MedusaWeights(folder, hidden, lm_head, target, config.full_vocab))
        self.num_heads = min(config.num_heads or w.heads.num_heads, w.heads.num_heads)
        self.heads, self.lm_head, self.token_map, self.w_sub, self.b_sub = w.heads, lm_head, w.token_map, w.w_sub, w.b_sub

    def _logits(self, hidden: Tensor) -> Tensor:
        """``hidden [1, H]`` -> ``[L, V or S]`` logits of the first ``num_heads`` heads."""
        if self.published is not None:
            return self.published.logits(hidden.to(self.published.lm_heads[0].weight.dtype))[0, : self.num_heads]
        h = hidden.to(self.heads.heads[0][0].linear.weight.dtype)  # [1, H]
        feats = self.heads(h)[0, : self.num_heads]  # [L, H]
        if self.token_map is None:
            return self.lm_head(feats)  # [L, V]
        logits = feats @ self.w_sub.T  # [L, S]
        return logits if self.b_sub is None else logits + self.b_sub

    @torch.inference_mode()
    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        if state.hidden is None:
            return DraftTree.empty(state.tokens.shape[0])
        probs = torch.softmax(self._logits(state.hidden[:1]).float(), dim=-1)  # [L, V or S]
        cfg = self.config
        budget = min(budget, cfg.max_nodes)
        if not self.trees or cfg.top_k == 1 or budget <= 1:
            ids = probs[: min(budget, self.num_heads)].argmax(-1).cpu()
            return DraftTree.chain(ids if self.token_map is None else self.token_map[ids])
        p, i = probs.topk(min(cfg.top_k, probs.shape[-1]), dim=-1)
        i = i.cpu()
        if self.token_map is not None:
            i = self.token_map[i]
        ids, parents = grow_tree(i.tolist(), p.tolist(), budget)
        return DraftTree.from_lists(ids, parents)


@hookimpl
def specframe_register_proposers(register) -> None:
    register(MedusaProposer)
