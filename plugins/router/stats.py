"""What the router knows about one proposer during a request: its live statistics (exponential moving averages,
decay ``decay``, reset per request) and the counters of its probes and its ledger.

Per proposer (depth ``d`` counts from 1; the lists are ``max_depth`` long, depth ``d`` at index ``d - 1``):

- ``reach[d]``: probability that, when asked to draft at least ``d`` deep, its nodes on the accepted path reach
  depth ``d`` (``accepted >= d`` with the attribution's crediting rule). This folds in how often it has a draft at
  all (an n-gram lookup that finds no match reaches depth 0). Starts at ``prior ** d``.
- ``cont[d]``: the chance that depth ``d`` is accepted once the path got to depth ``d - 1`` (its continuation
  rate), learned only from steps that got there, so the worth of a long match survives a run of misses. Starts at
  ``prior``. Their running products are ``hit`` (:func:`.ascent.hit`).
- ``width[d]``: nodes it drafts at depth ``d`` when it drafts there (1 for chains; medusa's trees are wider).

Its costs (in one-token target forwards, see :mod:`.cost`), its probes (:mod:`.probes`) and its ledger
(:mod:`.ledger`) keep their numbers here too.
"""

from __future__ import annotations

from dataclasses import dataclass

from specframe import ProposerStep

from .config import AdaptiveConfig


@dataclass(slots=True)
class ProposerStats:
    """One proposer's statistics and counters for the request the router serves (one per proposer, engine order)."""

    reach: list[float]  # [max_depth] reach[i]: P(its nodes on the accepted path reach depth i + 1)
    cont: list[float]  # [max_depth] cont[i]: P(depth i + 1 accepted | the path reached depth i, it drafted there)
    width: list[float]  # [max_depth] width[i]: nodes it drafts at depth i + 1 when it drafts there
    configured_cost: float  # draft cost per step from the config's draft_cost, one-token forwards (0 when not given)
    wait: int  # steps left out (or trimmed) in a row before its next probe
    judge_after: int  # verified steps before the ledger may leave it out
    draft_s: float = 0.0  # seconds per drafted step: its propose call and its feedback work (EMA; 0 = never measured)
    measured: bool = False  # its draft time has been measured (timed routers)
    fwd_cost: float = 0.0  # what its nodes added to the forward when it drafted, one-token forwards (EMA)
    fwd_known: bool = False  # fwd_cost has been measured (in this request or an earlier one)
    idle: int = 0  # steps left out in a row
    starved: int = 0  # steps in a row whose draft was trimmed (its deeper statistics went stale)
    net: float = 0.0  # moving average of the realised net gain per verified step (tokens - forwards added)
    net_steps: int = 0  # verified steps behind ``net``
    probation: bool = False  # left out but for probes until one pays (a verdict carried over)

    @classmethod
    def fresh(cls, config: AdaptiveConfig, configured_cost: float) -> "ProposerStats":
        """A request's start: the priors (``reach = prior ** d``, ``cont = prior``, ``width = 1``), a first probe
        after ``probe_every`` steps, the ledger's verdict after ``ledger_steps`` verified steps."""
        depths = config.max_depth
        return cls(reach=[config.prior ** d for d in range(1, depths + 1)], cont=[config.prior] * depths,
                   width=[1.0] * depths, configured_cost=configured_cost, wait=config.probe_every,
                   judge_after=config.ledger_steps)

    def learn_depths(self, s: ProposerStep, decay: float, max_depth: int) -> None:
        """Update ``reach``, ``width`` and ``cont`` from its part ``s`` in a step it was asked in (no fault).

        The depths the step tells about: all of them when it drafted what it wanted; only those it drafted when its
        budget (or the router, or the merged tree's) cut it short."""
        a = decay
        limited = s.proposed >= s.budget or s.drafted < s.proposed
        known = len(s.drafted_by_depth) if limited else max_depth
        for d in range(min(known, max_depth)):
            hit = 1.0 if s.accepted > d else 0.0
            self.reach[d] = a * self.reach[d] + (1 - a) * hit
        for d, n in enumerate(s.drafted_by_depth[:max_depth]):
            if n:
                self.width[d] = a * self.width[d] + (1 - a) * n
                if s.accepted >= d:  # the path reached depth d: depth d + 1 was put to the test
                    self.cont[d] = a * self.cont[d] + (1 - a) * (1.0 if s.accepted > d else 0.0)


def column(router, name: str) -> list:
    """``[stats.<name> for each proposer]`` of a router with ``stats`` (a view for tests and reports)."""
    return [getattr(st, name) for st in router.stats]
