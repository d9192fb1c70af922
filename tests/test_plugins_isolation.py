"""Deliberately broken proposer plugins, one per fault kind: the output is identical to the `none` proposer's,
the user gets exactly one warning naming the plugin, the metrics count the faults, and repeated faults disable
the proposer for the rest of the request."""

from __future__ import annotations

import logging
import time

import pytest
import torch

import specframe
from specframe import DraftTree, ProposerBase, ProposerConfig, hookimpl
from specframe.engine import Engine
from specframe.errors import ConfigError
from specframe.isolation import IsolationPolicy
from specframe.registry import build_registry
from specframe.sampling import SamplingParams
from specframe.verifiers import GreedyVerifier, SpeculativeSamplingVerifier

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
N_NEW = 20
SAMPLING = SamplingParams(temperature=1.0)


def draft_for(kind: str, state, vocab: int):
    """The broken draft of each malformed kind (all other fields valid)."""
    ok_ids = torch.tensor([[3, 4]])
    chain = torch.tensor([[-1, 0]])
    q = torch.full((1, 2, vocab), 1.0 / vocab)
    return {
        "wrong-dtype": lambda: DraftTree(ok_ids.to(torch.int32), chain.to(torch.int32)),
        "wrong-shape": lambda: DraftTree(torch.tensor([3, 4]), torch.tensor([-1, 0])),
        "wrong-batch": lambda: DraftTree(ok_ids.repeat(2, 1), chain.repeat(2, 1)),
        "out-of-vocab": lambda: DraftTree(torch.tensor([[3, vocab]]), chain),
        "negative-id": lambda: DraftTree(torch.tensor([[-1, 3]]), chain),
        "probs-not-summing-to-one": lambda: DraftTree(ok_ids, chain, q * 0.5),
        "probs-wrong-shape": lambda: DraftTree(ok_ids, chain, q[:, :, :-1]),
        "probs-nan": lambda: DraftTree(ok_ids, chain, torch.full_like(q, float("nan"))),
        "parents-out-of-order": lambda: DraftTree(ok_ids, torch.tensor([[1, -1]])),
        "tree-for-a-chain-verifier": lambda: DraftTree(ok_ids, torch.tensor([[-1, -1]])),
        "not-a-draft": lambda: [3, 4],
    }[kind]()


MALFORMED = [
    "wrong-dtype", "wrong-shape", "wrong-batch", "out-of-vocab", "negative-id", "probs-not-summing-to-one",
    "probs-wrong-shape", "probs-nan", "parents-out-of-order", "tree-for-a-chain-verifier", "not-a-draft",
]


class BrokenConfig(ProposerConfig):
    name: str = "broken"


class Broken(ProposerBase):
    """Faults in the way ``kind`` says; counts how often the engine called it."""

    name = "broken"
    Config = BrokenConfig
    kind = "raise"

    def __init__(self, config, target) -> None:
        super().__init__(config, target)
        self.calls = 0

    def propose(self, state, budget):
        self.calls += 1
        if self.kind == "raise":
            raise RuntimeError("boom")
        if self.kind == "slow":
            time.sleep(0.02)
            return DraftTree.chain([3])
        return draft_for(self.kind, state, self.target.vocab_size)


class BrokenOnVerified(Broken):
    kind = "ok"

    def propose(self, state, budget):
        self.calls += 1
        return DraftTree.empty()

    def on_verified(self, outcome):
        raise KeyError("feedback")


class BrokenStart(BrokenOnVerified):
    def on_verified(self, outcome):
        return None

    def start(self, state):
        raise ValueError("cannot start")


class Plugin:
    """A plugin object registering one class (as a third-party module would through its entry point)."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    @hookimpl
    def specframe_register_proposers(self, register) -> None:
        register(self.cls)


def none_output(target, sampling: SamplingParams, seed: int = 0) -> list[int]:
    from specframe_plugins.autoregressive import NoneConfig, NoProposer

    verifier = GreedyVerifier() if sampling.is_greedy else SpeculativeSamplingVerifier()
    engine = Engine(target, [NoProposer(NoneConfig(), target.info)], verifier)
    return engine.generate(PROMPT, max_new_tokens=N_NEW, sampling=sampling, seed=seed).token_ids


def broken_class(kind: str) -> type:
    return type(f"Broken_{kind}", (Broken,), {"kind": kind, "name": f"broken-{kind}"})


def run_through_api(target, cls: type, sampling: SamplingParams, **isolation):
    """Load the broken class as a plugin and generate through the public API (as `specframe generate` does)."""
    sf = specframe.load(target=target, registry=build_registry(extra_plugins=(Plugin(cls),)),
                        proposers=[{"name": cls.name}], isolation=isolation or None)
    return sf, sf.generate_result(PROMPT, max_new_tokens=N_NEW, temperature=sampling.temperature, seed=3)


def specframe_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "specframe" and r.levelno == logging.WARNING]


@pytest.fixture(scope="module")
def references(specframe_tiny_target):
    return {
        "greedy": none_output(specframe_tiny_target, SamplingParams()),
        "sampling": none_output(specframe_tiny_target, SAMPLING, seed=3),
    }


@pytest.mark.parametrize("mode", ["greedy", "sampling"])
@pytest.mark.parametrize("kind", ["raise", *MALFORMED])
def test_a_broken_proposer_leaves_the_output_identical_to_none(specframe_tiny_target, references, kind, mode, caplog):
    sampling = SamplingParams() if mode == "greedy" else SAMPLING
    cls = broken_class(kind)
    caplog.set_level(logging.WARNING, logger="specframe")
    _, result = run_through_api(specframe_tiny_target, cls, sampling)
    assert result.token_ids == references[mode]
    m = result.metrics
    assert m.drafted_tokens == 0  # no broken draft reached the target
    assert m.proposer_faults == 3 and m.proposer_disabled  # default max_faults = 3, then disabled
    assert m.proposer_fault_kinds == {"raised" if kind == "raise" else "malformed": 3}
    warnings = specframe_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert f"'broken-{kind}'" in warnings[0] and "output is unaffected" in warnings[0]


def test_repeated_faults_disable_the_proposer_for_the_rest_of_the_request(specframe_tiny_target, references):
    sf, result = run_through_api(specframe_tiny_target, broken_class("raise"), SamplingParams(), max_faults=2)
    (proposer,) = [o for o in sf._pool._idle.values() if getattr(o, "name", "") == "broken-raise"]  # reused
    assert proposer.calls == 2  # not called again once disabled
    assert result.metrics.proposer_disabled and result.metrics.proposer_faults == 2
    assert result.token_ids == references["greedy"]
    # the next request starts afresh
    again = sf.generate_result(PROMPT, max_new_tokens=N_NEW)
    assert proposer.calls == 4 and again.metrics.proposer_faults == 2


def test_a_slow_proposer_exceeds_its_time_budget(specframe_tiny_target, references, caplog):
    caplog.set_level(logging.WARNING, logger="specframe")
    _, result = run_through_api(specframe_tiny_target, broken_class("slow"), SamplingParams(), propose_timeout_s=0.005)
    assert result.token_ids == references["greedy"]
    assert result.metrics.proposer_fault_kinds == {"timeout": 3}
    assert result.metrics.drafted_tokens == 0  # the late drafts were dropped
    (warning,) = specframe_warnings(caplog)
    assert "ran over its time budget" in warning and "0.005 s budget" in warning


def test_no_time_budget_keeps_a_slow_proposer(specframe_tiny_target, references):
    _, result = run_through_api(specframe_tiny_target, broken_class("slow"), SamplingParams(), propose_timeout_s=None)
    assert result.metrics.proposer_faults == 0 and result.metrics.drafted_tokens > 0
    assert result.token_ids == references["greedy"]


@pytest.mark.parametrize("cls, where", [(BrokenOnVerified, "on_verified"), (BrokenStart, "start")])
def test_faults_in_feedback_and_start_are_isolated_too(specframe_tiny_target, references, cls, where, caplog):
    caplog.set_level(logging.WARNING, logger="specframe")
    _, result = run_through_api(specframe_tiny_target, cls, SamplingParams())
    assert result.token_ids == references["greedy"]
    assert result.metrics.proposer_faults >= 1
    (warning,) = specframe_warnings(caplog)
    assert f" in {where}: " in warning


def test_an_intermittent_fault_keeps_the_good_drafts(specframe_tiny_target, references):
    class Flaky(ProposerBase):
        """Drafts the true continuation, but raises on its second call."""

        name = "flaky"

        def __init__(self, config, target) -> None:
            super().__init__(config, target)
            self.calls = 0

        def propose(self, state, budget):
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("once")
            done = state.num_generated
            return DraftTree.chain(references["greedy"][done : done + min(3, budget)])

    _, result = run_through_api(specframe_tiny_target, Flaky, SamplingParams())
    assert result.token_ids == references["greedy"]
    assert result.metrics.proposer_faults == 1 and not result.metrics.proposer_disabled
    assert result.metrics.accepted_tokens > 0  # the other steps still sped things up


def test_isolation_settings_are_validated():
    with pytest.raises(ConfigError, match="propose_timeout_s"):
        IsolationPolicy(propose_timeout_s=0)
    with pytest.raises(ConfigError, match="max_faults"):
        IsolationPolicy(max_faults=0)
    with pytest.raises(ConfigError, match="isolation.max_faults"):
        specframe.config.load_config(None, isolation={"max_faults": 0})
