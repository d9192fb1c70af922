"""The kit's constraint: a token automaton over the tiny target's vocabulary, and the exact constrained references.

A proposer must stay exact under structured output too: its drafts are cut to what the grammar allows and the target's
rows are masked (:mod:`specframe.contracts.constraint`). The kit's tiny target has no tokenizer, so instead of a
grammar engine the kit constrains it with :class:`TokenAutomaton`, a deterministic automaton over token ids that
implements the :class:`~specframe.contracts.constraint.Constraint` contract directly; :data:`KIT_AUTOMATON` has free
choices, narrow choices and a forced token (what the ``grammar`` proposer drafts), and loops, so every kit prompt can
run for :data:`~specframe.testing.kit.NEW_TOKENS` tokens. The references mask a full forward per token (no KV cache,
no engine).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from torch import Tensor

from ..contracts import DraftTree
from ..errors import ConstraintError
from ..sampling import SamplingParams, probs_from_logits
from ..target.hf import Target

# state -> {token: next state}. 0: any of eight tokens; 1: token 9 is forced; 2: one of three; 3: one of two.
KIT_AUTOMATON: dict[int, dict[int, int]] = {
    0: {t: 1 for t in (1, 2, 3, 4, 5, 6, 7, 8)},
    1: {9: 2},
    2: {3: 3, 7: 0, 11: 3},
    3: {0: 0, 13: 2},
}


class TokenAutomaton:
    """A :class:`~specframe.contracts.constraint.Constraint` that is a deterministic automaton over token ids.

    Args:
        table: ``state -> {token: next state}``; a token missing from its state's row is forbidden there.
        vocab_size: ``V``, the width of the logits it masks.
        state: the state before the first generated token.
    """

    def __init__(self, table: Mapping[int, Mapping[int, int]], vocab_size: int, state: int = 0) -> None:
        self.table, self.vocab, self.state = table, int(vocab_size), state
        self.allowed = {s: torch.zeros(self.vocab, dtype=torch.bool) for s in table}
        for s, row in table.items():
            self.allowed[s][list(row)] = True

    def _states(self, draft: DraftTree) -> list[int | None]:
        """The state after each node's path (None where the path leaves the automaton)."""
        out: list[int | None] = []
        for tok, par in zip(draft.token_ids[0].tolist(), draft.parent[0].tolist()):
            before = self.state if par < 0 else out[par]
            out.append(None if before is None else self.table[before].get(tok))
        return out

    def allowed_prefix(self, draft: DraftTree) -> int:
        states = self._states(draft)
        return next((i for i, s in enumerate(states) if s is None), len(states))

    def mask(self, draft: DraftTree, logits: Tensor) -> Tensor:
        if logits.shape[-1] != self.vocab:
            raise ConstraintError(f"the logits have {logits.shape[-1]} columns, the automaton was built for {self.vocab}")
        rows = [self.allowed[self.state]]
        rows += [self.allowed[s] if s is not None else torch.ones(self.vocab, dtype=torch.bool)
                 for s in self._states(draft)]
        allowed = torch.stack(rows).to(logits.device).unsqueeze(0)
        return logits.masked_fill(~allowed, float("-inf"))

    def commit(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            nxt = self.table[self.state].get(int(token))
            if nxt is None:
                raise ConstraintError(f"token {token} was committed but the automaton forbids it in state {self.state}")
            self.state = nxt

    def _state_after(self, path: Sequence[int]) -> int | None:
        state: int | None = self.state
        for token in path:
            state = None if state is None else self.table[state].get(int(token))
        return state

    def forced(self, limit: int, after: Sequence[int] = ()) -> list[int]:
        out, state = [], self._state_after(after)
        while state is not None and len(out) < limit and len(self.table[state]) == 1:
            (token, state), = self.table[state].items()
            out.append(token)
        return out

    def choices(self, limit: int, after: Sequence[int] = ()) -> list[int] | None:
        state = self._state_after(after)
        if state is None:
            return []
        return sorted(self.table[state]) if len(self.table[state]) <= limit else None


def kit_constraint(vocab_size: int) -> TokenAutomaton:
    """A fresh :data:`KIT_AUTOMATON` constraint for one request."""
    return TokenAutomaton(KIT_AUTOMATON, vocab_size)


@torch.inference_mode()
def constrained_greedy(target: Target, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy decoding under :func:`kit_constraint`: the masked argmax of a full forward per token (no KV cache)."""
    c, tokens = kit_constraint(target.vocab_size), list(prompt)
    for _ in range(max_new_tokens):
        logits = target.model(input_ids=torch.tensor([tokens], device=target.device)).logits[:, -1:]
        token = int(c.mask(DraftTree.empty(), logits)[0, 0].argmax())
        c.commit([token])
        tokens.append(token)
    return tokens[len(prompt):]


@torch.inference_mode()
def constrained_first_two(target: Target, prompt: list[int], sampling: SamplingParams) -> Tensor:
    """Exact distribution of the first two tokens sampled under :func:`kit_constraint` (mask, then warp), ``[V, V]``
    float64 on the CPU."""
    v = target.vocab_size

    def probs(committed: list[int]) -> Tensor:
        c = kit_constraint(v)
        c.commit(committed)
        logits = target.model(input_ids=torch.tensor([prompt + committed], device=target.device)).logits[:, -1:]
        return probs_from_logits(c.mask(DraftTree.empty(), logits)[0, 0], sampling).double()

    first, exact = probs([]).cpu(), torch.zeros(v, v, dtype=torch.float64)
    for a in first.nonzero().flatten().tolist():
        exact[a] = first[a] * probs([a]).cpu()
    return exact
