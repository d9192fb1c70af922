"""The scoring contract: the verification forward of one request behind a small interface, so the decode loop runs
against the live target (:class:`specframe.decode.target_scorer.TargetScorer`), llama.cpp's (:mod:`specframe.target.llamacpp`)
or a recorded trace (:mod:`specframe.replay`) alike.

A *scorer* owns what a request needs from the target: the prefill, one scoring of ``[newest committed token] +
draft`` per step, and keeping only the accepted path afterwards. Between steps the request's KV cache holds every
committed token except the newest one (the engine's KV invariant). The engine cannot tell a live scorer from a
recorded one except by :attr:`Scored.seconds`.

Shapes: B batch (1), T committed tokens, N draft nodes, V vocabulary, H hidden size, F feature layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from torch import Tensor

from .proposer import DraftTree, TargetModel


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
