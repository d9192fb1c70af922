"""``recall``: drafts from a cache of earlier requests' outputs.

Serving traffic repeats itself: the same question asked again, a regeneration, a template answer with one name
changed. ``recall`` keeps the outputs of the last ``max_outputs`` requests and drafts from them:

1. same prompt as an earlier request, and the output so far is a prefix of that request's output -> propose the
   next ``k`` tokens of it;
2. otherwise, the longest suffix of prompt + output so far (``max_n`` down to ``min_n`` tokens) that occurs in
   an earlier output -> propose the ``k`` tokens that followed its most recent occurrence.

Drafts are deterministic (one-hot q), so output stays exact under greedy decoding and sampling alike.

Worked example (``min_n=2, max_n=3, k=3``)::

    cache = OutputCache(min_n=2, max_n=3, max_outputs=8)
    cache.add(prompt=(1, 2), output=[7, 8, 9, 10, 11])
    cache.lookup(prompt=(1, 2), generated=[7, 8], k=3)        -> [9, 10, 11]   (same prompt, same start)
    cache.lookup(prompt=(5,), generated=[3, 8, 9], k=3)       -> [10, 11]      (suffix [8, 9] seen before)
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal

from pydantic import Field, model_validator

from specframe import DecodeState, DraftTree, ProposerBase, ProposerConfig, TargetInfo, VerifyOutcome, hookimpl

__version__ = "0.1.0"


class RecallConfig(ProposerConfig):
    name: Literal["recall"] = "recall"
    k: int = Field(8, ge=1, le=64, description="Most tokens drafted per step.")
    min_n: int = Field(2, ge=1, description="Shortest context suffix looked up in earlier outputs.")
    max_n: int = Field(6, ge=1, le=32, description="Longest context suffix looked up (tried first).")
    max_outputs: int = Field(256, ge=1, description="Earlier outputs kept; the oldest is dropped first.")

    @model_validator(mode="after")
    def _order(self) -> "RecallConfig":
        if self.min_n > self.max_n:
            raise ValueError(f"recall: min_n ({self.min_n}) must be <= max_n ({self.max_n})")
        return self


class OutputCache:
    """Earlier outputs, by prompt and by n-gram (most recent occurrence wins). Pure: no torch, no model."""

    def __init__(self, min_n: int, max_n: int, max_outputs: int) -> None:
        self.min_n, self.max_n, self.max_outputs = min_n, max_n, max_outputs
        self.outputs: OrderedDict[int, list[int]] = OrderedDict()  # output id -> tokens, oldest first
        self.by_prompt: dict[tuple[int, ...], int] = {}
        self.grams: dict[tuple[int, ...], tuple[int, int]] = {}  # n-gram -> (output id, end index)
        self._keys: dict[int, tuple[tuple[int, ...], list[tuple[int, ...]]]] = {}  # id -> (prompt, its n-grams)
        self._next_id = 0

    def add(self, prompt: tuple[int, ...], output: list[int]) -> None:
        oid, self._next_id = self._next_id, self._next_id + 1
        self.outputs[oid] = list(output)
        self.by_prompt[prompt] = oid
        grams = []
        for end in range(len(output) - 1):  # an occurrence needs a continuation
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                gram = tuple(output[end - n + 1 : end + 1])
                self.grams[gram] = (oid, end)
                grams.append(gram)
        self._keys[oid] = (prompt, grams)
        while len(self.outputs) > self.max_outputs:
            self._evict(next(iter(self.outputs)))

    def _evict(self, oid: int) -> None:
        """Forget an output; entries a newer output took over stay."""
        del self.outputs[oid]
        prompt, grams = self._keys.pop(oid)
        if self.by_prompt.get(prompt) == oid:
            del self.by_prompt[prompt]
        for gram in grams:
            if self.grams.get(gram, (None,))[0] == oid:
                del self.grams[gram]

    def lookup(self, prompt: tuple[int, ...], generated: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens to draft after ``prompt + generated`` (``[]`` when nothing matches)."""
        oid = self.by_prompt.get(prompt)
        if oid is not None:
            earlier, g = self.outputs[oid], len(generated)
            if earlier[:g] == generated and len(earlier) > g:
                return earlier[g : g + k]
        context = list(prompt[-self.max_n :]) + generated if len(generated) < self.max_n else generated
        for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
            hit = self.grams.get(tuple(context[-n:]))
            if hit is not None:
                oid, end = hit
                return self.outputs[oid][end + 1 : end + 1 + k]
        return []


class RecallProposer(ProposerBase):
    """Drafts continuations of earlier requests' outputs (exact prompt first, then the longest n-gram)."""

    name = "recall"
    Config = RecallConfig

    def __init__(self, config: RecallConfig, target: TargetInfo) -> None:
        super().__init__(config, target)
        self.cache = OutputCache(config.min_n, config.max_n, config.max_outputs)  # lives across requests
        self._prompt: tuple[int, ...] = ()
        self._generated: list[int] = []

    def start(self, state: DecodeState) -> None:
        self._prompt = tuple(state.tokens[0, : state.prompt_len].tolist())
        self._generated = state.tokens[0, state.prompt_len :].tolist()

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        generated = state.tokens[0, state.prompt_len :].tolist()  # drafts depend on the committed tokens only
        draft = self.cache.lookup(self._prompt, generated, min(self.config.k, budget))
        return DraftTree.chain(draft) if draft else DraftTree.empty(state.tokens.shape[0])

    def on_verified(self, outcome: VerifyOutcome) -> None:
        self._generated.extend(outcome.committed[0])
        if outcome.finished:
            self.cache.add(self._prompt, self._generated)


@hookimpl
def specframe_register_proposers(register) -> None:
    register(RecallProposer)
