"""Deliberately broken proposer plugins, one per fault kind: the output is identical to the `none` proposer's,
the user gets exactly one warning naming the plugin, the metrics count the faults, and repeated faults disable
the proposer for the rest of the request."""

from __future__ import annotations

import logging
import time
from typing import Literal

import pytest
import torch

import specframe
from specframe import DraftTree, ProposerBase, ProposerConfig, hookimpl
from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from specframe.decode.engine import Engine
from specframe.decode.isolation import IsolationPolicy
from specframe.errors import ConfigError
from specframe.registry import build_registry
from specframe.sampling import SamplingParams

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
    name: Literal["broken"] = "broken"


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
    assert m.drafted_nodes == 0  # no broken draft reached the target
    assert m.proposer_faults == 3 and m.proposer_disabled  # default max_faults = 3, then disabled
    assert m.proposer_fault_kinds == {"raised" if kind == "raise" else "malformed": 3}
    warnings = specframe_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert f"'broken-{kind}'" in warnings[0] and "output is unaffected" in warnings[0]


def test_repeated_faults_disable_the_proposer_for_the_rest_of_the_request(specframe_tiny_target, references):
    sf, result = run_through_api(specframe_tiny_target, broken_class("raise"), SamplingParams(), max_faults=2)
    (proposer,) = [o for o in sf._plugins.pool._idle.values() if getattr(o, "name", "") == "broken-raise"]  # reused
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
    assert result.metrics.drafted_nodes == 0  # the late drafts were dropped
    (warning,) = specframe_warnings(caplog)
    assert "ran over its time limit" in warning and "0.005 s time limit" in warning


def test_no_time_budget_keeps_a_slow_proposer(specframe_tiny_target, references):
    _, result = run_through_api(specframe_tiny_target, broken_class("slow"), SamplingParams(), propose_timeout_s=None)
    assert result.metrics.proposer_faults == 0 and result.metrics.drafted_nodes > 0
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
    assert result.metrics.accepted_nodes > 0  # the other steps still sped things up


def test_isolation_settings_are_validated():
    with pytest.raises(ConfigError, match="propose_timeout_s"):
        IsolationPolicy(propose_timeout_s=0)
    with pytest.raises(ConfigError, match="max_faults"):
        IsolationPolicy(max_faults=0)
    with pytest.raises(ConfigError, match="isolation.max_faults"):
        specframe.config.load_config(None, isolation={"max_faults": 0})


# --- a plugin that raises while it is built --------------------------------------------------------------------------


class RaisesInInit(Broken):
    name = "raises-in-init"

    def __init__(self, config, target) -> None:
        raise RuntimeError("cannot load my weights")


class _Factory(type):
    def __call__(cls, *args, **kwargs):  # a factory (here a metaclass) that raises instead of building
        raise OSError("factory failed")


class RaisesInFactory(Broken, metaclass=_Factory):
    name = "raises-in-factory"


@pytest.mark.parametrize("cls", [RaisesInInit, RaisesInFactory], ids=["constructor", "factory"])
@pytest.mark.parametrize("combined", [False, True], ids=["alone", "with-ngram"])
@pytest.mark.parametrize("mode", ["greedy", "sampling"])
def test_a_proposer_that_raises_while_built_is_left_out(specframe_tiny_target, references, cls, combined, mode,
                                                        caplog):
    """Alone: target-only decoding; combined with ngram: ngram drafts alone. One warning per option set, never a
    traceback; every request's metrics say it was left out (fault kind "build", disabled)."""
    caplog.set_level(logging.WARNING, logger="specframe")
    sampling = SamplingParams() if mode == "greedy" else SAMPLING
    proposers = [{"name": cls.name}, {"name": "ngram"}] if combined else [{"name": cls.name}]
    sf = specframe.load(target=specframe_tiny_target, registry=build_registry(extra_plugins=(Plugin(cls),)),
                        proposers=proposers)
    for _ in range(2):
        result = sf.generate_result(PROMPT, max_new_tokens=N_NEW, temperature=sampling.temperature, seed=3)
        m = result.metrics
        if sampling.is_greedy or not combined:  # (combined sampling: ngram's drafts draw from the generator)
            assert result.token_ids == references[mode]
        assert m.proposer_fault_kinds == {"build": 1} and m.proposers[cls.name].disabled
        assert m.proposers[cls.name].steps == 0  # never called
        assert m.proposer_disabled == (not combined)
        if combined:
            assert m.proposers["ngram"].steps > 0
        else:
            assert m.drafted_nodes == 0
    (warning,) = specframe_warnings(caplog)  # once, when it was built (at load), not per request
    assert f"proposer {cls.name!r}" in warning and "while it was built" in warning and "output is unaffected" in warning


def test_a_proposer_that_refuses_its_config_while_built_is_one_error_line(specframe_tiny_target):
    """A SpecframeError from the constructor is the user's to fix (missing weights, a bad folder): it stops."""

    class NeedsWeights(Broken):
        name = "needs-weights"

        def __init__(self, config, target) -> None:
            raise ConfigError("needs-weights: set `weights: DIR`")

    with pytest.raises(ConfigError, match="set `weights: DIR`"):
        specframe.load(target=specframe_tiny_target, registry=build_registry(extra_plugins=(Plugin(NeedsWeights),)),
                       proposers=[{"name": "needs-weights"}])


@pytest.mark.parametrize("kind", ["merge policy", "router"])
def test_a_merge_policy_or_router_that_raises_while_built_is_replaced(specframe_tiny_target, references, kind, caplog):
    from specframe.contracts.combining import MergePolicyBase, MergePolicyConfig, RouterBase, RouterConfig

    class BadMergeConfig(MergePolicyConfig):
        name: Literal["bad"] = "bad"

    class BadMerge(MergePolicyBase):
        name, Config = "bad", BadMergeConfig

        def __init__(self, config, target=None) -> None:
            raise RuntimeError("no merge today")

        def plan(self, drafts, max_nodes):  # pragma: no cover
            return []

    class BadRouterConfig(RouterConfig):
        name: Literal["bad"] = "bad"

    class BadRouter(RouterBase):
        name, Config = "bad", BadRouterConfig

        def __init__(self, config, target=None) -> None:
            raise RuntimeError("no routing today")

    class Components:
        @hookimpl
        def specframe_register_merge_policies(self, register) -> None:
            register(BadMerge)

        @hookimpl
        def specframe_register_routers(self, register) -> None:
            register(BadRouter)

    caplog.set_level(logging.WARNING, logger="specframe")
    setting = {"merge": {"policy": "bad"}} if kind == "merge policy" else {"router": "bad"}
    sf = specframe.load(target=specframe_tiny_target, registry=build_registry(extra_plugins=(Components(),)),
                        proposers=["ngram", "none"], **setting)
    result = sf.generate_result(PROMPT, max_new_tokens=N_NEW, seed=3)
    assert result.token_ids == references["greedy"] and result.metrics.proposers["ngram"].steps > 0
    (warning,) = specframe_warnings(caplog)
    assert f"{kind} 'bad'" in warning and "while it was built" in warning


def test_cli_with_a_proposer_that_raises_while_built(tmp_path, monkeypatch, caplog):
    """`specframe generate --proposer X --proposer ngram` where X's constructor raises: one warning line on stderr,
    the answer on stdout, exit 0 (it was a 48-line traceback, exit 1)."""
    from typer.testing import CliRunner

    from specframe import registry as registry_module
    from specframe.cli import app

    from tests.fakes import PROMPT as WORD_PROMPT
    from tests.fakes import build_model, build_tokenizer, hf_greedy

    model = build_model("llama")
    model.save_pretrained(tmp_path)
    build_tokenizer().save_pretrained(tmp_path)
    real = registry_module.build_registry
    monkeypatch.setattr(registry_module, "build_registry", lambda **kw: real(extra_plugins=(Plugin(RaisesInInit),)))
    text = " ".join(build_tokenizer().convert_ids_to_tokens(WORD_PROMPT))
    caplog.set_level(logging.WARNING, logger="specframe")
    for proposers in (["raises-in-init"], ["raises-in-init", "ngram"]):
        args = ["generate", text, "--model", str(tmp_path), "--dtype", "float32", "--threads", "1", "--prepack", "off",
                "--no-chat", "--max-new-tokens", "8", "--json"]
        for p in proposers:
            args += ["--proposer", p]
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, (res.output, res.exception)
        assert "Traceback" not in res.output
        import json

        (record,) = [json.loads(line) for line in res.stdout.splitlines()]
        assert record["token_ids"] == hf_greedy(model, WORD_PROMPT, 8)
        assert record["metrics"]["proposer_fault_kinds"] == {"build": 1}
        built = [w for w in specframe_warnings(caplog) if "while it was built" in w]
        assert len(built) == 1, built  # (pytest captures the log; the CLI prints it as one stderr line)
        caplog.clear()
