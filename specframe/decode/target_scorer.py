"""The live scorer: the verification forward of one request on the target (the :class:`~specframe.contracts.Scorer`
contract is in :mod:`specframe.contracts.scoring`; a recorded trace's scorer is in :mod:`specframe.replay`).

A *scorer* owns what a request needs from the target: the prefill, one scoring of ``[newest committed token] +
draft`` per step, and keeping only the accepted path afterwards. :class:`TargetScorer` is the live one: the target
over the request's KV cache, which between steps holds every committed token except the newest one (the engine's KV
invariant). A scorer backed by a trace returns what the target returned when the trace was recorded; the engine
cannot tell the two apart except by :attr:`Scored.seconds`.

Shapes: B batch (1), T committed tokens, N draft nodes, V vocabulary, H hidden size, F feature layers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..contracts import DraftTree, Scored, TargetModel
from ..target.kv_cache import cache_length, compact, restore, rollback
from ..token_tree import tree_attention_mask, tree_position_ids


class TargetScorer:
    """The live scorer: target forwards over the request's KV cache.

    Args:
        target: a :class:`specframe.target.hf.Target` (``forward``, ``forward_features`` when ``layers``, ``new_cache``,
            ``device``, ``dtype``).
        layers: transformers ``hidden_states`` indices to return as features (empty: none).
        want_hidden: also return the last layer's hidden states.
    """

    def __init__(self, target: TargetModel, layers: tuple[int, ...], want_hidden: bool) -> None:
        self.target, self.layers, self.want_hidden = target, layers, want_hidden
        self.device = target.device
        self.cache = target.new_cache()
        self.base = 0  # cached past + the newest token, at the last score
        self.tree = False  # the last scored draft branched

    def prefill(self, ids: Tensor) -> tuple[Tensor | None, Tensor | None]:
        _, hidden, feats = self._forward(ids.to(self.device), logits_to_keep=1)
        return (None if hidden is None else hidden[:, -1]), feats

    def score(self, newest: Tensor, draft: DraftTree) -> Scored:
        self.base = cache_length(self.cache) + 1
        n = draft.num_nodes
        ids = torch.cat([newest, draft.token_ids], 1).to(self.device) if n else newest.to(self.device)
        self.tree = n > 1 and not draft.is_chain()
        if self.tree:  # one forward scores every branch: tree mask + per-node positions
            parent = draft.parent[0].tolist()
            mask = tree_attention_mask(parent, self.base - 1, self.target.dtype, self.device)
            pos = tree_position_ids(parent, self.base - 1, self.device)
            return Scored(*self._forward(ids, attention_mask=mask, position_ids=pos), parent)
        return Scored(*self._forward(ids), None)

    def keep(self, accepted: list[int]) -> None:
        if self.tree:
            compact(self.cache, self.base, accepted)  # keep only the accepted path
        else:
            rollback(self.cache, self.base + len(accepted))

    def undo(self) -> None:
        restore(self.cache, self.base - 1)

    def _forward(self, ids: Tensor, **kw: Any) -> tuple[Any, Any, Any]:
        if self.layers:
            return self.target.forward_features(ids, self.cache, self.layers, self.want_hidden, **kw)
        logits, hidden = self.target.forward(ids, self.cache, want_hidden=self.want_hidden, **kw)
        return logits, hidden, None
