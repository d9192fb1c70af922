"""Observer hooks: per-step events that add up to the request's metrics and output, one event per request, no
pluggy call (nor any event) in the decode loop when nobody observes, and a raising observer changes nothing."""

from __future__ import annotations

import logging

import pluggy
import pytest

import specframe
from specframe import DraftTree, ProposerBase, hookimpl
from specframe.decode.observe import Observers
from specframe.registry import build_registry

PROMPT = [3, 7, 3, 7, 3, 7, 3, 7]


class EventLog:
    def __init__(self) -> None:
        self.steps, self.requests = [], []

    @hookimpl
    def specframe_observe_step(self, event) -> None:
        self.steps.append(event)

    @hookimpl
    def specframe_observe_request(self, event) -> None:
        self.requests.append(event)


class Raising:
    @hookimpl
    def specframe_observe_step(self, event) -> None:
        raise RuntimeError("observer bug")


def load(target, *plugins, proposer: str = "ngram"):
    reg = build_registry(extra_plugins=plugins)
    return specframe.load(target=target, registry=reg, proposers=[{"name": proposer}])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_step_events_add_up_to_the_request(specframe_tiny_target, temperature):
    rec = EventLog()
    sf = load(specframe_tiny_target, rec)
    # (seed 1: with ngram's drafts through the repeat, seed 0's sampled run happens to accept none)
    result = sf.generate_result(PROMPT, max_new_tokens=24, temperature=temperature, seed=1)
    m = result.metrics
    assert m.accepted_nodes > 0  # ngram drafts on this prompt: the events are not trivial
    assert [e.step for e in rec.steps] == list(range(m.target_forwards))
    assert {e.proposer for e in rec.steps} == {"ngram"} and {e.request_id for e in rec.steps} == {0}
    assert sum(e.drafted for e in rec.steps) == m.drafted_nodes
    assert sum(e.accepted for e in rec.steps) == m.accepted_nodes
    assert [t for e in rec.steps for t in e.committed] == result.token_ids
    assert [e.finished for e in rec.steps] == [False] * (m.target_forwards - 1) + [True]
    assert all(e.faults == 0 for e in rec.steps)
    (req,) = rec.requests
    assert req.token_ids == tuple(result.token_ids) and req.finish_reason == "length"
    assert req.proposers == ("ngram",) and req.prompt_tokens == len(PROMPT)
    assert req.metrics == m.to_dict()


def test_request_ids_count_requests(specframe_tiny_target):
    rec = EventLog()
    sf = load(specframe_tiny_target, rec)
    for _ in range(3):
        sf.generate_result(PROMPT, max_new_tokens=4)
    assert [r.request_id for r in rec.requests] == [0, 1, 2]


def test_step_events_report_faults(specframe_tiny_target):
    class Once(ProposerBase):
        name = "once"

        def propose(self, state, budget):
            if state.num_generated == 0:
                raise RuntimeError("first step only")
            return DraftTree.empty()

    class Plugin:
        @hookimpl
        def specframe_register_proposers(self, register):
            register(Once)

    rec = EventLog()
    load(specframe_tiny_target, rec, Plugin(), proposer="once").generate_result(PROMPT, max_new_tokens=5)
    assert [e.faults for e in rec.steps] == [1, 0, 0, 0, 0]


class _Counting:
    """Stands in for a pluggy HookCaller: records calls, delegates everything else."""

    def __init__(self, caller: pluggy.HookCaller, calls: list) -> None:
        self._caller, self._calls = caller, calls

    def __call__(self, **kwargs):
        self._calls.append("hook")
        return self._caller(**kwargs)

    def __getattr__(self, name):
        return getattr(self._caller, name)


@pytest.mark.parametrize("observed", [False, True])
def test_no_observer_means_no_pluggy_call_and_no_event(specframe_tiny_target, monkeypatch, observed):
    sf = load(specframe_tiny_target, *([EventLog()] if observed else []))
    assert (sf.registry.observers() is None) is not observed
    calls = []
    hooks = sf.registry.plugin_manager.hook
    for name in [n for n in vars(hooks) if n.startswith("specframe_")]:  # count any hook call of our manager
        monkeypatch.setattr(hooks, name, _Counting(getattr(hooks, name), calls))
    real_step = Observers.step
    monkeypatch.setattr(Observers, "step", lambda *a, **k: (calls.append("event"), real_step(*a, **k)))
    result = sf.generate_result(PROMPT, max_new_tokens=16)
    assert result.metrics.target_forwards > 1
    # the control case (an observer installed) shows the probe sees events; without one there are none
    assert calls == (["event"] * result.metrics.target_forwards if observed else [])


def test_a_raising_observer_changes_nothing_and_warns_once(specframe_tiny_target, caplog):
    plain = load(specframe_tiny_target).generate_result(PROMPT, max_new_tokens=16)
    rec = EventLog()
    sf = load(specframe_tiny_target, Raising(), rec)
    caplog.set_level(logging.WARNING, logger="specframe")
    result = sf.generate_result(PROMPT, max_new_tokens=16)
    assert result.token_ids == plain.token_ids
    assert len(rec.steps) == result.metrics.target_forwards  # the other observer keeps receiving events
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "specframe"]
    assert "RuntimeError in specframe_observe_step: observer bug; dropped for the rest of the request" in warning
