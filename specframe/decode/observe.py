"""Observer hooks at run time: per-step and per-request events for metrics or logging plugins.

Plugins implement ``specframe_observe_step`` / ``specframe_observe_request`` (see :mod:`specframe.hookspecs`).
Once per request, :meth:`specframe.registry.Registry.observers` collects the implementations into an
:class:`Observers` object, or returns None when there are none; the engine then skips every event, so an install
without observers pays no pluggy call (and builds no event) in the decode loop.

Each implementation is called as a plain function (hook wrappers are not supported for observer hooks). One that
raises is dropped for the rest of the request with one warning naming its plugin: observers never change output
or stop generation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from ..contracts.combining import ProposerStep

log = logging.getLogger("specframe")


@dataclass(frozen=True, slots=True)
class StepEvent:
    """One verification step of one request (``specframe_observe_step``)."""

    request_id: int  # counts requests of one registry's observers, from 0
    step: int  # verification step within the request, from 0
    proposer: str  # label of the proposer that drafted this step; combined proposers joined by "+"
    drafted: int  # draft nodes the target verified (after truncation to the node budget; 0 on a fault)
    accepted: int  # of those, accepted
    committed: tuple[int, ...]  # tokens committed: accepted + the recovered/bonus token, cut at a stop
    faults: int  # proposer faults in this step (see specframe.decode.isolation); 0 normally
    finished: bool  # a stop condition ended the request in this step
    attribution: tuple[ProposerStep, ...] = ()  # per proposer: drafted, accepted (credited), wasted, draft time


@dataclass(frozen=True, slots=True)
class RequestEvent:
    """One finished request (``specframe_observe_request``)."""

    request_id: int
    proposers: tuple[str, ...]  # names of the active proposers
    prompt_tokens: int
    token_ids: tuple[int, ...]  # generated ids
    finish_reason: str  # "stop" | "length"
    metrics: dict  # RequestMetrics.to_dict(), the same as the --json record's "metrics"


Impl = tuple[str, Callable[..., Any]]  # (plugin description, hook function)


class Observers:
    """The observer implementations for one request.

    Args:
        request_id: stamped on every event.
        step_impls: ``(plugin, function)`` pairs implementing ``specframe_observe_step``.
        request_impls: pairs implementing ``specframe_observe_request``.
    """

    __slots__ = ("request_id", "_step", "_request")

    def __init__(self, request_id: int, step_impls: list[Impl], request_impls: list[Impl]) -> None:
        self.request_id = request_id
        self._step, self._request = list(step_impls), list(request_impls)

    def step(
        self, step: int, proposer: str, drafted: int, accepted: int, committed: tuple[int, ...], faults: int,
        finished: bool, attribution: tuple[ProposerStep, ...] = (),
    ) -> None:
        """Called by the engine after each verification step (only when observers exist)."""
        if self._step:
            event = StepEvent(self.request_id, step, proposer, drafted, accepted, committed, faults, finished,
                              attribution)
            self._step = _call_all(self._step, "specframe_observe_step", event)

    def request(
        self, proposers: tuple[str, ...], prompt_tokens: int, token_ids: tuple[int, ...], finish_reason: str,
        metrics: dict,
    ) -> None:
        """Called once when the request has finished."""
        if self._request:
            event = RequestEvent(self.request_id, proposers, prompt_tokens, token_ids, finish_reason, metrics)
            self._request = _call_all(self._request, "specframe_observe_request", event)


def _call_all(impls: list[Impl], hook: str, event: Any) -> list[Impl]:
    """Call each implementation; return those that did not raise (a raising one is dropped with a warning)."""
    kept = impls
    for impl in impls:
        plugin, fn = impl
        try:
            fn(event=event)
        except Exception as exc:  # noqa: BLE001 - an observer must never stop generation
            log.warning("observer %s raised %s in %s: %s; dropped for the rest of the request",
                        plugin, type(exc).__name__, hook, exc)
            kept = [i for i in kept if i is not impl]
    return kept
