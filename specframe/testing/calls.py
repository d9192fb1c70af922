"""A transparent proxy around the proposer under test (a call log): it forwards every call, logs what went in and out,
and notes contract problems in the author's terms. Exceptions are re-raised, so the engine isolates them as it
would in production; the kit then fails with the logged problem."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from ..contracts import DecodeState, DraftTree, VerifyOutcome
from ..decode.draft_checks import check_draft
from ..errors import DraftError
from ..token_tree import node_depths
from .report import describe_exc


@dataclass(frozen=True)
class Call:
    """One call into the proposer."""

    method: str  # "start" | "propose" | "on_verified"
    request: int  # index of the request (counts start calls, from 0)
    tokens: tuple[int, ...] = ()  # state.tokens[0] when called (start, propose)
    budget: int = 0  # propose
    draft: DraftTree | None = None  # propose: as returned; on_verified: outcome.draft
    outcome: VerifyOutcome | None = None  # on_verified


def draft_problem(draft: Any, proposer: Any, vocab_size: int) -> str | None:
    """What is wrong with a draft, or None."""
    try:
        check_draft(draft, vocab_size, trees_ok=bool(proposer.produces_trees), batch=1)
    except DraftError as exc:
        hint = " (or declare produces_trees = True)" if "chains only" in str(exc) else ""
        return f"propose returned a draft that breaks the DraftTree contract: {exc}{hint}"
    block = int(getattr(proposer, "block_size", 0) or 0)
    if block and draft.num_nodes and max(node_depths(draft.parent[0].tolist())) > block - 1:
        return (f"propose returned a draft {max(node_depths(draft.parent[0].tolist()))} deep, but a block proposer's "
                f"block_size = {block} holds the newest token and {block - 1} drafts: draft at most block_size - 1 "
                "deep (or declare the block_size its one forward fills)")
    if draft.draft_probs is not None and not proposer.provides_draft_probs:
        return ("propose returned draft_probs but the class declares provides_draft_probs = False; "
                "set it to True so `specframe plugins` tells users the truth")
    return None


class CallLog:
    """Wraps ``inner`` (a proposer instance) with the same name and capability flags."""

    def __init__(self, inner: Any, vocab_size: int) -> None:
        self.inner = inner
        self.vocab_size = vocab_size
        for attr in ("name", "Config", "needs_hidden_states", "produces_trees", "provides_draft_probs"):
            setattr(self, attr, getattr(inner, attr))
        self.feature_layers = tuple(sorted(int(i) for i in (getattr(inner, "feature_layers", None) or ())))
        self.block_size = int(getattr(inner, "block_size", 0) or 0)
        self.calls: list[Call] = []
        self.problems: list[str] = []
        self.request, self.step = -1, 0  # where we are: request index, verification step within it

    def _context(self) -> str:
        return f"request {self.request}, step {self.step}"

    @contextlib.contextmanager
    def _noting(self, method: str) -> Iterator[None]:
        """Around one direct call into the wrapped proposer: what it raises is noted as a problem, then re-raised."""
        try:
            yield
        except Exception as exc:
            self.problems.append(f"{method} raised {describe_exc(exc)} ({self._context()})")
            raise

    def start(self, state: DecodeState) -> None:
        self.request, self.step = self.request + 1, 0
        self.calls.append(Call("start", self.request, tuple(state.tokens[0].tolist())))
        with self._noting("start"):
            self.inner.start(state)

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        before = state.tokens.clone()
        with self._noting("propose"):
            draft = self.inner.propose(state, budget)
        if not torch.equal(before, state.tokens):
            self.problems.append(
                f"propose modified state.tokens in place ({self._context()}); the committed tokens are the "
                "engine's: treat DecodeState as read-only and copy before editing"
            )
        problem = draft_problem(draft, self, self.vocab_size)
        if problem:
            self.problems.append(f"{problem} ({self._context()})")
        self.calls.append(Call("propose", self.request, tuple(before[0].tolist()), budget, draft))
        return draft

    def on_verified(self, outcome: VerifyOutcome) -> None:
        self.calls.append(Call("on_verified", self.request, draft=outcome.draft, outcome=outcome))
        try:
            with self._noting("on_verified"):
                self.inner.on_verified(outcome)
        finally:
            self.step += 1

    def drafts(self) -> list[DraftTree]:
        return [c.draft for c in self.calls if c.method == "propose" and isinstance(c.draft, DraftTree)]
