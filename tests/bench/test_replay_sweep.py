"""Sweeps: grids in a bench config expand into one strategy per combination (and refuse what they cannot vary), and a
replay gives the same figures run here one task after another or as Ray tasks on a local Ray (skipped without
``ray``)."""

from __future__ import annotations

import json

import pytest

from specframe.bench.config import BenchConfig
from specframe.bench.report import sweep_rows
from specframe.errors import ConfigError
from specframe.registry import build_registry
from specframe.replay.driver import Request, with_trace_cost
from specframe.replay.sweep import Task, ray_available, run_here, run_on_ray
from specframe.replay.trace import read_trace

from tests.fakes import invoke


def test_a_grid_expands_into_named_strategies():
    cfg = BenchConfig.model_validate({"strategies": [
        {"name": "ngram", "proposers": ["ngram"], "grid": {"ngram.k": [2, 4], "ngram.max_n": [2, 3, 4]}},
        {"name": "both", "proposers": ["ngram", {"name": "retrieval", "max_nodes": 8}], "router": "adaptive",
         "grid": {"merge.max_nodes": [8, 16], "router.free_cost": [0.0, 0.1], "retrieval.max_depth": [4]}},
    ]})
    names = [s.name for s in cfg.strategies]
    assert names[:3] == ["none", "ngram k=2 max_n=2", "ngram k=2 max_n=3"] and len(names) == 1 + 6 + 4
    s = next(s for s in cfg.strategies if s.name == "ngram k=4 max_n=3")
    assert s.proposers == [{"name": "ngram", "k": 4, "max_n": 3}] and s.grid_of == "ngram" and s.grid is None
    assert s.grid_point == {"ngram.k": 4, "ngram.max_n": 3} and s.merge is None and s.router is None
    b = next(s for s in cfg.strategies if s.grid_of == "both" and s.grid_point["merge.max_nodes"] == 16
             and s.grid_point["router.free_cost"] == 0.1)
    assert b.name == "both merge.max_nodes=16 router.free_cost=0.1 retrieval.max_depth=4"
    assert b.merge == {"name": "priority", "max_nodes": 16} and b.router == {"name": "adaptive", "free_cost": 0.1}
    assert b.proposers[1] == {"name": "retrieval", "max_nodes": 8, "max_depth": 4}


@pytest.mark.parametrize("grid, needle", [
    ({"ngram.k": []}, "non-empty list"),
    ({"ngram.k": 4}, "grid.ngram.k: Input should be a valid list"),
    ({"retrieval.max_nodes": [4]}, "grid key 'retrieval.max_nodes' must be <proposer>.<option> for one of its proposers (ngram)"),
    ({"k": [4]}, "grid key 'k'"),
])
def test_bad_grids_are_refused(tmp_path, grid, needle):
    from specframe.bench.config import load_bench_config

    path = tmp_path / "b.yaml"
    path.write_text(json.dumps({"strategies": [{"name": "ngram", "proposers": ["ngram"], "grid": grid}]}))
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_bench_config(path)


def test_sweep_rows_rank_by_speedup_then_tau():
    strategies = [{"name": f"n {k}", "grid_of": "n", "grid_point": {"ngram.k": k}} for k in (1, 2, 3)]
    cell = lambda speedup, tau: {"by_column": {"overall": {"speedup": speedup, "tau": tau, "alpha": 0.5}},  # noqa: E731
                                 "ms_per_step": {"propose_s": 0.1}}
    summary = {"strategies": {"n 1": cell(1.2, 1.5), "n 2": cell(1.4, 1.6), "n 3": cell(1.4, 1.9)}}
    rows = sweep_rows(summary, strategies)["n"]
    assert [r[1] for r in rows] == ["ngram.k=3", "ngram.k=2", "ngram.k=1"] and [r[0] for r in rows] == ["1", "2", "3"]
    # a replay ranks by the verification-only prediction (no measured time), and shows both predictions
    for name, forward_only in (("n 1", 1.3), ("n 2", 1.1), ("n 3", 1.2)):
        summary["strategies"][name]["speedup_forward"] = forward_only
    rows = sweep_rows(summary, strategies)["n"]
    assert [(r[1], r[4], r[5]) for r in rows] == [("ngram.k=1", "1.300×", "1.20×"), ("ngram.k=3", "1.200×", "1.40×"),
                                                  ("ngram.k=2", "1.100×", "1.40×")]


def test_forward_only_speedups_use_no_measured_time():
    from specframe.replay.report import forward_only_speedups

    rec = lambda s, tokens, fwd, propose: {"strategy": s, "metrics": {"new_tokens": tokens, "forward_s": fwd,  # noqa: E731
                                                                      "propose_s": propose}}
    summary = {"strategies": {"none": {}, "a": {}}}
    forward_only_speedups(summary, [rec("none", 100, 10.0, 0.0), rec("a", 100, 5.0, 9.0), rec("a", 50, 3.0, 1.0)])
    assert summary["strategies"]["none"]["speedup_forward"] == 1.0
    assert summary["strategies"]["a"]["speedup_forward"] == pytest.approx((150 / 8.0) / (100 / 10.0))


COUNTS = ("new_tokens", "target_forwards", "drafted_nodes", "accepted_nodes", "drafted_by_depth",
          "accepted_by_depth", "proposer_faults")


def _figures(results) -> list:
    out = []
    for res in results:
        for r in res.records:
            m = r["metrics"]
            out.append((res.name, r["question_id"], tuple(r["token_ids"]), tuple(str(m[k]) for k in COUNTS),
                        tuple((label, p["steps"], p["drafted_nodes"], p["accepted_nodes"], p["accepted_alone"])
                              for label, p in sorted(m["proposers"].items()))))
    return out


@pytest.mark.skipif(not ray_available(), reason="ray is not installed (pip install 'specframe[ray]')")
def test_a_sweep_on_ray_gives_the_figures_of_a_sequential_one(trace_files, monkeypatch):
    from specframe.target.loader import load_target

    monkeypatch.setenv("SPECFRAME_CACHE", str(trace_files / "cache"))
    trace = read_trace(trace_files / "trace")
    model = str(trace_files / "tiny-llama")
    cfg = BenchConfig.model_validate({"strategies": [
        {"name": "ngram", "proposers": ["ngram"], "grid": {"ngram.k": [2, 4, 8], "ngram.max_n": [2, 4]}},
        {"name": "combined", "proposers": ["ngram", {"name": "ngram", "min_n": 2, "k": 3}],
         "router": {"name": "adaptive", "measure": "never"}, "grid": {"merge.max_nodes": [4, 12]}},
    ]})
    requests = tuple(Request(i) for i in range(len(trace.questions)))
    tasks = [Task(s.model_dump(), requests, trace.max_new_tokens) for s in cfg.strategies]
    target = with_trace_cost(load_target(model, "float32", threads=1, prepack=False, measure=False), trace)
    here = run_here(target, build_registry(), trace, tasks)
    on_ray, where = run_on_ray(trace, tasks, model, workers=2)
    assert where.startswith("Ray: 2 workers on 1 node(s)") and "(local)" in where
    assert [r.name for r in on_ray] == [r.name for r in here] == [s.name for s in cfg.strategies]
    assert _figures(on_ray) == _figures(here)
    assert any(r.records[0]["metrics"]["accepted_nodes"] for r in here)


@pytest.mark.skipif(not ray_available(), reason="ray is not installed (pip install 'specframe[ray]')")
def test_the_replay_command_sweeps_on_ray_by_default_and_ranks_as_without(trace_files, tmp_path, monkeypatch):
    import yaml

    monkeypatch.setenv("SPECFRAME_CACHE", str(trace_files / "cache"))
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(yaml.safe_dump({"model": str(trace_files / "tiny-llama"), "dtype": "float32", "threads": 1,
                                   "strategies": [{"name": "ngram", "proposers": ["ngram"],
                                                   "grid": {"ngram.k": [1, 3, 6], "ngram.max_n": [1, 2]}}]}))
    base = ["replay", "--traces", str(trace_files / "trace"), "--config", str(cfg)]
    on_ray = invoke(*base, "--output", str(tmp_path / "ray"))  # a grid and ray installed: Ray by default
    here = invoke(*base, "--output", str(tmp_path / "here"), "--no-ray")
    assert on_ray.exit_code == 0 and here.exit_code == 0, on_ray.output + here.output
    a, b = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("ray", "here"))
    assert a["replay"]["run"].startswith("Ray: ") and b["replay"]["run"].startswith("run here")
    assert [(r["strategy"], r["token_ids"], r["metrics"]["target_forwards"]) for r in a["records"]] == \
           [(r["strategy"], r["token_ids"], r["metrics"]["target_forwards"]) for r in b["records"]]
    ranking = lambda d: (tmp_path / d / "report.md").read_text().split("## Sweep")[1].split("\n## ")[0]  # noqa: E731
    taus = lambda text: [line.split("|")[2:4] for line in text.splitlines() if line.startswith("| ")]  # noqa: E731
    assert taus(ranking("ray")) == taus(ranking("here"))
