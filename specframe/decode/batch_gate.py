"""Whether a batched step drafts at all: a ledger of measured throughput per batch size, where it runs.

Each request's router budgets its own draft from the cost model (:mod:`specframe_plugins.router`), but in a shared
forward a row is padded to the widest: a draft looks free to one request as soon as another drafts as wide, so the
rows keep each other's drafts alive where the batch as a whole would do better without any — and the one-sequence
cost curve leaves out the batched forward's own costs (each row's attention over its own cache, the ragged masks,
the padding). So the batch loop keeps, per number of rows B, the committed tokens per second of steps that drafted
and of steps that did not (moving averages over the step's whole wall time: drafting, the forward, verifying), and
drafts at B only while drafting steps commit more per second. It probes the other mode now and then (``probe_every``
steps, ``probe_steps`` in a row; less often while the probes confirm the verdict), so a verdict follows prompts and
load.

Greedy rows only: under sampling, which drafts a step verifies decides how many random draws it makes, and no
timing may change a seed's tokens, so sampling rows always draft as their router says. Greedy output does not depend
on what is drafted (each row's tokens are the target's argmax whatever it verifies), so the gate changes speed only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SpeculationGate"]


@dataclass
class _Ledger:
    rate: dict[bool, float] = field(default_factory=dict)  # drafted? -> EMA of committed tokens per second
    steps: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})  # steps measured per mode
    drafting: bool = True
    since_probe: int = 0
    probing: int = 0  # steps left in the current probe of the other mode
    every: int = 0  # steps between probes now: doubles while probes confirm the verdict (0: not set yet)


class SpeculationGate:
    """Decides, per batched step, whether its greedy rows draft (see the module docstring).

    Args:
        alpha: weight of the newest step in the moving averages.
        probe_every: steps in one mode before a probe of the other.
        probe_steps: steps in a probe.
        margin: drafting must beat plain steps by this fraction to stay on (and plain steps beat drafting by it to
            switch drafting off): hysteresis against noise.
        max_every: a probe that confirms the verdict doubles the steps to the next, up to ``max_every *
            probe_every``; a flip starts again at ``probe_every``.
    """

    def __init__(self, alpha: float = 0.25, probe_every: int = 24, probe_steps: int = 3, margin: float = 0.03,
                 max_every: int = 8) -> None:
        self.alpha, self.probe_every, self.probe_steps, self.margin = alpha, probe_every, probe_steps, margin
        self.max_every = max_every
        self.ledgers: dict[int, _Ledger] = {}
        self._last: tuple[int, bool] | None = None

    def draft_now(self, rows: int) -> bool:
        """Whether the next step of ``rows`` requests drafts (its greedy rows)."""
        if rows <= 1:  # alone: the router's own cost model holds (no padding, no other rows)
            self._last = None
            return True
        led = self.ledgers.setdefault(rows, _Ledger())
        if led.steps[True] < self.probe_steps:  # first, each mode measured over a few steps
            mode = True
        elif led.steps[False] < self.probe_steps:
            mode = False
        elif led.probing:
            led.probing -= 1
            mode = not led.drafting
        else:
            led.since_probe += 1
            if led.since_probe >= (led.every or self.probe_every):
                led.since_probe, led.probing = 0, self.probe_steps - 1
                mode = not led.drafting
            else:
                mode = led.drafting
        self._last = (rows, mode)
        return mode

    def observe(self, committed: int, seconds: float) -> None:
        """The last step's committed tokens (all rows) and its wall seconds."""
        if self._last is None or seconds <= 0:
            return
        rows, mode = self._last
        led = self.ledgers[rows]
        rate = committed / seconds
        old = led.rate.get(mode)
        led.rate[mode] = rate if old is None else (1 - self.alpha) * old + self.alpha * rate
        led.steps[mode] += 1
        if led.probing or min(led.steps.values()) < self.probe_steps:
            return
        on, off = led.rate[True], led.rate[False]
        was = led.drafting
        if led.drafting and off > on * (1 + self.margin):
            led.drafting = False
        elif not led.drafting and on > off * (1 + self.margin):
            led.drafting = True
        if mode != led.drafting or led.drafting != was:  # a probe (or a flip) just ended: back off or start over
            led.every = self.probe_every if led.drafting != was else min(
                2 * (led.every or self.probe_every), self.max_every * self.probe_every)
