"""Routers through the engine: a proposer left out by the router catches up, and the router's revise (skipping a
proposer still to run, trimming drafts, the adaptive cascade) leaves greedy output unchanged."""

from __future__ import annotations

import pytest

from specframe import DraftTree
from specframe.acceptance import GreedyVerifier
from specframe.contracts.combining import RouterBase, RouterConfig
from specframe.decode.engine import Engine
from specframe.testing.calls import CallLog
from specframe_plugins.draft_model import DraftModelConfig, DraftModelProposer
from specframe_plugins.ngram import NgramConfig, NgramProposer
from specframe_plugins.router import AdaptiveConfig, AdaptiveRouter

from tests.fakes import ARCHS, PROMPT, VOCAB, ScriptedChain, build_tokenizer, check_metrics, policy_of
from tests.fakes import COMBINING_N_NEW as N_NEW  # the references in envs (conftest) hold N_NEW + 8 tokens


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
    assert pm.accepted_nodes >= pm.drafted_nodes - 2 > 0  # (a near-tie may differ in the last float bits)


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

    a = CallLog(ScriptedChain(target.info, refs[0], k=4, name="a"), VOCAB)  # always right
    b = CallLog(ScriptedChain(target.info, refs[0], k=4, correct=0, name="b"), VOCAB)  # always wrong
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
    assert m["a"].accepted_nodes == res.metrics.accepted_nodes > 0 and m["b"].accepted_nodes == 0
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
    costly = CallLog(ScriptedChain(target.info, refs[0], k=1, name="costly"), VOCAB)
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
    assert m.skipped_steps > 0 and m.steps == len(ran) and m.accepted_nodes > 0
