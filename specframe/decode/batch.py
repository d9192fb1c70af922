"""Continuous batching: several requests step together, one target forward per step for all of them.

Each request keeps everything of its own — its engine (own proposer instances, verifier, router), draft, acceptance,
stop checks, stream, metrics and random generator — and only the verification forward is shared. A step is:

1. every active request drafts (:meth:`~specframe.decode.engine.Request.draft`);
2. the batch runs one forward over every request's ``[newest token] + draft`` (ragged: chains and trees of any size);
3. every request verifies, commits and keeps its accepted path (:meth:`~specframe.decode.engine.Request.verify`).

Finished requests leave and waiting ones join between steps (prefilled on their own, then appended to the batch's KV
cache); no other row is re-prefilled. A request's output is the same as decoding it alone: each row attends to its own
keys at its own positions (:mod:`specframe.target.batch_kv`).

Which batch a target gets: ``target.new_batch(rows)`` when it has one (transformers targets with full-attention layers:
:mod:`specframe.target.batch_kv`; llama.cpp verifying chains: :mod:`specframe.target.llamacpp.batch`), otherwise
:class:`SequentialBatch` — the same loop, each request scored by its own forward (replay, sliding-window models,
llama.cpp with token trees), so the face works on every engine.
"""

from __future__ import annotations

import time
from concurrent.futures import CancelledError
from dataclasses import InitVar, dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from ..contracts.optional import optional
from ..errors import ConfigError
from ..sampling import SamplingParams, is_greedy_temperature
from .batch_gate import SpeculationGate
from .engine import Engine, GenerationResult, Request, default_scorer
from .observe import Observers
from .options import DecodeOptions

__all__ = ["BatchLoop", "BatchRequest", "SequentialBatch", "decode_batch", "new_batch"]


@dataclass
class BatchRequest:
    """One request for :func:`decode_batch`: its engine, prompt and :class:`~specframe.decode.options.DecodeOptions`
    (``BatchRequest(engine, ids, DecodeOptions(64, seed=7))``). ``engine`` is the request's own (its proposer
    instances); ``release`` is called once when the request has left the batch (e.g. to give the engine back to its
    pool).

    The options' fields may be given instead, as :meth:`Engine.request <specframe.decode.engine.Engine.request>`
    takes them (``BatchRequest(engine, ids, 64, sampling, seed=7)``: ``max_new_tokens`` in the options' place); they
    are read into ``options``.
    """

    engine: Engine
    prompt_ids: list[int]
    options: DecodeOptions | int | None = None  # an int: max_new_tokens, with the fields below
    sampling: InitVar[SamplingParams | None] = None
    seed: InitVar[int] = 0
    stop_strings: InitVar[Sequence[str]] = ()
    on_text: InitVar[Callable[[str], None] | None] = None
    observer: Observers | None = None
    release: Callable[[], None] | None = None
    tag: Any = None  # the caller's: comes back with the result
    cancel: Any = None  # a threading.Event: once set, the request leaves the batch before the next step
    constraint: InitVar[Any] = None  # its own compiled constraint (specframe.contracts.constraint.Constraint) or None
    logprobs: InitVar[int | None] = None  # alternatives per token of the log-probabilities kept (None: none)
    max_new_tokens: InitVar[int | None] = None  # (the options' place may hold it instead)

    def __post_init__(self, sampling: SamplingParams | None, seed: int, stop_strings: Sequence[str],
                      on_text: Callable[[str], None] | None, constraint: Any, logprobs: int | None,
                      max_new_tokens: int | None) -> None:
        fields = (sampling, seed, tuple(stop_strings), on_text, constraint, logprobs, max_new_tokens)
        if isinstance(self.options, DecodeOptions):
            if fields != (None, 0, (), None, None, None, None):
                raise TypeError("BatchRequest takes a DecodeOptions or its fields, not both")
        else:
            if (self.options is None) == (max_new_tokens is None):
                raise TypeError("BatchRequest needs a DecodeOptions, or max_new_tokens (once)")
            if self.options is None:
                self.options = max_new_tokens
            self.options = DecodeOptions(self.options, sampling, seed, tuple(stop_strings), constraint, logprobs,
                                         on_text)


class SequentialBatch:
    """The batch of a target without a batched forward: each request's own scorer, one forward per request per step
    (:meth:`forward` does nothing; each request's ``score`` runs its forward when it verifies)."""

    def __init__(self, target: Any) -> None:
        self.factory = default_scorer(target)

    def row(self, target: Any, layers: tuple[int, ...], want_hidden: bool) -> Any:
        return self.factory(target, layers, want_hidden)

    def forward(self, items: list) -> None:
        return None


def new_batch(target: Any, rows: int) -> Any:
    """The target's batch for up to ``rows`` requests at once (one forward for all) where it has one, else a
    :class:`SequentialBatch`."""
    make = optional(target, "new_batch")
    batch = make(rows) if make is not None else None
    return batch if batch is not None else SequentialBatch(target)


@dataclass
class _Active:
    item: BatchRequest
    request: Request  # its stepping state (engine.Request)
    index: Any
    draft: tuple = field(default=())
    size: int = 1  # its row's tokens in the last forward (newest + draft nodes)


class BatchLoop:
    """The continuous-batching loop as steps: :meth:`admit` requests while there is :attr:`room`, :meth:`step`
    them together, collect the finished. :func:`decode_batch` drives it over an iterable; the scheduler
    (:mod:`specframe.decode.scheduler`) over requests arriving from any thread. Call from one thread only.

    Args:
        target: the target every request's engine runs on.
        batch_size: requests in one forward at most.
        gate: measure whether drafting pays at each batch size and draft only where it does (greedy rows;
            :mod:`specframe.decode.batch_gate`); False: every row drafts as its router says (speed-independent
            forwards, as each request alone).

    Raises:
        ConfigError: ``batch_size < 1``; the target cannot hold that many requests at once (llama.cpp's cells).
    """

    def __init__(self, target: Any, batch_size: int, gate: bool = True) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.batch = new_batch(target, batch_size)
        self.t_start = time.perf_counter()
        self.active: list[_Active] = []
        self.gate = SpeculationGate() if gate else None  # whether greedy rows draft at this batch size

    @property
    def room(self) -> int:
        return self.batch_size - len(self.active)

    def admit(self, item: BatchRequest, index: Any, arrived: float | None = None) -> None:
        """Start ``item`` (its prefill, on its own) so that it joins the next step; ``arrived``: when it was asked
        for (``perf_counter``; None: when the loop started), for its ``queue_s``.

        Raises:
            ConfigError, PromptTooLongError: the request's own checks (its engine is given back).
            RuntimeError: no room.
        """
        if not self.room:
            raise RuntimeError(f"the batch holds {self.batch_size} requests at most")
        req = _start(item, self.batch)
        req.writer.metrics.queue_s = req.t_start - (self.t_start if arrived is None else arrived)
        self.active.append(_Active(item, req, index))

    def step(self) -> list[tuple[Any, GenerationResult | BaseException]]:
        """One step of every active request; returns ``(index, result)`` of those that finished, or ``(index,
        exception)`` of one that failed on its own (a client's ``on_text`` that raised, say) or was cancelled
        (:class:`concurrent.futures.CancelledError`, before the step): it leaves alone, the others go on. A target
        forward that fails for everyone raises."""
        out: list[tuple[Any, GenerationResult | BaseException]] = []
        for a in [a for a in self.active if a.item.cancel is not None and a.item.cancel.is_set()]:
            self.active.remove(a)  # a client that went away frees its row at once
            _leave(a)
            out.append((a.index, CancelledError("the request was cancelled")))
        active = self.active
        if not active:
            return out
        sizes = [a.size for a in active]
        failed: list[_Active] = []
        t0 = time.perf_counter()
        drafting = self.gate is None or self.gate.draft_now(len(active))
        before = sum(len(a.request.stops.generated) for a in active)
        for i, a in enumerate(active):  # the router budgets each request's draft from the whole forward
            a.request.drafting.set_batch(len(active), max(sizes[:i] + sizes[i + 1 :], default=1))
            a.draft = a.request.draft(None if drafting or not is_greedy_temperature(a.request.sampling.temperature)
                                      else 0)
            a.size = 1 + a.draft[0].tree.num_nodes
        self.batch.forward([(a.request.scorer, a.request.newest, a.draft[0].tree) for a in active])
        for a in active:
            try:
                a.request.verify(*a.draft)
            except Exception as exc:  # noqa: BLE001 - one request's failure must not end the others
                failed.append(a)
                out.append((a.index, exc))
        if self.gate is not None:
            self.gate.observe(sum(len(a.request.stops.generated) for a in active) - before, time.perf_counter() - t0)
        done = [a for a in active if a.request.finished and a not in failed]
        self.active = [a for a in active if not a.request.finished and a not in failed]
        for a in failed:
            _leave(a)
        for a in done:
            try:
                result: GenerationResult | BaseException = a.request.result()
            except Exception as exc:  # noqa: BLE001 - (its last piece of streamed text went to a raising client)
                result = exc
            _leave(a)
            out.append((a.index, result))
        return out

    def close(self) -> None:
        """Give every active row back (an error, or a consumer that stopped early) and free the batch."""
        for a in self.active:
            _leave(a)
        self.active = []
        close = optional(self.batch, "close")
        if close is not None:  # (a llama.cpp batch frees its context)
            close()


def decode_batch(target: Any, requests: Iterable[BatchRequest], batch_size: int,
                 between_steps: Callable[[], Any] | None = None,
                 gate: bool = True) -> Iterator[tuple[int, GenerationResult]]:
    """Decode ``requests`` with at most ``batch_size`` in each forward; yields ``(index, result)`` as each finishes
    (index: its place in ``requests``), so results come in finishing order.

    Requests are taken from ``requests`` as rows free up (an iterator may keep producing them: continuous batching).
    ``between_steps`` is called after every step (the thread governor's load check); ``gate`` as in
    :class:`BatchLoop`.

    Raises:
        ConfigError: ``batch_size < 1``; a request's own checks (``max_new_tokens < 1``, an empty prompt).
        PromptTooLongError: a prompt that leaves no room in the target's context.
        Exception: whatever a request's client callback (``on_text``) raised.
    """
    loop = BatchLoop(target, batch_size, gate)
    waiting = enumerate(iter(requests))
    more = True
    try:
        with torch.inference_mode():
            while loop.active or more:
                while more and loop.room:  # join: prefill on its own, enter the next forward
                    nxt = next(waiting, None)
                    if nxt is None:
                        more = False
                        break
                    loop.admit(nxt[1], nxt[0])
                if not loop.active:
                    break
                for index, result in loop.step():
                    if isinstance(result, BaseException):
                        raise result
                    yield index, result
                if between_steps is not None:
                    between_steps()
    finally:
        loop.close()


def _start(item: BatchRequest, batch: Any) -> Any:
    try:
        req = item.engine.request(item.prompt_ids, item.options, observer=item.observer, scorer=batch.row)
        req.start()
    except BaseException:
        if item.release is not None:
            item.release()
        raise
    return req


def _leave(a: _Active) -> None:
    try:
        a.request.close()
    finally:
        if a.item.release is not None:
            a.item.release()
