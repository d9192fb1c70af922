"""The machine's usable cores and others' load (:mod:`specframe.target.machine`): the thread count that fits the free
cores, the cgroup CPU quota, the affinity mask, and LoadMonitor's reading of /proc/stat (or the load average).

Nothing here measures the real machine: counters and clocks are faked so every value is known.
"""

from __future__ import annotations

import io
import os
from types import SimpleNamespace

import pytest

import specframe.target.machine as machine
from specframe.target.machine import LoadMonitor, cgroup_cpu_quota, choose_threads, usable_cores

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
