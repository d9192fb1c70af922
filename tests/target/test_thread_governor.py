"""The thread governor (:class:`specframe.target.profile.ThreadGovernor`): automatic threads follow others' load, and
the cost curve the router reads follows the threads; explicit threads never change, but a load they do not fit
is warned about once."""

from __future__ import annotations

import logging

import pytest
import torch

from specframe.target.cost import CostCurve
from specframe.target.machine import LoadSample
from specframe.target.profile import Candidate, Settings, ThreadGovernor

from tests.fakes import make_profile


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
