"""``adaptive`` router: each step, which combined proposers run and with how many nodes, chosen to maximise the
expected committed tokens per unit of step cost.

Live statistics per proposer ``j`` (exponential moving averages, decay ``decay``, reset per request):

- ``reach[j][d]``: probability that, when asked to draft at least ``d`` deep, its nodes on the accepted path
  reach depth ``d`` (``accepted >= d`` with the attribution's crediting rule). This folds in how often it has a
  draft at all (an n-gram lookup that finds no match reaches depth 0). Starts at ``prior ** d``.
- ``width[j][d]``: nodes it drafts at depth ``d`` when it drafts there (1 for chains; medusa's trees are wider).
- ``cost[j]``: its draft cost per step in one-token target forwards: ``draft_cost[label]`` from the config (0
  when not given), or, when timings are used, its measured seconds per propose call / ``t1``, the seconds of a
  one-token target forward (each step's forward time / v(verified + 1)).

Timings (``measure``): wall-clock times differ from run to run, and under sampling the routing decides which
proposers draw from the request's generator — so with timings a seed would no longer reproduce the same tokens
(the distribution stays exact). ``auto`` (the default) measures under greedy decoding only, where routing cannot
change the output; under sampling the configured ``draft_cost`` is used. ``always`` / ``never`` force it.

The cost curve ``v(n)`` (target forward time for ``n`` tokens over the time for one) comes from ``cost_curve``
(a list v(1), v(2), ...), or ``cost_profile`` (a ``specframe bench --profile`` results.json; its
``profile.v``), or else the linear default ``1 + cost_slope * (n - 1)``.

Choice (greedy ascent, deterministic): with depths ``D_j`` (0 = skip), the expected committed tokens are
``E = 1 + sum_d [1 - prod_j (1 - reach[j][d] * [d <= D_j])]`` (the bonus token, plus depth ``d`` reached by any
proposer, treating proposers as independent — optimistic for correlated ones) and the cost in one-token forwards
is ``C = v(1 + sum_j nodes_j(D_j)) + sum_{j: D_j > 0} cost[j]`` with ``nodes_j(D) = ceil(sum_{d<=D}
width[j][d])``. Starting from nobody, it repeatedly deepens the one proposer (to any deeper level) that most
raises ``E / C``, while that ratio rises and the node budgets hold (each proposer's nodes <= the step's budget,
all together <= the merged tree's ``max_nodes``). A proposer's node budget is ``nodes_j(D_j)``.

Exploration, so a skipped proposer's statistics do not freeze: one left out for ``probe_every`` steps in a row is
run once with the full budget, and with probability ``explore`` per step one skipped proposer (drawn from the
router's own ``random.Random`` seeded with the request's seed: deterministic, no global RNG, and the request's
generator is untouched) is run too.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Literal, Optional, Sequence

from pydantic import Field, field_validator

from specframe import hookimpl
from specframe.bench.costmodel import v_at
from specframe.contracts import RouterBase, RouterConfig, StepReport, TargetInfo
from specframe.errors import ConfigError


class AdaptiveConfig(RouterConfig):
    name: Literal["adaptive"] = "adaptive"
    decay: float = Field(0.9, ge=0.0, lt=1.0, description="Weight of the past in the moving averages.")
    prior: float = Field(0.6, gt=0.0, lt=1.0, description="Reach at depth d assumed before any feedback: prior ** d.")
    max_depth: int = Field(12, ge=1, le=64, description="Deepest level the router plans for.")
    cost_curve: Optional[list[float]] = Field(
        None, min_length=1, description="v(1), v(2), ...: target forward time for n tokens over one token's."
    )
    cost_profile: Optional[str] = Field(None, description="A `specframe bench --profile` results.json to take v(n) from.")
    cost_slope: float = Field(0.03, ge=0.0, description="Default curve without a profile: v(n) = 1 + slope * (n - 1).")
    draft_cost: dict[str, float] = Field(
        default_factory=dict,
        description="Draft cost per step by proposer label, in one-token target forwards (e.g. {draft-model: 0.3}); "
        "used when timings are not measured (missing: 0).",
    )
    measure: Literal["auto", "always", "never"] = Field(
        "auto", description="Measure draft and forward times: auto = under greedy decoding only (keeps sampled "
        "output reproducible under a seed); always; never (use draft_cost).",
    )
    probe_every: int = Field(16, ge=1, description="Run a proposer left out this many steps in a row once, fully.")
    explore: float = Field(0.05, ge=0.0, le=1.0, description="Chance per step to also run one left-out proposer.")

    @field_validator("cost_curve")
    @classmethod
    def _positive(cls, v: Optional[list[float]]) -> Optional[list[float]]:
        if v is not None and any(not x > 0 for x in v):
            raise ValueError("cost_curve values must be > 0 (v(n) = T(n) / T(1))")
        return v


def load_cost_curve(config: AdaptiveConfig) -> list[float] | None:
    """v(1..n) normalised to v(1) = 1, from ``cost_curve`` or ``cost_profile``; None for the linear default.

    Raises:
        ConfigError: an unreadable profile, or one without ``profile.v``.
    """
    curve = config.cost_curve
    if curve is None and config.cost_profile:
        path = Path(config.cost_profile).expanduser()
        try:
            doc = json.loads(path.read_text())
            curve = [float(x) for x in (doc.get("profile") or {})["v"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"router adaptive: cost_profile {path} has no profile.v ({type(exc).__name__}); run "
                "`specframe bench --profile` to write one, or give cost_curve"
            ) from None
    if not curve:
        return None
    return [x / curve[0] for x in curve]


class AdaptiveRouter(RouterBase):
    """Runs the proposers, and gives them the node budgets, that maximise expected tokens per unit cost."""

    name = "adaptive"
    Config = AdaptiveConfig

    def __init__(self, config: AdaptiveConfig, target: TargetInfo | None = None) -> None:
        super().__init__(config, target)
        self.curve = load_cost_curve(config)

    def v(self, n: float) -> float:
        if self.curve is not None:
            return v_at(self.curve, n)
        return 1.0 + self.config.cost_slope * (n - 1)

    def start(self, proposers: Sequence[str], seed: int, greedy: bool = True) -> None:
        super().start(proposers, seed, greedy)
        cfg, p = self.config, len(proposers)
        self.timed = cfg.measure == "always" or (cfg.measure == "auto" and greedy)
        self.configured_cost = [float(cfg.draft_cost.get(label, 0.0)) for label in proposers]
        self.reach = [[cfg.prior ** d for d in range(1, cfg.max_depth + 1)] for _ in range(p)]
        self.width = [[1.0] * cfg.max_depth for _ in range(p)]
        self.draft_s = [0.0] * p
        self.t1: float | None = None
        self.idle = [0] * p  # steps left out in a row
        self.rng = random.Random(seed)
        self.last: list[int] = [0] * p

    # --- decision ------------------------------------------------------------------------------------------
    def route(self, budget: int, max_nodes: int, available: Sequence[bool]) -> list[int]:
        depth, nodes = self.plan(budget, max_nodes, available)
        skipped = [j for j, ok in enumerate(available) if ok and depth[j] == 0]
        for j in skipped:
            if self.idle[j] + 1 >= self.config.probe_every:
                nodes[j] = budget
        if skipped and self.config.explore > 0 and self.rng.random() < self.config.explore:
            j = skipped[self.rng.randrange(len(skipped))]
            nodes[j] = max(nodes[j], budget)
        for j in range(len(nodes)):
            self.idle[j] = 0 if nodes[j] > 0 or not available[j] else self.idle[j] + 1
        self.last = nodes
        return nodes

    def plan(self, budget: int, max_nodes: int, available: Sequence[bool]) -> tuple[list[int], list[int]]:
        """``(depth per proposer, node budget per proposer)`` by greedy ascent of E / C (module docstring)."""
        p, dmax = len(available), min(self.config.max_depth, max(budget, 0))
        depth, nodes = [0] * p, [0] * p
        miss = [1.0] * (dmax + 1)  # miss[d]: probability no chosen proposer reaches depth d
        fixed = 0.0  # draft cost of the chosen proposers, in one-token forwards
        total_nodes, expected = 0, 1.0
        best_ratio = expected / self.v(1)
        while True:
            best = None
            for j in range(p):
                if not available[j]:
                    continue
                gain, cum = 0.0, sum(self.width[j][: depth[j]])
                extra = 0.0 if depth[j] else self._draft_cost(j)
                for d in range(depth[j] + 1, dmax + 1):
                    gain += miss[d] * self.reach[j][d - 1]
                    cum += self.width[j][d - 1]
                    n_j = math.ceil(cum - 1e-9)
                    n_all = total_nodes - nodes[j] + n_j
                    if n_j > budget or n_all > max_nodes:
                        break
                    ratio = (expected + gain) / (self.v(1 + n_all) + fixed + extra)
                    if ratio > best_ratio * (1 + 1e-9) and (best is None or ratio > best[0]):
                        best = (ratio, j, d, gain, n_j, extra)
            if best is None:
                return depth, nodes
            best_ratio, j, d, gain, n_j, extra = best
            for k in range(depth[j] + 1, d + 1):
                miss[k] *= 1.0 - self.reach[j][k - 1]
            expected += gain
            fixed += extra
            total_nodes += n_j - nodes[j]
            depth[j], nodes[j] = d, n_j

    def _draft_cost(self, j: int) -> float:
        if self.timed and self.t1 and self.draft_s[j]:
            return self.draft_s[j] / self.t1
        return self.configured_cost[j]

    # --- feedback ------------------------------------------------------------------------------------------
    def on_step(self, report: StepReport) -> None:
        a, cfg = self.config.decay, self.config
        if self.timed and report.forward_s > 0:
            t1 = report.forward_s / self.v(report.verified + 1)
            self.t1 = t1 if self.t1 is None else a * self.t1 + (1 - a) * t1
        for j, s in enumerate(report.proposers):
            if not s.asked or s.fault:
                continue
            if self.timed:
                self.draft_s[j] = a * self.draft_s[j] + (1 - a) * s.draft_s if self.draft_s[j] else s.draft_s
            # depths this step tells us about: all of them when the proposer drafted what it wanted; only those it
            # drafted when its budget (or the merged tree's) cut it short
            limited = s.proposed >= s.budget or s.drafted < s.proposed
            known = len(s.drafted_by_depth) if limited else cfg.max_depth
            for d in range(min(known, cfg.max_depth)):
                hit = 1.0 if s.accepted > d else 0.0
                self.reach[j][d] = a * self.reach[j][d] + (1 - a) * hit
            for d, n in enumerate(s.drafted_by_depth[: cfg.max_depth]):
                if n:
                    self.width[j][d] = a * self.width[j][d] + (1 - a) * n


@hookimpl
def specframe_register_routers(register) -> None:
    register(AdaptiveRouter)
