"""``ngram``: prompt lookup decoding (Saxena 2023; vLLM's ``ngram`` proposer; HF ``prompt_lookup_num_tokens``).

The last ``n`` committed tokens (longest ``n`` first, from ``max_n`` down to ``min_n``) are looked up earlier in
prompt + generated tokens; the tokens that followed their most recent earlier occurrence are proposed, up to
``k`` of them. Drafts are deterministic (one-hot q), so exactness holds under greedy and sampling alike.

With ``branches > 1`` the continuations of several earlier occurrences are merged into a token tree (shared
prefixes once, at most ``max_nodes`` nodes) and verified in the same single forward.

Worked example (``min_n=1, max_n=3, k=3``)::

    tokens = [5, 6, 7, 8, 9, 5, 6, 7]
    suffix [5, 6, 7] occurred at positions 0..2, followed by [8, 9, 5]  ->  proposes [8, 9, 5]

A continuation that runs into the end of the context continues through the repeat (an overlapping copy, as in
LZ77): the occurrence ending at ``end`` says the text repeats with period ``p = len(tokens) - 1 - end``, so the
proposal goes on with its own first tokens, up to ``k``. On periodic text the most recent occurrence is one
period back, and without this the draft would stop after one period (2 tokens for ``[5, 9]`` repeated)::

    tokens = [5, 9, 5, 9, 5, 9], k = 5
    suffix [5, 9] last occurred at 2..3, followed by [5, 9] (the end)  ->  proposes [5, 9, 5, 9, 5]

Feedback: none needed, so no ``on_verified`` (``ProposerBase``'s no-op). The index catches up with
``DecodeState.tokens`` (the committed tokens, which the engine replaces after each step) at the next ``propose``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from specframe import DecodeState, DraftTree, ProposerBase, ProposerConfig, TargetInfo, hookimpl
from specframe.services import TokenTrie


class NgramConfig(ProposerConfig):
    name: Literal["ngram"] = "ngram"
    k: int = Field(8, ge=1, le=64, description="Draft length: most tokens proposed per step.")
    min_n: int = Field(1, ge=1, description="Shortest suffix n-gram to match.")
    max_n: int = Field(4, ge=1, le=16, description="Longest suffix n-gram to match (tried first).")
    match: Literal["first", "recent"] = Field(
        "recent",
        description="Which earlier occurrence to copy from: the first (as HF prompt lookup) or the most recent.",
    )
    branches: int = Field(1, ge=1, le=8, description="Continuations of this many occurrences, merged into a tree.")
    max_nodes: int = Field(16, ge=1, le=128, description="Most tree nodes per step when branches > 1.")

    @model_validator(mode="after")
    def _order(self) -> "NgramConfig":
        if self.min_n > self.max_n:
            raise ValueError(f"ngram: min_n ({self.min_n}) must be <= max_n ({self.max_n})")
        return self


def continuation(tokens: list[int], end: int, k: int) -> list[int]:
    """Up to ``k`` tokens after position ``end``, continuing through the repeat past the end of ``tokens``.

    Example: ``continuation([5, 9, 5, 9], 1, 5) == [5, 9, 5, 9, 5]`` (period 2).
    """
    out = tokens[end + 1 : end + 1 + k]
    period = len(tokens) - 1 - end  # > 0: the occurrence ends before the last token
    while len(out) < k:
        out.append(out[len(out) - period])
    return out


def find_continuation(tokens: list[int], min_n: int, max_n: int, k: int, match: str = "recent") -> list[int]:
    """Reference (non-incremental) prompt lookup.

    Args:
        tokens: prompt + generated token ids.
        min_n, max_n: suffix lengths to try, longest first.
        k: most tokens to return.
        match: ``"recent"`` copies after the most recent earlier occurrence, ``"first"`` after the first.

    Returns:
        The ``k`` tokens that followed the chosen earlier occurrence of the longest matching suffix, continued
        through the repeat where they reach the end of ``tokens`` (:func:`continuation`); ``[]`` when no suffix of
        length in ``[min_n, max_n]`` occurred before.

    Example: ``find_continuation([5, 6, 7, 8, 9, 5, 6, 7], 1, 3, 3) == [8, 9, 5]``.
    """
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n :]
        # occurrences ending at e (e <= length - 2 so that a continuation exists)
        ends = range(length - 2, n - 2, -1) if match == "recent" else range(n - 1, length - 1)
        for end in ends:
            if tokens[end - n + 1 : end + 1] == suffix:
                return continuation(tokens, end, k)
    return []


class NgramIndex:
    """Incremental index giving the same answer as :func:`find_continuation` in O(max_n) per lookup.

    ``last_end[n][gram]`` is the end position of the chosen (most recent, or first) occurrence of ``gram`` that
    has a continuation (ends before the last token).
    """

    def __init__(self, min_n: int, max_n: int, match: str = "recent") -> None:
        self.min_n, self.max_n = min_n, max_n
        self.first = match == "first"
        self.tokens: list[int] = []
        self.last_end: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}
        self.all_ends: dict[int, dict[tuple[int, ...], list[int]]] | None = None  # every occurrence, if asked

    def extend(self, new_tokens: list[int]) -> None:
        old_len = len(self.tokens)
        self.tokens.extend(new_tokens)
        toks = self.tokens
        # ends old_len-1 .. len-2 now have a continuation
        for end in range(max(old_len - 1, 0), len(toks) - 1):
            for n, table in self.last_end.items():
                if end - n + 1 >= 0:
                    key = tuple(toks[end - n + 1 : end + 1])
                    if self.all_ends is not None:
                        self.all_ends[n].setdefault(key, []).append(end)
                    if self.first:
                        table.setdefault(key, end)
                    else:
                        table[key] = end

    def lookup(self, k: int) -> list[int]:
        toks = self.tokens
        length = len(toks)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            end = self.last_end[n].get(tuple(toks[length - n :]))
            if end is not None:
                return continuation(toks, end, k)
        return []

    def track_all(self) -> "NgramIndex":
        """Also record every occurrence (for :meth:`lookup_many`); call before :meth:`extend`."""
        self.all_ends = {n: {} for n in range(self.min_n, self.max_n + 1)}
        return self

    def lookup_many(self, k: int, branches: int) -> list[list[int]]:
        """Continuations (up to ``k`` tokens) of up to ``branches`` occurrences of the longest matching suffix,
        in ``match`` order (the first one is what :meth:`lookup` returns); duplicates dropped."""
        assert self.all_ends is not None, "call track_all() first"
        toks = self.tokens
        length = len(toks)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            ends = self.all_ends[n].get(tuple(toks[length - n :]))
            if ends:
                out: list[list[int]] = []
                for end in ends if self.first else reversed(ends):
                    cont = continuation(toks, end, k)
                    if cont not in out:
                        out.append(cont)
                        if len(out) == branches:
                            break
                return out
        return []


def merge_into_tree(continuations: list[list[int]], max_nodes: int) -> tuple[list[int], list[int]]:
    """Merge token sequences into a trie in topological order: ``(tokens, parent)``, at most ``max_nodes`` nodes.

    Sequences are inserted in order, so the first one is a chain at the front. Example:
    ``merge_into_tree([[1, 2, 3], [1, 4]], 8) == ([1, 2, 3, 4], [-1, 0, 1, 0])``.
    """
    trie = TokenTrie(max_nodes)
    for seq in continuations:
        trie.add(seq)
    return trie.token, trie.parent


class NgramProposer(ProposerBase):
    """Prompt lookup over prompt + generated tokens (row 0; batch > 1 comes later)."""

    name = "ngram"
    Config = NgramConfig
    produces_trees = True  # with branches > 1 (one branch drafts chains)

    def __init__(self, config: NgramConfig, target: TargetInfo) -> None:
        super().__init__(config, target)
        self._index = self._new_index()

    def _new_index(self) -> NgramIndex:
        index = NgramIndex(self.config.min_n, self.config.max_n, self.config.match)
        return index.track_all() if self.config.branches > 1 else index

    def start(self, state: DecodeState) -> None:
        self._index = self._new_index()
        self._index.extend(state.tokens[0].tolist())

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        seen = len(self._index.tokens)
        if state.tokens.shape[1] > seen:
            self._index.extend(state.tokens[0, seen:].tolist())
        cfg = self.config
        if cfg.branches > 1:
            conts = self._index.lookup_many(min(cfg.k, budget), cfg.branches)
            tokens, parent = merge_into_tree(conts, min(cfg.max_nodes, budget))
            if not tokens:
                return DraftTree.empty(state.tokens.shape[0])
            return DraftTree.from_lists(tokens, parent)
        draft = self._index.lookup(min(cfg.k, budget))
        return DraftTree.chain(draft) if draft else DraftTree.empty(state.tokens.shape[0])


@hookimpl
def specframe_register_proposers(register) -> None:
    register(NgramProposer)
