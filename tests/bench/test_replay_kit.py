"""The conformance kit's replay (specframe.testing.replay): a proposer class's τ on the dev-set trace shipped with
specframe, without loading the target; the same figures as ``specframe replay``'s driver on a loaded target."""

from __future__ import annotations

from typing import ClassVar

import pytest

import specframe
from specframe import DraftTree, ProposerBase
from specframe.bench.runner import MULTI_TURN
from specframe.errors import ConfigError, TraceError
from specframe.io.atomic import replace_folder
from specframe.registry import build_registry
from specframe.replay.driver import Request
from specframe.replay.record import record_trace
from specframe.replay.sweep import Task, run_here
from specframe.replay.trace import read_trace, write_trace
from specframe.testing import Kit, replay_proposer, shipped_traces
from specframe_plugins.ngram import NgramProposer

from tests.fakes import REPLAY_N_NEW as N_NEW
from tests.fakes import REPLAY_PROMPTS, replay_target


def test_the_dev_set_trace_ships():
    traces = shipped_traces()
    assert list(traces) == ["smollm2-135m-instruct-fp32-dev"]
    t = read_trace(traces["smollm2-135m-instruct-fp32-dev"])
    m = t.manifest
    assert (m["model"], m["dtype"], m["max_new_tokens"], m["recorded_with"]) == \
           ("smollm2-135m-instruct", "float32", 128, [{"name": "none"}])
    assert len(t.questions) == 30 and m["features"] is None and m["cost"]["t_ms"]
    from specframe.bench.runner import category_group

    groups = [category_group(q.category) for q in t.questions]
    assert {g: groups.count(g) for g in groups} == {MULTI_TURN: 5, "translation": 5, "summarization": 5, "qa": 5,
                                                   "math_reasoning": 5, "rag": 5}
    assert all(len(q.generated) == 128 or q.finish_reason == "stop" for q in t.questions)


def test_replay_proposer_on_the_shipped_trace_loads_no_model(no_model_load):
    result = replay_proposer(NgramProposer, {"k": 4})
    assert result.requests == 30 and result.faults == 0
    assert 1.0 < result.tau < 5.0 and 0.0 < result.alpha <= 1.0
    assert result.predicted_speedup is not None and result.draft_ms_per_step > 0
    assert set(result.tau_by_category) == {MULTI_TURN, "translation", "summarization", "qa", "math_reasoning", "rag"}
    assert sum(r["metrics"]["new_tokens"] for r in result.records) / \
        sum(r["metrics"]["target_forwards"] for r in result.records) == result.tau
    assert "τ" in str(result) and "smollm2-135m-instruct-fp32-dev" in str(result)


def test_the_kit_replay_equals_specframe_replay_on_a_loaded_target(tmp_path):
    sf = specframe.load(target=replay_target("llama", curve=True), registry=build_registry(), chat=False)
    trace = record_trace(sf, REPLAY_PROMPTS, max_new_tokens=N_NEW, chat=False)
    replace_folder(tmp_path / "t", lambda tmp: write_trace(trace, tmp))
    trace = read_trace(tmp_path / "t")
    kit = replay_proposer(NgramProposer, {"k": 5}, tmp_path / "t")
    (res,) = run_here(sf.target, sf.registry, trace, [Task({"name": "ngram", "proposers": [{"name": "ngram", "k": 5}],
                                                            "router": "none"}, tuple(Request(i) for i in range(6)), N_NEW)])
    assert [r["metrics"]["target_forwards"] for r in kit.records] == [r["metrics"]["target_forwards"] for r in res.records]
    assert [r["token_ids"] for r in kit.records] == [q.generated for q in trace.questions]
    assert Kit(NgramProposer, {"k": 5}).replay(tmp_path / "t").tau == kit.tau


class Faulty(ProposerBase):
    name = "kit-faulty"

    def propose(self, state, budget):
        if state.num_generated % 2:
            raise RuntimeError("boom")
        return DraftTree.chain([1, 2, 3][:budget])


class NeedsHidden(ProposerBase):
    name = "kit-hidden"
    needs_hidden_states: ClassVar[bool] = True

    def propose(self, state, budget):
        return DraftTree.empty()


def test_a_faulty_proposer_is_counted_not_fatal():
    result = replay_proposer(Faulty, max_new_tokens=16)
    assert result.faults > 0 and result.requests == 30
    assert all(r["token_ids"] for r in result.records)


def test_what_the_shipped_trace_cannot_serve_is_refused():
    with pytest.raises(TraceError, match="reads the last hidden state.*--features-for"):
        replay_proposer(NeedsHidden)
    from specframe_plugins.medusa import MedusaProposer

    with pytest.raises(ConfigError, match="cannot be built on a trace without its target.*specframe replay"):
        replay_proposer(MedusaProposer)
    with pytest.raises(ConfigError, match="no trace 'nope'"):
        replay_proposer(NgramProposer, trace="nope")
