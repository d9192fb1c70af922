"""Fault isolation when combining proposers: a faulty proposer disables only itself, and a faulty merge policy or
router (route or revise) changes nothing in the output."""

from __future__ import annotations

import logging

import pytest

from specframe import ProposerBase, ProposerConfig
from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from specframe.contracts.combining import MergePolicyBase, MergePolicyConfig, RouterBase, RouterConfig
from specframe.decode.engine import Engine
from specframe.sampling import SamplingParams
from specframe_plugins.merge_policies import PriorityConfig, PriorityPolicy

from tests.fakes import COMBINING_N_NEW as N_NEW  # the references in envs (conftest) hold N_NEW + 8 tokens
from tests.fakes import PROMPT, ScriptedChain, policy_of

# --- fault isolation per proposer -------------------------------------------------------------------------------------


class Faulty(ProposerBase):
    name = "faulty"

    def propose(self, state, budget):
        raise RuntimeError("boom")


def test_a_faulty_proposer_disables_only_itself(envs, caplog):
    target, refs, _ = envs["llama"]
    caplog.set_level(logging.WARNING, logger="specframe")
    proposers = [Faulty(ProposerConfig(name="faulty"), target.info), ScriptedChain(target.info, refs[0], k=3)]
    res = Engine(target, proposers, GreedyVerifier(), merge=policy_of("confidence")).generate(PROMPT, max_new_tokens=N_NEW)
    assert res.token_ids == refs[0][:N_NEW]
    m = res.metrics
    assert m.proposers["faulty"].faults == 3 and m.proposers["faulty"].disabled
    assert m.proposers["faulty"].steps == 3  # not called once disabled
    assert m.proposers["scripted"].faults == 0 and m.proposers["scripted"].accepted_nodes == m.accepted_nodes > 0
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
        assert bad.metrics.proposers["scripted"].accepted_nodes == bad.metrics.accepted_nodes > 0
