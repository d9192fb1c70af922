"""Speculation profiles (specdec_bench's schema 1.0), ceilings, and their bad input: pure functions on constructed
records, then `specframe replay --profile` on the CLI trace."""

from __future__ import annotations

import json
import math

import pytest

from specframe.bench.ceilings import any_path_speedup, entropy_bound, oracle
from specframe.bench.speculation_profile import (
    build_profile,
    check_profile,
    predict_accept_length,
    rates_for_length,
    read_profile,
)
from specframe.errors import ConfigError
from specframe.replay.driver import any_path_depth

from tests.fakes import assert_user_error, invoke


def record(steps: list[int], drafted: int = 4, category: str = "qa") -> dict:
    """A bench record whose steps accepted ``steps[i]`` drafts each, every step drafting a chain of ``drafted``."""
    acc = [sum(1 for a in steps if a > i) for i in range(drafted)]
    return {"strategy": "s", "kind": "specframe", "category": category,
            "metrics": {"target_forwards": len(steps), "accepted_nodes": sum(steps), "accepted_by_depth": acc,
                        "drafted_by_depth": [len(steps)] * drafted, "new_tokens": sum(steps) + len(steps),
                        "wall_s": 1.0, "propose_s": 0.01 * len(steps), "tree_steps": 0,
                        "steps_by_shape": {f"{drafted}/{a}": steps.count(a) for a in sorted(set(steps))}}}


def test_a_profile_is_the_histogram_s_survival_function_and_passes_its_own_checks():
    long_request, short_request = record([0, 1, 2, 4, 4, 0, 1, 3]), record([4, 4], category="math")
    p = build_profile([long_request, short_request], method="ngram", accept_length_model="chain_analytic")
    # L = accepted + 1 per step: 1,2,3,5,5,1,2,4 and 5,5
    assert p["acceptance_length_histogram"] == {"1": 2, "2": 2, "3": 1, "4": 1, "5": 4}
    assert p["marginal_accept_rates"] == [0.8, 0.6, 0.5, 0.4]
    assert p["conditional_accept_rates"] == [0.8, 0.75, pytest.approx(0.833333, abs=1e-6), 0.8]
    assert p["mean_accept_length"] == pytest.approx(3.3)  # 33 / 10 = 1 + sum(marginal)
    assert p["mean_accept_length_per_request"] == pytest.approx((23 / 8 + 5) / 2)  # a short request weighs as much
    assert p["num_speculative_tokens"] == 4 and p["schema_version"] == "1.0" and p["measured"] is True
    assert p["validation"]["mean_consistency"]["passed"] and p["validation"]["marginal_monotonicity"]["passed"]
    assert p["per_category"]["math"]["mean_accept_length"] == 5.0
    assert p["per_category"]["qa"]["marginal_accept_rates"] == [0.75, 0.5, 0.375, 0.25]
    assert p["specframe"]["steps_by_shape"] == {"4/0": 2, "4/1": 2, "4/2": 1, "4/3": 1, "4/4": 4}
    assert check_profile(json.loads(json.dumps(p)), "here") is not None  # it reads back


def test_chain_analytic_predicts_shorter_lengths_and_measured_per_k_refuses():
    p = build_profile([record([0, 1, 2, 4, 4, 0, 1, 3])], method="ngram", accept_length_model="chain_analytic")
    assert predict_accept_length(p, 4) == pytest.approx(p["mean_accept_length"])
    assert predict_accept_length(p, 4, "truncate") == pytest.approx(p["mean_accept_length"])
    assert predict_accept_length(p, 1, "truncate") == pytest.approx(1.75)  # P(L >= 2) = 6 / 8
    assert predict_accept_length(p, 2, "truncate") == pytest.approx(1.75 + 0.5)
    # L = 1, 2, 3, 5, 5, 1, 2, 4 (23 tokens) cut into steps of at most k + 1 tokens: k = 1 -> 1+1+2+3+3+1+1+2 steps
    assert predict_accept_length(p, 1) == pytest.approx(23 / 14)
    assert predict_accept_length(p, 2) == pytest.approx(23 / 11)
    with pytest.raises(ConfigError, match="outside the measured 1 .. 4"):
        predict_accept_length(p, 5)
    tree = dict(p, accept_length_model="measured_per_k")
    with pytest.raises(ConfigError, match="must be measured"):
        predict_accept_length(tree, 2)


def test_vllm_s_acceptance_length_is_a_constant_conditional_rate():
    for length, k in ((2.5, 4), (1.0, 3), (4.0, 3), (3.2, 16)):
        p = rates_for_length(length, k)[0]
        assert sum(p ** i for i in range(1, k + 1)) == pytest.approx(length - 1, abs=1e-9)
    with pytest.raises(ConfigError, match=r"in \[1, 5\]"):
        rates_for_length(5.5, 4)


GOOD = build_profile([record([0, 1, 2, 4, 4, 0, 1, 3])], method="ngram", accept_length_model="chain_analytic")


@pytest.mark.parametrize("change, needle", [
    ({"schema_version": "2.0"}, "schema_version is '2.0'"),
    ({"marginal_accept_rates": [0.75, 0.8, 0.375, 0.25]}, "marginal_accept_rates[1] = 0.8 > marginal_accept_rates[0]"),
    ({"marginal_accept_rates": [0.75, 0.5, 0.375]}, "num_speculative_tokens is 4, but marginal_accept_rates has 3"),
    ({"conditional_accept_rates": [0.75, 0.9, 0.75, 0.6667]}, "conditional_accept_rates[1]"),
    ({"mean_accept_length": 3.5}, "mean_accept_length 3.5 is not 1 + sum(marginal_accept_rates)"),
    ({"marginal_accept_rates": [1.2, 0.5, 0.375, 0.25]}, "marginal_accept_rates[0] = 1.2 is not a probability"),
    ({"accept_length_model": "guess"}, "accept_length_model must be one of chain_analytic, measured_per_k"),
    ({"marginal_accept_rates": "0.5"}, "marginal_accept_rates must be a list of numbers"),
])
def test_a_profile_that_contradicts_itself_is_one_line_naming_the_field(change, needle):
    with pytest.raises(ConfigError) as exc:
        check_profile(dict(GOOD, **change), "p.json")
    assert needle in str(exc.value) and "\n" not in str(exc.value) and str(exc.value).startswith("p.json: ")


def test_another_engine_s_profile_reads_and_extrapolates(tmp_path):
    # the shape specdec_bench writes for an EAGLE-3 run (no specframe section)
    theirs = {"schema_version": "1.0", "measured": True, "method": "eagle3", "num_speculative_tokens": 3,
              "conditional_accept_rates": [0.8, 0.75, 0.5], "marginal_accept_rates": [0.8, 0.6, 0.3],
              "mean_accept_length": 2.7, "accept_length_model": "chain_analytic",
              "acceptance_length_histogram": {"1": 20, "2": 20, "3": 30, "4": 30}}
    path = tmp_path / "speculation_profile.json"
    path.write_text(json.dumps(theirs))
    doc = read_profile(path)
    assert [round(predict_accept_length(doc, k, "truncate"), 4) for k in (1, 2, 3)] == [1.8, 2.4, 2.7]
    # L = 1, 2, 3, 4 for 20, 20, 30, 30 steps: 270 tokens; at k = 1 the 3s and 4s take two steps each
    assert predict_accept_length(doc, 1) == pytest.approx(270 / 160)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        read_profile(path)


def test_replay_profile_flag_reports_it_beside_ours_and_refuses_a_bad_one(trace_files, tmp_path):
    from tests.bench.test_replay_cli import config

    cfg = config(trace_files, at=tmp_path)
    theirs = tmp_path / "theirs.json"
    theirs.write_text(json.dumps({"schema_version": "1.0", "method": "eagle3", "num_speculative_tokens": 2,
                                  "conditional_accept_rates": [0.5, 0.5], "marginal_accept_rates": [0.5, 0.25],
                                  "mean_accept_length": 1.75, "accept_length_model": "chain_analytic"}))
    result = invoke("replay", "--traces", str(trace_files / "trace"), "--config", str(cfg), "--output",
                    str(tmp_path / "o"), "--no-ray", "--profile", str(theirs))
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    read = doc["replay"]["profiles_read"]
    assert [(r["method"], r["mean_accept_length"], r["predicted_by_k"]) for r in read] == \
        [("eagle3", 1.75, {"1": 1.5, "2": 1.75})]
    report = (tmp_path / "o" / "report.md").read_text()
    assert "## Speculation profiles read (--profile) beside this replay's" in report
    assert "| this replay: ngram+ngram | ngram+ngram |" in report
    assert "## Ceilings\n\nNone: the run has no cost curve" in report  # (recorded with --no-profile)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dict(json.loads(theirs.read_text()), mean_accept_length=2.5)))
    result = invoke("replay", "--traces", str(trace_files / "trace"), "--config", str(cfg), "--output",
                    str(tmp_path / "o2"), "--no-ray", "--profile", str(bad))
    assert_user_error(result, "mean_accept_length 2.5 is not 1 + sum(marginal_accept_rates)")
    assert not (tmp_path / "o2").exists()


def test_the_oracle_takes_the_best_k_and_pays_the_last_step_s_own_width():
    v = [1.0, 1.1, 1.2, 1.3, 2.0]  # v(1..5)
    o = oracle([10, 7], v)
    # k = 3: 10 -> 4 + 4 + 2 (v 1.3, 1.3, 1.1), 7 -> 4 + 3 (1.3, 1.2): 17 tokens / 6.2
    assert o["k"] == 3 and o["speedup"] == pytest.approx(17 / 6.2) and o["tau"] == pytest.approx(17 / 5)
    assert oracle([5], [1.0]) == {"speedup": 1.0, "k": 0, "tau": 1.0}


def test_the_entropy_bound_leading_term():
    v = [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4]
    b = entropy_bound([(1.0, 2.0), (1.0, 2.0)], v)  # mu = 1, mu2 = 2: X(P) = min(P, 3 ln P)
    best = max(range(len(v)), key=lambda p: (1 + (min(p, 3 * math.log(p)) if p > 1 else 0)) / v[p])
    assert b["p"] == best and b["tau"] == pytest.approx(1 + min(best, 3 * math.log(best)))
    certain = entropy_bound([(0.0, 0.0)], v)  # a target that is sure of every token bounds nothing
    assert certain["p"] == len(v) - 1 and certain["tau"] == len(v)
    assert entropy_bound([], v) is None


def test_ceilings_of_a_run_give_each_strategy_s_fraction_of_the_oracle():
    from specframe.bench.ceilings import ceilings

    recs = [{"strategy": "none", "metrics": {"new_tokens": 8}}, {"strategy": "none", "metrics": {"new_tokens": 8}},
            {"strategy": "ngram", "metrics": {"new_tokens": 8}}]
    summary = {"strategies": {"none": {"by_column": {"overall": {"speedup": 1.0}}},
                              "ngram": {"by_column": {"overall": {"speedup": 1.2}}}}}
    c = ceilings(summary, recs, {"t_ms": [10.0, 12.0, 14.0], "v": [1.0, 1.2, 1.4]}, "none", [(0.5, 0.5)] * 16)
    assert c["oracle"]["k"] == 2 and c["oracle"]["speedup"] == pytest.approx(16 / (2 * (2 * 1.4 + 1.2)))
    assert c["strategies"]["ngram"]["fraction_of_oracle"] == pytest.approx(1.2 / c["oracle"]["speedup"])
    assert c["strategies"]["none"]["any_path"] is None and c["entropy_bound"]["mu"] == 0.5
    assert ceilings(summary, recs, None, "none") is None
    # a live bench: the prefill counts in its speed-ups, so the fraction is of the oracle priced end to end
    live = [dict(r, metrics=dict(r["metrics"], prefill_s=1.0, wall_s=3.0)) for r in recs]
    c = ceilings(summary, live, {"t_ms": [10.0, 12.0, 14.0], "v": [1.0, 1.2, 1.4]}, "none")
    assert c["oracle"]["speedup_end_to_end"] == pytest.approx(6.0 / (2.0 + 4.0 / 2.0))  # 2 s prefill + 4 s decode / 2
    assert c["strategies"]["ngram"]["fraction_of_oracle"] == pytest.approx(1.2 / 1.5)


def test_the_top_k_oracle_takes_any_node_of_each_depth():
    # root 0 -> 1 -> 2 and root 3 -> 4; the continuation is 3's token, then 1's child's token
    tokens, parent = [10, 11, 12, 20, 21], [-1, 0, 1, -1, 3]
    want = [20, 11, 12, 9, 11, 9]  # after the newest: 20; after node 0 (depth 1): 11, ...; after node 3: 11
    assert any_path_depth(want, tokens, parent) == 3  # 20 (node 3), then 11 (node 1, not 3's child), then 12
    assert any_path_depth([10, 11, 5], [10, 11], [-1, 0]) == 2  # a chain: the greedy path
    assert any_path_depth([7], [], []) == 0
    rec = {"metrics": {"any_path_accepted": 6, "accepted_nodes": 2, "target_forwards": 4}}
    got = any_path_speedup([rec], 1.2)
    assert got["tau"] == 2.5 and got["speedup"] == pytest.approx(1.2 * 2.5 / 1.5)  # τ 1.5 -> 2.5 in the same steps


def test_the_spread_over_passes_says_which_strategies_are_within_noise():
    from specframe.bench.report import _spread_lines, aggregate

    def rec(strategy, rep, tokens_per_s):
        return {"strategy": strategy, "kind": "specframe", "seed": 0, "repeat": rep, "question": 0, "group": "qa",
                "metrics": {"new_tokens": 100, "wall_s": 100 / tokens_per_s, "target_forwards": 50, "drafted_nodes": 0,
                            "accepted_nodes": 0, "propose_s": 0, "forward_s": 0, "verify_s": 0, "other_s": 0}}

    records = []
    for rep, (none, a, b, c) in enumerate([(10, 15, 10.1, 14.8), (10, 15.3, 9.8, 15.2), (10, 14.9, 10.2, 15.0)]):
        records += [rec("none", rep, none), rec("a", rep, a), rec("b", rep, b), rec("c", rep, c)]
    summary = aggregate(records, ["none", "a", "b", "c"])
    a, b = summary["strategies"]["a"], summary["strategies"]["b"]
    assert a["speedup_spread"]["per_pass"] == pytest.approx([1.5, 1.53, 1.49])
    assert a["speedup_spread"]["n"] == 3 and a["speedup_spread"]["ci95"][0] < 1.5 < a["speedup_spread"]["ci95"][1]
    assert a["within_noise_of"] == ["c"] and b["within_noise_of"] == ["none"]
    table = "\n".join(_spread_lines(summary))
    assert "| b | 1.003× | 0.952–1.055 | 0.980–1.020 | 3 | none |" in table and "| 3 | c |" in table


def test_acceptance_by_context_length_bins_prompts_by_their_tokens():
    from specframe.bench.report import by_context

    def rec(strategy, prompt_tokens, tokens, forwards, wall):
        return {"strategy": strategy, "prompt_tokens": prompt_tokens,
                "metrics": {"new_tokens": tokens, "target_forwards": forwards, "wall_s": wall, "drafted_nodes": 10,
                            "accepted_nodes": 5}}

    records = [rec("none", 100, 64, 64, 8.0), rec("ngram", 100, 64, 32, 4.0),
               rec("none", 1500, 64, 64, 16.0), rec("ngram", 1500, 64, 48, 16.0)]
    ctx = by_context(records, ["none", "ngram"])
    assert [(c["bin"], c["tau"], c["speedup"]) for c in ctx["ngram"]] == [("0-255", 2.0, 2.0), ("1024-2047", 64 / 48, 1.0)]
    assert by_context(records[:2], ["none", "ngram"]) is None  # one bin: nothing to plot
