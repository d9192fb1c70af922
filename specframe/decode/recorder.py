"""The one writer of a request's metrics and observer events.

The decode loop, drafting and fault isolation report what happened to a :class:`Recorder`; only it writes
:class:`~specframe.decode.metrics.RequestMetrics` (request counters, per-proposer attribution, fault counts, timings)
and builds the observer's step events. Faults are counted per step as they happen, so each step event carries
that step's own faults.
"""

from __future__ import annotations

from typing import Sequence

from ..combining import StepReport
from .metrics import ProposerMetrics, RequestMetrics
from .observe import Observers


class Recorder:
    """Writes one request's metrics and observer events.

    Args:
        labels: the proposers' labels in the engine's order (keys of ``metrics.proposers``).
        prompt_tokens: the prompt's length in tokens.
        observer: where step events go; None (no plugin observes) builds no event.
    """

    __slots__ = ("metrics", "observer", "labels", "_step_faults")

    def __init__(self, labels: Sequence[str], prompt_tokens: int, observer: Observers | None = None) -> None:
        self.metrics = RequestMetrics(prompt_tokens=prompt_tokens)
        for label in labels:
            self.metrics.proposers.setdefault(label, ProposerMetrics())
        self.labels = tuple(labels)
        self.observer = observer
        self._step_faults = 0  # faults since the last step event

    # --- faults ----------------------------------------------------------------------------------------------
    def fault(self, label: str | None, kind: str, disabled: bool = False) -> None:
        """One fault of ``kind`` (:mod:`specframe.decode.isolation`'s fault kinds; ``label``: the proposer's, None: the
        request's, e.g. ``refused``); ``disabled``: that proposer is off for the rest of the request."""
        m = self.metrics
        m.proposer_faults += 1
        m.proposer_fault_kinds[kind] = m.proposer_fault_kinds.get(kind, 0) + 1
        self._step_faults += 1
        if label is not None:
            own = m.proposers[label]
            own.faults += 1
            if disabled:
                own.disabled = True
                m.proposer_disabled = all(pm.disabled for pm in m.proposers.values())

    def skipped(self, label: str) -> None:
        """The router left this proposer out of the step (no propose call)."""
        self.metrics.proposers[label].skipped_steps += 1

    # --- steps -----------------------------------------------------------------------------------------------
    def prefill(self, seconds: float) -> None:
        self.metrics.prefill_s = seconds

    def step(self, report: StepReport, depths: Sequence[int], committed: Sequence[int], finished: bool,
             propose_s: float, verify_s: float) -> None:
        """One verification step: the merged tree's ``depths`` (1-based, one per node), the attribution in
        ``report``, the committed tokens and the step's seconds per phase (the forward's are ``report.forward_s``);
        then the observer's step event."""
        m = self.metrics
        m.record_step(report.verified, report.accepted, depths)
        m.new_tokens += len(committed)
        for step in report.proposers:
            m.proposers[step.name].record(step)
        m.propose_s += propose_s
        m.forward_s += report.forward_s
        m.verify_s += verify_s
        if self.observer is not None:
            faults, self._step_faults = self._step_faults, 0
            self.observer.step(m.target_forwards - 1, "+".join(self.labels), report.verified, report.accepted,
                               tuple(committed), faults, finished, report.proposers)

    def finish(self, wall_s: float) -> RequestMetrics:
        """The request's end: its wall time in seconds. Returns the metrics."""
        self.metrics.wall_s = wall_s
        return self.metrics
