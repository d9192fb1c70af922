"""The adaptive router (docs/combining.md) on its own: routing, probing, cost curves, per-depth statistics,
revise (cascades and trimming) and its configuration."""

from __future__ import annotations

import json
import logging
import random

import pytest
import torch
from pydantic import ValidationError

from specframe import DraftTree, TargetInfo
from specframe.contracts.combining import ProposerStep, StepReport
from specframe.services import node_depths
from specframe_plugins.router import AdaptiveConfig, AdaptiveRouter, ascent, ledger
from specframe_plugins.router.config import load_cost_curve
from specframe_plugins.router.stats import column as col

from tests.fakes import chain, step, tree


def a_target() -> TargetInfo:
    """A target as a router sees it (no measured cost curve); each one a target of its own."""
    return TargetInfo(vocab_size=8, eos_token_ids=frozenset(), max_context=64, device=torch.device("cpu"),
                      dtype=torch.float32)


def hits(router: AdaptiveRouter) -> list[list[float]]:
    """Per proposer, the running products of its continuation rates (what a drafted proposer is valued with)."""
    return [ascent.hit(st.cont) for st in router.stats]


def _prefix_levels(draft: DraftTree, dmax: int) -> list[int]:
    return ascent.prefix_levels(node_depths(draft.parent[0].tolist()) if draft.num_nodes else [], dmax)


def test_router_drops_a_useless_proposer_and_probes_it_again():
    router = AdaptiveRouter(AdaptiveConfig(explore=0.0, probe_every=5, probe_backoff=1.0,  # a fixed period
                                           probe_share=1.0))  # (no cost floor on the wait)
    router.start(["good", "bad"], seed=0, greedy=True)
    assert all(b > 0 for b in router.route(16, 24, [True, True]))  # optimistic priors: both run at first
    for _ in range(30):
        budgets = router.route(16, 24, [True, True])
        router.on_step(StepReport((step("good", 4, 4, budget=budgets[0], proposed=4),
                                   step("bad", 4 if budgets[1] else 0, 0, asked=budgets[1] > 0, budget=budgets[1])),
                                  8, 4, 0.02))
    runs = []
    for _ in range(10):
        budgets = router.route(16, 24, [True, True])
        runs.append(budgets[1] > 0)
        assert budgets[0] >= 4  # the good one always runs, deep enough for what it gets accepted
        router.on_step(StepReport((step("good", 4, 4, budget=budgets[0], proposed=4),
                                   step("bad", 4 if budgets[1] else 0, 0, asked=budgets[1] > 0, budget=budgets[1])),
                                  8, 4, 0.02))
    assert runs.count(True) == 2  # the bad one only when probed (every 5th step)
    assert router.route(16, 24, [False, True])[0] == 0  # a disabled proposer is never given a budget


def test_router_is_deterministic_under_a_seed_and_leaves_the_global_rng_alone():
    def decisions(seed):
        router = AdaptiveRouter(AdaptiveConfig(explore=0.5, draft_cost={"a": 0.2, "b": 0.2, "c": 0.2}))
        router.start(["a", "b", "c"], seed=seed, greedy=False)
        out = []
        for i in range(40):
            budgets = router.route(12, 16, [True, True, True])
            out.append(tuple(budgets))
            # a and b get some of their nodes accepted, c never: c is left out but for probes and exploration
            router.on_step(StepReport(tuple(step(n, min(b, 3), 0 if n == "c" or not b else 1 + (i + k) % 3,
                                                 asked=b > 0, budget=b)
                                            for k, (n, b) in enumerate(zip("abc", budgets))), 6, 1, 0.01))
        return out

    torch.manual_seed(0)
    random.seed(0)
    state = (torch.get_rng_state(), random.getstate())
    assert decisions(3) == decisions(3)
    assert (torch.equal(torch.get_rng_state(), state[0]), random.getstate() == state[1]) == (True, True)
    assert decisions(3) != decisions(4)  # exploration draws from the router's own seeded generator


def test_router_draft_costs_timings_only_under_greedy():
    router = AdaptiveRouter(AdaptiveConfig(draft_cost={"slow": 50.0}, explore=0.0))
    router.start(["fast", "slow"], seed=0, greedy=False)
    assert not router.clock.timed and router.route(8, 16, [True, True])[1] == 0  # too costly to ever pay off
    for _ in range(5):  # measured times are ignored under sampling: the seed alone fixes the decisions
        router.on_step(StepReport((step("fast", 2, 2), step("slow", 0, 0, asked=False)), 2, 2, forward_s=9.0))
    assert router.clock.t1 is None and col(router, "draft_s") == [0.0, 0.0]
    router.start(["fast", "slow"], seed=0, greedy=True)
    assert router.clock.timed
    router.on_step(StepReport((step("fast", 2, 2, draft_s=0.5), step("slow", 0, 0, asked=False)), 2, 2, forward_s=0.1))
    assert router.clock.t1 == pytest.approx(0.1 / router.cost.verify(3)) and router.draft_cost(0) == pytest.approx(0.5 / router.clock.t1)


def test_router_cost_curve_from_a_bench_profile(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"profile": {"v": [2.0, 2.0, 2.0, 8.0]}}))
    router = AdaptiveRouter(AdaptiveConfig(cost_profile=str(results)))
    assert [router.cost.curve.v(n) for n in (1, 2, 3, 4)] == [1.0, 1.0, 1.0, 4.0]
    assert router.cost.verify(3) == 1.0 and router.cost.verify(4) == 4.0
    # with 3 verified tokens free and a 4th costing 4x, one proposer gets at most 2 nodes
    router.start(["a"], seed=0, greedy=True)
    assert router.allocate(16, 24, [True])[1] == [2]
    assert router.route(16, 24, [True]) == [2]  # not measured yet: a probe's budget (2 nodes add no cost here)
    router.on_step(StepReport((step("a", 1, 1, draft_s=1e-6),), 1, 1, forward_s=0.1))
    assert router.route(16, 24, [True]) == [0]  # step 1 times a one-token forward (no lineup has one yet)
    router.on_step(StepReport((step("a", 0, 0, asked=False),), 0, 0, forward_s=0.1))
    assert router.clock.t1_plain and router.clock.t1 == pytest.approx(0.1)
    assert router.route(16, 24, [True]) == [16]  # measured free to draft: drafts fully ...
    assert router.revise(16, 24, [True], [chain(list(range(8)))], [16]) == [2]  # ... and keeps what pays
    assert AdaptiveRouter(AdaptiveConfig()).cost.verify(11) == pytest.approx(1.3)  # the linear default
    curve = load_cost_curve(AdaptiveConfig(cost_curve=[2.0, 3.0]))  # normalised to v(1) = 1
    assert [curve.v(1), curve.v(2)] == [1.0, 1.5]
    (tmp_path / "bad.json").write_text("{}")
    # a bad profile fails when the config is validated (at load), not mid-request
    with pytest.raises(ValidationError, match="no profile.v"):
        AdaptiveConfig(cost_profile=str(tmp_path / "bad.json"))
    with pytest.raises(ValidationError, match="does not exist"):
        AdaptiveConfig(cost_profile=str(tmp_path / "missing.json"))
    for v in ([], [0.0, 1.0, 2.0], [1.0, -5.0, 2.0]):
        (tmp_path / "v.json").write_text(json.dumps({"profile": {"v": v}}))
        with pytest.raises(ValidationError, match="non-empty list of times > 0"):
            AdaptiveConfig(cost_profile=str(tmp_path / "v.json"))
    with pytest.raises(Exception, match="cost_curve"):
        AdaptiveConfig(cost_curve=[1.0, 0.0])


def test_router_on_step_counts_idle_steps_and_conditional_hits():
    router = AdaptiveRouter(AdaptiveConfig(prior=0.6, decay=0.9, measure="never"))
    router.start(["a", "b"], seed=0, greedy=True)
    prior = [0.6 ** d for d in range(1, 13)]
    # a: a 3-chain with its first 2 nodes accepted; b left out
    router.on_step(StepReport((step("a", 3, 2, budget=16), step("b", asked=False)), 3, 2, 0.0))
    assert col(router, "idle") == [0, 1]
    # per-depth continuation rates: depths 1 and 2 were reached and accepted, depth 3 reached and rejected
    assert col(router, "cont")[0][:3] == pytest.approx([0.9 * 0.6 + 0.1, 0.9 * 0.6 + 0.1, 0.9 * 0.6])
    assert hits(router)[0][:3] == pytest.approx([0.64, 0.64 ** 2, 0.64 ** 2 * 0.54])  # their running products
    assert col(router, "cont")[0][3:] == pytest.approx([0.6] * 9)  # depths it did not draft tell nothing about its hits
    assert hits(router)[1] == pytest.approx(prior)  # not asked: unchanged
    # the unconditional reach also learns that a reached nothing past depth 2 (it was not cut short)
    assert col(router, "reach")[0][3] == pytest.approx(0.9 * 0.6 ** 4)
    # b asked (a tree: 2 roots, 1 child; nothing accepted), a left out
    router.on_step(StepReport((step("a", asked=False),
                               step("b", 3, 0, budget=4, depths=(2, 1))), 3, 0, 0.0))
    assert col(router, "idle") == [1, 0]
    # depth 1 was put to the test and failed; depth 2 was never reached, so its rate keeps the prior
    assert col(router, "cont")[1][:3] == pytest.approx([0.9 * 0.6, 0.6, 0.6])
    assert hits(router)[1][:3] == pytest.approx([0.54, 0.54 * 0.6, 0.54 * 0.36])
    assert col(router, "width")[1][:2] == pytest.approx([0.9 + 0.1 * 2, 1.0])
    before = [list(h) for h in hits(router)]  # a faulty step counts as asked (idle 0) but teaches nothing
    faulty = ProposerStep("a", True, 8, 0, 0, (), 0, 0, 0.0, True)
    router.on_step(StepReport((faulty, step("b", asked=False)), 0, 0, 0.0))
    assert col(router, "idle") == [0, 1] and hits(router) == before


def cheap_and_costly_router(every: int) -> AdaptiveRouter:
    """a: free to draft (cost 0), drafts an 8-chain every ``every``-th step (then all of it is accepted) and
    nothing otherwise; b: costs 0.3 one-token forwards, drafts 4 and gets 2 accepted."""
    router = AdaptiveRouter(AdaptiveConfig(draft_cost={"b": 0.3}, measure="never", explore=0.0, probe_every=1000))
    router.start(["a", "b"], seed=0, greedy=True)
    for i in range(20):
        drafted = 8 if i % every == 0 else 0
        router.on_step(StepReport((step("a", drafted, drafted, budget=16), step("b", 4, 2, budget=4)), 8, 8, 0.0))
    return router


def test_router_cascade_skips_the_costly_proposer_when_the_cheap_draft_is_long_and_trusted():
    router = cheap_and_costly_router(every=5)
    # when a drafts its draft is accepted (hit: conditional on drafting), but it mostly has nothing to draft (reach)
    assert all(r < 0.35 and c > 0.7 for c, r in zip(col(router, "cont")[0][:8], col(router, "reach")[0][:8]))
    assert all(h > r + 0.2 for h, r in zip(hits(router)[0][:3], col(router, "reach")[0][:3]))
    budgets = router.route(16, 24, [True, True])
    assert budgets[0] == 16  # free: drafts with the full budget
    assert budgets[1] > 0  # before a's draft is known, b is worth running
    long = chain(list(range(1, 9)))
    assert router.revise(16, 24, [True, True], [long, None], budgets) == [8, 0]  # long, trusted: b skipped, a whole
    after_empty = router.revise(16, 24, [True, True], [DraftTree.empty(), None], budgets)
    assert after_empty[0] == 0 and after_empty[1] > 0  # a drafted nothing: b runs
    # an unavailable proposer still to run gets nothing
    assert router.revise(16, 24, [True, False], [DraftTree.empty(), None], budgets)[1] == 0


def test_router_revise_trims_a_draft_to_the_prefix_that_pays():
    # no tolerance: trim to the exact optimum; a cost curve where each extra node costs 0.1 of a forward
    router = AdaptiveRouter(AdaptiveConfig(measure="never", explore=0.0, keep_tolerance=0.0, cost_slope=0.1))
    router.start(["a", "b"], seed=0, greedy=True)
    for _ in range(20):  # a's 8-chains: only the first node is ever accepted
        router.on_step(StepReport((step("a", 8, 1, budget=16), step("b", asked=False)), 8, 1, 0.0))
    long = chain(list(range(1, 9)))
    assert router.revise(16, 24, [True, False], [long, None], [16, 0]) == [1, 0]
    router.start(["a", "b"], seed=0, greedy=True)
    for _ in range(20):  # all 8 accepted: the whole draft pays
        router.on_step(StepReport((step("a", 8, 8, budget=16), step("b", asked=False)), 8, 8, 0.0))
    assert router.revise(16, 24, [True, False], [long, None], [16, 0]) == [8, 0]
    # a tree is trimmed to the topological prefix holding its paying levels: depths 1 and 2, the first 4 nodes
    router.start(["a", "b"], seed=0, greedy=True)
    for _ in range(20):  # depths 1 and 2 accepted, depth 3 never
        router.on_step(StepReport((step("a", 5, 2, budget=16, depths=(2, 2, 1)), step("b", asked=False)), 5, 2, 0.0))
    t = tree([1, 2, 3, 4, 5], [-1, -1, 0, 1, 2])  # depths 1 1 2 2 3
    assert router.revise(16, 24, [True, False], [t, None], [16, 0]) == [4, 0]


def test_router_revise_keeps_probed_proposers_whole():
    router = AdaptiveRouter(AdaptiveConfig(draft_cost={"b": 0.3}, measure="never", explore=0.0, probe_every=3,
                                           probe_backoff=1.0, probe_share=1.0))  # (no cost floor on the wait)
    router.start(["a", "b"], seed=0, greedy=True)
    long, b_draft = chain(list(range(1, 9))), chain([9] * 5)
    seen = []
    for _ in range(6):
        budgets = router.route(16, 24, [True, True])
        forced = 1 in router.forced
        ahead = router.revise(16, 24, [True, True], [long, None], budgets)
        behind = router.revise(16, 24, [True, True], [long, b_draft], ahead)
        seen.append((forced, budgets[1], ahead[1], behind[1]))
        # a's drafts all accepted, b's never: b is only ever run when probed
        router.on_step(StepReport((step("a", 8, 8, budget=16),
                                   step("b", 5 if ahead[1] else 0, 0, asked=ahead[1] > 0, budget=ahead[1])), 8, 8, 0.0))
    assert [f for f, *_ in seen] == [False, False, True, False, False, True]  # every 3rd step
    for forced, routed, ahead, behind in seen[1:]:
        if forced:  # probed: full budget, and its draft is kept whole however poor its statistics
            assert (routed, ahead, behind) == (16, 16, 5)
        else:  # route plans b without the free a (b alone might pay); knowing a's long chain, revise skips it
            assert ahead == 0


def test_probes_that_do_not_pay_grow_rarer_and_one_that_pays_resets_them():
    """Where the cost curve is steep a probe costs several forwards: each one that does not pay doubles the wait
    before the next (up to probe_max); the first that pays brings it back to probe_every."""
    router = AdaptiveRouter(AdaptiveConfig(draft_cost={"bad": 0.5}, measure="never", explore=0.0, probe_every=4,
                                           probe_max=32, cost_slope=1.0,  # v(n) = n: every node costs a forward
                                           probe_share=1.0))  # (no cost floor on the wait: see the next test)
    router.start(["bad"], seed=0, greedy=True)
    probes = []
    for i in range(120):
        budgets = router.route(8, 16, [True])
        if budgets[0]:
            probes.append(i)
        # (a probe's one node, as probe_cost allows on this curve: 0.5 + 1 forwards, under the wait's cost floor)
        router.on_step(StepReport((step("bad", 1 if budgets[0] else 0, 0, asked=budgets[0] > 0, budget=budgets[0]),),
                                  1 if budgets[0] else 0, 0, 0.0))
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[:3] == [8, 16, 32] and set(gaps[3:]) == {32}  # 4, 8, 16, 32 steps left out, then capped
    # a probe whose draft is accepted (8 tokens for a cost of 8.5 forwards: no; 8 for 0.5 + 8 with v flat: yes)
    router = AdaptiveRouter(AdaptiveConfig(draft_cost={"x": 0.5}, measure="never", explore=0.0, probe_every=4,
                                           probe_max=32, cost_slope=0.0))
    router.start(["x"], seed=0, greedy=True)
    router.stats[0].wait = 32
    router.stats[0].idle = 31
    assert router.route(8, 16, [True]) == [8] and router.forced == {0}
    router.on_step(StepReport((step("x", 8, 8, budget=8),), 8, 8, 0.0))
    assert col(router, "wait") == [4]


def test_probes_of_a_costly_proposer_cost_at_most_probe_share_of_the_steps():
    """A probe that does not pay waits at least its cost / probe_share steps: its draft (0.5 forwards) and what its
    node added to the forward (v(2) - v(1) = 1 forward on this curve), 1.5 / 0.02 = 75 steps."""
    router = AdaptiveRouter(AdaptiveConfig(draft_cost={"bad": 0.5}, measure="never", explore=0.0, probe_every=4,
                                           probe_max=256, cost_slope=1.0, probe_share=0.02))
    router.start(["bad"], seed=0, greedy=True)
    probes = []
    for i in range(600):
        budgets = router.route(8, 16, [True])
        if budgets[0]:
            probes.append(i)
        router.on_step(StepReport((step("bad", 1 if budgets[0] else 0, 0, asked=budgets[0] > 0, budget=budgets[0]),),
                                  1 if budgets[0] else 0, 0, 0.0))
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == [75, 150, 256]  # 75 steps (not 4, nor the 25 its draft cost alone gives), doubled, capped


def test_a_measured_draft_cost_carries_over_to_the_next_request():
    """Timed: a proposer's draft seconds and the forward time measured in one request are where the next request
    starts (no second unmeasured draft, and the first probe waits draft cost / probe_share steps); acceptance
    statistics start afresh."""
    target = a_target()  # costs are kept per target (and router settings and lineup)
    router = AdaptiveRouter(AdaptiveConfig(measure="always", explore=0.0, probe_every=4, cost_slope=0.0,
                                           probe_share=0.05), target)
    router.start(["slow"], seed=0, greedy=True)
    assert router.route(8, 16, [True]) == [router.probe_nodes(8)]  # unmeasured: a probe's budget
    # it drafted 1 node in 0.1 s, rejected, next to a 0.05 s forward: 2 forwards of drafting
    router.on_step(StepReport((step("slow", 1, 0, budget=1, draft_s=0.1),), 1, 0, 0.05))
    assert col(router, "measured") == [True] and router.draft_cost(0) == pytest.approx(2.0)
    router.start(["slow"], seed=1, greedy=True)  # the next request
    assert col(router, "measured") == [True] and router.draft_cost(0) == pytest.approx(2.0)
    assert col(router, "wait") == [40]  # 2.0 / 0.05
    assert col(router, "reach")[0][0] == pytest.approx(router.config.prior)  # acceptance starts from the prior again
    asked = []
    for _ in range(45):
        budgets = router.route(8, 16, [True])
        asked.append(budgets[0] > 0)
        router.on_step(StepReport((step("slow", 1 if asked[-1] else 0, 0, asked=asked[-1], budget=budgets[0],
                                        draft_s=0.1),), 1 if asked[-1] else 0, 0, 0.05))
    # 2 forwards of drafting for a prior reach of 0.6: not worth it; its first probe after 40 steps left out
    assert asked.index(True) == 39 and asked.count(True) == 1
    same = AdaptiveRouter(AdaptiveConfig(measure="always", explore=0.0, probe_every=4, cost_slope=0.0,
                                         probe_share=0.05), target)
    same.start(["slow"], seed=2, greedy=True)
    assert col(same, "measured") == [True]  # another instance serving the same lineup (the pool may drop idle routers)
    for other in (AdaptiveRouter(AdaptiveConfig(measure="always"), target),  # other router settings
                  AdaptiveRouter(same.config, a_target())):  # another target
        other.start(["slow"], seed=0, greedy=True)
        assert col(other, "measured") == [False]


def test_a_proposer_whose_verified_drafts_do_not_pay_is_left_out_but_for_probes():
    """The ledger: a free proposer (draft cost 0) whose verified nodes are rejected on a steep curve (v(n) = n) is
    left out once its net gain per verified step has averaged below 0 over ledger_steps steps; a proposer that pays
    is not."""
    router = AdaptiveRouter(AdaptiveConfig(measure="never", explore=0.0, cost_slope=1.0, ledger_steps=4,
                                           probe_every=6, keep_tolerance=0.0))
    router.start(["lookup"], seed=0, greedy=True)
    asked = []
    for _i in range(40):
        budgets = router.route(8, 16, [True])
        asked.append(budgets[0] > 0)
        # when asked, it drafts 2 nodes and they are verified (as a draft kept whole would be), none accepted
        router.on_step(StepReport((step("lookup", 2 if budgets[0] else 0, 0, asked=budgets[0] > 0,
                                        budget=budgets[0]),), 2 if budgets[0] else 0, 0, 0.0))
    assert asked[:4] == [True] * 4 and ledger.losing(router.stats[0])
    assert 0 < asked[4:].count(True) <= 3  # afterwards only probes, growing rarer (6, 12, 24 steps apart)
    paying = AdaptiveRouter(AdaptiveConfig(measure="never", explore=0.0, cost_slope=1.0, ledger_steps=4))
    paying.start(["lookup"], seed=0, greedy=True)
    for _ in range(10):
        paying.route(8, 16, [True])
        paying.on_step(StepReport((step("lookup", 2, 2, budget=8),), 2, 2, 0.0))  # 2 accepted for 2 forwards added
    assert not ledger.losing(paying.stats[0]) and col(paying, "net") == [0.0]


def test_prefix_levels_of_a_draft():
    # nodes(D): the shortest prefix (what DraftTree.truncate keeps) holding every node of depth <= D
    assert _prefix_levels(chain([4, 5, 6]), 12) == [1, 2, 3]
    assert _prefix_levels(chain([4, 5, 6]), 2) == [1, 2]  # no deeper than the plan's depth
    assert _prefix_levels(tree([1, 2, 3, 4, 5], [-1, -1, 0, 1, 2]), 12) == [2, 4, 5]  # depths 1 1 2 2 3
    # a root after a depth-2 node: depth 1 needs 3 nodes, so depth 2 does too
    assert _prefix_levels(tree([1, 2, 3, 4], [-1, 0, -1, 1]), 12) == [3, 3, 4]  # depths 1 2 1 3
    assert _prefix_levels(tree([1, 2, 3, 4], [-1, 0, -1, 1]), 1) == [3]
    assert _prefix_levels(DraftTree.empty(), 12) == []


def test_router_revise_never_skips_a_free_proposer_still_to_run():
    # b is free to draft but has never had anything accepted; a drafted a long chain that is always accepted
    router = AdaptiveRouter(AdaptiveConfig(measure="never", explore=0.0))
    router.start(["a", "b"], seed=0, greedy=True)
    for _ in range(20):
        router.on_step(StepReport((step("a", 8, 8, budget=16), step("b", 4, 0, budget=16)), 12, 8, 0.0))
    ahead = router.revise(16, 24, [True, True], [chain(list(range(1, 9))), None], [16, 16])
    assert ahead[1] == 16  # it drafts (free) ...
    behind = router.revise(16, 24, [True, True], [chain(list(range(1, 9))), chain([9] * 4)], ahead)
    assert behind == [8, 0]  # ... and none of its draft is worth verifying


def test_config_shorthands_and_router_errors(caplog):
    from specframe.config import SpecframeConfig

    assert SpecframeConfig(proposers=["ngram", {"name": "medusa", "top_k": 2}]).proposers == [
        {"name": "ngram"}, {"name": "medusa", "top_k": 2}]
    assert SpecframeConfig(router=False).router.name == "none" and SpecframeConfig(router=None).router.name == "none"
    with pytest.raises(ValidationError, match="give a router name"):
        SpecframeConfig(router=3)
    router = AdaptiveRouter(AdaptiveConfig(draft_cost={"draft-modle": 0.3}))
    with caplog.at_level(logging.WARNING, logger="specframe"):
        router.start(["ngram", "draft-model"], seed=0, greedy=True)
        router.start(["ngram", "draft-model"], seed=1, greedy=True)
    warned = [r for r in caplog.records if "draft-modle" in r.getMessage()]
    assert len(warned) == 1 and col(router, "configured_cost") == [0.0, 0.0]  # a misspelt label is named once, not used


def test_router_counts_a_proposers_feedback_work_in_its_draft_cost():
    """What a proposer costs a step is its propose call and its on_verified work: with timings, 2 ms + 6 ms against
    a 10 ms one-token forward is 0.8 forwards (the draft time alone would be 0.2)."""
    router = AdaptiveRouter(AdaptiveConfig(measure="always", cost_slope=0.0, decay=0.5))
    router.start(["a"], seed=0, greedy=True)
    s = ProposerStep("a", True, 8, 1, 1, (1,), 1, 1, 0.002, False, 0.006)
    router.on_step(StepReport((s,), 1, 1, forward_s=0.010))
    assert router.draft_cost(0) == pytest.approx(0.8)


def test_probe_budget_follows_the_cost_curve():
    """A probe drafts the most nodes that add at most probe_cost forwards: the whole budget on a flat curve, one
    node on a steep one (v(2) = 1.5: one more node already costs half a forward)."""
    flat = AdaptiveRouter(AdaptiveConfig(cost_curve=[1.0] * 8 + [1.2] * 24))
    steep = AdaptiveRouter(AdaptiveConfig(cost_curve=[1.0, 1.5, 2.0, 2.6, 3.1, 3.6, 4.2, 4.8]))
    assert flat.probe_nodes(16) == 16 and flat.probe_nodes(4) == 4
    assert steep.probe_nodes(16) == 1
    assert AdaptiveRouter(AdaptiveConfig(cost_curve=[1.0, 1.2, 1.5, 1.9], probe_cost=0.6)).probe_nodes(16) == 2
    # a proposer left out until its probe is due is probed with that budget, not the step's
    router = AdaptiveRouter(AdaptiveConfig(cost_curve=[1.0, 1.5, 2.0, 2.6, 3.1, 3.6, 4.2, 4.8], measure="never",
                                           draft_cost={"x": 0.5}, explore=0.0, probe_every=3))
    router.start(["x"], seed=0, greedy=True)
    budgets = []
    for _ in range(6):
        nodes = router.route(8, 16, [True])
        budgets.append(nodes[0])
        router.on_step(StepReport((step("x", min(nodes[0], 1), 0, asked=nodes[0] > 0),), min(nodes[0], 1), 0,
                                  forward_s=0.1))
    assert budgets[0] == 0 and 1 in budgets and max(budgets) == 1


def test_a_verification_dearer_than_the_curve_is_charged_to_the_proposer_whose_nodes_it_held():
    """Timed: t1 comes from the steps that verify nothing, and what a wide verification costs beyond the curve
    (here a flat one: v(n) = 1) is charged to the nodes' proposers by their share of the nodes. 10 ms one-token
    forwards, 15 ms with 8 nodes (6 of a, 2 of b): 0.5 forwards over the curve, 0.375 of them a's."""
    target = a_target()
    router = AdaptiveRouter(AdaptiveConfig(measure="always", cost_slope=0.0, decay=0.5, explore=0.0), target)
    router.start(["a", "b"], seed=0, greedy=True)
    router.on_step(StepReport((step("a", 0, 0, asked=False), step("b", 0, 0, asked=False)), 0, 0, 0.010))
    assert router.clock.t1 == pytest.approx(0.010) and router.clock.t1_plain
    router.on_step(StepReport((step("a", 6, 1, budget=8, draft_s=0.0), step("b", 2, 0, budget=8, draft_s=0.0)), 8, 1,
                              0.015))
    assert router.clock.t1 == pytest.approx(0.010)  # not raised by the tree step
    assert col(router, "fwd_cost") == pytest.approx([0.375, 0.125])
    assert col(router, "net") == pytest.approx([1 - 0.375, -0.125])  # accepted - forward added - draft cost (0 here)
    # the next request of this lineup starts from those costs: a's first probe waits 0.375 / 0.02 = 19 steps
    # (b's 0.125 / 0.02 = 7 is below probe_every: 16)
    router.start(["a", "b"], seed=1, greedy=True)
    assert col(router, "fwd_cost") == pytest.approx([0.375, 0.125]) and col(router, "wait") == [19, 16]
    # a forward that costs less than the curve says is not a refund: what a proposer adds is never below 0
    router.on_step(StepReport((step("a", 8, 0, budget=8, draft_s=0.0), step("b", 0, 0, asked=False)), 8, 0, 0.008))
    assert col(router, "fwd_cost")[0] == pytest.approx(0.5 * 0.375) and col(router, "net")[0] == pytest.approx(0.0)


def test_exploration_leaves_a_proposer_whose_probes_did_not_pay_to_its_probes():
    """explore = 1: every step runs one costly proposer too, unless its wait was raised by a probe that did not
    pay; that one runs only when its probe is due."""
    router = AdaptiveRouter(AdaptiveConfig(draft_cost={"x": 2.0}, measure="never", explore=1.0, probe_every=4))
    router.start(["x"], seed=0, greedy=True)
    assert router.route(8, 16, [True]) != [0] and router.forced == {0}  # explored at once
    router.on_step(StepReport((step("x", 1, 0, budget=1),), 1, 0, 0.0))  # rejected: 2 + 0.03 forwards for nothing
    assert col(router, "wait")[0] > router.config.probe_every
    asked = []
    for _ in range(col(router, "wait")[0]):
        nodes = router.route(8, 16, [True])
        asked.append(nodes[0] > 0)
        router.on_step(StepReport((step("x", 1 if nodes[0] else 0, 0, asked=nodes[0] > 0, budget=nodes[0]),),
                                  1 if nodes[0] else 0, 0, 0.0))
    assert asked == [False] * (len(asked) - 1) + [True]  # only the probe, when due


def _request(config, target, seed, accepted, draft_s, steps=30):
    """One request of a lone proposer "weak" that drafts 2 nodes when asked, `accepted` of them accepted, in `draft_s`
    seconds next to a 0.05 s forward; returns the router and the steps it was asked in."""
    router = AdaptiveRouter(config, target)
    router.start(["weak"], seed=seed, greedy=True)
    asked = []
    for _ in range(steps):
        b = router.route(8, 16, [True])[0]
        asked.append(b > 0)
        router.on_step(StepReport((step("weak", 2 if b else 0, accepted if b else 0, asked=b > 0, budget=b,
                                        draft_s=draft_s),), 2 if b else 0, accepted if b else 0, 0.05))
    return router, asked


def test_the_ledger_verdict_carries_over_and_needs_less_evidence_in_the_next_request():
    """Timed: a free proposer the last request ended leaving out is judged after ledger_steps_known verified steps of
    the next request (on its own gains: one that pays there stays in); its verdict carries over in turn."""
    target = a_target()
    # 2 nodes add 0.5 forward each (slope 0.5); 1 ms of drafting is 0.02 forwards: free
    config = AdaptiveConfig(measure="auto", explore=0.0, cost_slope=0.5, ledger_steps=8, ledger_steps_known=4,
                            probe_every=64, probe_share=1.0, keep_tolerance=0.0)
    first, asked = _request(config, target, 0, accepted=0, draft_s=0.001)
    # the prior's optimism: 8 drafting steps (step 1 of the lineup's first request times a one-token forward)
    assert col(first, "judge_after") == [8] and asked[:9] == [True, False] + [True] * 7 and not any(asked[9:])
    second, asked = _request(config, target, 1, accepted=0, draft_s=0.001)
    assert col(second, "judge_after") == [4] and asked[:4] == [True] * 4 and not any(asked[4:])  # the same verdict, sooner
    assert col(second, "probation") == [False]  # (free: no probation)
    paying, asked = _request(config, target, 2, accepted=2, draft_s=0.001)  # this prompt suits it: it stays in
    assert col(paying, "judge_after") == [4] and all(asked) and not ledger.losing(paying.stats[0])
    after, _ = _request(config, target, 3, accepted=0, draft_s=0.001, steps=1)
    assert col(after, "judge_after") == [8]  # the last request ended with it paying: full evidence again
    _request(config, target, 4, accepted=0, draft_s=0.001)  # (it ends losing again)
    sampled = AdaptiveRouter(config, target)
    sampled.start(["weak"], seed=0, greedy=False)
    assert col(sampled, "judge_after") == [8]  # untimed: nothing carries over (the seed alone fixes a sampled request)


def test_a_costly_proposer_the_last_request_left_out_starts_on_probation():
    """Timed: a costly proposer (0.2 forwards of drafting) the last request ended leaving out is asked in the next only
    on probes, the first at the first step, until a probe pays; then it drafts again."""
    target = a_target()
    config = AdaptiveConfig(measure="auto", explore=0.0, cost_slope=0.0, ledger_steps=8, ledger_steps_known=4,
                            probe_every=8, probe_backoff=2.0, probe_share=1.0)
    _, asked = _request(config, target, 0, accepted=0, draft_s=0.01)
    assert asked[:9] == [True, False] + [True] * 7 and asked.count(True) < 12  # (step 1: the one-token time)
    second, asked = _request(config, target, 1, accepted=0, draft_s=0.01)
    assert col(second, "probation") == [True]
    assert [i for i, a in enumerate(asked) if a] == [0, 16]  # probes only: the first step, then 2 x 8 steps later
    paying, asked = _request(config, target, 2, accepted=2, draft_s=0.01)
    assert asked[0] and col(paying, "probation") == [False] and all(asked)  # its first probe paid: in from then on
    off = config.model_copy(update={"probation": False})
    _request(off, target, 0, accepted=0, draft_s=0.01)  # (its lineup has the one-token time already)
    second, asked = _request(off, target, 1, accepted=0, draft_s=0.01)
    assert col(second, "probation") == [False] and asked[:4] == [True] * 4  # without probation: the shorter ledger alone


def _steep_request(config, target, seed, greedy=True, steps=40):
    """A lone free proposer drafting up to 8 nodes (1 accepted) on a machine where a forward over 1 + n tokens costs
    1 + 2.1 n / 8 one-token forwards (10 ms; v(9) = 3.1), while the router's curve is flat: returns the router, the
    steps it drafted in, and its speed over plain decoding's (tokens per second over 100)."""
    router = AdaptiveRouter(config, target)
    router.start(["ngram"], seed=seed, greedy=greedy)
    asked, tokens, seconds = [], 0, 0.0
    for _ in range(steps):
        b = router.route(8, 16, [True])[0]
        asked.append(b > 0)
        n = min(b, 8)
        if n:  # the engine drafts, then keeps what the router's revise says pays
            n = min(n, router.revise(8, 16, [True], [chain(list(range(n)))], [b])[0])
        router.on_step(StepReport((step("ngram", n, min(n, 1), asked=b > 0, budget=b, draft_s=1e-4),), n,
                                  min(n, 1), 0.010 * (1 + 2.1 * n / 8)))
        tokens, seconds = tokens + 1 + min(n, 1), seconds + 0.010 * (1 + 2.1 * n / 8)
    return router, asked, tokens / seconds * 0.010


def test_a_timed_request_times_one_token_so_a_curve_flatter_than_the_machine_is_repriced():
    """Issue 67: a profile from another machine (flat curve) on one where v(1 + n) = 1 + 2.1 n / 8. Step 1 verifies
    nothing; from then on the measured forwards re-price the curve, so the router trims the drafts (8 nodes commit 2
    tokens for 3.1 forwards; 1 node, 2 for 1.26) and runs faster than plain decoding. Without that step nothing is
    measured against one token, and every step verifies the whole draft at the flat curve's price."""
    target = a_target()
    config = AdaptiveConfig(measure="auto", explore=0.0, cost_slope=0.0, ledger_steps=8, probe_every=16)
    router, asked, speed = _steep_request(config, target, 0)
    assert asked[:2] == [True, False] and router.clock.t1 == pytest.approx(0.010) and router.clock.t1_plain
    # the curve is re-priced by the measured forwards: v(1 + n) = 1 + 2.1 n / 8 here, against the flat curve's 1
    assert router.cost.v(9) == pytest.approx(3.1, rel=0.02) and router.cost.v(1) == 1.0
    assert all(router.cost.v(1 + n) == pytest.approx(1 + 2.1 * n / 8, rel=0.02) for n in range(1, 9))  # (linear)
    assert speed > 1.2  # one node a step (always accepted, 1.26 forwards for 2 tokens) pays; eight do not
    again, asked, faster = _steep_request(config, target, 1)
    assert asked[1] and again.cost.v(9) == pytest.approx(3.1, rel=0.02)  # time and curve carried over: no second
    assert faster > speed  # calibration, and the first steps are priced right
    sampled, asked, _ = _steep_request(config, target, 0, greedy=False)  # untimed: no step spent on timing, no re-pricing
    assert all(asked) and not sampled.clock.t1_plain and sampled.cost.v(9) == 1.0
    import specframe_plugins.router.adaptive as adaptive_module

    old = adaptive_module.CALIBRATE_STEP
    try:  # the rule off: the flat curve prices the 8 nodes at nothing and the drafts keep coming
        adaptive_module.CALIBRATE_STEP = -1
        blind, asked, blind_speed = _steep_request(config, a_target(), 0)
    finally:
        adaptive_module.CALIBRATE_STEP = old
    assert all(asked) and not blind.clock.t1_plain and blind.cost.v(9) == 1.0 and blind_speed < 0.7
