"""Fault isolation: a faulty proposer costs speed, never correctness.

A proposer *faults* when ``start``/``propose``/``on_verified`` raises, when ``propose`` returns a draft that breaks
the :class:`~specframe.contracts.DraftTree` contract (see :func:`specframe.decode.draft_checks.check_draft`), or when one
``propose`` call takes longer than the policy's time limit. Its draft is then left out of the step (a
target-only step when it drafts alone; combined, the other proposers' drafts are still verified), so the committed
tokens are exactly those of plain decoding. Per request and proposer, a :class:`FaultGuard` counts faults in the
request's metrics through the request's metrics writer (and the proposer's own attribution), logs **one** warning naming the plugin, and after
``max_faults`` faults disables that proposer — and only it — for the rest of the request (no more calls into it).

Every call into a plugin is a direct call inside a guard, so a grep finds it and a type checker sees its signature::

    with slot.guard.call("on_verified"):  # the label names the call in the warning
        slot.proposer.on_verified(outcome)

An ``Exception`` raised inside goes to the guard's fault handler and is suppressed (a plugin must never crash
generation): a :class:`FaultGuard` records a proposer's fault; a :class:`Guard` runs a handler of its own (the merge
policy and router are replaced for the rest of the request, :mod:`specframe.decode.drafting`).

The time limit is checked after ``propose`` returns (a Python call cannot be interrupted safely); the late
draft is dropped, and repeated overruns disable the proposer, which bounds the damage of a slow plugin.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import ConfigError, DraftError, ProposerTimeoutError
from .metrics import MetricsWriter


def raised_at(exc: BaseException) -> str:
    """`` at file.py:line`` of the innermost frame that raised ``exc`` (the plugin's own line, for its author), or
    ``""`` without a traceback."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f" at {Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}"


NEVER_DISABLED = 1 << 30  # a max_faults this large means no limit (the conformance kit and replay use it)

log = logging.getLogger("specframe")

# Fault kinds, as counted in ``RequestMetrics.proposer_fault_kinds``; "refused": the target's verification forward
# raised on a draft (a tree mask or length it cannot take), counted by the engine, not against one proposer;
# "build": the proposer raised while it was built (it is left out of the request, see UnbuiltProposer).
RAISED, MALFORMED, TIMEOUT, REFUSED, BUILD = "raised", "malformed", "timeout", "refused", "build"


@dataclass(frozen=True, slots=True)
class IsolationPolicy:
    """How the engine treats a faulty proposer.

    Raises:
        ConfigError: a non-positive time limit or ``max_faults < 1``.
    """

    propose_timeout_s: float | None = 5.0  # a propose call slower than this is a fault; None = no time limit
    max_faults: int = 3  # faults in one request after which the proposer is disabled for the rest of it

    def __post_init__(self) -> None:
        if self.propose_timeout_s is not None and not self.propose_timeout_s > 0:
            raise ConfigError(f"propose_timeout_s must be > 0 seconds (or null for none), got {self.propose_timeout_s}")
        if self.max_faults < 1:
            raise ConfigError(f"max_faults must be >= 1, got {self.max_faults}")


class UnbuiltProposer:
    """Stands in for a proposer whose constructor (or factory) raised something other than a
    :class:`~specframe.errors.SpecframeError` (those are the user's to fix and stop with one error line): a plugin
    fault. The request runs with it disabled from the start — counted once as a ``build`` fault in the metrics,
    never called — so the other proposers draft alone, or, alone, the request decodes from the target (output
    unchanged). The warning is given once, where it was built (:mod:`specframe.api`)."""

    needs_hidden_states = produces_trees = provides_draft_probs = False

    def __init__(self, name: str, error: BaseException) -> None:
        self.name, self.build_error = name, error

    def start(self, state: object) -> None:  # pragma: no cover - never called (disabled from the start)
        raise self.build_error

    def propose(self, state: object, budget: int) -> object:  # pragma: no cover - never called
        raise self.build_error

    def on_verified(self, outcome: object) -> None:  # pragma: no cover - never called
        raise self.build_error


def fault_kind(exc: BaseException) -> str:
    if isinstance(exc, DraftError):
        return MALFORMED
    if isinstance(exc, ProposerTimeoutError):
        return TIMEOUT
    return RAISED


class GuardedCall:
    """One guarded block (``with guard.call(where):``): an ``Exception`` raised in it goes to ``on_fault(where, exc)``
    and is suppressed; :attr:`failed` says whether it did. Anything else (``KeyboardInterrupt``) passes through."""

    __slots__ = ("on_fault", "where", "failed")

    def __init__(self, on_fault: Callable[[str, Exception], None], where: str) -> None:
        self.on_fault, self.where, self.failed = on_fault, where, False

    def __enter__(self) -> "GuardedCall":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if not isinstance(exc, Exception):
            return False
        self.failed = True
        self.on_fault(self.where, exc)
        return True


class Guard:
    """The fault guard of a plugin that is not a proposer (a merge policy, a router).

    Args:
        on_fault: called as ``on_fault(where, exc)`` with the label of the guarded call and what it raised.
    """

    __slots__ = ("on_fault",)

    def __init__(self, on_fault: Callable[[str, Exception], None]) -> None:
        self.on_fault = on_fault

    def call(self, where: str) -> GuardedCall:
        """A guard for one call into the plugin, labelled ``where`` (the method's name) in the fault's warning."""
        return GuardedCall(self.on_fault, where)


class FaultGuard:
    """Counts one proposer's faults in one request and decides when to stop calling it.

    Args:
        name: the proposer's name.
        label: its label in the request (metrics key: the name, or ``name#2`` for a second instance).
        plugin: where it comes from, e.g. ``"specframe-recall 0.1.0"`` ("" when unknown).
        policy: the isolation policy.
        writer: the request's :class:`~specframe.decode.metrics.MetricsWriter`, which counts every fault in the metrics.

    With several proposers combined, each has its own guard: one proposer's faults never disable another.
    ``tripped``: it faulted since the step began (:meth:`new_step`), for the step's attribution.
    """

    __slots__ = ("name", "label", "plugin", "policy", "writer", "faults", "disabled", "tripped")

    def __init__(self, name: str, label: str, plugin: str, policy: IsolationPolicy, writer: MetricsWriter) -> None:
        self.name, self.label, self.plugin, self.policy, self.writer = name, label, plugin, policy, writer
        self.faults = 0
        self.disabled = False
        self.tripped = False

    def call(self, where: str) -> GuardedCall:
        """A guard for one call into the proposer (``where``: ``start`` | ``propose`` | ``on_verified``): a fault in
        it is recorded (:meth:`fault`) and suppressed. The caller skips the call when :attr:`disabled`."""
        return GuardedCall(self.fault, where)

    def new_step(self) -> None:
        """A new step begins: no fault in it yet."""
        self.tripped = False

    def unbuilt(self) -> None:
        """The proposer could not be built (:class:`UnbuiltProposer`): one ``build`` fault, disabled from the start,
        no warning (given once when it was built)."""
        self.faults, self.disabled = self.faults + 1, True
        self.writer.fault(self.label, BUILD, disabled=True)

    def fault(self, where: str, exc: BaseException) -> None:
        """Record a fault in ``where`` (``start`` | ``propose`` | ``on_verified``); warn on the first one."""
        kind = fault_kind(exc)
        self.faults, self.tripped = self.faults + 1, True
        if self.faults >= self.policy.max_faults:
            self.disabled = True
        self.writer.fault(self.label, kind, disabled=self.disabled)
        if self.faults == 1:
            what = {MALFORMED: "broke the draft contract", TIMEOUT: "ran over its time limit"}.get(
                kind, f"raised {type(exc).__name__}{raised_at(exc)}"
            )
            source = f" (plugin {self.plugin})" if self.plugin else ""
            limit = (f"after {self.policy.max_faults} fault(s) it is disabled for the rest of the request"
                     if self.policy.max_faults < NEVER_DISABLED else "it is never disabled here (kit / replay)")
            log.warning(
                "proposer %r%s %s in %s: %s; that step goes on without its draft (a target-only step when it drafts "
                "alone), output is unaffected; %s",
                self.name, source, what, where, exc, limit,
            )
