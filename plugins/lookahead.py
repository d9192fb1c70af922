"""``lookahead``: lookahead decoding (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference Using
Lookahead Decoding", ICML; LADE; TensorRT-LLM's ``LookaheadDecodingConfig``; llama.cpp's ``examples/lookahead``).
Training-free, no draft model.

Jacobi decoding guesses the next ``window`` tokens at once and lets the target correct them all in one forward: the
target's argmax after each guessed prefix is the next iteration's guess for the position after it. Those guesses
converge slowly, but along the way they form n-grams the text is likely to contain: LADE keeps the last ``ngram``
iterations and reads n-grams along their diagonal (the token at position q of iteration t - n + 1, at q + 1 of
iteration t - n + 2, ..., at q + n - 1 of iteration t, each one predicted after the one before it). An n-gram pool
keyed by its first token keeps the ``guesses`` most recent per key; those whose first token is the newest
committed token are verified as branches of the draft tree.

Here both branches ride in the one verification forward as one token tree from the newest committed token: first
the Jacobi window (a chain: it is verified too, and now and then accepted), then the pool's matching n-grams. The
target's argmax at each node comes back in the proposer's feedback (``reads_target_tokens``,
:class:`specframe.VerifyOutcome`), which is all Jacobi needs. Where LADE's lookahead branch is a 2-D window with its
own attention pattern (W x (N - 1) tokens, never accepted), this window is one level deep and its n-grams come from
the iterations kept (the last ``ngram``): fewer nodes per forward — what a CPU target can pay for — for n-grams
that take ``ngram`` steps to form.

Drafts are deterministic (one-hot q): exact under greedy and sampling. The pool is the request's own unless
``shared_pool: true`` (then one pool per target serves every request with that option; a seeded sampled request's
tokens then depend on what other requests left in the pool — its distribution does not).
"""

from __future__ import annotations

import threading
from collections import deque
from contextlib import nullcontext
from typing import Literal

from pydantic import Field

from specframe import DecodeState, DraftTree, ProposerBase, ProposerConfig, TargetInfo, VerifyOutcome, hookimpl
from specframe.services import TokenTrie


class LookaheadConfig(ProposerConfig):
    name: Literal["lookahead"] = "lookahead"
    window: int = Field(4, ge=1, le=64, description="W: tokens the Jacobi window guesses ahead.")
    ngram: int = Field(3, ge=2, le=16, description="N: length of the n-grams the pool keeps (key token + N - 1).")
    guesses: int = Field(4, ge=0, le=64, description="G: n-grams verified per step at most (the pool's per-key cap).")
    shared_pool: bool = Field(False, description="One n-gram pool per target for every request that asks for it.")


_POOLS: dict[tuple, dict[int, list[tuple[int, ...]]]] = {}  # (target, N, G) -> shared pool
_POOLS_LOCK = threading.Lock()


class LookaheadProposer(ProposerBase):
    """Jacobi window + n-gram pool, verified as one tree (see the module docstring)."""

    name = "lookahead"
    Config = LookaheadConfig
    produces_trees = True
    reads_target_tokens = True

    def __init__(self, config: LookaheadConfig, target: TargetInfo) -> None:
        super().__init__(config, target)
        self.pool: dict[int, list[tuple[int, ...]]] = {}
        self.levels: deque[dict[int, int]] = deque(maxlen=config.ngram)  # position -> the target's guess there
        self.window: list[int] = []  # guesses for the positions after the newest committed token
        self._chain: list[int] = []  # this step's window nodes, by depth
        self._root = 0  # this step's position of the newest committed token
        self._prompt: list[int] = []

    def start(self, state: DecodeState) -> None:
        c = self.config
        if c.shared_pool:
            with _POOLS_LOCK:
                self.pool = _POOLS.setdefault((self.target.name, id(self.target.tokenizer), c.ngram, c.guesses), {})
        else:
            self.pool = {}
        self.levels.clear()
        self._prompt = state.tokens[0, : state.prompt_len].tolist()
        self.window = []

    def _fill(self, start: int) -> list[int]:
        """Guesses for positions ``start, start + 1, ...``: the newest iteration's where it has one, else prompt
        tokens (LADE starts its window from prompt tokens too)."""
        newest = self.levels[-1] if self.levels else {}
        out = []
        for pos in range(start, start + self.config.window):
            tok = newest.get(pos)
            if tok is None:
                tok = self._prompt[(pos * 7919) % len(self._prompt)] if self._prompt else 0
            out.append(tok)
        return out

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        tokens = state.tokens[0].tolist()
        self._root = len(tokens) - 1
        if not self.window:
            self.window = self._fill(self._root + 1)
        trie = TokenTrie(max_nodes=budget)
        self._chain = trie.add(self.window)
        with _POOLS_LOCK if self.config.shared_pool else nullcontext():
            grams = list(self.pool.get(tokens[-1], ()))[: self.config.guesses]
        for gram in grams:
            if trie.full:
                break
            trie.add(gram)
        return trie.to_draft() if len(trie) else DraftTree.empty(state.tokens.shape[0])

    def on_verified(self, outcome: VerifyOutcome) -> None:
        if outcome.target_tokens is None or outcome.finished:
            return
        seen = outcome.target_tokens[0]  # [1 + N]: after the root, then after each node of the verified draft
        kept = outcome.draft.num_nodes
        level = {self._root + 1: seen[0]}
        for depth, node in enumerate(self._chain, start=2):  # window node at depth d guesses position root + d + 1
            if node < kept:
                level[self._root + depth] = seen[1 + node]
        self.levels.append(level)
        self._harvest()
        self.window = self._fill(self._root + len(outcome.committed[0]) + 1)

    def _harvest(self) -> None:
        """The n-grams along the diagonal of the kept iterations into the pool (most recent first, G per key)."""
        n = self.config.ngram
        if len(self.levels) < n or self.config.guesses == 0:
            return
        levels = list(self.levels)
        with _POOLS_LOCK if self.config.shared_pool else nullcontext():
            for q in sorted(levels[0]):
                gram = []
                for j in range(n):
                    tok = levels[j].get(q + j)
                    if tok is None:
                        break
                    gram.append(tok)
                if len(gram) < n:
                    continue
                key, rest = gram[0], tuple(gram[1:])
                bucket = self.pool.setdefault(key, [])
                if rest in bucket:
                    bucket.remove(rest)
                bucket.insert(0, rest)
                del bucket[self.config.guesses :]


@hookimpl
def specframe_register_proposers(register) -> None:
    register(LookaheadProposer)
