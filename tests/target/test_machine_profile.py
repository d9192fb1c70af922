"""The measured machine profile and the settings chosen from it (:mod:`specframe.target.profile`): dtype, threads and
pre-packing chosen for speculative or plain decoding, explicit settings, the profile's JSON and its cache (measured
once, measured again when a provisional one was taken under load), and the measurement itself on a tiny model.

Nothing here measures the real machine's speed: profiles are synthetic (:func:`tests.fakes.make_profile`) and the
load is faked, so every value is known.
"""

from __future__ import annotations

import functools
import json
import logging
from types import SimpleNamespace

import pytest
import torch

import specframe.target.machine as machine
import specframe.target.profile as tune
from specframe.target.cost import NS, token_cost_ms
from specframe.target.machine import LoadMonitor, LoadSample
from specframe.target.packed import packing_available
from specframe.target.profile import (
    Candidate,
    MachineProfile,
    Settings,
    fingerprint_key,
    get_profile,
    load_profile,
    measured_threads,
    profile_path,
    resolve_settings,
    time_forwards,
)

from tests.fakes import build_model, make_profile

# --- the profile and the choice ---------------------------------------------------------------------------------------

def test_the_synthetic_profile_ranks_as_intended():
    p = make_profile()
    spec = {m.candidate.label: token_cost_ms(m.t_ms, True) for m in p.measured}
    plain = {m.candidate.label: token_cost_ms(m.t_ms, False) for m in p.measured}
    assert min(spec, key=spec.get) == "bf16/2t" and min(plain, key=plain.get) == "fp32/2t"
    assert Candidate("bfloat16", 2, True).label == "bf16/2t/packed"
    assert Candidate("float32", 1, False).label == "fp32/1t"


def test_choose_speculative_vs_plain_and_explicit_filters():
    p = make_profile()
    c, m, why = p.choose(speculative=True)
    assert c == Candidate("bfloat16", 2, False) and m is p.find(c)
    assert why.startswith("fastest measured (ms per token at the reference acceptance: bf16/2t ")
    c, m, why = p.choose(speculative=False)
    assert c == Candidate("float32", 2, False) and m is not None and "plain decoding" in why
    # explicit settings filter; auto parts are still chosen
    assert p.choose(dtype="float32")[0] == Candidate("float32", 2, False)
    assert p.choose(prepack=True)[0] == Candidate("bfloat16", 2, True)
    assert p.choose(prepack=False, speculative=False)[0] == Candidate("float32", 2, False)
    assert p.choose(threads=1)[0] == Candidate("bfloat16", 1, False)
    assert p.choose(threads=1, speculative=False)[0] == Candidate("float32", 1, False)
    assert p.choose(threads=2, max_threads=1)[0].threads == 2  # explicit threads ignore the free cores
    # auto threads stay within max_threads
    assert p.choose(max_threads=1)[0] == Candidate("bfloat16", 1, False)
    assert p.choose(max_threads=1, speculative=False)[0] == Candidate("float32", 1, False)
    assert p.choose(max_threads=2)[0] == Candidate("bfloat16", 2, False)


def test_choose_uses_the_fewest_threads_when_none_fit():
    rows = {Candidate("float32", 2, False): [12.0, 20.0, 35.0, 60.0, 110.0, 200.0],
            Candidate("bfloat16", 2, False): [20.0, 20.5, 21.0, 22.0, 25.0, 30.0],
            Candidate("bfloat16", 4, False): [10.0, 10.5, 11.0, 12.0, 15.0, 20.0]}
    p = make_profile(rows)
    c, m, _ = p.choose(max_threads=1)
    assert c == Candidate("bfloat16", 2, False) and m is not None  # not the faster 4-thread one
    assert p.choose(max_threads=1, speculative=False)[0] == Candidate("float32", 2, False)
    assert p.choose(max_threads=8)[0] == Candidate("bfloat16", 4, False)


def test_choose_returns_unmeasured_explicit_settings_as_given():
    p = make_profile()
    c, m, why = p.choose(dtype="float32", threads=3, prepack=False)
    assert (c, m) == (Candidate("float32", 3, False), None) and "not measured" in why
    c, m, _ = p.choose(threads=3, prepack=True)
    assert (c, m) == (Candidate("bfloat16", 3, True), None)
    c, m, _ = p.choose(dtype="float32", prepack=True, max_threads=2)  # no packed fp32 measured
    assert (c, m) == (Candidate("float32", 2, True), None)


def test_choose_on_a_profile_with_nothing_measured_returns_the_defaults():
    p = MachineProfile("k", "tiny", "cpu", {}, [], 0.0, 90.0)
    assert p.choose(max_threads=2) == (Candidate("bfloat16", 2, False), None, "not measured on this machine: as given")


def test_measured_threads():
    p = make_profile()
    assert measured_threads(p, Candidate("bfloat16", 7, False)) == [1, 2]
    assert measured_threads(p, Candidate("bfloat16", 1, True)) == [2]
    assert measured_threads(None, Candidate("bfloat16", 1, False)) == []


# --- storage and caching ---------------------------------------------------------------------------------------------


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_profile_json_round_trip_and_atomic_save(cache):
    p = make_profile(others_load=0.25)
    doc = json.loads(json.dumps(p.to_json()))
    assert doc["ns"] == list(NS) and [c["label"] for c in doc["candidates"]][:2] == ["fp32/1t", "fp32/2t"]
    q = MachineProfile.from_json(doc)
    assert (q.key, q.model, q.device, q.fingerprint, q.others_load) == (p.key, "tiny", "cpu", p.fingerprint, 0.25)
    assert [(m.candidate, m.t_ms) for m in q.measured] == [(m.candidate, m.t_ms) for m in p.measured]
    assert q.choose() == (p.choose()[0], q.find(p.choose()[0]), p.choose()[2])
    path = profile_path(p.key)
    assert path == cache / "machine" / f"{p.key}.json"
    p.save(path)
    assert p.path == path and sorted(x.name for x in path.parent.iterdir()) == [path.name]  # no .tmp left behind
    loaded = load_profile(p.key)
    assert loaded is not None and loaded.path == path and loaded.to_json() == p.to_json()
    for bad in ({**doc, "version": 999}, {**doc, "ns": [1, 2, 4]}, {**doc, "candidates": []}):
        with pytest.raises(ValueError):
            MachineProfile.from_json(bad)


def test_load_profile_returns_none_for_missing_or_corrupt_files(cache):
    assert load_profile("nothing-here") is None
    path = profile_path("corrupt")
    path.parent.mkdir(parents=True)
    for text in ("{not json", "", json.dumps({"version": 1}), json.dumps({**make_profile().to_json(), "version": 0})):
        path.write_text(text)
        assert load_profile("corrupt") is None


@pytest.mark.parametrize("text", ["null", "[]"])
def test_load_profile_returns_none_for_json_that_is_not_an_object(cache, text):
    path = profile_path("odd")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    assert load_profile("odd") is None


@pytest.fixture
def fake_measure(monkeypatch, cache):
    """measure_profile replaced: counts calls, returns a profile whose others_load is the next of ``loads``."""
    state = SimpleNamespace(calls=0, loads=[])

    def measure(directory, model_name, device, progress=None):
        state.calls += 1
        load = state.loads.pop(0) if state.loads else 0.0
        return make_profile(key=fingerprint_key(model_name, device), others_load=load)

    monkeypatch.setattr(tune, "measure_profile", measure)
    return state


def quiet_machine(monkeypatch, others: float) -> list[float]:
    """LoadMonitor.sample returns ``others`` without sleeping; returns the settle_s of each call."""
    calls: list[float] = []

    def sample(self, settle_s: float = 0.25) -> LoadSample:
        calls.append(settle_s)
        return self._keep(LoadSample(others, settle_s, "/proc/stat"))

    monkeypatch.setattr(LoadMonitor, "sample", sample)
    return calls


def test_get_profile_measures_once_then_reads_the_cache(tmp_path, fake_measure, monkeypatch):
    sampled = quiet_machine(monkeypatch, 0.0)
    first = get_profile(tmp_path, "tiny", "cpu")
    assert fake_measure.calls == 1 and first.path == profile_path(fingerprint_key("tiny", "cpu"))
    assert first.path.is_file()
    second = get_profile(tmp_path, "tiny", "cpu")
    assert fake_measure.calls == 1 and second is not first and second.to_json() == first.to_json()
    assert sampled == []  # a profile taken on a quiet machine is used without looking at the load
    get_profile(tmp_path, "tiny", "cpu", refresh=True)
    assert fake_measure.calls == 2
    get_profile(tmp_path, "other-model", "cpu")  # another model: another key, another profile
    assert fake_measure.calls == 3
    assert len(list(first.path.parent.glob("*.json"))) == 2


def test_a_provisional_profile_is_measured_again_when_the_machine_is_quiet(tmp_path, fake_measure, monkeypatch,
                                                                               caplog):
    fake_measure.loads = [1.2, 0.1]
    with caplog.at_level(logging.WARNING, logger="specframe"):
        prof = get_profile(tmp_path, "tiny", "cpu")
    assert fake_measure.calls == 1 and prof.others_load == 1.2
    assert "provisional" in caplog.text
    quiet_machine(monkeypatch, 2.0)  # still busy: the provisional profile is used as it is
    assert get_profile(tmp_path, "tiny", "cpu").others_load == 1.2 and fake_measure.calls == 1
    quiet_machine(monkeypatch, 0.0)  # quiet now: measured again, and the new one replaces it
    assert get_profile(tmp_path, "tiny", "cpu").others_load == 0.1 and fake_measure.calls == 2
    sampled = quiet_machine(monkeypatch, 5.0)
    assert get_profile(tmp_path, "tiny", "cpu").others_load == 0.1 and fake_measure.calls == 2 and sampled == []


def test_resolve_settings_explicit_settings_win(tmp_path, fake_measure, monkeypatch):
    quiet_machine(monkeypatch, 1.0)  # one of 2 cores busy: auto fits 1 thread
    monkeypatch.setattr("specframe.target.packed.packing_available", lambda dtype, device: True)  # any CPU: a fake profile
    monkeypatch.setattr(tune, "usable_cores", lambda: (2, "2 test cores"))
    s, prof, others = resolve_settings(tmp_path, "tiny", "cpu")  # dtype auto: the profile is measured
    assert fake_measure.calls == 1 and others == 1.0 and prof is not None
    assert (s.dtype, s.threads, s.prepack) == ("bfloat16", 1, False)
    assert "others using 1.0" in s.threads_reason and s.dtype_reason.startswith("fastest measured")
    assert s.profile == str(profile_path(fingerprint_key("tiny", "cpu")))
    s, _, _ = resolve_settings(tmp_path, "tiny", "cpu", speculative=False)
    assert (s.dtype, s.threads) == ("float32", 1)
    s, _, _ = resolve_settings(tmp_path, "tiny", "cpu", dtype="float32", threads=2, prepack=False)
    assert (s.dtype, s.threads, s.prepack) == ("float32", 2, False)
    assert (s.dtype_reason, s.threads_reason, s.prepack_reason) == ("as given", "as given", "as given")
    s, _, _ = resolve_settings(tmp_path, "tiny", "cpu", threads=4)  # not measured: still as given
    assert s.threads == 4 and s.threads_reason == "as given"
    # packed bf16 was measured with 2 threads only; 1 fits: packed at 1 thread, unmeasured, rather than 2
    s, _, _ = resolve_settings(tmp_path, "tiny", "cpu", dtype="bfloat16", prepack=True)
    assert (s.dtype, s.threads, s.prepack) == ("bfloat16", 1, True)
    assert fake_measure.calls == 1  # all from the cached profile
    # explicit dtype and no cached profile: nothing is measured
    s, prof, _ = resolve_settings(tmp_path, "never-measured", "cpu", dtype="float32")
    assert prof is None and fake_measure.calls == 1
    assert (s.dtype, s.threads, s.prepack) == ("float32", 1, False) and "no machine profile" in s.prepack_reason
    s.threads = 3
    assert Settings(**s.to_dict()) == s


def test_measure_profile_times_every_candidate_and_restores_threads(tmp_path, monkeypatch, cache, caplog):
    import specframe.target.models

    def load_model(directory, dtype, device, tokenizer=True):
        return build_model("llama").to(dtype), None

    cands = [Candidate("float32", 1, False), Candidate("bfloat16", 1, False)]
    if packing_available(torch.float32, "cpu"):
        cands.append(Candidate("float32", 1, True))
    monkeypatch.setattr(specframe.target.models, "load_model", load_model)
    monkeypatch.setattr(tune, "candidates", lambda device, cores: list(cands))
    quiet_machine(monkeypatch, 0.0)
    threads = torch.get_num_threads()
    measure = functools.partial(tune.measure_profile, contexts=(16,), rounds=2)
    prof = measure(tmp_path, "tiny", "cpu")
    assert torch.get_num_threads() == threads
    assert sorted(m.candidate.label for m in prof.measured) == sorted(c.label for c in cands)
    assert all(set(m.t_ms) == {16} and len(m.t_ms[16]) == len(NS) and min(m.t_ms[16]) > 0 for m in prof.measured)
    # two interleaved rounds each, both dtypes loaded at once (one session); the first round times all of NS, the
    # second the decisive points: those are the medians of both rounds, the rest the first round's
    assert all(m.n_rounds == 2 and m.session == 0 for m in prof.measured) and prof.rounds == 2
    assert all([len(r) for r in m.rounds[16]] == [len(NS), len(tune.DECISIVE_NS)] for m in prof.measured)
    d = len(tune.DECISIVE_NS)
    assert all(m.t_ms[16][:d] == [(a + b) / 2 for a, b in zip(*m.rounds[16])] for m in prof.measured)
    assert all(m.t_ms[16][d:] == m.rounds[16][0][d:] for m in prof.measured)
    assert prof.key == fingerprint_key("tiny", "cpu") and prof.fingerprint == machine.fingerprint()
    prof.save(profile_path(prof.key))
    assert load_profile(prof.key).to_json() == prof.to_json()
    monkeypatch.setattr(tune, "MEMORY_SHARE", 0.0)  # the second dtype does not fit beside the first: a session each
    apart = measure(tmp_path, "tiny", "cpu")
    assert {m.candidate.dtype: m.session for m in apart.measured} == {"float32": 1, "bfloat16": 0}
    with caplog.at_level(logging.WARNING, logger="specframe"):
        spent = measure(tmp_path, "tiny", "cpu", budget_s=0.0)
    # the budget counts timing only (not model loading): the first candidate is always measured (one round), then
    # it stops
    assert len(spent.measured) == 1 and spent.measured[0].n_rounds == 1 and "time limit is spent" in caplog.text


def test_time_forwards_shape_and_context_clipping():
    model = build_model("llama")  # max_position_embeddings 256
    out = time_forwards(model, 64, contexts=(16, 300), ns=(1, 2, 4), repeats=1)
    assert sorted(out) == [16, 256 - 4 - 1]
    assert all(len(row) == 3 and min(row) > 0 for row in out.values())
