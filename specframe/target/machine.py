"""What machine this is and how busy it is: the CPU's fingerprint, the cores this process may use, and the CPU
time other processes take from them.

torch on a small CPU collapses when it runs more threads than there are free cores: OpenMP threads spin-wait for
each other at every kernel's barrier, and a thread that shares its core with a busy neighbour stalls the others
(measured on a 2-core machine with one busy neighbour: 2 threads 2-3.5x slower than 1 thread). So specframe picks
its thread count from the cores left free (:func:`choose_threads`) and re-checks while it runs
(:class:`LoadMonitor`). Measured on that machine, ``OMP_WAIT_POLICY=PASSIVE`` instead of fewer threads cost 1.6x
when the machine was quiet, so the wait policy is left to the user (see docs/machine.md).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

# ISA features that decide which kernels torch can use for matrix products (bf16 natively or not, int8 dot products)
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8", "amx_tile",
             "asimd", "sve", "bf16", "i8mm")


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, list[str]]:
    """(CPU model name, the :data:`ISA_FLAGS` it has) from ``/proc/cpuinfo``; platform names elsewhere."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model name", "Hardware") and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key in ("flags", "Features"):
                    flags.update(value.split())
    except OSError:
        pass
    return model, [f for f in ISA_FLAGS if f in flags]


def usable_cores() -> tuple[int, str]:
    """Cores this process may run on: the CPU affinity mask, capped by a cgroup CPU quota. Returns (count, why)."""
    try:
        cores = len(os.sched_getaffinity(0))
        why = f"{cores} in the CPU affinity mask"
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
        why = f"{cores} CPUs"
    quota = cgroup_cpu_quota()
    if quota is not None and quota < cores:
        cores = max(1, int(quota + 0.5))
        why += f", capped by the cgroup CPU quota {quota:g}"
    return cores, why


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The cgroup's CPU quota in cores (cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``); None when unlimited."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def fingerprint() -> dict:
    """What decides the speed of a forward on this machine: CPU model, ISA flags, usable cores, torch version."""
    import torch

    model, isa = _cpuinfo()
    cores, _ = usable_cores()
    return {"cpu": model, "isa": list(isa), "cores": cores, "machine": platform.machine(), "torch": torch.__version__}


def fingerprint_key(*parts: object) -> str:
    """A short stable hash of the fingerprint plus ``parts`` (model identity, device)."""
    blob = json.dumps([fingerprint(), [str(p) for p in parts]], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _proc_stat() -> tuple[float, float] | None:
    """(busy, total) CPU seconds so far of the CPUs this process may run on (its affinity mask; the per-CPU lines
    of ``/proc/stat``, the machine-wide line where they are missing); None where ``/proc/stat`` is missing.
    Load on CPUs outside the mask takes nothing from this process. (A cgroup CPU quota on a larger host is not
    seen this way: there the figure counts the whole mask.)"""
    try:
        with open("/proc/stat") as f:
            lines = [line.split() for line in f if line.startswith("cpu")]
    except OSError:
        return None
    try:
        mine = {f"cpu{i}" for i in os.sched_getaffinity(0)}
    except AttributeError:
        mine = set()
    rows = [r for r in lines if r[0] in mine] or [r for r in lines if r[0] == "cpu"]
    try:
        busy = total = 0.0
        for r in rows:
            fields = [float(x) for x in r[1:]]
            idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
            t = sum(fields[:8])  # guest time is already counted in user
            busy, total = busy + t - idle, total + t
    except (ValueError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return busy / tick, total / tick


def _own_cpu_s() -> float:
    """CPU seconds this process (all its threads) has used."""
    t = os.times()
    return t.user + t.system


@dataclass
class LoadSample:
    """Other processes' CPU use over an interval, in cores (1.0 = one core kept busy), and how it was seen."""

    others: float
    interval_s: float
    source: str  # "/proc/stat" | "loadavg"


class LoadMonitor:
    """Measures how many cores other processes keep busy: the machine's busy CPU time minus this process's own,
    over the time since the previous sample (so sampling costs nothing while a run goes on)."""

    def __init__(self) -> None:
        self._last: tuple[float, float, float] | None = None  # (wall, machine busy s, own cpu s)
        self.samples: list[float] = []

    def _now(self) -> tuple[float, float, float] | None:
        stat = _proc_stat()
        if stat is None:
            return None
        return time.monotonic(), stat[0], _own_cpu_s()

    def sample(self, settle_s: float = 0.25) -> LoadSample:
        """Others' load since the previous call; the first call (or one right after another) watches ``settle_s``."""
        now = self._now()
        if now is None:  # no /proc/stat: the 1-minute load average, which counts this process too
            try:
                load = os.getloadavg()[0]
            except (AttributeError, OSError):
                load = 0.0
            return self._keep(LoadSample(load, 60.0, "loadavg"))
        if self._last is None or now[0] - self._last[0] < 0.05:
            self._last = now
            time.sleep(settle_s)
            now = self._now()
        wall = now[0] - self._last[0]
        others = ((now[1] - self._last[1]) - (now[2] - self._last[2])) / max(wall, 1e-6)
        self._last = now
        return self._keep(LoadSample(max(0.0, others), wall, "/proc/stat"))

    def _keep(self, s: LoadSample) -> LoadSample:
        self.samples.append(s.others)
        return s


def choose_threads(cores: int, others: float, candidates: list[int] | None = None) -> int:
    """The largest thread count that fits in the free cores (at least 1).

    A core counts as free when others use less than 0.3 of it: one thread too many costs far more (threads wait
    for a thread that shares its core) than one too few. ``candidates``: the thread counts allowed (e.g. those a
    machine profile measured); the largest one that fits, else the smallest.
    """
    fit = max(1, math.floor(cores - others + 0.3))
    fit = min(fit, cores)
    if candidates:
        ok = [c for c in candidates if c <= fit]
        return max(ok) if ok else min(candidates)
    return fit
