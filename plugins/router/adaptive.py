"""``adaptive`` router: each step, which combined proposers run and with how many nodes, chosen to maximise the
expected committed tokens per unit of step cost.

Live statistics per proposer ``j`` (exponential moving averages, decay ``decay``, reset per request):

- ``reach[j][d]``: probability that, when asked to draft at least ``d`` deep, its nodes on the accepted path
  reach depth ``d`` (``accepted >= d`` with the attribution's crediting rule). This folds in how often it has a
  draft at all (an n-gram lookup that finds no match reaches depth 0). Starts at ``prior ** d``.
- ``width[j][d]``: nodes it drafts at depth ``d`` when it drafts there (1 for chains; medusa's trees are wider).
- ``cost[j]``: its draft cost per step in one-token target forwards: ``draft_cost[label]`` from the config (0
  when not given), or, when timings are used, its measured seconds per step it drafts (its propose call and its
  ``on_verified`` feedback work) / ``t1``, the seconds of a one-token target forward (measured on the steps that
  verify nothing; until there is one, each step's forward time / v(verified + 1)). What its nodes add to the
  forward is ``v(1 + all nodes) - v(1 + the others' nodes)``, plus, when timed, its share by nodes of the
  forward's measured excess over the curve (``forward_s / t1 - v(1 + verified)``): a tree's attention mask or a
  profile taken under other conditions can make a wide verification dearer than the curve says.

Timings (``measure``): wall-clock times differ from run to run, and under sampling the routing decides which
proposers draw from the request's generator — so with timings a seed would no longer reproduce the same tokens
(the distribution stays exact). ``auto`` (the default) measures under greedy decoding only, where routing cannot
change the output; under sampling the configured ``draft_cost`` is used. ``always`` / ``never`` force it.

The cost curve ``v(n)`` (target forward time for ``n`` tokens over the time for one) comes from ``cost_curve``
(a list v(1), v(2), ...), or ``cost_profile`` (a ``specframe bench --profile`` results.json; its
``profile.v``), or else this machine's measured profile for the target as it runs (``TargetInfo.cost``, see
:mod:`specframe.target.profile`; it follows thread changes under load), or else the linear default
``1 + cost_slope * (n - 1)``. Under sampling no measured curve is read (only ``cost_curve`` / ``cost_profile``, else
the linear default): a measurement depends on the load it met and the thread governor follows the load, so a seed
gives the same tokens whatever the load, and on any machine. With a steep curve (no native bf16) drafts are trimmed hard, and where no prefix of
any draft raises ``E / C`` above plain decoding's ``1 / v(1)`` nothing is verified: speculation switches itself
off, and the probes below switch it back on when drafts start to pay again.

The router serves a lone proposer too when the target carries a measured cost curve (a target loaded with a
machine profile) or the router is set explicitly (``router: none`` turns it off): its draft is trimmed to what
pays.

Choice (greedy ascent, deterministic): with depths ``L_j`` (0 = skip), the expected committed tokens are
``E = 1 + sum_d [1 - prod_j (1 - reach[j][d] * [d <= L_j])]`` (the bonus token, plus depth ``d`` reached by any
proposer, treating proposers as independent — optimistic for correlated ones) and the cost in one-token forwards
is ``C = v(1 + sum_j nodes_j(L_j)) + sum_{j: L_j > 0} cost[j]`` with ``nodes_j(L) = ceil(sum_{d<=L}
width[j][d])``. Starting from nobody, it repeatedly deepens the one proposer (to any deeper level) that most
raises ``E / C``, while that ratio rises and the node budgets hold (each proposer's nodes <= the step's budget,
all together <= the merged tree's ``max_nodes``). A proposer's node budget is ``nodes_j(L_j)``.

Cascade (``revise``, after each proposer drafts, in the configured order): a proposer whose draft cost is at
most ``free_cost`` drafts with the full budget, and ``route`` weighs the costly ones without the free ones (an upper
bound: 0 means not worth running even alone); then the same ascent runs with the drafts made so far known — a
drafted proposer's options are the prefixes of its actual draft (``nodes(L)`` = shortest prefix holding its nodes
of depth <= L) valued with ``hit[j][d]``, the probability its nodes reach depth ``d`` on the accepted path given
its kept draft reaches depth ``d`` — the product of per-depth continuation rates ``cont[j][d]`` (the chance that
depth ``d + 1`` is accepted once the path got to depth ``d``, learned only from steps that got there, so the worth
of a long match survives a run of misses) — and its draft cost counts as spent. Proposers still to run get their
budgets again (0 = skip: the cheap draft already looks good enough), and every draft is trimmed to its chosen
prefix, unless keeping it whole costs at most ``keep_tolerance`` (3 %) of the best E / C: on a flat cost curve
extra nodes are nearly free and a trim must clearly pay.

Exploration, so a skipped proposer's statistics do not freeze: one left out (or whose draft was trimmed) for
``wait[j]`` steps in a row (``probe_every`` at first) is run once with a probe's budget and its draft kept whole,
and with probability ``explore`` per step one costly proposer (drawn from the router's own ``random.Random`` seeded
with the request's seed: deterministic, no global RNG, and the request's generator is untouched) is run too, unless
its last probe did not pay (its wait is above ``probe_every``): that one is left to its probes. A probe's budget is
the most nodes that add at most ``probe_cost`` one-token forwards to the step's forward (``v(1 + n) - v(1)``): the
full budget on a flat cost curve, a node or two on a steep one, where a whole draft of a proposer that is not worth
running costs several forwards; a timed proposer's first draft, before its cost is measured, gets the same budget. A
probe costs its draft and the nodes it adds to the forward; one whose accepted tokens do not pay for that multiplies
the proposer's wait by ``probe_backoff`` (up to ``probe_max``), and at least to its cost per drafted step (its draft
cost and what its nodes added to the forward, measured) / ``probe_share`` steps, and one that pays resets it: a
proposer that does not pay is left out for the rest of the request but for probes that grow rarer and cheaper, so
what probing costs stays a small fraction (``probe_share``) of the run.

Costs outlive a request: the draft seconds and the forward cost measured per proposer label and the one-token
forward time carry over to the next request of the same lineup (target, router settings, proposer labels) in the
process, whichever router instance serves it (acceptance statistics start afresh), so a proposer an earlier request
found costly is not drafted unmeasured again, and its first probe waits its cost per drafted step / ``probe_share`` steps.

Ledger: the estimates above lag (moving averages of depths), and on a steep curve each kept node that is rejected
costs most of a forward. So each proposer also keeps its realised net gain per verified step, ``accepted - what its
nodes added to the forward (as above, measured when timed) - draft cost`` (tokens minus the forwards it added); once
the moving average is below 0 over at least ``ledger_steps`` verified steps, it is left out of every step, free ones
too, but for probes after ``wait[j]`` steps (whose outcomes update the ledger and the wait as above). With timings the
verdict carries over as the costs do: a proposer that the previous request of the lineup ended leaving out is judged
after ``ledger_steps_known`` (4) verified steps of the new request instead of ``ledger_steps`` — on that request's
own gains, so one that pays on the new prompt stays in — which halves what a proposer that does not pay on any of a
run's prompts costs each request before the ledger leaves it out. A costly one (draft cost above ``free_cost``) so
carried over starts on ``probation``: out but for probes, the first at the request's first step, until a probe pays
for itself; then the ledger judges it afresh. So a drafter that pays on no prompt of a run (a weak draft model) costs
a request a probe or two, and one that pays on this prompt is back after its first paying probe.
"""

from __future__ import annotations

import json
import logging
import math
import random
from pathlib import Path
from typing import Literal, Optional, Sequence

from pydantic import Field, field_validator

from specframe import (
    ConfigError,
    CostCurve,
    DraftTree,
    ProposerStep,
    RouterBase,
    RouterConfig,
    StepReport,
    TargetInfo,
    hookimpl,
    node_depths,
)

log = logging.getLogger("specframe")


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
    free_cost: float = Field(
        0.05, ge=0.0, description="A proposer whose draft costs at most this (one-token forwards) drafts with the full "
        "budget every step; what of its draft is kept is decided once it is known.",
    )
    probe_every: int = Field(16, ge=1, description="Run a proposer left out this many steps in a row once, fully.")
    probe_backoff: float = Field(
        2.0, ge=1.0, description="After a probe (or exploration) that did not pay for itself, the wait before the next "
        "one grows by this factor, up to probe_max; a probe that pays brings it back to probe_every (1 = fixed).")
    probe_max: int = Field(512, ge=1, description="The longest wait between probes of one proposer, in steps.")
    probe_share: float = Field(
        0.02, gt=0.0, le=1.0, description="Most of a run's time the probes of one proposer that does not pay may cost: "
        "its wait after such a probe is at least its draft cost (one-token forwards) / probe_share steps, and so is "
        "the first wait of a request for a proposer whose cost an earlier request measured.")
    probe_cost: float = Field(
        0.5, gt=0.0, description="Most a probe (or a proposer's first, unmeasured draft) may add to its step's "
        "forward, in one-token forwards: it drafts at most the largest n nodes with v(1 + n) - v(1) <= this (on a "
        "flat cost curve the whole budget, on a steep one a node or two).")
    ledger_steps: int = Field(
        8, ge=0, description="Leave a proposer out for the rest of the request (but for probes) once, over at least "
        "this many verified steps, its accepted tokens fell short of what its nodes and draft cost (a moving average "
        "of the net gain per step below 0); 0 = never.")
    ledger_steps_known: int = Field(
        4, ge=0, description="With timings: the ledger's verdict on a proposer that the previous request of this lineup "
        "ended leaving out (its net gain below 0) needs only this many verified steps of the new request (its own "
        "gains: a proposer that pays here is kept); 0 = as ledger_steps.")
    probation: bool = Field(
        True, description="With timings: a costly proposer (draft cost above free_cost) that the previous request of "
        "this lineup ended leaving out starts the next one left out but for probes, the first at its first step, "
        "until a probe pays for itself (then the ledger judges it afresh).")
    keep_tolerance: float = Field(
        0.03, ge=0.0, lt=1.0, description="Keep a draft whole when that lowers the expected tokens per cost by at most "
        "this fraction (the nodes a trim saves must pay clearly; 0 = trim to the exact optimum).")
    explore: float = Field(0.05, ge=0.0, le=1.0, description="Chance per step to also run one left-out proposer.")

    @field_validator("cost_profile")
    @classmethod
    def _profile_readable(cls, v: Optional[str]) -> Optional[str]:
        if v:
            read_profile(Path(v).expanduser())  # a missing or malformed profile fails with the config, not mid-request
        return v

    @field_validator("cost_curve")
    @classmethod
    def _positive(cls, v: Optional[list[float]]) -> Optional[list[float]]:
        if v is not None and any(not x > 0 for x in v):
            raise ValueError("cost_curve values must be > 0 (v(n) = T(n) / T(1))")
        return v


def read_profile(path: Path) -> list[float]:
    """``profile.v`` of a ``specframe bench --profile`` results.json.

    Raises:
        ConfigError: the file is missing or unreadable, has no ``profile.v``, or a value there is not > 0.
    """
    fix = "run `specframe bench --profile` to write one, or give cost_curve"
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; {fix}")
    try:
        doc = json.loads(path.read_text())
        curve = [float(x) for x in (doc.get("profile") or {})["v"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path} has no profile.v ({type(exc).__name__}); {fix}") from None
    if not curve or any(not x > 0 for x in curve):
        raise ConfigError(f"{path}: profile.v must be a non-empty list of times > 0; {fix}")
    return curve


def load_cost_curve(config: AdaptiveConfig) -> CostCurve | None:
    """The router's own curve v(n), from ``cost_curve`` or ``cost_profile`` (normalised to v(1) = 1); None when
    neither is set (then the target's measured curve, else the linear default).

    Raises:
        ConfigError: as :func:`read_profile`.
    """
    curve = config.cost_curve
    if curve is None and config.cost_profile:
        try:
            curve = read_profile(Path(config.cost_profile).expanduser())
        except ConfigError as exc:
            raise ConfigError(f"router adaptive: cost_profile {exc}") from None
    return CostCurve.from_v(curve) if curve else None


_KNOWN_COSTS: dict[tuple, dict[str, float]] = {}  # (target, router settings, lineup) -> label -> draft seconds


class AdaptiveRouter(RouterBase):
    """Runs the proposers, and gives them the node budgets, that maximise expected tokens per unit cost; after each
    proposer drafts, decides again on the rest knowing its draft (a cascade) and trims what is not worth verifying."""

    name = "adaptive"
    Config = AdaptiveConfig

    def __init__(self, config: AdaptiveConfig, target: TargetInfo | None = None) -> None:
        super().__init__(config, target)
        self.curve = load_cost_curve(config)
        self.linear = CostCurve.linear(config.cost_slope)
        self.warned_labels = False  # draft_cost labels matching no proposer: said once per router
        self.known: dict[str, float] = {}  # this lineup's measured costs (see start)

    def _v(self, n: float) -> float:
        """v(n) of one forward over ``n`` tokens: its configured curve, else the target's measured one, else the linear
        guess ``cost_slope`` (all :class:`specframe.CostCurve`)."""
        # under sampling, no timing may steer a decision: which drafts a step verifies decides how many random draws
        # it makes, so a curve measured on this machine (under whatever load the measurement met, then followed by
        # the thread governor) would give a seed other tokens elsewhere or later. The configured curve or the linear
        # default only.
        if not getattr(self, "greedy", True):
            return (self.curve or self.linear).v(n)
        return (self.curve or getattr(self.target, "cost", None) or self.linear).v(n)

    def verify_cost(self, n: float) -> float:
        """This request's cost of a step that verifies ``n`` of its tokens (its newest + drafts), in one-token
        forwards. Alone: v(n). In a batch of ``B`` rows whose other rows are ``w`` tokens wide (see :meth:`on_batch`;
        the forward pads every row to the widest, so it runs ``B * max(w, n)`` tokens): its equal share of the
        forward without its drafts, plus all that its drafts add, ``v(B w) / B + v(B max(w, n)) - v(B w)``. So a
        draft node costs what it adds to everyone's forward, weighed against the tokens the request gets per share:
        speculation shrinks as the batch grows and stops where the forward is compute-bound."""
        rows, width = getattr(self, "batch", (1, 1))
        if rows <= 1:
            return self._v(n)
        base = self._v(rows * width)
        return base / rows + self._v(rows * max(width, n)) - base

    def forward_cost(self, n: float) -> float:
        """v of the whole forward that verifies ``n`` tokens of this request (alone: v(n); in a batch:
        ``v(B max(w, n))``), in one-token forwards: what a measured forward time is divided by to read T(1)."""
        rows, width = getattr(self, "batch", (1, 1))
        return self._v(n) if rows <= 1 else self._v(rows * max(width, n))

    def on_batch(self, rows: int, width: int) -> None:
        """The next step's forward is shared: ``rows`` requests (this one included), the others' rows ``width``
        tokens wide (their newest token + draft at the last step). Greedy requests plan with it (:meth:`verify_cost`);
        under sampling a router decides from its seed and counts alone, so a seed gives the same tokens in any batch,
        and the batch is ignored."""
        self.batch = (max(1, int(rows)), max(1, int(width))) if getattr(self, "greedy", True) else (1, 1)

    def start(self, proposers: Sequence[str], seed: int, greedy: bool = True) -> None:
        super().start(proposers, seed, greedy)
        cfg, p = self.config, len(proposers)
        self.greedy = greedy
        self.timed = cfg.measure == "always" or (cfg.measure == "auto" and greedy)
        self.configured_cost = [float(cfg.draft_cost.get(label, 0.0)) for label in proposers]
        unknown = sorted(set(cfg.draft_cost) - set(proposers))
        if unknown and not self.warned_labels:
            self.warned_labels = True
            log.warning("router adaptive: draft_cost names %s, not among the proposers %s; those costs are ignored",
                        unknown, list(proposers))
        self.reach = [[cfg.prior ** d for d in range(1, cfg.max_depth + 1)] for _ in range(p)]
        self.cont = [[cfg.prior] * cfg.max_depth for _ in range(p)]  # P(depth d+1 accepted | depth d reached, kept)
        self.width = [[1.0] * cfg.max_depth for _ in range(p)]
        self.draft_s = [0.0] * p
        self.t1: float | None = None
        self.t1_plain = False  # t1 comes from one-token forwards (steps that verified nothing), not the curve
        self.fwd_cost = [0.0] * p  # what its nodes added to the forward when it drafted, one-token forwards (EMA)
        self.fwd_known = [False] * p  # fwd_cost has been measured (in this request or an earlier one)
        self.idle = [0] * p  # steps left out in a row
        self.starved = [0] * p  # steps in a row whose draft was trimmed (its deeper statistics went stale)
        self.rng = random.Random(seed)
        self.forced: set[int] = set()  # probed / explored this step: run with the full budget, kept whole
        self.wait = [cfg.probe_every] * p  # steps left out (or trimmed) in a row before the next probe
        self.net = [0.0] * p  # moving average of the realised net gain per verified step (tokens - forwards added)
        self.net_steps = [0] * p  # verified steps behind it
        self.measured = [False] * p  # its draft time has been measured (timed routers)
        self.judge_after = [cfg.ledger_steps] * p  # verified steps before the ledger may leave it out
        self.probation = [False] * p  # left out but for probes until one pays (a verdict carried over)
        # draft seconds per proposer label and the one-token forward time ("t1"), measured by earlier requests of
        # this lineup on this target: costs belong to the machine, not the request, so a later request starts from
        # them (acceptance statistics start afresh). Kept per process, not per router instance: the instance pool
        # may drop an idle router between requests.
        t = self.target  # (TargetInfo may be built anew per request: the model it describes is what stays)
        anchor = getattr(t, "model", None)
        key = (getattr(t, "name", ""), id(anchor if anchor is not None else t), cfg.model_dump_json(), tuple(proposers))
        self.known = {} if self.target is None else _KNOWN_COSTS.setdefault(key, {})  # (no target: nothing shared)
        if self.timed:
            self.t1 = self.known.get("\0t1")
            self.t1_plain = bool(self.known.get("\0t1 plain"))
            for j, label in enumerate(proposers):
                if label in self.known:
                    self.draft_s[j], self.measured[j] = self.known[label], True
                    if label + "\0forward" in self.known:
                        self.fwd_cost[j], self.fwd_known[j] = self.known[label + "\0forward"], True
                    self.wait[j] = self._cost_wait(j, cfg.probe_every)
                if not self.known.get(label + "\0losing"):
                    continue
                # the last request ended with it left out: the same verdict needs less of this one's evidence
                if cfg.ledger_steps_known:
                    self.judge_after[j] = min(cfg.ledger_steps, cfg.ledger_steps_known)
                if cfg.probation and self._draft_cost(j) > cfg.free_cost:
                    self.probation[j] = True  # costly, and it did not pay: it earns its way back by a probe
                    self.idle[j] = self.wait[j] - 1  # probed at the first step: a prompt that suits it finds out now

    # --- decision ------------------------------------------------------------------------------------------
    def route(self, budget: int, max_nodes: int, available: Sequence[bool]) -> list[int]:
        free = [ok and self._draft_cost(j) <= self.config.free_cost for j, ok in enumerate(available)]
        # the costly proposers are weighed without the free ones, whose drafts revise() will weigh once known
        _, nodes = self.allocate(budget, max_nodes, [ok and not f for ok, f in zip(available, free)])
        self.forced = set()
        for j, f in enumerate(free):
            if f:
                nodes[j] = budget  # drafting is (nearly) free: draft fully, keep what pays (revise)
        costly = [j for j, ok in enumerate(available) if ok and not free[j]]  # the ones a step may leave out
        for j in costly:
            if self.idle[j] + 1 >= self.wait[j]:
                self.forced.add(j)
        for j, ok in enumerate(available):  # a draft trimmed every step would never have its depths measured again
            if ok and self.starved[j] + 1 >= self.wait[j]:
                self.forced.add(j)
        if costly and self.config.explore > 0 and self.rng.random() < self.config.explore:
            j = costly[self.rng.randrange(len(costly))]
            if self.wait[j] <= self.config.probe_every:  # one whose probes did not pay is left to its rarer probes
                self.forced.add(j)
        for j, ok in enumerate(available):  # a proposer whose drafts have not paid: out, but for its probes
            if ok and self.losing(j) and j not in self.forced:
                if self.idle[j] + 1 >= self.wait[j]:
                    self.forced.add(j)
                else:
                    nodes[j] = 0
        probe = self.probe_nodes(budget)
        for j in self.forced:  # a free one drafts fully: what of it a probe keeps is decided in revise()
            nodes[j] = budget if free[j] else probe
        if self.timed:  # a proposer not measured yet: its first draft is as small as a probe's
            for j, ok in enumerate(available):
                if ok and not self.measured[j] and nodes[j] > probe:
                    nodes[j] = probe
        return nodes

    def probe_nodes(self, budget: int) -> int:
        """The node budget of a probe: the largest ``n <= budget`` whose nodes add at most ``probe_cost`` one-token
        forwards to the step's forward (``v(1 + n) - v(1)``), at least 1. A probe asks whether a proposer pays again;
        a whole draft verified where the cost curve is steep costs several forwards, a node or two answers it."""
        base, n = self.verify_cost(1), 1
        while n < budget and self.verify_cost(2 + n) - base <= self.config.probe_cost:
            n += 1
        return n

    def losing(self, j: int) -> bool:
        """Proposer ``j``'s realised net gain per verified step is below 0 (see the module docstring, Ledger)."""
        n = self.judge_after[j]
        return self.probation[j] or (n > 0 and self.net_steps[j] >= n and self.net[j] < 0)

    def revise(self, budget: int, max_nodes: int, available: Sequence[bool],
               drafts: Sequence[DraftTree | None], budgets: Sequence[int]) -> list[int]:
        """Decide again given the drafts made so far: budgets of the proposers still to run (0 = skip), and how much of
        each draft to keep (the prefix that maximises E / C)."""
        _, nodes = self.allocate(budget, max_nodes, available, drafts)
        for j in range(len(nodes)):
            if drafts[j] is None and budgets[j] == 0:
                nodes[j] = 0  # a proposer the step's route left out stays out
            elif j in self.forced:  # a probe keeps what it may add to the forward (probe_cost)
                nodes[j] = self.probe_nodes(budget) if drafts[j] is None else min(drafts[j].num_nodes,
                                                                                  self.probe_nodes(budget))
            elif drafts[j] is None and self._draft_cost(j) <= self.config.free_cost:
                nodes[j] = budget  # free to draft: it drafts; what of it is kept is decided once it is known
        return nodes

    def allocate(self, budget: int, max_nodes: int, available: Sequence[bool],
             drafts: Sequence[DraftTree | None] | None = None) -> tuple[list[int], list[int]]:
        """``(depth per proposer, node budget per proposer)`` by greedy ascent of E / C (module docstring).

        With ``drafts`` (see :meth:`revise`), a proposer that drafted is judged by its actual draft — its depths
        and node counts, ``hit`` as its reach, its draft cost already spent — and its number is the nodes to keep.
        """
        p, dmax = len(available), min(self.config.max_depth, max(budget, 0))
        hits = self.hit if drafts is not None else None
        options: list[tuple[list[int], list[float], float]] = []  # per proposer: nodes(L) for L=1.., reach, cost
        fixed = 0.0  # draft cost already spent this step (drafted proposers), in one-token forwards
        for j in range(p):
            draft = None if drafts is None else drafts[j]
            if draft is not None:
                if draft.num_nodes:
                    fixed += self._draft_cost(j)
                options.append(_prefix_levels(draft, dmax) + (hits[j], 0.0))
            elif not available[j]:
                options.append(([], [], 0.0))
            else:
                levels, cum = [], 0.0
                for d in range(dmax):
                    cum += self.width[j][d]
                    levels.append(math.ceil(cum - 1e-9))
                options.append((levels, self.reach[j], self._draft_cost(j)))
        depth, nodes = [0] * p, [0] * p
        total_nodes, extra_cost = 0, 0.0
        best_ratio = 1.0 / (self.verify_cost(1) + fixed)
        while True:
            best = None
            for j, (levels, reach, cost) in enumerate(options):
                if len(levels) <= depth[j]:
                    continue
                others = [1.0] * dmax  # chance no other chosen proposer reaches depth d + 1
                for i in range(p):
                    if i != j and depth[i]:
                        r_i = options[i][1]
                        for d in range(depth[i]):
                            others[d] *= 1.0 - r_i[d]
                e_rest = 1.0 + sum(1.0 - o for o in others)  # E without j
                add = extra_cost + (0.0 if depth[j] else cost)
                gain = 0.0
                for d in range(len(levels)):
                    gain += others[d] * reach[d]
                    if d + 1 <= depth[j]:
                        continue
                    n_j = levels[d]
                    n_all = total_nodes - nodes[j] + n_j
                    if ((drafts is None or drafts[j] is None) and n_j > budget) or n_all > max_nodes:
                        break
                    ratio = (e_rest + gain) / (self.verify_cost(1 + n_all) + fixed + add)
                    if ratio > best_ratio * (1 + 1e-9) and (best is None or ratio > best[0]):
                        best = (ratio, j, d + 1, n_j, add)
            if best is None:
                if drafts is not None and self.config.keep_tolerance > 0:
                    self._keep_whole(options, drafts, depth, nodes, fixed, max_nodes, best_ratio)
                return depth, nodes
            best_ratio, j, d, n_j, extra_cost = best
            total_nodes += n_j - nodes[j]
            depth[j], nodes[j] = d, n_j

    def _keep_whole(self, options: list, drafts: Sequence[DraftTree | None], depth: list[int], nodes: list[int],
                    fixed: float, max_nodes: int, best: float) -> None:
        """Keep each trimmed draft whole when that costs at most ``keep_tolerance`` of the best E / C: the
        statistics are noisy moving averages, and the tokens a trim throws away come in bursts (a long lookup match)
        that a short memory undervalues, while on a flat cost curve the nodes cost almost nothing. In place."""
        dmax = max((len(o[0]) for o in options), default=0)

        def ratio(dep: list[int], nod: list[int]) -> float:
            e = 1.0
            for d in range(dmax):
                miss = 1.0
                for i, (_, reach, _) in enumerate(options):
                    if d < dep[i]:
                        miss *= 1.0 - reach[d]
                e += 1.0 - miss
            extra = sum(options[i][2] for i in range(len(options)) if dep[i] and (drafts[i] is None))
            return e / (self.verify_cost(1 + sum(nod)) + fixed + extra)

        for j, draft in enumerate(drafts):
            if draft is None or not options[j][0] or nodes[j] >= options[j][0][-1]:
                continue
            dep, nod = list(depth), list(nodes)
            dep[j], nod[j] = len(options[j][0]), options[j][0][-1]
            if sum(nod) <= max_nodes and ratio(dep, nod) >= (1 - self.config.keep_tolerance) * best:
                depth[j], nodes[j] = dep[j], nod[j]

    @property
    def hit(self) -> list[list[float]]:
        """``hit[j][d]``: probability that ``j``'s nodes on the accepted path reach depth ``d + 1`` given its kept
        draft reaches that depth: the product of the per-depth continuation rates ``cont[j][0..d]``. Learning each
        depth's rate only when the path got there keeps what a long match is worth even after a run of misses
        (lookup drafts are all-or-nothing: bursts of long accepted copies between short misses)."""
        out = []
        for row in self.cont:
            acc, prods = 1.0, []
            for c in row:
                acc *= c
                prods.append(acc)
            out.append(prods)
        return out

    def _probed(self, j: int, report: StepReport) -> None:
        """After a probe of ``j``: did its accepted tokens pay for its draft and the nodes it added to the forward
        (in one-token forwards)? Yes: the next probe after ``probe_every`` steps; no: after ``probe_backoff`` times the
        last wait (at most ``probe_max``)."""
        if j >= len(report.proposers):
            return
        s, cfg = report.proposers[j], self.config
        if not s.asked or s.fault:
            return
        cost = self.added(report, s) + self._draft_cost(j)
        if s.accepted >= cost:
            self.wait[j] = cfg.probe_every
            if self.probation[j]:  # it paid on this request's prompt: the ledger judges it afresh
                self.probation[j], self.net_steps[j] = False, 0
        else:
            self.wait[j] = self._cost_wait(j, min(cfg.probe_max, max(cfg.probe_every,
                                                                      int(self.wait[j] * cfg.probe_backoff))))

    def _cost_wait(self, j: int, wait: int) -> int:
        """``wait``, raised so that one probe of ``j`` per wait costs at most ``probe_share`` of the steps' time: its
        draft cost and what its nodes added to the forward when it last drafted (one-token forwards)."""
        cfg = self.config
        return min(cfg.probe_max, max(wait, math.ceil((self._draft_cost(j) + self.fwd_cost[j]) / cfg.probe_share)))

    def added(self, report: StepReport, s: ProposerStep) -> float:
        """What proposer step ``s``'s nodes added to the step's target forward, in one-token forwards: the cost
        curve's ``v(1 + verified) - v(1 + verified - drafted)``, plus, when timed, its share (by nodes) of the
        forward's measured excess over the curve (``forward_s / t1 - v(1 + verified)``: a tree's attention mask, a
        long context, a profile taken under other conditions). Never below 0."""
        n = report.verified
        added = self.verify_cost(1 + n) - self.verify_cost(1 + max(n - s.drafted, 0))
        alone = getattr(self, "batch", (1, 1))[0] <= 1  # (in a batch the forward's excess is every row's)
        if alone and self.timed and self.t1_plain and self.t1 and n > 0 and report.forward_s > 0:
            added += (report.forward_s / self.t1 - self.verify_cost(1 + n)) * min(s.drafted, n) / n
        return max(0.0, added)

    def _draft_cost(self, j: int) -> float:
        if self.timed and self.t1 and self.draft_s[j]:
            return self.draft_s[j] / self.t1
        return self.configured_cost[j]

    # --- feedback ------------------------------------------------------------------------------------------
    def on_step(self, report: StepReport) -> None:
        a, cfg = self.config.decay, self.config
        if self.timed and report.forward_s > 0 and (report.verified == 0 or not self.t1_plain):
            # t1 from one-token forwards once there are any: read through the curve, a tree forward that costs
            # more than the curve says would raise t1 and hide that excess from what its proposer is charged
            t1 = report.forward_s / self.forward_cost(report.verified + 1)
            first_plain = report.verified == 0 and not self.t1_plain
            self.t1 = t1 if self.t1 is None or first_plain else a * self.t1 + (1 - a) * t1
            self.t1_plain = self.t1_plain or report.verified == 0
            self.known["\0t1"], self.known["\0t1 plain"] = self.t1, float(self.t1_plain)
        for j, s in enumerate(report.proposers):
            if s.asked and s.drafted and not s.fault:
                added = self.added(report, s)
                self.fwd_cost[j] = a * self.fwd_cost[j] + (1 - a) * added if self.fwd_known[j] else added
                self.fwd_known[j] = True
                if j < len(self.proposers):
                    self.known[self.proposers[j] + "\0forward"] = self.fwd_cost[j]
                gain = s.accepted - added - self._draft_cost(j)
                self.net[j] = gain if not self.net_steps[j] else a * self.net[j] + (1 - a) * gain
                self.net_steps[j] += 1
                if self.timed and j < len(self.proposers) and self.net_steps[j] >= self.judge_after[j]:
                    self.known[self.proposers[j] + "\0losing"] = float(self.net[j] < 0)  # for the next request
        for j, s in enumerate(report.proposers):
            self.idle[j] = 0 if s.asked else self.idle[j] + 1
            if s.asked and s.proposed:  # trimmed: its deeper nodes' statistics are not refreshed this step
                # (a probe counts as the refresh: it keeps what probe_cost allows, all of it on a flat curve)
                self.starved[j] = self.starved[j] + 1 if s.drafted < s.proposed and j not in self.forced else 0
            if not s.asked or s.fault:
                continue
            if self.timed:
                self.measured[j] = True
                spent = s.draft_s + getattr(s, "feedback_s", 0.0)  # its propose call and its feedback work
                self.draft_s[j] = a * self.draft_s[j] + (1 - a) * spent if self.draft_s[j] else spent
                if j < len(self.proposers):
                    self.known[self.proposers[j]] = self.draft_s[j]
            # depths this step tells us about: all of them when the proposer drafted what it wanted; only those it
            # drafted when its budget (or the router, or the merged tree's) cut it short
            limited = s.proposed >= s.budget or s.drafted < s.proposed
            known = len(s.drafted_by_depth) if limited else cfg.max_depth
            for d in range(min(known, cfg.max_depth)):
                hit = 1.0 if s.accepted > d else 0.0
                self.reach[j][d] = a * self.reach[j][d] + (1 - a) * hit
            for d, n in enumerate(s.drafted_by_depth[: cfg.max_depth]):
                if n:
                    self.width[j][d] = a * self.width[j][d] + (1 - a) * n
                    if s.accepted >= d:  # the path reached depth d: depth d + 1 was put to the test
                        self.cont[j][d] = a * self.cont[j][d] + (1 - a) * (1.0 if s.accepted > d else 0.0)
        for j in self.forced:  # (after the timings: a first probe is judged with its own cost)
            self._probed(j, report)


def _prefix_levels(draft: DraftTree, dmax: int) -> tuple[list[int]]:
    """For a drafted tree, ``nodes(L)`` for L = 1..its depth (at most ``dmax``): the shortest prefix (topological
    order, what :meth:`DraftTree.truncate` keeps) holding every node of depth <= L."""
    if not draft.num_nodes:
        return ([],)
    depths = node_depths(draft.parent[0].tolist())
    deepest = min(max(depths), dmax)
    last = [0] * deepest  # last index of a node at each depth
    for i, d in enumerate(depths):
        if d <= deepest:
            last[d - 1] = i
    levels, need = [], 0
    for d in range(deepest):
        need = max(need, last[d] + 1)
        levels.append(need)
    return (levels,)


@hookimpl
def specframe_register_routers(register) -> None:
    register(AdaptiveRouter)
