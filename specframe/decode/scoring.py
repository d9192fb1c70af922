"""The verification forward of one request, behind a small interface so the decode loop can run against the live
target or against a recorded trace (:mod:`specframe.replay`).

A *scorer* owns what a request needs from the target: the prefill, one scoring of ``[newest committed token] +
draft`` per step, and keeping only the accepted path afterwards. :class:`TargetScorer` is the live one: the target
over the request's KV cache, which between steps holds every committed token except the newest one (the engine's KV
invariant). A scorer backed by a trace returns what the target returned when the trace was recorded; the engine
cannot tell the two apart except by :attr:`Scored.seconds`.

Shapes: B batch (1), T committed tokens, N draft nodes, V vocabulary, H hidden size, F feature layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
from torch import Tensor

from ..contracts import DraftTree, TargetModel
from ..target.kv_cache import cache_length, compact, restore, rollback
from ..tree import tree_attention_mask, tree_position_ids


@dataclass(frozen=True, slots=True)
class Scored:
    """One scoring of ``[newest committed token] + draft`` (N + 1 rows: row 0 after the newest token, row ``i + 1``
    after draft node ``i``)."""

    logits: Tensor  # [B, N + 1, V] what the verifier reads (any dtype with an argmax for greedy verification)
    hidden: Tensor | None  # [B, N + 1, H] the last layer's hidden states of the rows (needs_hidden_states), or None
    features: Tensor | None  # [B, N + 1, F, H] hidden states of the feature layers, or None
    parent: list[int] | None  # [N] the draft's parents when it branches (scored with a tree mask), else None
    seconds: float | None = None  # modeled cost of this forward in seconds (replay); None: the engine times it


class Scorer(Protocol):
    """One request's verification forwards (see the module docstring)."""

    def prefill(self, ids: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """Process the prompt but its newest token: ``ids [B, T - 1]`` int64. Returns ``(hidden [B, H] at the last
        position or None, features [B, T - 1, F, H] or None)``."""

    def score(self, newest: Tensor, draft: DraftTree) -> Scored:
        """Score ``newest [B, 1]`` int64 (the newest committed token) followed by the draft's nodes."""

    def keep(self, accepted: list[int]) -> None:
        """After :meth:`score`: keep the newest token and the accepted nodes (indices into the draft, root first)."""

    def undo(self) -> None:
        """After a :meth:`score` that raised partway: forget what it processed."""

    # optional: ``close()``, called once when the request ends (e.g. to give an engine's context back)


ScorerFactory = Callable[[TargetModel, tuple[int, ...], bool], Scorer]
"""``factory(target, feature_layers, want_hidden)`` -> the scorer of one request."""


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
