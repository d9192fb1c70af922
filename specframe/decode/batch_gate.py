"""Whether a batched step drafts at all: paired measurements of drafting and plain steps per batch size, where it
runs.

Each request's router budgets its own draft from the cost model (:mod:`specframe_plugins.router`), but in a shared
forward a row is padded to the widest: a draft looks free to one request as soon as another drafts as wide, so the
rows keep each other's drafts alive where the batch as a whole would do better without any — and the one-sequence
cost curve leaves out the batched forward's own costs (each row's attention over its own cache, the ragged masks,
the padding). So the batch loop measures, per number of rows B, whether steps that draft commit more tokens per
second (over the step's whole wall time: drafting, the forward, verifying) than steps that do not, and drafts at B
only while they do.

The measurement is paired: a *probe* runs ``probe_steps`` steps in the other mode right after ``probe_steps`` steps
in the current one, at the same B, and compares the two (tokens over seconds of each run of steps). A step's cost
drifts far more with what the batch holds than with the mode — a joining request with a long prompt widens every
row's cache (on the dev set a step at B = 8 went from 36 to 56 ms at one join) — so rates averaged over long
stretches would compare modes measured under different caches; adjacent runs see the same one. The log-ratio of
each pair goes into a moving average (``alpha``), and the verdict flips only past ``margin`` (hysteresis against
noise). A probe that confirms the verdict doubles the steps to the next one (up to ``max_every`` x
``probe_every``); a flip starts again at ``probe_every``. A batch size not measured yet starts in the verdict of the
nearest one measured (the gain of drafting changes slowly with the rows in a forward) and probes the other mode
after its first ``probe_steps`` steps.

Greedy rows only: under sampling, which drafts a step verifies decides how many random draws it makes, and no
timing may change a seed's tokens, so sampling rows always draft as their router says. Greedy output does not depend
on what is drafted (each row's tokens are the target's argmax whatever it verifies), so the gate changes speed only.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

__all__ = ["SpeculationGate"]


@dataclass
class _Ledger:
    drafting: bool = True  # the verdict
    gain: float | None = None  # moving average of log(drafting rate / plain rate) over paired runs (None: no pair yet)
    recent: deque = field(default_factory=deque)  # (tokens, seconds) of the last steps in the verdict's mode
    probe: list = field(default_factory=list)  # (tokens, seconds) of the probe under way
    probing: int = 0  # steps left in the probe under way
    since: int = 0  # steps in the verdict's mode since the last probe
    every: int = 0  # steps between probes now (0: the first probe comes after ``probe_steps`` steps)
    last_step: int = -2  # the gate's step count at this ledger's last step (a gap breaks the pairing)
    pairs: int = 0  # paired comparisons made


def _rate(steps: list | deque) -> float:
    seconds = sum(s for _, s in steps)
    return sum(t for t, _ in steps) / seconds if seconds > 0 else 0.0


class SpeculationGate:
    """Decides, per batched step, whether its greedy rows draft (see the module docstring).

    Args:
        alpha: weight of the newest pair in the moving average of the gain.
        probe_every: steps in the verdict's mode between probes (at first; see ``max_every``).
        probe_steps: steps in a probe (and in the run it is compared with).
        margin: drafting must gain this fraction to be turned on, and lose it to be turned off.
        max_every: a probe that confirms the verdict doubles the steps to the next, up to ``max_every *
            probe_every``; a flip starts again at ``probe_every``.
    """

    def __init__(self, alpha: float = 0.5, probe_every: int = 24, probe_steps: int = 3, margin: float = 0.03,
                 max_every: int = 8) -> None:
        self.alpha, self.probe_every, self.probe_steps, self.margin = alpha, probe_every, probe_steps, margin
        self.max_every = max_every
        self.ledgers: dict[int, _Ledger] = {}
        self.steps = 0
        self._last: tuple[int, bool] | None = None

    def draft_now(self, rows: int) -> bool:
        """Whether the next step of ``rows`` requests drafts (its greedy rows)."""
        self.steps += 1
        if rows <= 1:  # alone: the router's own cost model holds (no padding, no other rows)
            self._last = None
            return True
        led = self.ledgers.get(rows) or self._new_ledger(rows)
        if led.last_step != self.steps - 1:  # other batch sizes ran in between: no run to pair a probe with
            led.recent.clear()
            led.probe.clear()
            led.probing = 0
        led.last_step = self.steps
        if not led.probing and len(led.recent) >= self.probe_steps and led.since >= (led.every or self.probe_steps):
            led.probing, led.since = self.probe_steps, 0
            led.probe.clear()
        mode = (not led.drafting) if led.probing else led.drafting
        self._last = (rows, mode)
        return mode

    def _new_ledger(self, rows: int) -> _Ledger:
        """A ledger for ``rows`` starting in the verdict of the nearest batch size measured (the smaller on a tie;
        none measured: drafting)."""
        measured = [(abs(b - rows), b, led.drafting) for b, led in self.ledgers.items() if led.pairs]
        led = self.ledgers[rows] = _Ledger(drafting=min(measured)[2] if measured else True)
        return led

    def observe(self, committed: int, seconds: float) -> None:
        """The last step's committed tokens (all rows) and its wall seconds."""
        if self._last is None or seconds <= 0:
            return
        rows, mode = self._last
        led = self.ledgers[rows]
        step = (float(committed), seconds)
        if not led.probing:
            led.recent.append(step)
            while len(led.recent) > self.probe_steps:
                led.recent.popleft()
            led.since += 1
            return
        led.probe.append(step)
        led.probing -= 1
        if led.probing:
            return
        probe, led.probe = led.probe, []
        base, other = _rate(led.recent), _rate(probe)
        if base <= 0 or other <= 0:
            return
        ratio = math.log(other / base) if mode else math.log(base / other)  # log(drafting rate / plain rate)
        led.gain = ratio if led.gain is None else (1 - self.alpha) * led.gain + self.alpha * ratio
        led.pairs += 1
        was = led.drafting
        if led.drafting and led.gain < -math.log1p(self.margin):
            led.drafting = False
        elif not led.drafting and led.gain > math.log1p(self.margin):
            led.drafting = True
        if led.drafting != was:  # the probe's mode is the verdict now: its steps are the run the next probe pairs
            led.recent = deque(probe)
            led.every = self.probe_every
        else:
            led.every = min(2 * led.every if led.every else self.probe_every, self.max_every * self.probe_every)

    def gain(self, rows: int) -> float | None:
        """The measured gain of drafting at ``rows`` rows: drafting rate / plain rate (None: not measured)."""
        led = self.ledgers.get(rows)
        return None if led is None or led.gain is None else math.exp(led.gain)
