"""The machine layer: usable cores and others' load (:mod:`specframe.target.machine`), the measured profile and the
settings chosen from it (:mod:`specframe.target.profile`), pre-packed oneDNN weights (:mod:`specframe.target.packed`), and the
router's use of the measured cost curve (``TargetInfo.cost``), a lone proposer included.

Nothing here measures the real machine's speed: counters, clocks and profiles are faked so every value is known.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import os
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import specframe
import specframe.target.machine as machine
import specframe.target.profile as tune
from specframe import DraftTree
from specframe.config import load_config
from specframe.contracts.combining import ProposerStep, StepReport
from specframe.contracts import TargetInfo
from specframe.errors import ConfigError
from specframe.target.machine import LoadMonitor, LoadSample, cgroup_cpu_quota, choose_threads, usable_cores
from specframe.target.packed import PackedLinear, is_packed, pack_linears, packing_available
from specframe.target.hf import Target
from specframe.target.cost import NS, CostCurve, expected_tokens, token_cost_ms
from specframe.target.profile import (Candidate, MachineProfile, Measured, Settings, ThreadGovernor,
                            fingerprint_key, get_profile, load_profile, measured_threads,
                            profile_path, resolve_settings, time_forwards)
from specframe_plugins.router import AdaptiveConfig, AdaptiveRouter
from specframe_plugins.router.stats import column as col

from tests.fakes import PROMPT, build_model, build_tokenizer

CLK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# --- choose_threads, cgroup quota, usable cores ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "cores, others, candidates, want",
    [
        (2, 0.0, None, 2),  # quiet
        (2, 0.2, None, 2),  # a core others use < 0.3 of still counts as free
        (2, 0.8, None, 1),  # 1.2 free: one thread too many costs more than one too few
        (2, 1.0, None, 1),
        (2, 1.9, None, 1),  # at least 1
        (2, 5.0, None, 1),
        (8, 3.0, None, 5),
        (4, 0.0, None, 4),  # never more than the cores
        (8, 3.0, [1, 2, 4, 8], 4),  # the largest measured count that fits in 5
        (8, 0.0, [1, 4], 4),
        (2, 1.0, [2, 4], 2),  # none fits: the smallest measured
    ],
)
def test_choose_threads(cores, others, candidates, want):
    assert choose_threads(cores, others, candidates) == want


def test_cgroup_cpu_quota_v2_and_v1(tmp_path):
    assert cgroup_cpu_quota(tmp_path) is None  # no files: unlimited
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    assert cgroup_cpu_quota(tmp_path) == 2.0
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(v1) == 0.5
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(v1) is None
    (v1 / "cpu.max").write_text("garbage\n")  # unreadable v2 file: falls through to v1
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    assert cgroup_cpu_quota(v1) == 3.0


@pytest.mark.parametrize(
    "quota, want, capped",
    [(None, 8, False), (16.0, 8, False), (2.0, 2, True), (2.5, 3, True), (1.4, 1, True), (0.2, 1, True)],
)
def test_usable_cores_capped_by_the_quota(monkeypatch, quota, want, capped):
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(machine, "cgroup_cpu_quota", lambda: quota)
    cores, why = usable_cores()
    assert cores == want
    assert "8 in the CPU affinity mask" in why
    assert ("capped by the cgroup CPU quota" in why) == capped


# --- LoadMonitor ------------------------------------------------------------------------------------------------------


class FakeMachine:
    """A clock and CPU counters that advance together: ``busy_rate`` cores busy in all (this process included),
    ``own_rate`` cores used by this process."""

    def __init__(self, busy_rate: float, own_rate: float) -> None:
        self.wall, self.busy, self.own = 1000.0, 500.0, 20.0
        self.busy_rate, self.own_rate = busy_rate, own_rate
        self.slept: list[float] = []

    def advance(self, dt: float) -> None:
        self.wall += dt
        self.busy += self.busy_rate * dt
        self.own += self.own_rate * dt

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.advance(s)

    def install(self, monkeypatch) -> "FakeMachine":
        monkeypatch.setattr(machine, "time", SimpleNamespace(monotonic=lambda: self.wall, sleep=self.sleep))
        monkeypatch.setattr(machine, "_proc_stat", lambda: (self.busy, self.busy + 10_000.0))
        monkeypatch.setattr(machine, "_own_cpu_s", lambda: self.own)
        return self


def test_load_monitor_counts_others_busy_time_minus_its_own(monkeypatch):
    fm = FakeMachine(busy_rate=1.5, own_rate=0.5).install(monkeypatch)
    mon = LoadMonitor()
    s = mon.sample()  # first call: watches settle_s
    assert fm.slept == [0.25]
    assert (s.others, s.interval_s, s.source) == (pytest.approx(1.0), pytest.approx(0.25), "/proc/stat")
    # later calls measure over the time since the previous one, without sleeping
    fm.busy_rate, fm.own_rate = 0.7, 0.5
    fm.advance(2.0)
    s = mon.sample()
    assert fm.slept == [0.25]
    assert (s.others, s.interval_s) == (pytest.approx(0.2), pytest.approx(2.0))
    # own time counted twice over (several threads) never makes others' load negative
    fm.busy_rate, fm.own_rate = 0.2, 1.0
    fm.advance(1.0)
    assert mon.sample().others == 0.0
    # a call right after another watches settle_s again (no division by a tiny interval)
    fm.busy_rate, fm.own_rate = 3.0, 1.0
    s = mon.sample(settle_s=0.5)
    assert fm.slept == [0.25, 0.5] and s.others == pytest.approx(2.0) and s.interval_s == pytest.approx(0.5)
    assert mon.samples == pytest.approx([1.0, 0.2, 0.0, 2.0])


def test_load_monitor_falls_back_to_the_load_average(monkeypatch):
    monkeypatch.setattr(machine, "_proc_stat", lambda: None)
    monkeypatch.setattr(machine.os, "getloadavg", lambda: (1.5, 1.0, 0.5), raising=False)
    s = LoadMonitor().sample()
    assert (s.others, s.source) == (1.5, "loadavg")


def test_proc_stat_reads_the_machine_counters():
    stat = machine._proc_stat()
    if stat is None:
        pytest.skip("no /proc/stat on this system")
    busy, total = stat
    assert 0 <= busy <= total and total > 0
    assert machine._own_cpu_s() > 0


def _fake_proc_stat(per_cpu_ticks: list[tuple[int, int]]) -> str:
    """A /proc/stat whose cpuN lines have (busy user ticks, idle ticks), and the aggregate line their sum."""
    lines = []
    for name, (busy, idle) in [("cpu ", (sum(b for b, _ in per_cpu_ticks), sum(i for _, i in per_cpu_ticks)))] + [
            (f"cpu{i}", t) for i, t in enumerate(per_cpu_ticks)]:
        lines.append(f"{name} {busy} 0 0 {idle} 0 0 0 0 0 0")
    return "\n".join(lines) + "\nintr 0\n"


def test_load_on_cpus_outside_the_affinity_mask_does_not_count(monkeypatch):
    # 8 CPUs; this process may run on 0 and 1 (both idle); CPUs 2..7 are kept busy by others
    clock = {"t": 0.0}

    def content() -> str:
        t = clock["t"]
        return _fake_proc_stat([(0, int(CLK * t))] * 2 + [(int(CLK * t), 0)] * 6)

    def fake_open(path, *args, **kwargs):
        assert str(path) == "/proc/stat"
        return io.StringIO(content())

    monkeypatch.setattr(machine, "open", fake_open, raising=False)
    monkeypatch.setattr(machine, "time", SimpleNamespace(monotonic=lambda: clock["t"],
                                                         sleep=lambda s: clock.__setitem__("t", clock["t"] + s)))
    monkeypatch.setattr(machine, "_own_cpu_s", lambda: 0.0)
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    clock["t"] = 10.0
    others = LoadMonitor().sample(settle_s=1.0).others  # today: 6.0, all of it on CPUs it cannot use
    assert others < 0.5
    assert choose_threads(2, others) == 2


# --- expected tokens, cost per token, cost curve ----------------------------------------------------------------------


def test_expected_tokens():
    assert expected_tokens(1) == pytest.approx(1.0)
    assert expected_tokens(2) == pytest.approx(1.6)  # 1 + a
    assert expected_tokens(4, 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(8) == pytest.approx((1 - 0.6 ** 8) / 0.4)
    assert expected_tokens(32, 0.9) < 10.0  # bounded by 1 / (1 - a)


def test_token_cost_ms_plain_and_speculative():
    rows = {128: [10.0, 12.0, 14.0, 20.0, 40.0, 80.0], 512: [20.0, 22.0, 30.0, 30.0, 50.0, 90.0]}
    assert token_cost_ms(rows, speculative=False) == pytest.approx(15.0)  # mean T(1)
    # the first row's best is n = 4 (14 / 2.176), the second's n = 8 (30 / 2.458)
    per_ctx = [14.0 / expected_tokens(4), 30.0 / expected_tokens(8)]
    assert per_ctx == pytest.approx([6.4338, 12.2050], abs=1e-3)
    assert token_cost_ms(rows, speculative=True) == pytest.approx(sum(per_ctx) / 2)
    # where verification never pays, speculation is judged by plain decoding's T(1)
    steep = {128: [10.0, 100.0, 200.0, 400.0, 800.0, 1600.0]}
    assert token_cost_ms(steep, speculative=True) == pytest.approx(10.0)


def test_cost_curve_interpolates_over_ns_and_averages_contexts():
    c = CostCurve({128: [10.0, 12.0, 14.0, 20.0, 40.0, 80.0]})
    assert c and c.v(1) == 1.0 and c.v(0.5) == 1.0
    assert c.v(2) == pytest.approx(1.2) and c.v(4) == pytest.approx(1.4)
    assert c.v(3) == pytest.approx(1.3)  # halfway between n = 2 and n = 4
    assert c.v(6) == pytest.approx(1.7)  # halfway between 1.4 and 2.0
    assert c.v(12) == pytest.approx(3.0)
    assert c.v(48) == pytest.approx(8.0 + 4.0 * 16 / 16)  # linear past the last point: slope 4 per 16 tokens
    c2 = CostCurve({"128": [10.0, 12.0, 14.0, 20.0, 40.0, 80.0], "512": [20.0, 30.0, 40.0, 60.0, 100.0, 180.0]})
    assert set(c2.t_ms) == {128, 512}  # context keys from JSON become ints
    assert c2.v(1) == 1.0
    assert c2.v(2) == pytest.approx((1.2 + 1.5) / 2) and c2.v(8) == pytest.approx((2.0 + 3.0) / 2)
    assert c2.t1_ms() == pytest.approx(15.0)
    empty = CostCurve()
    assert not empty and empty.v(1) == 1.0 and empty.v(17) == 1.0
    c.set({})  # the governor may repoint it
    assert not c and c.v(8) == 1.0


# --- the profile and the choice --------------------------------------------------------------------------------------

# bf16/2t is flat (native bf16): best for speculation; fp32/2t has the lowest T(1): best for plain decoding
ROWS = {
    Candidate("float32", 1, False): [18.0, 30.0, 50.0, 90.0, 170.0, 330.0],
    Candidate("float32", 2, False): [12.0, 20.0, 35.0, 60.0, 110.0, 200.0],
    Candidate("bfloat16", 1, False): [30.0, 31.0, 32.0, 33.0, 38.0, 45.0],
    Candidate("bfloat16", 2, False): [20.0, 20.5, 21.0, 22.0, 25.0, 30.0],
    Candidate("bfloat16", 2, True): [21.0, 21.5, 22.0, 23.0, 27.0, 33.0],
}


def make_profile(rows=None, key: str = "k" * 16, others_load: float = 0.0, contexts=(128, 512)) -> MachineProfile:
    rows = ROWS if rows is None else rows
    measured = [Measured(c, {ctx: [t * (1 + i) for t in row] for i, ctx in enumerate(contexts)})
                for c, row in rows.items()]
    return MachineProfile(key, "tiny", "cpu", {"cpu": "test", "cores": 2}, measured, others_load, 12.3)


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
    monkeypatch.setattr(tune, "time_forwards", functools.partial(time_forwards, contexts=(16,), repeats=1))
    quiet_machine(monkeypatch, 0.0)
    threads = torch.get_num_threads()
    prof = tune.measure_profile(tmp_path, "tiny", "cpu")
    assert torch.get_num_threads() == threads
    assert sorted(m.candidate.label for m in prof.measured) == sorted(c.label for c in cands)
    assert all(set(m.t_ms) == {16} and len(m.t_ms[16]) == len(NS) and min(m.t_ms[16]) > 0 for m in prof.measured)
    assert prof.key == fingerprint_key("tiny", "cpu") and prof.fingerprint == machine.fingerprint()
    prof.save(profile_path(prof.key))
    assert load_profile(prof.key).to_json() == prof.to_json()
    with caplog.at_level(logging.WARNING, logger="specframe"):
        spent = tune.measure_profile(tmp_path, "tiny", "cpu", budget_s=0.0)
    # the budget counts timing only (not model loading): the first candidate is always measured, then it stops
    assert len(spent.measured) == 1 and "time limit is spent" in caplog.text


def test_time_forwards_shape_and_context_clipping():
    model = build_model("llama")  # max_position_embeddings 256
    out = time_forwards(model, 64, contexts=(16, 300), ns=(1, 2, 4), repeats=1)
    assert sorted(out) == [16, 256 - 4 - 1]
    assert all(len(row) == 3 and min(row) > 0 for row in out.values())


# --- thread governor -------------------------------------------------------------------------------------------------


class FixedMonitor:
    def __init__(self, others: float) -> None:
        self.others, self.calls = others, 0

    def sample(self, settle_s: float = 0.25) -> LoadSample:
        self.calls += 1
        return LoadSample(self.others, settle_s, "/proc/stat")


@pytest.fixture
def set_threads(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    return calls


def test_governor_lowers_and_raises_threads_with_others_load(set_threads):
    prof = make_profile()
    s = Settings("bfloat16", 2, False)
    curve = CostCurve(prof.find(Candidate("bfloat16", 2, False)).t_ms)
    mon = FixedMonitor(1.0)
    gov = ThreadGovernor(s, auto=True, cores=2, profile=prof, curve=curve, monitor=mon)
    assert gov.check(force=True) == 1.0
    assert set_threads == [1] and s.threads == 1 and "others using 1.0" in s.threads_reason
    assert curve.t_ms == prof.find(Candidate("bfloat16", 1, False)).t_ms  # the router's v(n) follows
    assert gov.check() == 1.0 and mon.calls == 1  # within every_s: no new sample
    mon.others = 0.1
    gov.check(force=True)
    assert set_threads == [1, 2] and s.threads == 2
    assert curve.t_ms == prof.find(Candidate("bfloat16", 2, False)).t_ms
    gov.check(force=True)  # no change: no call
    assert set_threads == [1, 2]


def test_governor_without_a_profile_fits_the_free_cores(set_threads):
    s = Settings("float32", 4, False)
    gov = ThreadGovernor(s, auto=True, cores=4, monitor=FixedMonitor(1.0))
    gov.check(force=True)
    assert set_threads == [3] and s.threads == 3 and not gov.curve


def test_governor_never_changes_explicit_threads_but_warns_once(set_threads, caplog):
    s = Settings("float32", 2, False, threads_reason="as given")
    mon = FixedMonitor(0.2)
    gov = ThreadGovernor(s, auto=False, cores=2, monitor=mon)
    with caplog.at_level(logging.WARNING, logger="specframe"):
        gov.check(force=True)  # 2 threads + 0.2 busy fits
        assert caplog.records == []
        mon.others = 1.0
        gov.check(force=True)
        gov.check(force=True)
    assert set_threads == [] and s.threads == 2 and s.threads_reason == "as given"
    assert len(caplog.records) == 1 and "threads is set to 2" in caplog.records[0].getMessage()


# --- pre-packed weights ----------------------------------------------------------------------------------------------


needs_packing = pytest.mark.skipif(not packing_available(torch.float32, "cpu"),
                                   reason="oneDNN pre-packing is not available in this torch build")


def test_packing_available():
    assert not packing_available(torch.float16, "cpu")
    assert not packing_available(torch.float32, "meta")


@needs_packing
@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2 has biases on q, k, v
def test_pack_linears_replaces_every_linear_and_keeps_the_logits(arch):
    ref = build_model(arch)
    model = build_model(arch)
    linears = [name for name, m in model.named_modules() if type(m) is nn.Linear]
    head, up = model.lm_head.weight, model.model.layers[0].mlp.up_proj.weight
    keys, n_params = list(model.state_dict()), sum(p.numel() for p in model.parameters())
    assert not is_packed(model)
    assert pack_linears(model) == len(linears) == 2 * 7 + 1
    assert is_packed(model) and not any(type(m) is nn.Linear for m in model.modules())
    assert all(isinstance(model.get_submodule(name), PackedLinear) for name in linears)
    assert model.lm_head.weight is head and model.model.layers[0].mlp.up_proj.weight is up  # shared, not copied
    assert list(model.state_dict()) == keys and sum(p.numel() for p in model.parameters()) == n_params
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        want, got = ref(input_ids=ids).logits, model(input_ids=ids).logits
    assert got.shape == want.shape == (1, len(PROMPT), 64)
    assert (got - want).abs().max().item() < 1e-5


@pytest.mark.skipif(not packing_available(torch.bfloat16, "cpu"), reason="no oneDNN bf16 pre-packing here")
def test_pack_linears_in_bfloat16():
    ref = build_model("llama").to(torch.bfloat16)
    model = build_model("llama").to(torch.bfloat16)
    pack_linears(model)
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        want, got = ref(input_ids=ids).logits.float(), model(input_ids=ids).logits
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).abs().max().item() < 0.05


def test_pack_linears_refuses_float16():
    model = build_model("llama").half()
    with pytest.raises(ValueError, match="float16"):
        pack_linears(model)
    assert not is_packed(model)


@needs_packing
def test_speculative_decoding_on_a_packed_model_equals_plain_decoding():
    model = build_model("llama")
    pack_linears(model)
    sf = specframe.load(target=Target(model, build_tokenizer()), proposers=[{"name": "ngram", "k": 4}],
                        max_new_tokens=24)
    spec = sf.generate_result(PROMPT)
    plain = sf.generate_result(PROMPT, proposers=[{"name": "none"}])
    assert spec.token_ids == plain.token_ids and len(spec.token_ids) == 24
    assert spec.metrics.drafted_nodes > 0 and plain.metrics.target_forwards == 24


# --- the router and the measured cost curve --------------------------------------------------------------------------


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
    assert run(CostCurve.linear(0.0)) == whole  # a flat measured curve keeps them whole
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


# --- config and CLI --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1])
def test_threads_below_one_rejected(bad, tmp_path):
    with pytest.raises(ConfigError, match=r"threads must be in \[1, 1024\] or auto"):
        load_config(None, threads=bad)
    f = tmp_path / "c.yaml"
    f.write_text(f"threads: {bad}\n")
    with pytest.raises(ConfigError, match="threads"):
        load_config(f)


def test_threads_and_prepack_accepted(tmp_path):
    assert load_config(None).threads == "auto" and load_config(None).prepack == "auto"
    assert load_config(None, threads="auto").threads == "auto"
    assert load_config(None, threads=2).threads == 2
    for value, want in ((True, True), (False, False), ("auto", "auto")):
        assert load_config(None, prepack=value).prepack == want
    f = tmp_path / "c.yaml"
    f.write_text("threads: 3\nprepack: false\n")
    cfg = load_config(f)
    assert (cfg.threads, cfg.prepack) == (3, False)
    with pytest.raises(ConfigError, match="prepack"):
        load_config(None, prepack="maybe")
    with pytest.raises(ConfigError, match="threads"):
        load_config(None, threads="many")


def test_threads_true_is_rejected(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("threads: yes\n")
    with pytest.raises(ConfigError, match="threads"):
        load_config(f)


@pytest.mark.parametrize("args, needle", [(["--threads", "x"], "--threads"), (["--threads", "0"], "--threads"),
                                          (["--threads", "-2"], "--threads"), (["--prepack", "maybe"], "--prepack")])
def test_cli_bad_machine_flags(args, needle, no_model_load):
    from specframe import cli

    result = CliRunner().invoke(cli.app, ["generate", "hello", *args])
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stdout == ""
    lines = result.stderr.strip("\n").splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert needle in lines[0] and repr(args[-1]) in lines[0]
    assert "Traceback" not in result.output


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
