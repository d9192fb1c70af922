"""What a step costs the ``adaptive`` router, in one-token target forwards: the cost curve ``v(n)``, a shared
forward's share (batched decoding), a probe's node budget, and the measured clocks (the one-token forward time
``t1``, each proposer's draft seconds) that turn seconds into forwards.

The curve ``v(n)`` (target forward time for ``n`` tokens over the time for one) is the configured one
(:func:`.config.load_cost_curve`), else the target's measured one (``TargetInfo.cost``), else the linear default
``1 + cost_slope * (n - 1)``; a timed request alone re-prices a measured or default one (never a configured one)
from its own steps (:meth:`StepCost.learn`): each
width bucket (n in 2, 3-4, 5-8, 9-16, ...) keeps the moving averages of its forwards' width and measured
``forward_s / t1``, and v(n) is the line through (1, 1) and those points, past the widest the curve's shape from
there. A curve measured on another machine or under other load (issue 67: a 2-core Xeon's flat curve on an AVX2
EPYC where v(9) ~ 3.1) is so corrected within a few steps: the ascent then trims drafts to what pays here, and
probes stay small. Under sampling no measured curve is read: which drafts a step verifies decides how many
random draws it makes, so a curve measured under whatever load the measurement met (then followed by the thread
governor) would give a seed other tokens elsewhere or later.

Timings (``measure``): wall-clock times differ from run to run, and under sampling the routing decides which
proposers draw from the request's generator — so with timings a seed would no longer reproduce the same tokens
(the distribution stays exact). ``auto`` measures under greedy decoding only; ``always`` / ``never`` force it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specframe import ProposerStep, StepReport, TargetInfo
from specframe.services import CostCurve

from .stats import ProposerStats


class StepCost:
    """The cost of verifying ``n`` tokens of this request, in one-token forwards, alone or in a shared forward.

    Args:
        curve: the router's configured curve, or None.
        linear: the linear default (``cost_slope``).
        target: what the target is (its measured ``cost`` curve, when it has one), or None.
    """

    def __init__(self, curve: CostCurve | None, linear: CostCurve, target: TargetInfo | None) -> None:
        self.curve, self.linear = curve, linear
        self.target = target
        self.greedy = True  # under sampling only the configured curve or the linear default is read
        self.rows, self.width = 1, 1  # a shared forward: rows (this request's included), the others' width
        self.points: dict[int, tuple[float, float]] = {}  # width bucket -> (width, measured v): see learn; greedy

    def v(self, n: float) -> float:
        """v(n) of one forward over ``n`` tokens: the curve's, or under greedy decoding with forwards measured
        (:meth:`learn`) the line through (1, 1) and the measured points, past the widest point the curve's shape
        scaled to it."""
        if not self.greedy:
            return (self.curve or self.linear).v(n)
        if n <= 1 or not self.points or self.curve is not None:
            return self._curve_v(n)
        pts = [(1.0, 1.0), *sorted(self.points.values())]
        for (n0, v0), (n1, v1) in zip(pts, pts[1:]):
            if n <= n1:
                return v0 + (v1 - v0) * (n - n0) / (n1 - n0) if n1 > n0 else v1
        n_last, v_last = pts[-1]
        return v_last * self._curve_v(n) / self._curve_v(n_last)

    def _curve_v(self, n: float) -> float:
        measured = self.target.cost if self.target is not None else None  # (read now: it follows the machine)
        return (self.curve or measured or self.linear).v(n)

    @staticmethod
    def bucket(n: float) -> int:
        """The width bucket of a forward over ``n`` tokens: ceil(log2 n) (1: n = 2; 2: 3-4; 3: 5-8; ...)."""
        return math.ceil(math.log2(max(float(n), 1.0)))

    def learn(self, n: int, v_measured: float, decay: float) -> None:
        """A forward over ``n`` > 1 tokens measured at ``v_measured`` one-token forwards (``forward_s / t1``): its
        bucket's point (width, v) moves towards ``(n, v_measured)`` (moving averages, weight ``decay`` on the past;
        a bucket's first measurement is taken as it is). A curve the router's config gives (``cost_curve``,
        ``cost_profile``) is the user's word: it is not re-priced."""
        if n <= 1 or v_measured <= 0 or self.curve is not None:
            return
        b = self.bucket(n)
        old = self.points.get(b)
        self.points[b] = (float(n), v_measured) if old is None else \
            (decay * old[0] + (1 - decay) * n, decay * old[1] + (1 - decay) * v_measured)

    def plain(self) -> float:
        """Plain decoding's best time per token, in one-token forwards of the settings the target runs with: the
        measured curve's :meth:`~specframe.target.cost.CostCurve.plain_share` (``plain_t1_ms / T(1)``, at most 1).
        1.0 where these settings are plain decoding's best or nothing was measured; below 1.0 where the machine
        profile ran speculation on other settings than plain decoding's (they won at its reference acceptance), so
        a step on them beats plain decoding's best only where it commits more than ``1 / plain()`` tokens per
        one-token forward. Read for :attr:`AdaptiveRouter.vs_plain`, which decides nothing: verifying nothing runs
        on these settings too, so the ascent's reference stays their own one-token forward."""
        measured = self.target.cost if self.target is not None else None
        return measured.plain_share() if measured else 1.0

    def share(self, rows: int, width: int) -> None:
        """The next step's forward is shared by ``rows`` requests whose other rows are ``width`` tokens wide (see
        :meth:`verify`). Ignored under sampling: a sampled request decides from its seed and counts alone, so a seed
        gives the same tokens in any batch."""
        self.rows, self.width = (max(1, int(rows)), max(1, int(width))) if self.greedy else (1, 1)

    @property
    def alone(self) -> bool:
        """The forward verifies this request only."""
        return self.rows <= 1

    def verify(self, n: float) -> float:
        """This request's cost of a step that verifies ``n`` of its tokens (its newest + drafts). Alone: v(n). In a
        batch of ``B`` rows whose other rows are ``w`` tokens wide (the forward pads every row to the widest, so it
        runs ``B * max(w, n)`` tokens): its equal share of the forward without its drafts, plus all that its drafts
        add, ``v(B w) / B + v(B max(w, n)) - v(B w)``. So a draft node costs what it adds to everyone's forward:
        speculation shrinks as the batch grows and stops where the forward is compute-bound."""
        if self.rows <= 1:
            return self.v(n)
        base = self.v(self.rows * self.width)
        return base / self.rows + self.v(self.rows * max(self.width, n)) - base

    def forward(self, n: float) -> float:
        """v of the whole forward that verifies ``n`` tokens of this request (alone: v(n); in a batch:
        ``v(B max(w, n))``): what a measured forward time is divided by to read T(1)."""
        return self.v(n) if self.rows <= 1 else self.v(self.rows * max(self.width, n))

    def probe_nodes(self, budget: int, probe_cost: float) -> int:
        """The node budget of a probe: the largest ``n <= budget`` whose nodes add at most ``probe_cost`` one-token
        forwards to the step's forward (``v(1 + n) - v(1)``), at least 1. A probe asks whether a proposer pays again;
        a whole draft verified where the cost curve is steep costs several forwards, a node or two answers it."""
        base, n = self.verify(1), 1
        while n < budget and self.verify(2 + n) - base <= probe_cost:
            n += 1
        return n


@dataclass(slots=True)
class Clock:
    """The measured side: whether this request is timed, and the one-token forward time ``t1`` (seconds)."""

    timed: bool = False
    t1: float | None = None  # seconds of a one-token target forward (EMA); None = not measured
    t1_plain: bool = False  # t1 comes from one-token forwards (steps that verified nothing), not the curve

    def draft_cost(self, st: ProposerStats) -> float:
        """A proposer's draft cost per step, one-token forwards: measured seconds / ``t1`` when timed and known,
        else its configured ``draft_cost``."""
        if self.timed and self.t1 and st.draft_s:
            return st.draft_s / self.t1
        return st.configured_cost

    def observe(self, report: StepReport, cost: StepCost, decay: float) -> bool:
        """Learn ``t1`` from the step's forward time (timed routers). Once a step verified nothing, only such steps
        count: read through the curve, a tree forward that costs more than the curve says would raise ``t1`` and hide
        that excess from what its proposer is charged. True when ``t1`` changed."""
        if not (self.timed and report.forward_s > 0 and (report.verified == 0 or not self.t1_plain)):
            return False
        t1 = report.forward_s / cost.forward(report.verified + 1)
        first_plain = report.verified == 0 and not self.t1_plain
        self.t1 = t1 if self.t1 is None or first_plain else decay * self.t1 + (1 - decay) * t1
        self.t1_plain = self.t1_plain or report.verified == 0
        return True

    def added(self, report: StepReport, s: ProposerStep, cost: StepCost) -> float:
        """What proposer step ``s``'s nodes added to the step's target forward, one-token forwards: the curve's
        ``v(1 + verified) - v(1 + verified - drafted)``, plus, when timed and alone (in a batch the forward's excess
        is every row's), its share by nodes of the forward's measured excess over the curve (``forward_s / t1 -
        v(1 + verified)``: a tree's attention mask, a long context, a profile taken under other conditions). Never
        below 0."""
        n = report.verified
        added = cost.verify(1 + n) - cost.verify(1 + max(n - s.drafted, 0))
        if cost.alone and self.timed and self.t1_plain and self.t1 and n > 0 and report.forward_s > 0:
            added += (report.forward_s / self.t1 - cost.verify(1 + n)) * min(s.drafted, n) / n
        return max(0.0, added)
