"""``adaptive`` router: each step, which combined proposers run and with how many nodes, chosen to maximise the
expected committed tokens per unit of step cost.

The parts, each its own module:

- :mod:`.config`: the settings (``router:`` in the config) and the configured cost curve;
- :mod:`.stats`: one proposer's live statistics (``reach``, ``cont``, ``width``: moving averages reset per request)
  and its counters, one :class:`~.stats.ProposerStats` per proposer;
- :mod:`.cost`: a step's cost in one-token target forwards (the curve ``v(n)``, a shared forward's share) and the
  clocks that turn measured seconds into forwards;
- :mod:`.ascent`: the choice itself, a pure greedy ascent of ``E / C`` over plain lists;
- :mod:`.probes`: how a proposer left out gets measured again; :mod:`.ledger`: which proposer does not pay;
- :mod:`.memory`: the costs and verdicts one request leaves to the next of the same lineup.

A step: :meth:`AdaptiveRouter.route` gives every free proposer (draft cost at most ``free_cost``) the full budget and
weighs the costly ones by the ascent (an upper bound without the free ones; 0 = skip); after each proposer drafts,
:meth:`AdaptiveRouter.revise` runs the ascent again with the drafts so far known (a cascade): a drafted proposer's
options are the prefixes of its actual draft valued with its continuation rates, its draft cost spent; the others
get their budgets again, and every draft is trimmed to its chosen prefix unless keeping it whole costs at most
``keep_tolerance`` of the best ``E / C``. :meth:`AdaptiveRouter.on_step` learns from the step's report.

The router serves a lone proposer too when the target carries a measured cost curve (a target loaded with a
machine profile) or the router is set explicitly (``router: none`` turns it off): its draft is trimmed to what pays.

Against plain decoding's best settings: where the machine profile ran speculation on other settings than plain
decoding's (:meth:`specframe.target.profile.MachineProfile.choose`: only where they win at its reference
acceptance), the target's curve carries plain decoding's best T(1) (``CostCurve.plain_t1_ms``) and
:attr:`AdaptiveRouter.vs_plain` compares each request with it: committed tokens per one-token forward (measured
when timed) times :meth:`.cost.StepCost.plain`. A request at least ``PLAIN_STEPS`` steps long that ran below
``PLAIN_FLOOR`` of it is said once per lineup (a warning). It decides nothing: the steps cannot run on plain
decoding's settings, so verifying nothing is still judged against these settings' own one-token forward.
"""

from __future__ import annotations

import logging
import random
from typing import Sequence

from specframe import (
    DraftTree,
    ProposerStep,
    RouterBase,
    StepReport,
    TargetInfo,
    hookimpl,
)
from specframe.services import CostCurve, node_depths

from . import ascent, ledger, probes
from .config import AdaptiveConfig, load_cost_curve
from .cost import Clock, StepCost
from .memory import LineupKey, LineupMemory, recall
from .stats import ProposerStats

log = logging.getLogger("specframe")

PLAIN_STEPS = 32  # steps of a request before it is compared with plain decoding's best settings (vs_plain)
NOISE_FLOOR = 0.03  # T(1) differences below this share are the machine profile's noise (profile.NOISE_FLOOR)
PLAIN_FLOOR = 0.98  # below this share of plain decoding's best speed, a request says so (once per lineup)
CALIBRATE_STEP = 1  # a timed request alone verifies nothing at this step when its lineup has no one-token time yet


class AdaptiveRouter(RouterBase):
    """Runs the proposers, and gives them the node budgets, that maximise expected tokens per unit cost; after each
    proposer drafts, decides again on the rest knowing its draft (a cascade) and trims what is not worth verifying."""

    name = "adaptive"
    Config = AdaptiveConfig

    def __init__(self, config: AdaptiveConfig, target: TargetInfo | None = None) -> None:
        super().__init__(config, target)
        self.config: AdaptiveConfig = config
        self.cost = StepCost(load_cost_curve(config), CostCurve.linear(config.cost_slope), target)
        self.warned_labels = False  # draft_cost labels matching no proposer: said once per router
        self.proposers: tuple[str, ...] = ()
        self.stats: list[ProposerStats] = []  # per proposer, engine order
        self.clock = Clock()
        self.memory = LineupMemory()  # this lineup's costs across requests (see start)
        self.forced: set[int] = set()  # probed / explored this step: run with a probe's budget, kept whole
        self.rng = random.Random(0)
        self.steps, self.committed, self.spent = 0, 0, 0.0  # this request: steps, tokens, one-token forwards

    # --- per request ---------------------------------------------------------------------------------------
    def start(self, proposers: Sequence[str], seed: int, greedy: bool = True) -> None:
        super().start(proposers, seed, greedy)
        cfg = self.config
        self.cost.greedy = greedy
        self.clock = Clock(timed=cfg.measure == "always" or (cfg.measure == "auto" and greedy))
        unknown = sorted(set(cfg.draft_cost) - set(proposers))
        if unknown and not self.warned_labels:
            self.warned_labels = True
            log.warning("router adaptive: draft_cost names %s, not among the proposers %s; those costs are ignored",
                        unknown, list(proposers))
        self.stats = [ProposerStats.fresh(cfg, float(cfg.draft_cost.get(label, 0.0))) for label in proposers]
        self.cost.points = {}  # (a timed request starts from its lineup's: _resume)
        self.rng = random.Random(seed)
        self.forced = set()
        self.steps, self.committed, self.spent = 0, 0, 0.0
        key = None if self.target is None else LineupKey.of(self.target, cfg.model_dump_json(), tuple(proposers))
        self.memory = recall(key)  # (no target: nothing shared)
        if self.clock.timed:
            self._resume()

    def _resume(self) -> None:
        """Start from the costs and verdicts an earlier request of this lineup measured (:mod:`.memory`)."""
        cfg, mem, clock = self.config, self.memory, self.clock
        clock.t1, clock.t1_plain = mem.t1, mem.t1_plain
        self.cost.points = dict(mem.points)
        for label, st in zip(self.proposers, self.stats):
            known = mem.labels.get(label)
            if known is None:
                continue
            if known.draft_s is not None:
                st.draft_s, st.measured = known.draft_s, True
                if known.forward is not None:
                    st.fwd_cost, st.fwd_known = known.forward, True
                st.wait = probes.cost_wait(st, clock.draft_cost(st), cfg.probe_every, cfg)
            if known.losing:
                ledger.carry_over(st, clock.draft_cost(st) > cfg.free_cost, cfg)

    def on_batch(self, rows: int, width: int) -> None:
        """The next step's forward is shared: ``rows`` requests (this one included), the others' rows ``width``
        tokens wide. Greedy requests plan with it (:meth:`.cost.StepCost.verify`); a sampled one counts alone."""
        self.cost.share(rows, width)

    def probe_nodes(self, budget: int) -> int:
        """A probe's node budget this step (:meth:`.cost.StepCost.probe_nodes` with ``probe_cost``)."""
        return self.cost.probe_nodes(budget, self.config.probe_cost)

    def draft_cost(self, j: int) -> float:
        """Proposer ``j``'s draft cost per step, one-token forwards (:meth:`.cost.Clock.draft_cost`)."""
        return self.clock.draft_cost(self.stats[j])

    # --- decision ------------------------------------------------------------------------------------------
    def route(self, budget: int, max_nodes: int, available: Sequence[bool]) -> list[int]:
        cfg, stats = self.config, self.stats
        if self.calibrates():
            self.forced = set()
            return [0] * len(available)
        free = [ok and self.draft_cost(j) <= cfg.free_cost for j, ok in enumerate(available)]
        # the costly proposers are weighed without the free ones, whose drafts revise() will weigh once known
        _, nodes = self.allocate(budget, max_nodes, [ok and not f for ok, f in zip(available, free)])
        self.forced = set()
        for j, f in enumerate(free):
            if f:
                nodes[j] = budget  # drafting is (nearly) free: draft fully, keep what pays (revise)
        costly = [j for j, ok in enumerate(available) if ok and not free[j]]  # the ones a step may leave out
        self.forced.update(j for j in costly if probes.due(stats[j]))
        self.forced.update(j for j, ok in enumerate(available) if ok and probes.stale(stats[j]))
        if costly and cfg.explore > 0 and self.rng.random() < cfg.explore:
            j = costly[self.rng.randrange(len(costly))]
            if stats[j].wait <= cfg.probe_every:  # one whose probes did not pay is left to its rarer probes
                self.forced.add(j)
        for j, ok in enumerate(available):  # a proposer whose drafts have not paid: out, but for its probes
            if ok and ledger.losing(stats[j]) and j not in self.forced:
                if probes.due(stats[j]):
                    self.forced.add(j)
                else:
                    nodes[j] = 0
        probe = self.probe_nodes(budget)
        for j in self.forced:  # a free one drafts fully: what of it a probe keeps is decided in revise()
            nodes[j] = budget if free[j] else probe
        if self.clock.timed:  # a proposer not measured yet: its first draft is as small as a probe's
            for j, ok in enumerate(available):
                if ok and not stats[j].measured and nodes[j] > probe:
                    nodes[j] = probe
        return nodes

    def calibrates(self) -> bool:
        """This step verifies nothing to time a one-token forward: a timed request, alone, at step
        :data:`CALIBRATE_STEP` (the first step's forward can carry first-call costs), while no step of this lineup
        has verified nothing. Until then a step's measured time is read through the cost curve, so a curve flatter
        than the machine (a profile measured elsewhere or under other load; issue 67: a 2-core Xeon's v(8) ~ 1.2 on
        an AVX2 EPYC where v(8) ~ 3.1) would price every draft node too low and hide the excess: with the one-token
        time known, what a forward costs beyond the curve is charged to the nodes' proposers
        (:meth:`.cost.Clock.added`) and the curve is re-priced by the measured forwards (:meth:`.cost.StepCost.learn`),
        so the ascent trims what does not pay there. One step per lineup (:mod:`.memory` keeps the time and the
        correction for the next request)."""
        return (self.clock.timed and self.cost.alone and not self.clock.t1_plain and self.steps == CALIBRATE_STEP)

    def revise(self, budget: int, max_nodes: int, available: Sequence[bool],
               drafts: Sequence[DraftTree | None], budgets: Sequence[int]) -> list[int]:
        """Decide again given the drafts made so far: budgets of the proposers still to run (0 = skip), and how much of
        each draft to keep (the prefix that maximises E / C)."""
        _, nodes = self.allocate(budget, max_nodes, available, drafts)
        probe = self.probe_nodes(budget)
        for j in range(len(nodes)):
            if drafts[j] is None and budgets[j] == 0:
                nodes[j] = 0  # a proposer the step's route left out stays out
            elif j in self.forced:  # a probe keeps what it may add to the forward (probe_cost)
                nodes[j] = probe if drafts[j] is None else min(drafts[j].num_nodes, probe)
            elif drafts[j] is None and self.draft_cost(j) <= self.config.free_cost:
                nodes[j] = budget  # free to draft: it drafts; what of it is kept is decided once it is known
        return nodes

    def allocate(self, budget: int, max_nodes: int, available: Sequence[bool],
                 drafts: Sequence[DraftTree | None] | None = None) -> tuple[list[int], list[int]]:
        """``(depth per proposer, node budget per proposer)`` by :func:`.ascent.allocate`.

        With ``drafts`` (see :meth:`revise`), a proposer that drafted is judged by its actual draft — its depths
        and node counts, its ``hit`` as its reach, its draft cost already spent — and its number is the nodes to keep.
        """
        dmax = min(self.config.max_depth, max(budget, 0))
        options: list[ascent.Option] = []
        fixed = 0.0  # draft cost already spent this step (drafted proposers), in one-token forwards
        drafted = [False] * len(available)
        for j, ok in enumerate(available):
            draft = None if drafts is None else drafts[j]
            st = self.stats[j]
            if draft is not None:
                drafted[j] = True
                if draft.num_nodes:
                    fixed += self.draft_cost(j)
                depths = node_depths(draft.parent[0].tolist()) if draft.num_nodes else []
                options.append(ascent.Option(ascent.prefix_levels(depths, dmax), ascent.hit(st.cont), 0.0))
            elif not ok:
                options.append(ascent.Option([], [], 0.0))
            else:
                options.append(ascent.Option(ascent.levels_of(st.width, dmax), st.reach, self.draft_cost(j)))
        tolerance = self.config.keep_tolerance if drafts is not None else 0.0
        return ascent.allocate(options, drafted, budget, max_nodes, dmax, fixed, self.cost.verify, tolerance)

    # --- feedback ------------------------------------------------------------------------------------------
    def on_step(self, report: StepReport) -> None:
        cfg, clock, mem = self.config, self.clock, self.memory
        a = cfg.decay
        if clock.observe(report, self.cost, a):
            mem.t1, mem.t1_plain = clock.t1, clock.t1_plain
        if clock.timed and clock.t1_plain and clock.t1 and self.cost.alone and report.verified and report.forward_s > 0:
            self.cost.learn(report.verified + 1, report.forward_s / clock.t1, a)  # re-price the curve (.cost)
            mem.points = dict(self.cost.points)
        self._tally(report)
        labels = self.proposers
        for j, s in enumerate(report.proposers):
            if s.asked and s.drafted and not s.fault:
                st = self.stats[j]
                added = clock.added(report, s, self.cost)
                st.fwd_cost = a * st.fwd_cost + (1 - a) * added if st.fwd_known else added
                st.fwd_known = True
                if j < len(labels):
                    mem.label(labels[j]).forward = st.fwd_cost
                ledger.record(st, s.accepted - added - self.draft_cost(j), a)
                verdict = ledger.verdict(st)
                if clock.timed and j < len(labels) and verdict is not None:
                    mem.label(labels[j]).losing = verdict  # for the next request
        for j, s in enumerate(report.proposers):
            self._learn(j, s)
        for j in self.forced:  # (after the timings: a first probe is judged with its own cost)
            self._probed(j, report)

    @property
    def vs_plain(self) -> float | None:
        """This request's speed so far over plain decoding's best settings' (1.0: as fast): the tokens it committed
        per one-token forward of the settings it runs on (steps' forwards and drafts, measured when timed and
        alone, else by the cost curve and draft costs) times :meth:`.cost.StepCost.plain`. None before a step."""
        return self.committed / self.spent * self.cost.plain() if self.spent > 0 else None

    def _tally(self, report: StepReport) -> None:
        """Count a step into :attr:`vs_plain`, and say once per lineup when a request runs below ``PLAIN_FLOOR`` of
        plain decoding's best settings."""
        clock, asked = self.clock, [(j, s) for j, s in enumerate(report.proposers) if s.asked]
        if clock.timed and clock.t1 and report.forward_s > 0 and self.cost.alone:
            spent = (report.forward_s + sum(s.draft_s + s.feedback_s for _, s in asked)) / clock.t1
        else:
            spent = self.cost.verify(report.verified + 1) + sum(self.draft_cost(j) for j, _ in asked
                                                                 if j < len(self.stats))
        self.steps += 1
        self.committed += report.accepted + 1
        self.spent += spent
        plain = self.cost.plain()
        # (plain decoding's best within the profile's noise floor of these settings' T(1): the same settings, or as
        # good as them; nothing to say)
        if self.steps < PLAIN_STEPS or plain >= 1.0 - NOISE_FLOOR or self.memory.below_plain:
            return
        vs = self.vs_plain
        if vs is not None and vs < PLAIN_FLOOR:
            self.memory.below_plain = True
            measured = self.target.cost if self.target is not None else None
            log.warning("router adaptive: %s committed %.2f tokens per one-token forward over %d steps, %.2fx the "
                        "speed of plain decoding's best settings (T(1) %.1f ms against %.1f ms on the settings it "
                        "runs on): the machine profile chose these settings for speculation, and at this "
                        "acceptance they do not pay; `specframe tune` shows both choices",
                        "+".join(self.proposers) or "this lineup", self.committed / self.spent, self.steps, vs,
                        measured.plain_t1_ms if measured else 0.0, measured.t1_ms() if measured else 0.0)

    def _learn(self, j: int, s: ProposerStep) -> None:
        """Proposer ``j``'s counters, draft time and depth statistics from its part ``s`` of a step."""
        st, cfg = self.stats[j], self.config
        st.idle = 0 if s.asked else st.idle + 1
        if s.asked and s.proposed:  # trimmed: its deeper nodes' statistics are not refreshed this step
            # (a probe counts as the refresh: it keeps what probe_cost allows, all of it on a flat curve)
            st.starved = st.starved + 1 if s.drafted < s.proposed and j not in self.forced else 0
        if not s.asked or s.fault:
            return
        if self.clock.timed:
            st.measured = True
            spent = s.draft_s + s.feedback_s  # its propose call and its feedback work
            st.draft_s = cfg.decay * st.draft_s + (1 - cfg.decay) * spent if st.draft_s else spent
            if j < len(self.proposers):
                self.memory.label(self.proposers[j]).draft_s = st.draft_s
        st.learn_depths(s, cfg.decay, cfg.max_depth)

    def _probed(self, j: int, report: StepReport) -> None:
        """After a probe of ``j``: did its accepted tokens pay for its draft and the nodes it added to the forward
        (:func:`.probes.judge`)?"""
        if j >= len(report.proposers):
            return
        s = report.proposers[j]
        if not s.asked or s.fault:
            return
        cost = self.clock.added(report, s, self.cost) + self.draft_cost(j)
        probes.judge(self.stats[j], s.accepted >= cost, self.draft_cost(j), self.config)


@hookimpl
def specframe_register_routers(register) -> None:
    register(AdaptiveRouter)
