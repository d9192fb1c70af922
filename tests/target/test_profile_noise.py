"""Measurements that hold (issue 67, 5): the machine profile's interleaved rounds and their spread, choices that
noise does not make (the within-noise rule and its tie-break), speculation never on slower settings than plain
decoding's best unless it pays against them, version-1 profile files, the plain reference handed to the cost curve,
and the forced Xeon profiles of ``lab/data/machine-profiles/``.

Every measurement here is constructed (:func:`tests.fakes.xeon_profile`, :func:`rows_profile`): nothing is timed.
"""

from __future__ import annotations

import json
import logging

import pytest

import specframe.target.profile as tune
from specframe.target.cost import NS, CostCurve, expected_tokens
from specframe.target.machine import LoadMonitor, LoadSample
from specframe.target.profile import (
    NOISE_FLOOR,
    PROFILE_VERSION,
    Candidate,
    MachineProfile,
    Measured,
    cost_ratio,
    faster,
    fingerprint_key,
    get_profile,
    interleave,
    load_profile,
    median_ci,
    preference,
    profile_path,
    resolve_settings,
)

from tests.fakes import ROOT, XEON_ROWS, make_profile, xeon_profile

XEON_NOISY = {"bf16/2t": [1.07, 0.97, 1.00, 1.02, 0.95], "other": [1.0] * 5}  # bf16/2t 8.6 % cheaper, jitter 7 %
XEON_TIGHT = {"bf16/2t": [1.004, 0.997, 1.000, 1.002, 0.995], "other": [1.0] * 5}
PLAIN, SPEC = Candidate("bfloat16", 1, True), Candidate("bfloat16", 2, False)  # the Xeon's old split


def rows_profile(rows: dict[Candidate, list[list[float]]], sessions: dict[Candidate, int] | None = None,
                 ) -> MachineProfile:
    """A profile of one context (128) whose candidates have the given rounds (each a row of T(n))."""
    measured = [Measured.of_rounds(c, {128: rs}, (sessions or {}).get(c, 0)) for c, rs in rows.items()]
    return MachineProfile("k" * 16, "tiny", "cpu", {}, measured, 0.0, 1.0, rounds=max(len(r) for r in rows.values()))


def scaled(row: list[float], factors: list[float]) -> list[list[float]]:
    return [[t * f for t in row] for f in factors]


# --- the spread ---------------------------------------------------------------------------------------------------


def test_median_ci_is_the_range_below_six_values_then_order_statistics():
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)
    assert median_ci([5.0]) == (5.0, 5.0)
    assert median_ci([float(x) for x in range(5)]) == (0.0, 4.0)  # coverage 94 %: the best 5 values give
    assert median_ci([float(x) for x in range(10)]) == (1.0, 8.0)  # x(2), x(9): coverage 97.9 %
    assert median_ci([float(x) for x in range(20)]) == (5.0, 14.0)  # x(6), x(15): coverage 95.9 %
    with pytest.raises(ValueError):
        median_ci([])


def test_measured_rounds_give_the_medians_and_each_points_interval():
    m = Measured.of_rounds(SPEC, {128: [[10.0, 20.0], [12.0, 18.0], [11.0, 30.0]]})
    assert m.t_ms == {128: [11.0, 20.0]} and m.n_rounds == 3
    assert m.spread() == {128: [[10.0, 18.0], [12.0, 30.0]]}
    assert m.costs(False) == [10.0, 12.0, 11.0] and m.cost(False) == 11.0
    one = Measured(SPEC, {128: [10.0, 20.0]})  # no rounds: one round, its interval the point
    assert one.n_rounds == 1 and one.round_curves() == [one.t_ms] and one.spread() == {128: [[10.0, 20.0]] * 2}


def test_later_rounds_time_the_decisive_points_and_costs_are_priced_on_them_alone():
    d = len(tune.DECISIVE_NS)
    assert tune.DECISIVE_NS == (1, 2, 4, 8, 16) and NS[:d] == tune.DECISIVE_NS
    first = [10.0, 11.0, 12.0, 14.0, 18.0, 1.0, 1.0, 1.0]  # (the points past 16 deliberately cheap: never priced)
    m = Measured.of_rounds(SPEC, {128: [first, [12.0, 13.0, 14.0, 16.0, 20.0], [8.0, 9.0, 10.0, 12.0, 16.0]]})
    assert m.t_ms == {128: [10.0, 11.0, 12.0, 14.0, 18.0, 1.0, 1.0, 1.0]} and m.n_rounds == 3
    assert m.spread() == {128: [[8.0, 9.0, 10.0, 12.0, 16.0, 1.0, 1.0, 1.0],
                                [12.0, 13.0, 14.0, 16.0, 20.0, 1.0, 1.0, 1.0]]}
    # speculative: min over n <= 16 of T(n) / E(n), E at the reference acceptance 0.6 (E(8) = 2.458)
    assert m.cost(True) == pytest.approx(min(t / expected_tokens(n, 0.6) for n, t in zip(tune.DECISIVE_NS, first)))
    assert m.costs(False) == [10.0, 12.0, 8.0]
    doc = MachineProfile("k", "tiny", "cpu", {}, [m], 0.0, 1.0, rounds=3).to_json()
    assert MachineProfile.from_json(doc).measured[0].rounds == m.rounds
    doc["candidates"][0]["t_rounds"]["128"][1] = [12.0, 13.0]  # shorter than the decisive points
    with pytest.raises(ValueError, match="fewer points"):
        MachineProfile.from_json(doc)


def test_rounds_of_one_session_pair_up_so_a_drift_that_hits_all_alike_cancels():
    drift = [1.0, 1.3, 0.8, 1.15, 0.9]  # the machine's speed wandering by 30 % between rounds
    a = {Candidate("bfloat16", 2, False): scaled([9.0], drift), Candidate("float32", 2, False): scaled([10.0], drift)}
    paired = rows_profile(a)
    fast, slow = paired.measured
    assert cost_ratio(fast, slow, False, False) == pytest.approx((0.9, 0.9, 0.9))
    assert faster(fast, slow, False)
    apart = rows_profile(a, {Candidate("float32", 2, False): 1})  # other sessions: the intervals taken apart
    fast, slow = apart.measured
    _, lo, hi = cost_ratio(fast, slow, False, False)
    assert (lo, hi) == pytest.approx((0.9 * 0.8 / 1.3, 0.9 * 1.3 / 0.8))
    assert not faster(fast, slow, False)
    assert not faster(*paired.measured, False, paired=False)  # two profiles: never paired


def test_one_round_has_only_the_noise_floor():
    one = rows_profile({Candidate("bfloat16", 2, False): [[10.0]], Candidate("float32", 2, False): [[10.2]],
                        Candidate("float32", 1, False): [[9.0]]})
    bf, fp2, fp1 = one.measured
    assert not faster(bf, fp2, False) and not faster(fp2, bf, False)  # 2 %: within NOISE_FLOOR
    assert faster(fp1, bf, False) and 1 - 9.0 / 10.0 > NOISE_FLOOR


# --- choosing -----------------------------------------------------------------------------------------------------


def test_within_noise_the_tie_break_keeps_the_first_and_says_so():
    bf, fp = Candidate("bfloat16", 2, False), Candidate("float32", 2, False)
    assert sorted([fp, Candidate("bfloat16", 1, True), bf, Candidate("bfloat16", 1, False)], key=preference) == \
        [bf, Candidate("bfloat16", 1, False), Candidate("bfloat16", 1, True), fp]
    # fp32 5 % faster at the median, but one round of five the other way: within noise, bf16 (first) kept
    noisy = rows_profile({bf: scaled([20.0], [1.0] * 5), fp: scaled([19.0], [1.0, 0.98, 1.06, 1.0, 1.01])})
    c, m, why = noisy.choose(speculative=False)
    assert c == bf and m is noisy.find(bf)
    assert why.startswith("bf16/2t: within noise of the fastest measured, fp32/2t (ms per token, plain decoding: "
                          "fp32/2t 19.0, bf16/2t 20.0; fp32/2t / bf16/2t 0.95, interval 0.93-1.01); kept by the "
                          "tie-break (bf16, more threads, plain weights first)")
    # the same medians, every round 5 % faster: outside noise, fp32 taken
    tight = rows_profile({bf: scaled([20.0], [1.0] * 5), fp: scaled([19.0], [1.0, 0.99, 1.01, 1.0, 1.0])})
    c, _, why = tight.choose(speculative=False)
    assert c == fp and why == "fastest measured (ms per token, plain decoding: fp32/2t 19.0, bf16/2t 20.0)"
    # two within noise of the fastest: named
    three = rows_profile({bf: scaled([20.0], [1.0] * 5), fp: scaled([19.0], [1.0] * 5),
                          Candidate("float32", 1, False): scaled([19.1], [1.0] * 5)})
    c, _, why = three.choose(speculative=False)
    assert c == fp and why.endswith("; within noise of it: fp32/1t")


def test_the_choice_is_never_one_that_another_beats_outside_noise():
    """The fastest by its median is too noisy to beat the default, but another beats the default every round: the
    default is left, for the first candidate nothing beats."""
    d, x, f = Candidate("bfloat16", 2, False), Candidate("bfloat16", 1, False), Candidate("float32", 2, False)
    prof = rows_profile({d: scaled([20.0], [1.0] * 5), x: scaled([18.8], [1.0, 1.01, 0.99, 1.0, 1.0]),
                         f: scaled([18.0], [0.7, 1.3, 1.0, 1.4, 0.8])})
    md, mx, mf = (prof.find(c) for c in (d, x, f))
    assert not faster(mf, md, False) and faster(mx, md, False) and not faster(mf, mx, False)
    c, _, why = prof.choose(speculative=False)
    assert c == x and why.startswith("bf16/1t: within noise of the fastest measured, fp32/2t")


def test_old_rule_split_on_the_xeon_shape():
    """One round (a version-1 file): the point estimates split as the issue reports, and 8.6 % is outside the floor."""
    prof = xeon_profile()
    assert prof.choose(max_threads=2, speculative=False)[0] == PLAIN
    assert prof.find(PLAIN).cost(False) == pytest.approx(44.9)
    assert prof.find(SPEC).cost(True) == pytest.approx(22.681, abs=1e-3)  # 8.6 % below bf16/1t/packed's
    assert prof.find(PLAIN).cost(True) == pytest.approx(24.817, abs=1e-3)
    c, _, why = prof.choose(max_threads=2)
    assert c == SPEC and why.endswith("beats plain decoding's best, bf16/1t/packed (T(1) 44.9 ms, 24.8 "
                                      "speculative), outside noise")


def test_speculation_runs_on_plain_decodings_settings_when_its_own_win_within_noise():
    prof = xeon_profile(XEON_NOISY)
    assert prof.choose(max_threads=2, speculative=False)[0] == PLAIN
    c, m, why = prof.choose(max_threads=2)
    assert c == PLAIN and m is prof.find(PLAIN)
    assert why.startswith("bf16/1t/packed: within noise of the fastest measured, bf16/2t (ms per token at the "
                          "reference acceptance: bf16/2t 22.7, bf16/2t/packed 24.1, bf16/1t/packed 24.8;")
    assert why.endswith("kept by the tie-break (plain decoding's settings first, then bf16, more threads, plain "
                        "weights first)")
    tight = xeon_profile(XEON_TIGHT)  # the same medians, rounds within 0.5 %: speculation's own settings pay
    c, _, why = tight.choose(max_threads=2)
    assert c == SPEC and "beats plain decoding's best, bf16/1t/packed (T(1) 44.9 ms" in why
    assert tight.plain_reference(max_threads=2) == ("bf16/1t/packed", 44.9)


def test_speculation_falls_back_to_plain_decodings_settings_when_nothing_it_may_run_beats_them(monkeypatch):
    """The guard behind the choice: the settings speculation would run on must beat plain decoding's best T(1) and
    plain decoding's settings' own speculative cost outside noise, whatever the within-noise relation made of the
    rest (here a relation where P is beaten only by a candidate that another beats)."""
    prof = xeon_profile(XEON_TIGHT)
    real = tune.faster
    dominated = {("bf16/2t/packed", "bf16/1t/packed"), ("bf16/2t", "bf16/2t/packed")}  # (a beats b), nothing else

    def relation(a, b, a_spec=True, b_spec=None, accept=0.6, paired=True):
        if not a_spec:  # plain decoding as measured: bf16/1t/packed
            return real(a, b, a_spec, b_spec, accept, paired)
        return b_spec is not False and (a.candidate.label, b.candidate.label) in dominated

    monkeypatch.setattr(tune, "faster", relation)
    c, _, why = prof.choose(max_threads=2)
    assert c == PLAIN and why == ("plain decoding's settings, bf16/1t/packed: speculation's fastest, bf16/2t (22.7 ms "
                                  "per token at the reference acceptance), does not beat plain decoding's best T(1) "
                                  "(44.9 ms) outside noise")

    def relation_t1(a, b, a_spec=True, b_spec=None, accept=0.6, paired=True):  # beats P's T(1), not its speculation
        return relation(a, b, a_spec, b_spec, accept, paired) or (
            a_spec and a.candidate == SPEC and b.candidate == PLAIN and b_spec is False)

    monkeypatch.setattr(tune, "faster", relation_t1)
    c, _, why = prof.choose(max_threads=2)
    assert c == PLAIN and why.endswith("is within noise of speculation on them (24.8)")


def test_runnable_keeps_candidates_this_machine_cannot_run_out():
    prof = xeon_profile(XEON_TIGHT)
    nopack = lambda c: not c.prepack  # noqa: E731
    assert prof.choose(max_threads=2, speculative=False, runnable=nopack)[0] == Candidate("bfloat16", 1, False)
    assert prof.choose(max_threads=2, runnable=nopack)[0] == SPEC
    assert prof.plain_reference(max_threads=2, runnable=nopack) == ("bf16/1t", 47.5)


# --- files --------------------------------------------------------------------------------------------------------


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_version_2_keeps_the_rounds_and_intervals(cache):
    prof = xeon_profile(XEON_NOISY)
    doc = json.loads(json.dumps(prof.to_json()))
    assert doc["version"] == PROFILE_VERSION == 2 and doc["rounds"] == 5 and doc["repeats"] == tune.REPEATS
    one = next(c for c in doc["candidates"] if c["label"] == "bf16/2t")
    assert len(one["t_rounds"]["128"]) == 5 and one["t_rounds"]["128"][0][0] == pytest.approx(47.0 * 1.07)
    assert one["t_ci"]["512"] == [[pytest.approx(52.0 * 0.95)] + [pytest.approx(t * 0.95) for t in
                                                                 XEON_ROWS[SPEC][1][1:]],
                                  [pytest.approx(t * 1.07) for t in XEON_ROWS[SPEC][1]]]
    back = MachineProfile.from_json(doc)
    assert back.version == 2 and [m.rounds for m in back.measured] == [
        {k: [[round(t, 3) for t in r] for r in rows] for k, rows in m.rounds.items()} for m in prof.measured]
    assert back.choose(max_threads=2)[0] == prof.choose(max_threads=2)[0] == PLAIN
    bad = json.loads(json.dumps(doc))
    bad["candidates"][0]["t_rounds"]["512"] = bad["candidates"][0]["t_rounds"]["512"][:2]
    with pytest.raises(ValueError, match="rounds differ"):
        MachineProfile.from_json(bad)


V1 = {"version": 1, "key": "k", "model": "tiny", "device": "cpu", "fingerprint": {"cpu": "old"}, "others_load": 0.0,
      "seconds": 40.0, "ns": list(NS), "candidates": [
          {"dtype": "bfloat16", "threads": 2, "prepack": False, "label": "bf16/2t",
           "t_ms": {"128": [20.0, 20.5, 21.0, 22.0, 25.0, 30.0, 40.0, 60.0]}},
          {"dtype": "float32", "threads": 2, "prepack": False, "label": "fp32/2t",
           "t_ms": {"128": [19.8, 30.0, 45.0, 80.0, 150.0, 290.0, 570.0, 1130.0]}}]}


def test_a_version_1_file_is_read_as_one_round():
    prof = MachineProfile.from_json(V1)
    assert prof.version == 1 and prof.rounds == 1 and all(not m.rounds and m.n_rounds == 1 for m in prof.measured)
    c, _, why = prof.choose(speculative=False)  # fp32's T(1) 1 % lower: within the floor, bf16 kept
    assert c == Candidate("bfloat16", 2, False) and "within noise of the fastest measured, fp32/2t" in why
    assert prof.choose()[0] == Candidate("bfloat16", 2, False)
    assert "t_rounds" not in json.dumps(prof.to_json())


def quiet(monkeypatch, others: float) -> None:
    monkeypatch.setattr(LoadMonitor, "sample", lambda self, settle_s=0.25: self._keep(LoadSample(others, settle_s, "")))


def test_a_version_1_file_is_measured_again_when_the_machine_is_quiet(tmp_path, cache, monkeypatch):
    key = fingerprint_key("tiny", "cpu")
    path = profile_path(key)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**V1, "key": key}))
    calls = []

    def measure(directory, model_name, device, progress=None):
        calls.append(model_name)
        return make_profile(key=key)

    monkeypatch.setattr(tune, "measure_profile", measure)
    quiet(monkeypatch, 1.5)  # busy now: the old file is used as it is (better than a measurement under load)
    assert get_profile(tmp_path, "tiny", "cpu").version == 1 and calls == []
    quiet(monkeypatch, 0.0)
    prof = get_profile(tmp_path, "tiny", "cpu")
    assert calls == ["tiny"] and prof.version == PROFILE_VERSION
    assert load_profile(key).version == PROFILE_VERSION  # saved over the old file
    assert get_profile(tmp_path, "tiny", "cpu").version == PROFILE_VERSION and calls == ["tiny"]


def test_resolve_settings_carries_plain_decodings_reference_and_skips_what_cannot_run(tmp_path, cache, monkeypatch):
    key = fingerprint_key("tiny", "cpu")
    xeon_profile(XEON_TIGHT).save(profile_path(key))
    monkeypatch.setattr(tune, "usable_cores", lambda: (2, "2 test cores"))
    quiet(monkeypatch, 0.0)
    monkeypatch.setattr("specframe.target.packed.packing_available", lambda dtype, device: True)
    s, prof, _ = resolve_settings(tmp_path, "tiny", "cpu", measure=False)
    assert (s.dtype, s.threads, s.prepack) == ("bfloat16", 2, False)
    assert (s.plain, s.plain_t1_ms) == ("bf16/1t/packed", 44.9)
    s, _, _ = resolve_settings(tmp_path, "tiny", "cpu", speculative=False, measure=False)
    assert (s.dtype, s.threads, s.prepack, s.plain, s.plain_t1_ms) == ("bfloat16", 1, True, "bf16/1t/packed", 44.9)
    # a CPU without bf16 packing (the profile came from another machine): packed bf16 is never chosen
    monkeypatch.setattr("specframe.target.packed.packing_available",
                        lambda dtype, device: str(dtype) != "torch.bfloat16")
    s, _, _ = resolve_settings(tmp_path, "tiny", "cpu", speculative=False, measure=False)
    assert (s.dtype, s.threads, s.prepack, s.plain_t1_ms) == ("bfloat16", 1, False, 47.5)


def test_the_loaded_targets_curve_carries_plain_decodings_t1(tmp_path, cache, monkeypatch):
    from specframe.target.loader import load_target

    from tests.fakes import build_model, build_tokenizer

    model = tmp_path / "tiny-m"
    build_model("llama").save_pretrained(model)
    build_tokenizer().save_pretrained(model)
    xeon_profile(XEON_TIGHT).save(profile_path(fingerprint_key("tiny-m", "cpu")))
    monkeypatch.setattr(tune, "usable_cores", lambda: (2, "2 test cores"))
    quiet(monkeypatch, 0.0)
    t = load_target(str(model), dtype="float32", prepack=False, measure=False)  # fp32 on every CPU: no packing
    assert (t.settings.dtype, t.settings.threads, t.settings.prepack) == ("float32", 2, False)
    assert t.settings.plain == "fp32/2t" and t.info.cost.plain_t1_ms == t.settings.plain_t1_ms == 53.0
    assert t.info.cost.plain_share() == 1.0  # plain decoding's own settings


# --- the cost curve and the forced profiles --------------------------------------------------------------------------


def test_plain_share_is_plain_decodings_best_t1_in_these_settings_one_token_forwards():
    assert CostCurve({128: [50.0, 55.0], 512: [60.0, 65.0]}, plain_t1_ms=49.5).plain_share() == pytest.approx(0.9)
    assert CostCurve({128: [50.0, 55.0]}).plain_share() == 1.0
    assert CostCurve({128: [50.0, 55.0]}, plain_t1_ms=60.0).plain_share() == 1.0  # never above 1
    assert CostCurve(plain_t1_ms=40.0).plain_share() == 1.0 and CostCurve().plain_t1_ms is None


@pytest.mark.parametrize("kind, spec, share", [("noisy", PLAIN, 1.0), ("split", SPEC, 44.9 / 49.5)])
def test_the_forced_xeon_profiles_choose_as_documented(kind, spec, share):
    doc = json.loads((ROOT / "lab" / "data" / "machine-profiles" / f"xeon-2c-{kind}.json").read_text())
    prof = MachineProfile.from_json(doc)
    assert prof.version == PROFILE_VERSION and prof.others_load == 0.0
    assert {m.candidate: (m.t_ms[128], m.t_ms[512]) for m in prof.measured} == {
        c: (list(a), list(b)) for c, (a, b) in XEON_ROWS.items()}
    assert all(m.n_rounds == 5 for m in prof.measured)
    assert prof.choose(max_threads=2, speculative=False)[0] == PLAIN
    c, m, _ = prof.choose(max_threads=2)
    assert c == spec
    curve = CostCurve(m.t_ms, plain_t1_ms=prof.plain_reference(max_threads=2)[1])
    assert curve.plain_share() == pytest.approx(share, abs=1e-3)


def test_force_profile_writes_it_under_this_machines_key_beside_the_shared_cache(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("force_profile", ROOT / "lab" / "scripts" / "force_profile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    real = tmp_path / "real"
    (real / "models").mkdir(parents=True)
    monkeypatch.setenv("SPECFRAME_CACHE", str(real))
    src = ROOT / "lab" / "data" / "machine-profiles" / "xeon-2c-split.json"
    path = mod.force(src, tmp_path / "forced", "smollm2-135m-instruct")
    assert path == tmp_path / "forced" / "machine" / f"{fingerprint_key('smollm2-135m-instruct', 'cpu')}.json"
    assert (tmp_path / "forced" / "models").resolve() == (real / "models").resolve()
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "forced"))
    prof = load_profile(fingerprint_key("smollm2-135m-instruct", "cpu"))
    assert prof is not None and prof.choose(max_threads=2)[0] == SPEC
    with pytest.raises(ValueError, match="in use"):
        mod.force(src, tmp_path / "forced", "smollm2-135m-instruct")
    assert mod.main([str(ROOT / "README.md"), "--cache", str(tmp_path / "x")]) == 2


# --- measuring ----------------------------------------------------------------------------------------------------


def test_interleave_rotates_the_order_each_round_and_stops_at_the_budget(caplog):
    order: list[str] = []

    def slot(name: str):
        c = Candidate(name, 1, False)
        return c, (lambda: order.append(name)), (lambda ctx, warm: [1.0 if warm else 2.0] * len(NS))

    slots = [slot("a"), slot("b"), slot("c")]
    got, _ = interleave(slots, [128, 512], 3, budget_s=1e9)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert got[slots[0][0]] == {128: [[1.0] * len(NS), [2.0] * len(NS), [2.0] * len(NS)],
                                512: [[1.0] * len(NS), [2.0] * len(NS), [2.0] * len(NS)]}  # round 1 warms up
    order.clear()
    with caplog.at_level(logging.WARNING, logger="specframe"):
        got, spent = interleave(slots, [128], 3, budget_s=0.0)
    assert order == ["a"] and list(got) == [slots[0][0]] and len(got[slots[0][0]][128]) == 1 and spent > 0
    assert caplog.text.count("time limit is spent") == 2  # b and c not measured


def test_llamacpp_weights_auto_keeps_the_files_own_types_within_noise(monkeypatch):
    from types import SimpleNamespace

    from specframe.target.llamacpp import loader

    curves = {"gguf": [10.0, 15.0, 22.0, 38.0], "bf16": [9.8, 14.8, 21.5, 37.0], "q8_0": [12.0, 13.0, 14.0, 30.0]}

    class Fake:
        def __init__(self, path, *a, **k):
            self.kind, self.llama = path, self

        def close(self):
            pass

    def fake_profile(target, name, progress=None):
        m = Measured(Candidate("gguf", 2, False), {128: curves[target.kind]})
        return MachineProfile("k", name, "cpu", {}, [m], 0.0, 0.0)

    monkeypatch.setattr(loader, "_weights_file", lambda source, kind, log: kind)
    monkeypatch.setattr("specframe.target.llamacpp.binding.LlamaModel", Fake)
    monkeypatch.setattr("specframe.target.llamacpp.target.LlamaCppTarget", Fake)
    monkeypatch.setattr("specframe.target.llamacpp.profile.get_profile", fake_profile)
    source = SimpleNamespace(name="m", gguf="m.gguf")
    kind, why = loader._choose_weights(source, None, 2, "auto", False, None, lambda s: None)
    assert kind == "gguf" and why.startswith("gguf: within noise of the fastest measured, bf16")  # 2 %
    kind, why = loader._choose_weights(source, None, 2, "auto", True, None, lambda s: None)
    assert kind == "q8_0" and why.startswith("fastest measured")  # 8.125 against gguf's 10: outside noise
