"""Synthetic acceptance (specframe.bench.synthetic, the `synthetic` proposer): schedules of minimum variance, vLLM's
semantics, reproduction of a recorded profile's shapes, the bench's labels, and bad config."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from specframe.bench.speculation_profile import build_profile, rates_for_length, read_profile
from specframe.bench.synthetic import CreditSchedule, ShapeSchedule, SyntheticVerifier, marginals_from_conditional
from specframe.contracts import DraftTree
from specframe.sampling import SamplingParams

from tests.fakes import assert_user_error, invoke

V = 16


def test_credit_schedule_is_within_one_of_the_marginals_and_keeps_prefixes():
    m = [0.9, 0.6, 0.3, 0.05]
    s = CreditSchedule(m)
    lengths = [s.next(4) for _ in range(100)]
    for i, want in enumerate(m):
        assert abs(sum(a > i for a in lengths) - 100 * want) <= 2.0
    assert [lengths.count(a) for a in range(5)] == [10, 30, 30, 25, 5]  # P(A = j) = m[j - 1] - m[j], exactly
    assert sum(lengths) == pytest.approx(100 * sum(m), abs=1)


def _verify(v: SyntheticVerifier, n: int, logits: torch.Tensor | None = None) -> tuple[int, int]:
    draft = DraftTree.chain([3] * n) if n else DraftTree.empty(1)
    logits = logits if logits is not None else torch.zeros(1, n + 1, V)
    r = v.verify(draft, logits, SamplingParams(), torch.Generator())
    return len(r.accepted_nodes[0]), r.next_token[0]


def test_acceptance_length_gives_vllm_s_mean_and_the_bonus_is_never_eos():
    k = 4
    v = SyntheticVerifier(marginals_from_conditional(rates_for_length(2.5, k)), eos_token_ids=[7])
    logits = torch.zeros(1, k + 1, V)
    logits[..., 7], logits[..., 2] = 5.0, 4.0  # EOS is the target's favourite: the next best is taken
    steps = [_verify(v, k, logits) for _ in range(400)]
    assert sum(1 + a for a, _ in steps) / 400 == pytest.approx(2.5, abs=0.01)
    assert {tok for _, tok in steps} == {2}
    assert _verify(v, 0)[0] == 0  # nothing drafted: nothing accepted


def test_a_joint_histogram_is_followed_per_node_count():
    shapes = {"4/0": 3, "4/2": 1, "2/1": 2}
    s = ShapeSchedule(shapes, CreditSchedule([0.5]))
    got = [s.next(4, 4) for _ in range(40)]
    assert got.count(0) == 30 and got.count(2) == 10
    assert [s.next(2, 2) for _ in range(5)] == [1] * 5
    assert s.next(3, 3) in (0, 1)  # an unseen width: the fallback marginals


def test_the_synthetic_proposer_drafts_its_widths_in_proportion():
    from specframe.contracts import DecodeState, TargetInfo
    from specframe_plugins.synthetic import SyntheticConfig, SyntheticProposer

    info = TargetInfo(V, frozenset({0}), 512, torch.device("cpu"), torch.float32)
    p = SyntheticProposer(SyntheticConfig(widths={0: 1, 3: 3}), info)
    state = DecodeState(torch.tensor([[1, 2, 9]]), 2, SamplingParams(), torch.Generator())
    p.start(state)
    sizes = [p.propose(state, 16).num_nodes for _ in range(40)]
    assert sizes.count(0) == 10 and sizes.count(3) == 30
    assert p.propose(state, 2).token_ids.tolist() in ([[9, 9]], [])  # the newest token, cut to the budget


def _config(root, at, strategies):
    cfg = {"model": str(root / "tiny-llama"), "dtype": "float32", "threads": 1, "warmup": 0, "max_new_tokens": 24,
           "strategies": strategies}
    path = at / "bench.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_synthetic_strategy_is_labelled_never_lossless_and_reproduces_a_recorded_profile(trace_files, tmp_path):
    cfg = _config(trace_files, tmp_path, [
        {"name": "ngram", "proposers": ["ngram"]},
        {"name": "at-2.5", "proposers": [{"name": "synthetic", "k": 4}], "router": "none",
         "synthetic": {"acceptance_length": 2.5}}])
    result = invoke("bench", "--config", str(cfg), "--questions", str(trace_files / "q.jsonl"), "--output",
                    str(tmp_path / "o"), "--no-profile")
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    assert all(r.get("synthetic") for r in doc["records"] if r["strategy"] == "at-2.5")
    assert not [m for m in doc["lossless"] or [] if m["strategy"] == "at-2.5"]
    assert doc["summary"]["strategies"]["at-2.5"]["synthetic"] is True
    report = (tmp_path / "o" / "report.md").read_text()
    assert "at-2.5 (synthetic, not lossless)" in report
    prof = read_profile(tmp_path / "o" / "profiles" / "at-2.5" / "speculation_profile.json")
    assert prof["measured"] is False and prof["specframe"]["synthetic"] is True
    assert abs(prof["mean_accept_length"] - 2.5) < 0.35  # (a few short requests; the schedule restarts each)
    # the recorded ngram profile imposed on the synthetic drafter: the same steps, shapes and acceptance
    ngram = tmp_path / "o" / "profiles" / "ngram" / "speculation_profile.json"
    cfg2 = _config(trace_files, tmp_path, [
        {"name": "as-ngram", "proposers": [{"name": "synthetic", "profile": str(ngram)}], "router": "none",
         "synthetic": {"profile": str(ngram)}}])
    result = invoke("bench", "--config", str(cfg2), "--questions", str(trace_files / "q.jsonl"), "--output",
                    str(tmp_path / "o2"), "--no-profile")
    assert result.exit_code == 0, result.output
    again = read_profile(tmp_path / "o2" / "profiles" / "as-ngram" / "speculation_profile.json")
    recorded = read_profile(ngram)
    # (71 recorded steps of 5 short requests, most of its shapes seen once, and widths cut by the token limit near each
    # request's end: the mean follows within 0.2 here; the schedules themselves are exact, see the tests above)
    assert abs(again["mean_accept_length"] - recorded["mean_accept_length"]) < 0.2
    assert again["specframe"]["steps_by_shape"]["8/8"] >= 1 and again["specframe"]["steps_by_shape"]["0/0"] > 40
    widths = lambda p: {k.split("/")[0] for k in p["specframe"]["steps_by_shape"]}  # noqa: E731
    assert widths(again) <= widths(recorded)


@pytest.mark.parametrize("synthetic, needle", [
    ({"acceptance_length": 2.0, "profile": "p.json"}, "give exactly one of acceptance_length, acceptance_rates, "
                                                      "profile (got acceptance_length, profile)"),
    ({"acceptance_rates": [0.5, 0.7]}, "acceptance_rates[1] = 0.7 > acceptance_rates[0] = 0.5"),
    ({"acceptance_length": 2.0}, "synthetic.acceptance_length needs the draft length it spreads over"),
    ({"profile": "missing.json"}, "speculation profile missing.json: cannot read it"),
])
def test_bad_synthetic_config_is_one_error_line(trace_files, tmp_path, synthetic, needle):
    cfg = _config(trace_files, tmp_path, [{"name": "s", "proposers": [{"name": "none"}], "synthetic": synthetic}])
    result = invoke("bench", "--config", str(cfg), "--questions", str(trace_files / "q.jsonl"), "--output",
                    str(tmp_path / "o"), "--no-profile")
    assert_user_error(result, needle)
    assert not (tmp_path / "o").exists()


def test_a_profile_built_from_synthetic_records_is_marked_unmeasured():
    rec = {"strategy": "s", "kind": "specframe", "category": None, "synthetic": True,
           "metrics": {"target_forwards": 2, "accepted_nodes": 2, "accepted_by_depth": [1, 1], "drafted_by_depth": [2, 2],
                       "new_tokens": 4, "wall_s": 1.0, "propose_s": 0.0}}
    p = build_profile([rec], method="synthetic", accept_length_model="chain_analytic", synthetic=True)
    assert p["measured"] is False and p["mean_accept_length"] == 2.0


def test_a_synthetic_sweep_is_the_machine_s_speed_surface(trace_files, tmp_path):
    cfg = _config(trace_files, tmp_path, [
        {"name": "surface", "proposers": [{"name": "synthetic"}], "router": "none",
         "synthetic": {"acceptance_length": 1.0},
         "grid": {"synthetic.acceptance_length": [1.0, 2.0, 3.0], "synthetic.k": [1, 2]}}])
    result = invoke("bench", "--config", str(cfg), "--questions", str(trace_files / "q.jsonl"), "--output",
                    str(tmp_path / "o"), "--no-profile", "--limit-per-category", "1")
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    surf = doc["speed_surface"]
    assert surf["al"] == [1.0, 2.0, 3.0] and surf["k"] == [1, 2]
    assert sorted(surf["cells"]) == ["1/1", "1/2", "2/1", "2/2", "3/2"]  # AL 3 > k + 1 = 2: no such point
    for key, cell in surf["cells"].items():
        al, k = key.split("/")
        strategy = next(s for s in doc["config"]["strategies"] if s["name"] == cell["strategy"])
        assert strategy["proposers"][0]["k"] == int(k)  # the drafter drafts what the acceptance spans
        prof = doc["speculation_profiles"][cell["strategy"]]
        assert abs(prof["mean_accept_length"] - float(al)) < 0.3 and cell["speedup"] > 0
    assert (tmp_path / "o" / "speed_surface.png").stat().st_size > 1000
    assert "## Speed surface (synthetic acceptance, not lossless)" in (tmp_path / "o" / "report.md").read_text()
