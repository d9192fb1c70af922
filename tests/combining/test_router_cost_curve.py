"""The router's use of the target's measured cost curve (``TargetInfo.cost``), a lone proposer included: v(n) read
from the measured curve under greedy decoding (following the thread governor's changes) and never under
sampling, so a seed's tokens do not depend on the machine's load (issue 39, 7); a steep curve trims drafts, which
are then probed; a lone proposer is routed only with a measured cost or an explicit router."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch

import specframe
from specframe import DraftTree
from specframe.contracts import TargetInfo
from specframe.contracts.combining import ProposerStep, StepReport
from specframe.target.cost import CostCurve
from specframe.target.hf import Target
from specframe_plugins.router import AdaptiveConfig, AdaptiveRouter
from specframe_plugins.router.stats import column as col

from tests.fakes import PROMPT, build_model, build_tokenizer


def info(cost) -> TargetInfo:
    return TargetInfo(64, frozenset(), 256, torch.device("cpu"), torch.float32, cost=cost)


def lone_router(cost, **cfg) -> AdaptiveRouter:
    router = AdaptiveRouter(AdaptiveConfig(measure="never", explore=0.0, **cfg), info(cost))
    router.start(["ngram"], seed=0, greedy=True)
    return router


def test_router_takes_v_from_the_targets_measured_cost():
    assert lone_router(CostCurve.linear(0.5)).cost.verify(5) == pytest.approx(3.0)
    curve = CostCurve({128: [10.0, 12.0, 14.0, 20.0, 40.0, 80.0]})
    assert lone_router(curve).cost.verify(3) == pytest.approx(1.3)
    curve.set({128: [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]})  # the governor changed threads: v follows
    assert lone_router(curve).cost.verify(2) == pytest.approx(2.0)
    assert lone_router(CostCurve()).cost.verify(11) == pytest.approx(1.3)  # nothing measured: the linear default
    assert lone_router(None).cost.verify(11) == pytest.approx(1.3)
    assert lone_router(CostCurve.linear(0.5), cost_curve=[1.0, 1.0, 1.0]).cost.verify(3) == 1.0  # configured curve wins


def test_a_steep_measured_curve_trims_a_lone_draft_more_than_a_flat_one():
    draft = DraftTree.chain(list(range(1, 9)))
    flat, steep = lone_router(CostCurve.linear(0.0)), lone_router(CostCurve.linear(0.5))
    assert flat.route(16, 1 << 16, [True]) == [16] and steep.route(16, 1 << 16, [True]) == [16]  # free: drafts fully
    assert flat.revise(16, 1 << 16, [True], [draft], [16]) == [8]
    # at the prior (0.6 ** d): E/C is 1.6 / 1.5 at depth 1, 1.96 / 2.0 at depth 2
    assert steep.revise(16, 1 << 16, [True], [draft], [16]) == [1]
    assert lone_router(CostCurve.linear(2.0)).revise(16, 1 << 16, [True], [draft], [16]) == [0]  # nothing pays


def starved_step(proposed: int, drafted: int) -> StepReport:
    s = ProposerStep("ngram", True, 16, proposed, drafted, (1,) * drafted, 0, 0, 0.0, False)
    return StepReport((s,), drafted, 0, 0.0)


def test_under_sampling_the_router_reads_no_measured_curve():
    """A seed's tokens must not depend on the machine's load (issue 39, 7): the thread governor swaps the curve (set),
    and a curve measured under load is another curve; the router follows them under greedy decoding only, and under
    sampling reads the configured curve or the linear default, whatever was measured."""
    quiet = {128: [10.0, 11.0, 12.0, 14.0, 18.0, 26.0]}
    busy = {128: [20.0, 40.0, 80.0, 160.0, 320.0, 640.0]}
    costs = []
    for measured in (CostCurve(quiet), CostCurve(busy), CostCurve(busy, fixed=quiet)):
        sampling = AdaptiveRouter(AdaptiveConfig(measure="never", explore=0.0), info(measured))
        sampling.start(["ngram"], seed=0, greedy=False)
        costs.append(sampling.cost.verify(8))
    assert costs == [pytest.approx(1 + 0.03 * 7)] * 3  # cost_slope's line, not a measured point
    curve = CostCurve(quiet)
    greedy = lone_router(curve)
    before = greedy.cost.verify(8)
    curve.set(busy)  # what the governor does when a neighbour takes a core
    assert greedy.cost.verify(8) == pytest.approx(8.0) != before
    configured = AdaptiveRouter(AdaptiveConfig(measure="never", cost_curve=[1.0, 2.0, 3.0]), info(CostCurve(busy)))
    configured.start(["ngram"], seed=0, greedy=False)
    assert configured.cost.verify(3) == pytest.approx(3.0)


def test_a_lone_draft_trimmed_to_nothing_is_probed_whole_every_probe_every_steps():
    router = lone_router(CostCurve.linear(2.0), probe_every=4, probe_backoff=1.0,  # a fixed period (backoff: test_routers)
                         probe_share=1.0)  # (no floor from the probe's cost: its one node costs 2 forwards here)
    draft = DraftTree.chain(list(range(1, 9)))
    kept = []
    for _ in range(9):
        budgets = router.route(16, 1 << 16, [True])
        assert budgets == [16]
        keep = router.revise(16, 1 << 16, [True], [draft], budgets)
        kept.append((0 in router.forced, keep[0]))
        router.on_step(starved_step(8, keep[0]))  # nothing of it accepted
    # trimmed to nothing 3 steps in a row, then probed once: as much of it as adds at most probe_cost forwards (on this
    # steep curve, v(2) - v(1) = 2: one node; a flat curve keeps it whole); the counter restarts after the probe
    assert kept == [(False, 0)] * 3 + [(True, 1)] + [(False, 0)] * 3 + [(True, 1)] + [(False, 0)]
    flat = lone_router(CostCurve.linear(0.0), probe_every=4, probe_backoff=1.0)
    assert flat.probe_nodes(16) == 16
    # a step with no draft at all (no n-gram match) neither counts nor resets
    router.start(["ngram"], seed=0, greedy=True)
    for report in (starved_step(8, 0), starved_step(0, 0), starved_step(8, 0), starved_step(0, 0)):
        router.on_step(report)
    assert col(router, "starved") == [2]
    router.on_step(starved_step(8, 0))
    router.route(16, 1 << 16, [True])
    assert router.forced == {0}


def test_a_lone_proposer_is_routed_only_with_a_measured_cost_or_an_explicit_router():
    base = Target(build_model("llama"), build_tokenizer())
    plain = base.model  # the same weights for every target below
    want = specframe.load(target=base, proposers=["none"], max_new_tokens=24).generate(PROMPT)["token_ids"]

    def run(cost, **kw):
        target = Target(plain, base.tokenizer)
        target.info = replace(target.info, cost=cost)
        sf = specframe.load(target=target, proposers=[{"name": "ngram", "k": 8}], max_new_tokens=24, **kw)
        r = sf.generate_result(PROMPT)
        assert r.token_ids == want
        return r.metrics.drafted_nodes

    whole = run(None)  # no cost curve, no router: drafts verified whole
    assert whole > 0
    untimed = {"name": "adaptive", "measure": "never"}  # (timed, the router re-prices the curve from this machine)
    assert run(CostCurve.linear(0.0), router=untimed) == whole  # a flat measured curve keeps them whole
    steep = run(CostCurve.linear(2.0))  # nothing pays: only the probes are verified
    assert steep < whole
    assert run(CostCurve.linear(2.0), router="none") == whole  # `router: none` turns it off


def test_a_seed_gives_the_same_sampled_tokens_whatever_curve_the_load_switched_to():
    """Issue 25 item 11, end to end: the same seed at temperature 0.8, with the governor's curve quiet or busy
    (flat or steep: different routing under greedy), gives the same tokens; with v read live it would not."""
    base = Target(build_model("llama"), build_tokenizer())

    def tokens(live_t_ms):
        target = Target(base.model, base.tokenizer)
        curve = CostCurve({128: [10.0, 10.5, 11.0, 12.0, 14.0, 18.0]})  # the fixed (most-threads) curve
        curve.set(live_t_ms)  # what the thread governor switched to
        target.info = replace(target.info, cost=curve)
        sf = specframe.load(target=target, proposers=[{"name": "ngram", "k": 8}], max_new_tokens=40,
                            temperature=0.8, seed=3)
        return sf.generate_result(PROMPT).token_ids

    quiet = tokens({128: [10.0, 10.5, 11.0, 12.0, 14.0, 18.0]})
    busy = tokens({128: [20.0, 40.0, 80.0, 160.0, 320.0, 640.0]})
    assert quiet == busy and len(quiet) > 0


def test_a_seeded_sampled_request_gives_the_same_tokens_whatever_curve_was_measured():
    """Issue 39, 7: the same seed, one run with the quiet machine's measured curve and one with a busy machine's
    (and its governor's): the same tokens, the same forwards."""
    base = Target(build_model("llama"), build_tokenizer())
    quiet = {128: [10.0, 10.2, 10.4, 10.6, 10.8, 11.0]}
    busy = {128: [20.0, 40.0, 80.0, 160.0, 320.0, 640.0]}
    runs = []
    for measured in (CostCurve(quiet), CostCurve(busy), CostCurve(busy, fixed=busy)):
        target = Target(base.model, base.tokenizer)
        target.info = replace(target.info, cost=measured)
        sf = specframe.load(target=target, proposers=[{"name": "ngram", "k": 8}], max_new_tokens=32)
        r = sf.generate_result(PROMPT, temperature=0.8, seed=7)
        runs.append((r.token_ids, r.metrics.target_forwards, r.metrics.drafted_nodes))
    assert runs[0] == runs[1] == runs[2]


# --- plain decoding's best settings as the reference (issue 67, 5) --------------------------------------------------

SPLIT = {128: [47.0, 50.0, 51.0, 53.0, 63.0, 92.0], 512: [52.0, 55.5, 56.5, 58.5, 69.0, 100.0]}  # bf16/2t, T(1) 49.5


def test_the_router_reads_plain_decodings_best_t1_from_the_targets_curve():
    """The Xeon of issue 67: speculation on bf16/2t (T(1) 49.5 ms), plain decoding's best bf16/1t/packed (44.9 ms)."""
    assert lone_router(CostCurve(SPLIT, plain_t1_ms=44.9)).cost.plain() == pytest.approx(44.9 / 49.5)
    assert lone_router(CostCurve(SPLIT)).cost.plain() == 1.0  # no reference: these settings are the reference
    assert lone_router(None).cost.plain() == 1.0
    sampling = AdaptiveRouter(AdaptiveConfig(measure="never"), info(CostCurve(SPLIT, plain_t1_ms=44.9)))
    sampling.start(["ngram"], seed=0, greedy=False)
    assert sampling.cost.plain() == pytest.approx(44.9 / 49.5)  # (read for vs_plain only: it decides nothing)


def test_the_plain_reference_changes_no_decision():
    """Verifying nothing runs on the speculative settings too, so what pays is still judged against their own
    one-token forward: the same budgets and trims with or without the reference."""
    draft = DraftTree.chain(list(range(1, 9)))
    out = []
    for plain_t1 in (None, 44.9):
        router = lone_router(CostCurve(SPLIT, plain_t1_ms=plain_t1), probe_every=4)
        seen = []
        for step in range(12):
            budgets = router.route(16, 1 << 16, [True])
            keep = router.revise(16, 1 << 16, [True], [draft], budgets)
            seen.append((list(budgets), list(keep), sorted(router.forced)))
            s = ProposerStep("ngram", True, 16, 8, keep[0], (1,) * keep[0], min(keep[0], step % 3), 0, 0.0, False)
            router.on_step(StepReport((s,), keep[0], min(keep[0], step % 3), 0.0))
        out.append(seen)
    assert out[0] == out[1]


def test_a_request_below_plain_decodings_best_settings_is_said_once_per_lineup(caplog):
    from specframe_plugins.router.adaptive import PLAIN_FLOOR, PLAIN_STEPS

    # one TargetInfo, one lineup (named: the process-wide memory keys lineups by name and id)
    target = replace(info(CostCurve(SPLIT, plain_t1_ms=44.9)), name="below-plain-once")
    nothing = StepReport((ProposerStep("ngram", True, 16, 1, 1, (1,), 0, 0, 0.0, False),), 1, 0, 0.0)
    router = AdaptiveRouter(AdaptiveConfig(measure="never", explore=0.0), target)
    router.start(["ngram"], seed=0, greedy=True)
    assert router.vs_plain is None
    with caplog.at_level(logging.WARNING, logger="specframe"):
        for _ in range(PLAIN_STEPS - 1):
            router.on_step(nothing)  # one token per step for a forward over 2 tokens: below plain decoding
        assert "plain decoding's best settings" not in caplog.text  # not judged before PLAIN_STEPS steps
        router.on_step(nothing)
    v2 = CostCurve(SPLIT).v(2)
    assert router.vs_plain == pytest.approx(44.9 / 49.5 / v2) and router.vs_plain < PLAIN_FLOOR
    assert caplog.text.count("plain decoding's best settings") == 1 and "T(1) 44.9 ms against 49.5 ms" in caplog.text
    again = AdaptiveRouter(AdaptiveConfig(measure="never", explore=0.0), target)
    again.start(["ngram"], seed=0, greedy=True)
    with caplog.at_level(logging.WARNING, logger="specframe"):
        for _ in range(PLAIN_STEPS):
            again.on_step(nothing)
    assert caplog.text.count("plain decoding's best settings") == 1  # said once for the lineup
    caplog.clear()
    same = AdaptiveRouter(AdaptiveConfig(measure="never", explore=0.0), info(CostCurve(SPLIT)))
    same.start(["ngram"], seed=0, greedy=True)
    with caplog.at_level(logging.WARNING, logger="specframe"):
        for _ in range(PLAIN_STEPS):
            same.on_step(nothing)
    assert same.vs_plain == pytest.approx(1 / v2) and caplog.text == ""  # plain decoding's own settings: nothing to say
