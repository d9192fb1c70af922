"""Combining several proposers in one verification pass (docs/combining.md): the merge primitive (dedup,
provenance, node budget, exactness rules), the built-in merge policies and the adaptive router, greedy exactness
on llama / qwen2 / qwen2-sliding with ngram + a tree proposer + the draft-model proposer, the sampling
distribution of merged trees (and a deliberately wrong merge that the same check catches), per-proposer feedback
and attribution, fault isolation per proposer, and the API / CLI / bench faces."""

from __future__ import annotations

import json
import logging
import math
import random
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

import specframe
from specframe import DraftTree, ProposerBase, ProposerConfig, hookimpl
from specframe.contracts import MergePolicyBase, MergePolicyConfig, ProposerStep, RouterBase, RouterConfig, StepReport
from specframe.engine import Engine
from specframe.errors import ConfigError
from specframe.merge import MergedDraft, check_plan, merge_drafts
from specframe.registry import build_registry
from specframe.sampling import SamplingParams, probs_from_logits
from specframe.target import Target
from specframe.testing.recorder import Recorder
from specframe.verifiers import GreedyVerifier, SpeculativeSamplingVerifier
from specframe_plugins.draft_model import DraftModelConfig, DraftModelProposer
from specframe_plugins.merge import ConfidenceConfig, ConfidencePolicy, PriorityConfig, PriorityPolicy, share_budget
from specframe_plugins.ngram import NgramConfig, NgramProposer
from specframe_plugins.router import AdaptiveConfig, AdaptiveRouter, _prefix_levels, load_cost_curve

from .support import ARCHS, PROMPT, PROMPT_2, VOCAB, build_model, build_tokenizer, check_metrics, hf_greedy

N_NEW = 32


def chain(ids, probs=None) -> DraftTree:
    return DraftTree.chain(ids, probs)


def tree(ids, parents, probs=None) -> DraftTree:
    return DraftTree(torch.tensor([ids]), torch.tensor([parents]), None if probs is None else probs[None])


def whole(drafts):
    """The priority plan: every draft whole, in order."""
    return [(j, d.num_nodes) for j, d in enumerate(drafts)]


def paths(t: DraftTree) -> list[tuple[int, ...]]:
    """Token path from the root to each node."""
    out: list[tuple[int, ...]] = []
    for tok, p in zip(t.token_ids[0].tolist(), t.parent[0].tolist()):
        out.append((out[p] if p >= 0 else ()) + (tok,))
    return out


# --- the merge primitive ---------------------------------------------------------------------------------------------


def test_merge_worked_example_greedy():
    m = merge_drafts([chain([1, 2, 3]), chain([1, 4])], [(0, 3), (1, 2)], 8, greedy=True)
    assert m.tree.token_ids.tolist() == [[1, 2, 3, 4]] and m.tree.parent.tolist() == [[-1, 0, 1, 0]]
    assert m.sources == (0b11, 0b01, 0b01, 0b10)
    assert m.node_of == ((0, 1, 2), (0, 3))
    assert m.tree.draft_probs is None


def test_sampling_merges_deterministic_duplicates_only():
    q = torch.softmax(torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(0)), -1)
    a = chain([3, 5], q)  # stochastic: its own q rows
    b, c = chain([3, 1]), chain([3, 4])  # deterministic, the same first token as each other and as a
    m = merge_drafts([a, b, c], whole([a, b, c]), 16, greedy=False)
    #            a3  a5  b3=c3  b1  c4
    assert m.tree.token_ids.tolist() == [[3, 5, 3, 1, 4]]
    assert m.tree.parent.tolist() == [[-1, 0, -1, 2, 2]]
    assert m.sources == (0b001, 0b001, 0b110, 0b010, 0b100)
    probs = m.tree.draft_probs[0]
    torch.testing.assert_close(probs[:2], q)  # the stochastic nodes keep their own q
    for node, tok in ((2, 3), (3, 1), (4, 4)):  # deterministic nodes: one-hot q
        assert probs[node, tok] == 1 and probs[node].sum() == 1
    # under greedy everything may merge, and no probabilities are carried
    g = merge_drafts([a, b, c], whole([a, b, c]), 16, greedy=True)
    assert g.tree.token_ids.tolist() == [[3, 5, 1, 4]] and g.tree.parent.tolist() == [[-1, 0, 0, 0]]
    assert g.sources == (0b111, 0b001, 0b010, 0b100) and g.tree.draft_probs is None


def test_two_stochastic_drafts_with_the_same_tokens_stay_apart():
    q = torch.full((2, VOCAB), 1.0 / VOCAB)
    m = merge_drafts([chain([7, 8], q), chain([7, 8], q)], [(0, 2), (1, 2)], 8, greedy=False)
    assert m.tree.parent.tolist() == [[-1, 0, -1, 2]] and m.sources == (1, 1, 2, 2)


def test_node_budget_takes_prefixes_and_duplicates_are_free():
    a, b = chain([1, 2, 3]), chain([1, 2, 9, 8])
    m = merge_drafts([a, b], whole([a, b]), 4, greedy=True)
    assert m.tree.token_ids.tolist() == [[1, 2, 3, 9]]  # b's 1 and 2 cost nothing, 9 takes the last node
    assert m.node_of == ((0, 1, 2), (0, 1, 3)) and m.kept(1) == 3  # 8 did not fit: b contributed a prefix
    m = merge_drafts([a, b], [(1, 2), (0, 3)], 2, greedy=True)  # plan order and quotas: b's first two, then a
    assert m.tree.token_ids.tolist() == [[1, 2]] and m.node_of == ((0, 1), (0, 1))
    assert merge_drafts([a, b], [], 4, greedy=True).tree.num_nodes == 0


@pytest.mark.parametrize("greedy", [True, False])
def test_every_node_keeps_its_own_path(greedy):
    """Random drafts (chains and trees, deterministic and stochastic): each own node maps to a merged node whose
    root path is the own node's root path, provenance bits match, and the merged tree is topological."""
    rng = random.Random(0)
    for _ in range(200):
        drafts = []
        for _ in range(rng.randint(1, 4)):
            n = rng.randint(0, 7)
            parents = [rng.randint(-1, i - 1) for i in range(n)]
            ids = [rng.randint(1, 4) for _ in range(n)]
            probs = torch.full((n, 5), 0.2) if rng.random() < 0.4 else None
            drafts.append(tree(ids, parents, probs))
        plan = [(j, rng.randint(0, d.num_nodes)) for j, d in enumerate(drafts)]
        rng.shuffle(plan)
        m = merge_drafts(drafts, plan, rng.randint(1, 20), greedy=greedy)
        merged_paths = paths(m.tree)
        par = m.tree.parent[0].tolist()
        assert all(p < i for i, p in enumerate(par))
        if greedy:  # every duplicate merged: no two nodes share a path
            assert len(set(merged_paths)) == m.tree.num_nodes
        for j, d in enumerate(drafts):
            own_paths = paths(d)
            for i, node in enumerate(m.node_of[j]):
                assert merged_paths[node] == own_paths[i]
                assert m.sources[node] >> j & 1
        for node, src in enumerate(m.sources):
            assert src and all(node in m.node_of[j] for j in range(len(drafts)) if src >> j & 1)
        if not greedy:  # a stochastic node is never shared
            for node, src in enumerate(m.sources):
                stochastic = [j for j in range(len(drafts)) if src >> j & 1 and drafts[j].draft_probs is not None]
                assert not stochastic or src == 1 << stochastic[0]


def test_own_accepted_credit_and_alone():
    a, b = chain([1, 2, 3]), tree([1, 5, 2], [-1, -1, 0])
    m = merge_drafts([a, b], whole([a, b]), 8, greedy=True)  # 1(ab) 2(ab) 3(a) 5(b)
    path = (0, 1, 2)
    assert m.own_accepted(0, path, a.parent[0].tolist()) == (0, 1, 2)
    assert m.own_accepted(1, path, b.parent[0].tolist()) == (0, 2)  # b's own node indices
    assert (m.credited(0, path), m.credited(1, path), m.alone(0, path), m.alone(1, path)) == (3, 2, 1, 0)
    single = MergedDraft.single(a)
    assert single.own_accepted(0, (0, 1), a.parent[0].tolist()) == (0, 1) and single.sources == (1, 1, 1)


def test_check_plan():
    assert check_plan([(1, 3), (0, 0)], 2) == [(1, 3), (0, 0)]
    for bad in ([(2, 1)], [(0, 1), (0, 2)], [(0, -1)]):
        with pytest.raises(ValueError):
            check_plan(bad, 2)


# --- exactness of merged trees under sampling (statistical) ---------------------------------------------------------

V = 6
P = torch.tensor([0.45, 0.05, 0.2, 0.02, 0.1, 0.18])  # the target at every position (context-free)
Q = torch.tensor([0.5, 0.3, 0.02, 0.14, 0.02, 0.02])  # the stochastic proposer's q: often 1 and 3, which p rarely takes
TRIALS = 8_000


def merge_dedup_stochastic(drafts, plan, max_nodes, greedy=False):
    """BUG: merges a stochastic node into an existing node with the same token at the same path (keeping the
    existing node and its q), as one would under greedy. Recursive rejection would have subtracted the dropped
    node's q from the residual, so the emitted distribution shifts."""
    tokens, parents, rows, index, node_of = [], [], [], {}, []
    for j, quota in plan:
        d, own = drafts[j], []
        for i, (tok, p) in enumerate(zip(d.token_ids[0, :quota].tolist(), d.parent[0, :quota].tolist())):
            at = -1 if p < 0 else own[p]
            node = index.get((at, tok))
            if node is None:
                node = len(tokens)
                tokens.append(tok)
                parents.append(at)
                rows.append(torch.nn.functional.one_hot(torch.tensor(tok), V).float() if d.draft_probs is None
                            else d.draft_probs[0, i])
                index[(at, tok)] = node
            own.append(node)
        node_of.append(tuple(own))
    probs = torch.stack(rows)[None] if rows else None
    return MergedDraft(DraftTree(torch.tensor([tokens]).reshape(1, -1), torch.tensor([parents]).reshape(1, -1), probs),
                       (0,) * len(tokens), tuple(node_of))


def emitted_pairs(merge, order: str, trials: int, seed: int) -> torch.Tensor:
    """First two emitted tokens (as ``a * V + b``) of ``trials`` verifications of merged trees of a stochastic
    chain (two tokens drawn from Q, its q given) and three deterministic chains — two of them share their first
    token, 3, and the third starts with 1: the stochastic chain draws 1 or 3 at the same path 44 % of the time —
    through the real verifier. (A merge that drops the stochastic duplicates is off by TV 0.2 in the first token.)"""
    g = torch.Generator().manual_seed(seed)
    verifier, params = SpeculativeSamplingVerifier(), SamplingParams(temperature=1.0)
    logits = {}
    out = []
    for _ in range(trials):
        stochastic = chain(torch.multinomial(Q, 2, replacement=True, generator=g), Q.expand(2, -1).clone())
        deterministic = [chain([3, 1]), chain([3, 4]), chain([1, 2])]
        drafts = deterministic + [stochastic] if order == "deterministic-first" else [stochastic] + deterministic
        m = merge(drafts, whole(drafts), 16, greedy=False)
        n = m.tree.num_nodes
        if n not in logits:
            logits[n] = P.log().expand(1, n + 1, V).contiguous()
        res = verifier.verify(m.tree, logits[n], params, g)
        toks = [int(m.tree.token_ids[0, i]) for i in res.accepted_nodes[0]] + [res.next_token[0]]
        if len(toks) == 1:  # nothing accepted: the second token comes from a fresh step, drawn from the target
            toks.append(int(torch.multinomial(P, 1, generator=g)))
        out.append(toks[0] * V + toks[1])
    return torch.tensor(out)


def tv(samples: torch.Tensor, probs: torch.Tensor) -> float:
    freq = torch.bincount(samples, minlength=probs.numel()).double() / samples.numel()
    return 0.5 * float((freq - probs.double().flatten()).abs().sum())


@pytest.mark.parametrize("order", ["deterministic-first", "stochastic-first"])
def test_merged_trees_emit_the_target_distribution(order):
    pairs = emitted_pairs(merge_drafts, order, TRIALS, seed=1)
    assert tv(pairs // V, P) <= math.sqrt(V / TRIALS)  # first token ~ p
    assert tv(pairs, P[:, None] * P[None, :]) <= math.sqrt(V * V / TRIALS)  # first two tokens ~ p x p


def test_the_check_catches_a_merge_that_deduplicates_stochastic_nodes():
    pairs = emitted_pairs(merge_dedup_stochastic, "deterministic-first", TRIALS, seed=1)
    assert tv(pairs // V, P) > 4 * math.sqrt(V / TRIALS)


# --- policies and the router ------------------------------------------------------------------------------------------


def test_priority_plan_and_config():
    policy = PriorityPolicy(PriorityConfig(max_nodes=5))
    assert policy.max_nodes == 5
    assert policy.plan([chain([1, 2]), DraftTree.empty(), chain([3])], 5) == [(0, 2), (1, 0), (2, 1)]
    with pytest.raises(Exception, match="max_nodes"):
        PriorityConfig(max_nodes=0)


def test_share_budget_water_fills():
    assert share_budget([6, 5], [0.6, 0.2], 8) == [(0, 6), (1, 2)]
    assert share_budget([3, 5], [0.6, 0.2], 8) == [(0, 3), (1, 5)]  # what one cannot use goes to the other
    assert share_budget([0, 5, 5], [0.9, 0.1, 0.1], 4) == [(1, 2), (2, 2)]  # an empty draft gets nothing
    assert share_budget([9, 9], [0.5, 0.5], 3) == [(0, 2), (1, 1)]  # ties: proposer order
    assert sum(q for _, q in share_budget([30, 30, 30], [0.7, 0.2, 0.05], 24)) == 24


def test_confidence_policy_follows_live_acceptance():
    policy = ConfidencePolicy(ConfidenceConfig(max_nodes=8, decay=0.5))
    policy.start(["a", "b"])
    drafts = [chain([1] * 8), chain([2] * 8)]
    assert policy.plan(drafts, 8) == [(0, 4), (1, 4)]  # equal priors
    for _ in range(4):  # b's drafts are accepted, a's are not
        policy.on_step(StepReport((step("a", drafted=8, accepted=0), step("b", drafted=8, accepted=6)), 16, 6, 0.01))
    plan = policy.plan(drafts, 8)
    assert plan[0][0] == 1 and plan[0][1] >= 6 and sum(q for _, q in plan) == 8


def step(name, drafted=0, accepted=0, asked=True, budget=8, proposed=None, depths=None, draft_s=0.001):
    proposed = drafted if proposed is None else proposed
    depths = tuple([1] * drafted) if depths is None else depths
    return ProposerStep(name, asked, budget if asked else 0, proposed, drafted, depths, accepted, accepted, draft_s,
                        False)


def test_router_drops_a_useless_proposer_and_probes_it_again():
    router = AdaptiveRouter(AdaptiveConfig(explore=0.0, probe_every=5))
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
    assert not router.timed and router.route(8, 16, [True, True])[1] == 0  # too costly to ever pay off
    for _ in range(5):  # measured times are ignored under sampling: the seed alone fixes the decisions
        router.on_step(StepReport((step("fast", 2, 2), step("slow", 0, 0, asked=False)), 2, 2, forward_s=9.0))
    assert router.t1 is None and router.draft_s == [0.0, 0.0]
    router.start(["fast", "slow"], seed=0, greedy=True)
    assert router.timed
    router.on_step(StepReport((step("fast", 2, 2, draft_s=0.5), step("slow", 0, 0, asked=False)), 2, 2, forward_s=0.1))
    assert router.t1 == pytest.approx(0.1 / router.v(3)) and router._draft_cost(0) == pytest.approx(0.5 / router.t1)


def test_router_cost_curve_from_a_bench_profile(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"profile": {"v": [2.0, 2.0, 2.0, 8.0]}}))
    router = AdaptiveRouter(AdaptiveConfig(cost_profile=str(results)))
    assert router.curve == [1.0, 1.0, 1.0, 4.0] and router.v(3) == 1.0 and router.v(4) == 4.0
    # with 3 verified tokens free and a 4th costing 4x, one proposer gets at most 2 nodes
    router.start(["a"], seed=0, greedy=True)
    assert router.plan(16, 24, [True])[1] == [2]
    assert router.route(16, 24, [True]) == [16]  # free to draft: drafts fully ...
    assert router.revise(16, 24, [True], [chain(list(range(8)))], [16]) == [2]  # ... and keeps what pays
    assert AdaptiveRouter(AdaptiveConfig()).v(11) == pytest.approx(1.3)  # the linear default
    assert load_cost_curve(AdaptiveConfig(cost_curve=[1.0, 1.5])) == [1.0, 1.5]
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
    assert router.idle == [0, 1]
    # per-depth continuation rates: depths 1 and 2 were reached and accepted, depth 3 reached and rejected
    assert router.cont[0][:3] == pytest.approx([0.9 * 0.6 + 0.1, 0.9 * 0.6 + 0.1, 0.9 * 0.6])
    assert router.hit[0][:3] == pytest.approx([0.64, 0.64 ** 2, 0.64 ** 2 * 0.54])  # their running products
    assert router.cont[0][3:] == pytest.approx([0.6] * 9)  # depths it did not draft tell nothing about its hits
    assert router.hit[1] == pytest.approx(prior)  # not asked: unchanged
    # the unconditional reach also learns that a reached nothing past depth 2 (it was not cut short)
    assert router.reach[0][3] == pytest.approx(0.9 * 0.6 ** 4)
    # b asked (a tree: 2 roots, 1 child; nothing accepted), a left out
    router.on_step(StepReport((step("a", asked=False),
                               step("b", 3, 0, budget=4, depths=(2, 1))), 3, 0, 0.0))
    assert router.idle == [1, 0]
    # depth 1 was put to the test and failed; depth 2 was never reached, so its rate keeps the prior
    assert router.cont[1][:3] == pytest.approx([0.9 * 0.6, 0.6, 0.6])
    assert router.hit[1][:3] == pytest.approx([0.54, 0.54 * 0.6, 0.54 * 0.36])
    assert router.width[1][:2] == pytest.approx([0.9 + 0.1 * 2, 1.0])
    before = [list(h) for h in router.hit]  # a faulty step counts as asked (idle 0) but teaches nothing
    faulty = ProposerStep("a", True, 8, 0, 0, (), 0, 0, 0.0, True)
    router.on_step(StepReport((faulty, step("b", asked=False)), 0, 0, 0.0))
    assert router.idle == [0, 1] and router.hit == before


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
    assert all(r < 0.35 and c > 0.7 for c, r in zip(router.cont[0][:8], router.reach[0][:8]))
    assert all(h > r + 0.2 for h, r in zip(router.hit[0][:3], router.reach[0][:3]))
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
    router = AdaptiveRouter(AdaptiveConfig(draft_cost={"b": 0.3}, measure="never", explore=0.0, probe_every=3))
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


def test_prefix_levels_of_a_draft():
    # nodes(D): the shortest prefix (what DraftTree.truncate keeps) holding every node of depth <= D
    assert _prefix_levels(chain([4, 5, 6]), 12) == ([1, 2, 3],)
    assert _prefix_levels(chain([4, 5, 6]), 2) == ([1, 2],)  # no deeper than the plan's depth
    assert _prefix_levels(tree([1, 2, 3, 4, 5], [-1, -1, 0, 1, 2]), 12) == ([2, 4, 5],)  # depths 1 1 2 2 3
    # a root after a depth-2 node: depth 1 needs 3 nodes, so depth 2 does too
    assert _prefix_levels(tree([1, 2, 3, 4], [-1, 0, -1, 1]), 12) == ([3, 3, 4],)  # depths 1 2 1 3
    assert _prefix_levels(tree([1, 2, 3, 4], [-1, 0, -1, 1]), 1) == ([3],)
    assert _prefix_levels(DraftTree.empty(), 12) == ([],)


# --- proposers for the engine tests -----------------------------------------------------------------------------------


class ScriptedTree(ProposerBase):
    """A deterministic tree: a wrong branch first, then ``good`` correct tokens of the reference under the second
    root child. On a target that cannot take trees it drafts the correct chain."""

    name = "scripted-tree"
    produces_trees = True

    def __init__(self, target, reference: list[int], good: int = 3) -> None:
        super().__init__(ProposerConfig(name=self.name), target)
        self.reference, self.good = reference, good

    def propose(self, state, budget):
        done = state.num_generated
        right = self.reference[done : done + self.good]
        if not right:
            return DraftTree.empty()
        if not self.target.supports_trees:
            return chain(right)
        wrong = [(t + 1) % VOCAB for t in right]
        ids = [wrong[0], right[0]] + right[1:] + wrong[1:2]
        parents = [-1, -1] + list(range(1, len(right))) + [0][: len(wrong[1:2])]
        return tree(ids, parents).truncate(budget)


class ScriptedChain(ProposerBase):
    """Drafts ``k`` tokens of the reference, the ones from ``correct`` on made wrong."""

    name = "scripted"

    def __init__(self, target, reference: list[int], k: int = 4, correct: int | None = None, name: str = "scripted"):
        super().__init__(ProposerConfig(name=name), target)
        self.name = name
        self.reference, self.k, self.correct = reference, k, correct

    def propose(self, state, budget):
        done = state.num_generated
        draft = self.reference[done : done + min(self.k, budget)]
        c = len(draft) if self.correct is None else self.correct
        return chain(draft[:c] + [(t + 1) % VOCAB for t in draft[c:]]) if draft else DraftTree.empty()


class Faulty(ProposerBase):
    name = "faulty"

    def propose(self, state, budget):
        raise RuntimeError("boom")


def draft_dir(root: Path, arch: str) -> Path:
    """A different tiny random model with the same vocabulary: an HF draft for the draft-model proposer."""
    folder = root / f"draft-{arch}"
    if not folder.exists():
        build_model(arch, seed=1).save_pretrained(folder)
        build_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    root = tmp_path_factory.mktemp("combining")
    out = {}
    for arch in ARCHS:
        model = build_model(arch)
        target = Target(model, build_tokenizer(), name="specframe-test-combining")
        refs = [hf_greedy(model, p, N_NEW + 8) for p in (PROMPT, PROMPT_2)]
        out[arch] = (target, refs, draft_dir(root, arch))
    return out


def policy_of(name: str, max_nodes: int = 12):
    if name == "priority":
        return PriorityPolicy(PriorityConfig(max_nodes=max_nodes))
    return ConfidencePolicy(ConfidenceConfig(max_nodes=max_nodes))


# --- greedy: combined == plain greedy ---------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("policy", ["priority", "confidence"])
@pytest.mark.parametrize("routed", [False, True], ids=["no-router", "adaptive"])
def test_combined_greedy_equals_plain_greedy(envs, arch, policy, routed):
    target, refs, folder = envs[arch]
    for i, prompt in enumerate((PROMPT, PROMPT_2)):
        proposers = [
            Recorder(NgramProposer(NgramConfig(k=4), target.info), VOCAB),
            Recorder(ScriptedTree(target.info, refs[i]), VOCAB),
            Recorder(DraftModelProposer(DraftModelConfig(model=str(folder), k=3, min_confidence=0.0), target.info),
                     VOCAB),
        ]
        router = AdaptiveRouter(AdaptiveConfig()) if routed else None
        engine = Engine(target, proposers, GreedyVerifier(), merge=policy_of(policy), router=router)
        res = engine.generate(prompt, max_new_tokens=N_NEW)
        assert res.token_ids == refs[i][:N_NEW]
        check_metrics(res)
        m = res.metrics
        assert list(m.proposers) == ["ngram", "scripted-tree", "draft-model"]
        assert m.accepted_tokens > N_NEW // 3  # the scripted tree alone is accepted 3 deep per step
        credited = sum(pm.accepted_tokens for pm in m.proposers.values())
        alone = sum(pm.accepted_alone for pm in m.proposers.values())
        assert alone <= m.accepted_tokens <= credited
        assert m.drafted_tokens <= sum(pm.drafted_nodes for pm in m.proposers.values())
        for pm in m.proposers.values():
            assert pm.wasted_nodes == pm.drafted_nodes - pm.accepted_tokens >= 0
            assert pm.drafted_nodes <= pm.proposed_nodes and pm.faults == 0
            assert sum(pm.drafted_by_position) == pm.drafted_nodes
            assert sum(pm.accepted_by_position) == pm.accepted_tokens
        for rec in proposers:
            assert not rec.problems, rec.problems


def test_merged_trees_respect_the_node_budget_and_the_verifier_sees_one_tree(envs):
    target, refs, folder = envs["llama"]
    seen = []

    class Spy(GreedyVerifier):
        def verify(self, draft, target_logits, sampling, generator):
            seen.append((draft.num_nodes, target_logits.shape[1]))
            return super().verify(draft, target_logits, sampling, generator)

    proposers = [ScriptedChain(target.info, refs[0], k=6, correct=2), ScriptedTree(target.info, refs[0], good=4),
                 NgramProposer(NgramConfig(k=6), target.info)]
    res = Engine(target, proposers, Spy(), merge=policy_of("priority", max_nodes=5)).generate(PROMPT, max_new_tokens=N_NEW)
    assert res.token_ids == refs[0][:N_NEW]
    assert all(n <= 5 and rows == n + 1 for n, rows in seen)  # one forward over the merged tree
    assert len(seen) == res.metrics.target_forwards


def test_sliding_window_target_verifies_one_chain_the_policy_picks(envs):
    target, refs, _ = envs["qwen2-sliding"]
    assert not target.supports_trees
    chains = []

    class Spy(GreedyVerifier):
        def verify(self, draft, target_logits, sampling, generator):
            chains.append((draft.is_chain(), draft.token_ids[0].tolist()))
            return super().verify(draft, target_logits, sampling, generator)

    # two chains that diverge after their first token would make a tree: the first proposer's chain is verified
    a, b = ScriptedChain(target.info, refs[0], k=4, correct=1, name="a"), ScriptedChain(target.info, refs[0], k=4, name="b")
    res = Engine(target, [a, b], Spy(), merge=policy_of("priority")).generate(PROMPT, max_new_tokens=N_NEW)
    assert res.token_ids == refs[0][:N_NEW]
    assert all(is_chain for is_chain, _ in chains)
    a_m, b_m = res.metrics.proposers["a"], res.metrics.proposers["b"]
    assert a_m.drafted_nodes == a_m.proposed_nodes > 0  # a's chain every step
    assert b_m.drafted_nodes <= 1 and b_m.accepted_alone == 0  # b only where its draft was a's (a 1-token step)
    assert res.metrics.proposer_faults == 0


# --- feedback --------------------------------------------------------------------------------------------------------


def test_each_proposer_hears_about_its_own_draft(envs):
    target, refs, _ = envs["llama"]
    a = Recorder(ScriptedChain(target.info, refs[0], k=4, name="a"), VOCAB)  # always right
    b = Recorder(ScriptedChain(target.info, refs[0], k=3, correct=1, name="b"), VOCAB)  # right once, then wrong
    res = Engine(target, [a, b], GreedyVerifier(), merge=policy_of("priority")).generate(PROMPT, max_new_tokens=21)
    assert res.token_ids == refs[0][:21]
    for rec, want in ((a, lambda d: tuple(range(d.num_nodes))), (b, lambda d: (0,) if d.num_nodes else ())):
        outcomes = [c.outcome for c in rec.calls if c.method == "on_verified"]
        drafts = rec.drafts()
        assert len(outcomes) == res.metrics.target_forwards
        for o, d in zip(outcomes, drafts):
            assert torch.equal(o.draft.token_ids, d.token_ids)  # its own draft, own node indices
            assert o.accepted_nodes == (want(d),)
    m = res.metrics.proposers
    assert m["a"].accepted_tokens == res.metrics.accepted_tokens  # a's chain is the accepted path
    assert m["b"].accepted_tokens == m["a"].steps == m["b"].steps  # b's first node shared: credited to both
    assert m["b"].accepted_alone == 0 and m["a"].accepted_alone == res.metrics.accepted_tokens - m["b"].accepted_tokens


def test_a_truncated_draft_hears_about_the_part_that_was_verified(envs):
    target, refs, _ = envs["llama"]
    a = Recorder(ScriptedChain(target.info, refs[0], k=3, correct=0, name="a"), VOCAB)
    b = Recorder(ScriptedChain(target.info, refs[0], k=5, name="b"), VOCAB)
    res = Engine(target, [a, b], GreedyVerifier(), merge=policy_of("priority", max_nodes=5)).generate(
        PROMPT, max_new_tokens=13)
    assert res.token_ids == refs[0][:13]
    first = next(c.outcome for c in b.calls if c.method == "on_verified")
    assert first.draft.num_nodes == 2 and first.accepted_nodes == ((0, 1),)  # 3 of a's nodes, then 2 of b's
    assert res.metrics.proposers["b"].proposed_nodes > res.metrics.proposers["b"].drafted_nodes


class Alternate(RouterBase):
    """A test router: proposer 1 runs on even steps only."""

    name = "alternate"

    def start(self, proposers, seed, greedy):
        self.calls = 0

    def route(self, budget, max_nodes, available):
        self.calls += 1
        return [budget if ok and (j == 0 or self.calls % 2) else 0 for j, ok in enumerate(available)]


@pytest.mark.parametrize("arch", ARCHS)
def test_draft_model_skipped_by_the_router_catches_up(envs, tmp_path, arch):
    """The draft-model proposer is left out every other step; its KV cache catches up from the committed tokens
    when it is asked again. Its draft is the target itself, so every node it drafts must be accepted."""
    target, refs, _ = envs[arch]
    folder = tmp_path / "self"
    target.model.save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    dm = DraftModelProposer(DraftModelConfig(model=str(folder), k=3, min_confidence=0.0, schedule="constant"),
                            target.info)
    ngram = NgramProposer(NgramConfig(k=2), target.info)
    res = Engine(target, [ngram, dm], GreedyVerifier(), merge=policy_of("priority"),
                 router=Alternate(RouterConfig(name="alternate"))).generate(PROMPT, max_new_tokens=N_NEW)
    assert res.token_ids == refs[0][:N_NEW]
    pm = res.metrics.proposers["draft-model"]
    assert pm.skipped_steps >= 3 and pm.steps >= 3
    assert pm.accepted_tokens >= pm.drafted_nodes - 2 > 0  # (a near-tie may differ in the last float bits)


# --- fault isolation per proposer -------------------------------------------------------------------------------------


def test_a_faulty_proposer_disables_only_itself(envs, caplog):
    target, refs, _ = envs["llama"]
    caplog.set_level(logging.WARNING, logger="specframe")
    proposers = [Faulty(ProposerConfig(name="faulty"), target.info), ScriptedChain(target.info, refs[0], k=3)]
    res = Engine(target, proposers, GreedyVerifier(), merge=policy_of("confidence")).generate(PROMPT, max_new_tokens=N_NEW)
    assert res.token_ids == refs[0][:N_NEW]
    m = res.metrics
    assert m.proposers["faulty"].faults == 3 and m.proposers["faulty"].disabled
    assert m.proposers["faulty"].steps == 3  # not called once disabled
    assert m.proposers["scripted"].faults == 0 and m.proposers["scripted"].accepted_tokens == m.accepted_tokens > 0
    assert m.proposer_faults == 3 and not m.proposer_disabled  # one proposer still drafts
    warnings = [r.getMessage() for r in caplog.records if r.name == "specframe"]
    assert len(warnings) == 1 and "'faulty'" in warnings[0] and "output is unaffected" in warnings[0]


class BadPolicy(MergePolicyBase):
    name = "bad"

    def plan(self, drafts, max_nodes):
        return [(0, 1), (0, 1)]  # proposer 0 twice: malformed


class BadRouter(RouterBase):
    name = "bad-router"

    def route(self, budget, max_nodes, available):
        raise RuntimeError("router bug")


@pytest.mark.parametrize("mode", ["greedy", "sampling"])
def test_a_faulty_policy_or_router_changes_nothing(envs, caplog, mode):
    target, refs, _ = envs["llama"]
    sampling = SamplingParams() if mode == "greedy" else SamplingParams(temperature=1.0)
    verifier = GreedyVerifier() if mode == "greedy" else SpeculativeSamplingVerifier()

    def run(policy, router):
        proposers = [ScriptedChain(target.info, refs[0], k=3, correct=1, name="a"), ScriptedChain(target.info, refs[0], k=3)]
        return Engine(target, proposers, verifier, merge=policy, router=router).generate(
            PROMPT, max_new_tokens=20, sampling=sampling, seed=5)

    good = run(PriorityPolicy(PriorityConfig()), None)
    caplog.set_level(logging.WARNING, logger="specframe")
    bad = run(BadPolicy(MergePolicyConfig(policy="bad")), BadRouter(RouterConfig(name="bad-router")))
    assert bad.token_ids == good.token_ids
    if mode == "greedy":
        assert good.token_ids == refs[0][:20]
    warnings = [r.getMessage() for r in caplog.records if r.name == "specframe"]
    assert len(warnings) == 2 and any("router 'bad-router' raised RuntimeError in route" in w for w in warnings)
    assert any("merge policy 'bad' raised ValueError in plan" in w for w in warnings)


# --- the router's revise through the engine (a cascade) ------------------------------------------------------------


class Counting(ScriptedChain):
    """A scripted chain that counts its propose calls."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0

    def propose(self, state, budget):
        self.calls += 1
        return super().propose(state, budget)


class SkipMiddle(RouterBase):
    """Routes every proposer; once proposer 0 has drafted, skips proposer 1. Records what revise is shown."""

    name = "skip-middle"

    def start(self, proposers, seed, greedy):
        self.seen = []

    def revise(self, budget, max_nodes, available, drafts, budgets):
        self.seen.append(([None if d is None else d.num_nodes for d in drafts], list(budgets)))
        return [0 if j == 1 and d is None else b for j, (d, b) in enumerate(zip(drafts, budgets))]


def test_revise_skips_a_proposer_still_to_run(envs):
    target, refs, _ = envs["llama"]
    a, b = Counting(target.info, refs[0], k=4, name="a"), Counting(target.info, refs[0], k=4, name="b")
    c = Counting(target.info, refs[0], k=3, correct=1, name="c")
    router = SkipMiddle(RouterConfig(name="skip-middle"))
    res = Engine(target, [a, b, c], GreedyVerifier(), merge=policy_of("priority"), router=router).generate(
        PROMPT, max_new_tokens=N_NEW)
    assert res.token_ids == refs[0][:N_NEW]
    check_metrics(res)
    m = res.metrics.proposers
    steps = m["a"].steps
    assert steps == a.calls == c.calls == m["c"].steps > 0
    assert b.calls == 0 and m["b"].steps == 0 and m["b"].skipped_steps == steps  # skipped by revise, every step
    assert m["b"].proposed_nodes == m["b"].drafted_nodes == 0 and m["a"].skipped_steps == m["c"].skipped_steps == 0
    # revise after each proposer that ran: a (b and c still to run: None), then c (b skipped: an empty draft)
    assert len(router.seen) == 2 * steps
    for (after_a, budgets_a), (after_c, budgets_c) in zip(router.seen[::2], router.seen[1::2]):
        assert after_a[1:] == [None, None] and after_a[0] > 0 and budgets_a[1] > 0
        assert after_c[0] == after_a[0] and after_c[1] == 0 and after_c[2] > 0 and budgets_c[1] == 0


class BadRevise(RouterBase):
    """Routes every proposer but the second; its revise raises or returns a malformed list."""

    name = "bad-revise"

    def __init__(self, config, mode):
        super().__init__(config)
        self.mode, self.routes, self.revises = mode, 0, 0

    def route(self, budget, max_nodes, available):
        self.routes += 1
        return [budget, 0]

    def revise(self, budget, max_nodes, available, drafts, budgets):
        self.revises += 1
        if self.mode == "raises":
            raise RuntimeError("revise bug")
        return [1] if self.mode == "short" else [1, -1]


@pytest.mark.parametrize("mode, error", [("raises", "RuntimeError"), ("short", "ValueError"),
                                         ("negative", "ValueError")])
@pytest.mark.parametrize("sampling", ["greedy", "sampling"])
def test_a_faulty_revise_drops_the_router_and_changes_nothing(envs, caplog, mode, error, sampling):
    target, refs, _ = envs["llama"]
    params = SamplingParams() if sampling == "greedy" else SamplingParams(temperature=1.0)
    verifier = GreedyVerifier() if sampling == "greedy" else SpeculativeSamplingVerifier()

    def run(router):
        proposers = [ScriptedChain(target.info, refs[0], k=3, correct=1, name="a"),
                     ScriptedChain(target.info, refs[0], k=3)]
        return Engine(target, proposers, verifier, merge=policy_of("priority"), router=router).generate(
            PROMPT, max_new_tokens=20, sampling=params, seed=5)

    good = run(None)
    caplog.set_level(logging.WARNING, logger="specframe")
    router = BadRevise(RouterConfig(name="bad-revise"), mode)
    bad = run(router)
    assert bad.token_ids == good.token_ids
    if sampling == "greedy":
        assert good.token_ids == refs[0][:20]
    warnings = [r.getMessage() for r in caplog.records if r.name == "specframe"]
    assert len(warnings) == 1 and f"router 'bad-revise' raised {error} in revise" in warnings[0]
    assert router.routes == router.revises == 1  # dropped for the rest of the request
    # from the fault on, every proposer runs with the full budget (the second too, in the step that faulted)
    assert bad.metrics.proposers["scripted"].skipped_steps == 0
    assert bad.metrics.proposers["scripted"].steps == bad.metrics.proposers["a"].steps > 1
    if sampling == "greedy":  # (its drafts are the greedy continuation)
        assert bad.metrics.proposers["scripted"].accepted_tokens == bad.metrics.accepted_tokens > 0


class Trim(RouterBase):
    """Keeps the first ``keep[j]`` nodes of each draft (budgets ahead as routed)."""

    name = "trim"

    def __init__(self, config, keep):
        super().__init__(config)
        self.keep = keep

    def revise(self, budget, max_nodes, available, drafts, budgets):
        return [b if d is None else k for d, b, k in zip(drafts, budgets, self.keep)]


@pytest.mark.parametrize("keep_b", [1, 0])
def test_revise_trims_drafts_and_greedy_output_is_unchanged(envs, keep_b):
    target, refs, _ = envs["llama"]
    verified = []

    class Spy(GreedyVerifier):
        def verify(self, draft, target_logits, sampling, generator):
            verified.append(draft.token_ids[0].tolist())
            return super().verify(draft, target_logits, sampling, generator)

    a = Recorder(ScriptedChain(target.info, refs[0], k=4, name="a"), VOCAB)  # always right
    b = Recorder(ScriptedChain(target.info, refs[0], k=4, correct=0, name="b"), VOCAB)  # always wrong
    router = Trim(RouterConfig(name="trim"), [2, keep_b])
    res = Engine(target, [a, b], Spy(), merge=policy_of("priority"), router=router).generate(
        PROMPT, max_new_tokens=N_NEW)
    assert res.token_ids == refs[0][:N_NEW]
    check_metrics(res)
    m = res.metrics.proposers
    # the merged tree: a's first 2 nodes, then b's first keep_b (b's first token differs from a's)
    assert verified and all(len(ids) <= 2 + keep_b for ids in verified)
    assert any(len(ids) == 2 + keep_b for ids in verified)
    assert m["a"].proposed_nodes > m["a"].drafted_nodes
    assert 2 * m["a"].steps - 2 <= m["a"].drafted_nodes <= 2 * m["a"].steps  # (the last step's budget may be 1)
    assert m["b"].proposed_nodes > m["b"].drafted_nodes and m["b"].drafted_nodes <= keep_b * m["b"].steps
    assert m["a"].accepted_tokens == res.metrics.accepted_tokens > 0 and m["b"].accepted_tokens == 0
    # each proposer hears about the part of its draft that was verified
    for rec, k in ((a, 2), (b, keep_b)):
        outcomes = [c.outcome for c in rec.calls if c.method == "on_verified"]
        assert outcomes and all(o.draft.num_nodes <= k for o in outcomes)
        assert any(d.num_nodes > k for d in rec.drafts())  # ... while it drafted more


class EveryNth(ScriptedChain):
    """Drafts its chain of the reference on every ``every``-th call only (an n-gram table that rarely matches, but
    is right when it does); records (tokens generated, nodes drafted) per call."""

    def __init__(self, *args, every: int = 5, **kwargs):
        super().__init__(*args, **kwargs)
        self.every, self.calls = every, []

    def propose(self, state, budget):
        draft = super().propose(state, budget) if len(self.calls) % self.every == 0 else DraftTree.empty()
        self.calls.append((state.num_generated, draft.num_nodes))
        return draft


def test_adaptive_cascade_runs_the_costly_proposer_only_when_the_cheap_one_drafted_little(envs):
    target, refs, _ = envs["llama"]
    cheap = EveryNth(target.info, refs[0], k=8, name="cheap", every=3)
    costly = Recorder(ScriptedChain(target.info, refs[0], k=1, name="costly"), VOCAB)
    router = AdaptiveRouter(AdaptiveConfig(draft_cost={"costly": 0.3}, measure="never", explore=0.0,
                                           probe_every=1000))
    res = Engine(target, [cheap, costly], GreedyVerifier(), merge=policy_of("priority", 16), router=router).generate(
        PROMPT, max_new_tokens=N_NEW)
    assert res.token_ids == refs[0][:N_NEW]
    check_metrics(res)
    ran = {len(c.tokens) - len(PROMPT) for c in costly.calls if c.method == "propose"}
    full = {n for n, k in cheap.calls if k == 8}
    empty = {n for n, k in cheap.calls if k == 0}
    assert len(cheap.calls) == res.metrics.proposers["cheap"].steps  # free to draft: asked every step
    assert full - {0} and not ran & full  # the cheap proposer's long chain: the costly one is skipped ...
    assert len(ran & empty) >= 3  # ... and run when the cheap one had nothing
    m = res.metrics.proposers["costly"]
    assert m.skipped_steps > 0 and m.steps == len(ran) and m.accepted_tokens > 0


# --- sampling through the engine --------------------------------------------------------------------------------------


class QSampler(ProposerBase):
    """A stochastic chain: ``k`` tokens sampled from a fixed q with the request's generator, q given."""

    name = "q-sampler"
    provides_draft_probs = True

    def __init__(self, target, q, k):
        super().__init__(ProposerConfig(name=self.name), target)
        self.q, self.k = q, k

    def propose(self, state, budget):
        k = min(self.k, budget)
        tokens = torch.multinomial(self.q, k, replacement=True, generator=state.generator)
        return chain(tokens, self.q.expand(k, -1).clone())


class Mode(ProposerBase):
    """Deterministic: always proposes q's most likely token (so it often equals the stochastic chain's first)."""

    name = "mode"

    def __init__(self, target, q, name="mode", k=1):
        super().__init__(ProposerConfig(name=name), target)
        self.name, self.token, self.k = name, int(q.argmax()), k

    def propose(self, state, budget):
        return chain([self.token] * min(self.k, budget))


@pytest.fixture(scope="module")
def peaky_target():
    model = build_model("llama", seed=3, vocab_size=16, initializer_range=0.3, max_position_embeddings=4096)
    return Target(model, None)


@pytest.mark.parametrize("routed", [False, True], ids=["no-router", "adaptive"])
def test_combined_sampling_is_calibrated(peaky_target, routed):
    """One long sampled generation with a stochastic chain, ngram and two deterministic proposers that often
    draft the stochastic chain's token at the same path (see test_engine_sampling_is_calibrated in
    test_sampling_exactness.py for the statistics)."""
    target, vocab, n = peaky_target, 16, 1500
    params = SamplingParams(temperature=1.0, top_k=12)
    prompt = [1, 2, 3, 1, 2, 3, 4]
    with torch.inference_mode():  # q: the target's average next-token distribution over the prompt
        q = probs_from_logits(target.model(input_ids=torch.tensor([prompt])).logits[0], params).mean(0)
    proposers = [Mode(target.info, q, "mode", 2), QSampler(target.info, q, 3),
                 NgramProposer(NgramConfig(k=3, max_n=3), target.info), Mode(target.info, q, "mode-1", 1)]
    router = AdaptiveRouter(AdaptiveConfig()) if routed else None
    engine = Engine(target, proposers, SpeculativeSamplingVerifier(), merge=policy_of("priority", 8), router=router)
    result = engine.generate(prompt, max_new_tokens=n, sampling=params, seed=1)
    assert len(result.token_ids) == n and result.metrics.proposer_faults == 0
    m = result.metrics
    if not routed:  # every proposer's drafts got accepted (and rejected)
        assert all(pm.accepted_tokens > 25 for pm in m.proposers.values())
        assert m.proposers["mode-1"].accepted_alone == 0  # always the same node as mode's first: shared credit
    again = [engine.generate(prompt, max_new_tokens=40, sampling=params, seed=s).token_ids for s in (7, 7, 8)]
    assert again[0] == again[1] != again[2]  # seeded: same seed, same tokens
    with torch.inference_mode():
        logits = target.model(input_ids=torch.tensor([prompt + result.token_ids])).logits[0, len(prompt) - 1 : -1]
    p = probs_from_logits(logits, params).double()
    y = torch.tensor(result.token_ids)
    freq = torch.bincount(y, minlength=vocab).double() / n
    assert 0.5 * (freq - p.mean(0)).abs().sum().item() <= math.sqrt(vocab / n)
    chosen = p[torch.arange(n), y]
    expected = (p**2).sum(-1)
    z = (chosen - expected).sum() / ((p**3).sum(-1) - expected**2).sum().sqrt()
    assert abs(z.item()) < 4, f"calibration z-score {z.item():+.2f}"


# --- the public faces ---------------------------------------------------------------------------------------------------


class _Plugin:
    def __init__(self, *classes):
        self.classes = classes

    @hookimpl
    def specframe_register_proposers(self, register):
        for cls in self.classes:
            register(cls)


class Events:
    def __init__(self):
        self.steps = []

    @hookimpl
    def specframe_observe_step(self, event):
        self.steps.append(event)


def test_api_json_attribution_and_observer_events(envs):
    target, refs, _ = envs["llama"]
    events = Events()
    sf = specframe.load(target=target, registry=build_registry(extra_plugins=(events,)),
                        proposers=[{"name": "ngram", "k": 4}, {"name": "ngram", "k": 2, "max_n": 2}],
                        merge={"policy": "confidence", "max_nodes": 6}, router="none")
    record = sf.generate(PROMPT, max_new_tokens=N_NEW)
    assert record["token_ids"] == refs[0][:N_NEW]
    m = record["metrics"]
    assert list(m["proposers"]) == ["ngram", "ngram#2"]
    for entry in m["proposers"].values():
        assert {"drafted_nodes", "accepted_tokens", "accepted_alone", "wasted_nodes", "draft_s", "acceptance_rate",
                "steps", "skipped_steps", "faults", "disabled"} <= set(entry)
        assert entry["steps"] == m["target_forwards"] - 1 or entry["steps"] == m["target_forwards"]
    assert len(events.steps) == m["target_forwards"]
    assert {e.proposer for e in events.steps} == {"ngram+ngram#2"}
    for label in ("ngram", "ngram#2"):
        assert sum(s.accepted for e in events.steps for s in e.attribution if s.name == label) == \
            m["proposers"][label]["accepted_tokens"]
    # a single proposer has its attribution too, equal to the request's counts
    single = sf.generate(PROMPT, max_new_tokens=N_NEW, proposers=[{"name": "ngram"}])["metrics"]
    assert single["proposers"]["ngram"]["accepted_tokens"] == single["accepted_tokens"]
    assert single["proposers"]["ngram"]["drafted_nodes"] == single["drafted_tokens"]
    # per-request overrides of the merge policy and router
    assert sf.generate(PROMPT, max_new_tokens=8, merge="priority", router="adaptive")["token_ids"] == refs[0][:8]


@pytest.mark.parametrize("settings, needle", [
    ({"merge": {"policy": "nope"}}, "unknown merge policy 'nope'"),
    ({"merge": {"max_nodes": 0}}, "merge.max_nodes"),
    ({"merge": {"policy": "priority", "decay": 0.5}}, "merge policy 'priority': decay"),
    ({"merge": {"policy": "confidence", "decay": 2}}, "decay"),
    ({"router": "nope"}, "unknown router 'nope'"),
    ({"router": {"name": "adaptive", "probe_every": 0}}, "probe_every"),
    ({"router": {"name": "none", "decay": 0.5}}, "router: none takes no options"),
])
@pytest.mark.parametrize("proposers", [[{"name": "ngram"}, {"name": "ngram", "k": 2}], [{"name": "ngram"}]],
                         ids=["combined", "single"])
def test_combination_settings_are_validated_at_load(envs, settings, needle, proposers):
    # with a single proposer too: a typo fails now, not on the day a second proposer is added
    target, _, _ = envs["llama"]
    with pytest.raises((ConfigError, KeyError), match=needle):
        specframe.load(target=target, registry=build_registry(), proposers=proposers, **settings)


def test_cli_combines_repeated_proposers(tmp_path):
    from typer.testing import CliRunner

    from specframe import cli

    model = build_model("llama")
    model.save_pretrained(tmp_path)
    build_tokenizer().save_pretrained(tmp_path)
    prompt = " ".join(build_tokenizer().convert_ids_to_tokens(PROMPT))
    base = [prompt, "--model", str(tmp_path), "--dtype", "float32", "--no-chat", "--max-new-tokens", "12"]
    result = CliRunner().invoke(cli.app, ["generate", *base, "--json", "--proposer", "ngram", "--proposer", "none",
                                          "--merge", "confidence", "--max-nodes", "8", "--router", "none"])
    assert result.exit_code == 0, (result.output, result.exception)
    (record,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert record["token_ids"] == hf_greedy(model, PROMPT, 12)
    assert list(record["metrics"]["proposers"]) == ["ngram", "none"]
    result = CliRunner().invoke(cli.app, ["generate", *base, "--proposer", "ngram", "--proposer", "none"])
    assert result.exit_code == 0 and "ngram: " in result.stderr and "none: " in result.stderr
    bad = CliRunner().invoke(cli.app, ["generate", *base, "--proposer", "ngram", "--proposer", "none", "--merge", "x"])
    assert bad.exit_code == 2 and "unknown merge policy 'x'" in bad.stderr


def test_bench_strategy_combining_proposers_reports_attribution(envs):
    from specframe.bench.config import BenchConfig
    from specframe.bench.report import aggregate, render_markdown
    from specframe.bench.runner import BenchRunner, environment, lossless_check
    from specframe.prompts import Prompt

    target, _, _ = envs["llama"]
    sf = specframe.load(target=target, registry=build_registry())
    cfg = BenchConfig.model_validate(dict(max_new_tokens=12, warmup=0, strategies=[
        {"name": "combo", "proposers": [{"name": "ngram", "k": 4}, {"name": "ngram", "k": 2, "max_n": 2}],
         "merge": {"policy": "priority", "max_nodes": 6}, "router": "adaptive"},
    ]))
    questions = [Prompt("aa ab ac aa ab ad ae aa ab", 1, "summarization"), Prompt("ba bb bc ba bb bd", 2, "qa")]
    records = BenchRunner(sf, cfg).run(questions)
    assert lossless_check(sf, records, questions, cfg.chat) == []
    summary = aggregate(records, [s.name for s in cfg.strategies])
    attribution = summary["strategies"]["combo"]["attribution"]
    assert set(attribution) == {"ngram", "ngram#2"}
    assert all(0 <= a["acceptance_rate"] <= 1 and a["run_share"] <= 1 for a in attribution.values())
    results = {"config": cfg.model_dump(), "environment": environment(), "summary": summary, "lossless": [],
               "records": records, "profile": None}
    text = render_markdown(results, [])
    assert "## Attribution by proposer" in text and "### combo" in text and "| ngram#2 |" in text
    with pytest.raises(Exception, match="not peers"):
        BenchConfig.model_validate(dict(strategies=[{"name": "p", "peer": "hf-greedy", "router": "none"}]))


# --- a third-party merge policy, as docs/combining.md writes it --------------------------------------------------------


def docs_policy_module():
    """The example of docs/combining.md, executed from the document itself."""
    text = (Path(__file__).parents[1] / "docs" / "combining.md").read_text()
    code = text.split("## Writing a merge policy")[1].split("```python\n")[1].split("```")[0]
    namespace: dict = {"__name__": "docs_policy"}
    exec(compile(code, "docs/combining.md", "exec", dont_inherit=True), namespace)  # (not this module's __future__)
    return type("DocsPolicy", (), {"specframe_register_merge_policies": staticmethod(
        namespace["specframe_register_merge_policies"])})()


def test_the_documented_merge_policy_plugin_works(envs):
    target, refs, _ = envs["llama"]
    reg = build_registry(extra_plugins=(docs_policy_module(),))
    assert "shortest-first" in reg.merge_policies
    sf = specframe.load(target=target, registry=reg, proposers=[{"name": "ngram", "k": 6}, {"name": "ngram", "k": 2}],
                        merge={"policy": "shortest-first", "max_nodes": 6})
    record = sf.generate(PROMPT, max_new_tokens=N_NEW)
    assert record["token_ids"] == refs[0][:N_NEW]
    with pytest.raises(ConfigError, match="shortest-first"):
        specframe.load(target=target, registry=reg, proposers=[{"name": "ngram"}, {"name": "none"}],
                       merge={"policy": "shortest-first", "width": 3})


def test_merge_policy_and_router_contracts_are_checked():
    from specframe.errors import PluginContractError

    class Plain(MergePolicyBase):
        name = "plain"  # MergePolicyBase's Config, MergePolicyConfig itself, is a valid config model

    class NoPlan:
        name = "no-plan"
        Config = MergePolicyConfig

        def start(self, proposers): ...

        def on_step(self, report): ...

    class NoneRouter(RouterBase):
        name = "none"

    def plugin(hook, cls):
        return type("P", (), {hook: staticmethod(hookimpl(lambda register: register(cls)))})()

    assert build_registry(entry_points=False, extra_plugins=(
        plugin("specframe_register_merge_policies", Plain),)).merge_policies == {"plain": Plain}
    with pytest.raises(PluginContractError, match="method `plan` is missing"):
        build_registry(entry_points=False, extra_plugins=(plugin("specframe_register_merge_policies", NoPlan),))
    with pytest.raises(PluginContractError, match="'none' is reserved"):
        build_registry(entry_points=False, extra_plugins=(plugin("specframe_register_routers", NoneRouter),))


def test_one_proposer_needs_no_merge_policy_installed(envs, monkeypatch):
    from specframe.config import SpecframeConfig
    from specframe.registry import ALLOW_ENV

    target, refs, _ = envs["llama"]
    monkeypatch.setenv(ALLOW_ENV, "ngram")  # neither the merge policies nor the router are loaded
    sf = specframe.load(SpecframeConfig(proposers=[{"name": "ngram"}]), target=target)
    assert sf.generate(PROMPT, max_new_tokens=8)["token_ids"] == refs[0][:8]
    with pytest.raises(KeyError, match=r"unknown merge policy 'priority'; installed: \(none\)"):
        specframe.load(SpecframeConfig(proposers=[{"name": "ngram"}, {"name": "ngram", "k": 3}]), target=target)


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
    assert len(warned) == 1 and router.configured_cost == [0.0, 0.0]  # a misspelt label is named once, not used
