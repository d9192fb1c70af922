"""``specframe trace record`` and ``specframe replay`` end to end on a tiny random model saved as a model folder:
the replay's τ and attribution equal a live ``specframe bench`` of the same config (the report says so), the output is
the bench's (report.md, results.json, plots), and every bad input stops with one error line, exit 2, and nothing
written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from specframe.bench.speculation_profile import read_profile

from tests.fakes import CLI_TRACE_N_NEW as N_NEW
from tests.fakes import assert_user_error, invoke


@pytest.fixture(autouse=True)
def _cache(trace_files, monkeypatch):
    monkeypatch.setenv("SPECFRAME_CACHE", str(trace_files / "cache"))


def config(root: Path, name: str = "bench.yaml", at: Path | None = None, **changes) -> Path:
    """A bench config over the model folders in ``root``, written into ``at`` (default ``root``)."""
    never = {"name": "adaptive", "measure": "never"}  # combined proposers routed without reading the clock
    cfg = {"model": str(root / "tiny-llama"), "dtype": "float32", "threads": 1, "warmup": 1, "max_new_tokens": N_NEW,
           "strategies": [{"name": "ngram", "proposers": ["ngram"]},
                          {"name": "ngram k3", "proposers": [{"name": "ngram", "k": 3, "max_n": 2}]},
                          {"name": "ngram+ngram", "proposers": ["ngram", {"name": "ngram", "min_n": 2, "k": 4}],
                           "router": never, "merge": {"policy": "confidence", "max_nodes": 8}}]}
    cfg.update(changes)
    path = (at or root) / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def assert_nothing_written(parent: Path, name: str) -> None:
    assert not (parent / name).exists()
    assert not [p.name for p in parent.iterdir() if p.name.startswith(f".{name}.")]  # no temporary folder left


def test_replay_equals_a_live_bench_and_writes_the_bench_report(trace_files, tmp_path):
    cfg = config(trace_files)
    live = invoke("bench", "--config", str(cfg), "--questions", str(trace_files / "q.jsonl"), "--output",
                  str(tmp_path / "live"), "--no-profile")
    assert live.exit_code == 0, live.output
    result = invoke("replay", "--traces", str(trace_files / "trace"), "--config", str(cfg), "--output",
                    str(tmp_path / "replay"), "--no-ray", "--compare", str(tmp_path / "live" / "results.json"))
    assert result.exit_code == 0, result.output
    out = tmp_path / "replay"
    assert sorted(p.name for p in out.iterdir() if p.name != ".specframe-output") == [
        "acceptance_by_depth.png", "profiles", "report.md", "results.json", "speedup_by_category.png"]
    doc = json.loads((out / "results.json").read_text())
    live_doc = json.loads((tmp_path / "live" / "results.json").read_text())
    # a speculation profile per drafting strategy from each, passing the schema's rules, the same from both
    for name, model in (("ngram", "chain_analytic"), ("ngram k3", "chain_analytic"), ("ngram+ngram", "measured_per_k")):
        mine = read_profile(out / "profiles" / name.replace(" ", "_") / "speculation_profile.json")
        theirs = read_profile(tmp_path / "live" / "profiles" / name.replace(" ", "_") / "speculation_profile.json")
        assert mine["accept_length_model"] == theirs["accept_length_model"] == model
        assert all(v["passed"] for v in mine["validation"].values())
        for key in ("marginal_accept_rates", "conditional_accept_rates", "mean_accept_length",
                    "acceptance_length_histogram", "num_speculative_tokens"):
            assert mine[key] == theirs[key], key
        assert mine["mean_accept_length"] > 1.0 and mine["measurement_conditions"]["source"] == "specframe replay"
        assert theirs["measurement_conditions"]["source"] == "specframe bench"
    assert not (out / "profiles" / "none").exists()
    for name in ("none", "ngram", "ngram k3", "ngram+ngram"):
        mine, theirs = doc["summary"]["strategies"][name], live_doc["summary"]["strategies"][name]
        assert {c: v["tau"] for c, v in mine["by_column"].items()} == {c: v["tau"] for c, v in theirs["by_column"].items()}
        assert mine["acceptance_by_depth"] == theirs["acceptance_by_depth"]
        for label, a in (mine.get("attribution") or {}).items():
            b = theirs["attribution"][label]
            assert [a[k] for k in ("steps", "drafted_nodes", "accepted_nodes", "accepted_alone")] == \
                   [b[k] for k in ("steps", "drafted_nodes", "accepted_nodes", "accepted_alone")]
    for r, lr in zip(doc["records"], [r for r in live_doc["records"]]):
        assert (r["question_id"], r["strategy"], r["token_ids"]) == (lr["question_id"], lr["strategy"], lr["token_ids"])
    comp = doc["replay"]["compare"]["strategies"]
    assert all(c["same_attribution"] and c["tau"][0] == c["tau"][1] for c in comp.values())
    report = (out / "report.md").read_text()
    assert report.startswith("# specframe replay report")
    assert "## Replay vs live" in report and "**no**" not in report and "Every replayed request committed" in report
    assert "tiny-llama" in result.stdout  # the rich table


def test_a_sweep_ranks_its_grid(trace_files, tmp_path):
    cfg = config(trace_files, at=tmp_path, strategies=[{"name": "ngram", "proposers": ["ngram"],
                                                        "grid": {"ngram.k": [1, 2, 4, 8], "ngram.max_n": [1, 3]}}])
    result = invoke("replay", "--traces", str(trace_files / "trace"), "--config", str(cfg), "--output",
                    str(tmp_path / "o"), "--no-ray")
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    taus = {s: e["by_column"]["overall"]["tau"] for s, e in doc["summary"]["strategies"].items()}
    assert len(taus) == 1 + 8 and taus["ngram k=8 max_n=3"] >= taus["ngram k=1 max_n=3"]
    report = (tmp_path / "o" / "report.md").read_text()
    section = report.split("## Sweep `ngram`: 8 settings")[1].split("\n## ")[0]
    ranked = [line.split("|")[3].strip() for line in section.strip().splitlines() if line.startswith("| ")][1:]
    assert [float(t) for t in ranked] == sorted((float(f"{t:.2f}") for s, t in taus.items() if s != "none"), reverse=True)


# --- errors: one line, exit 2, nothing written ------------------------------------------------------------------


def _trace_copy(trace_files: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "trace"
    shutil.copytree(trace_files / "trace", copy)
    return copy


@pytest.mark.parametrize("case", ["model", "dtype", "temperature", "truncated", "manifest", "max_new_tokens",
                                  "features", "chat", "strategy dtype", "strategy engine"])
def test_bad_replay_input_is_one_error_line(trace_files, tmp_path, case):
    traces = trace_files / "trace"
    changes: dict = {}
    needles: tuple[str, ...] = ()
    extra: list[str] = []
    if case == "model":
        changes = {"model": str(trace_files / "tiny-qwen")}
        needles = ("recorded with model 'tiny-llama'", "asks for 'tiny-qwen'")
    elif case == "dtype":
        changes, needles = {"dtype": "bfloat16"}, ("recorded in float32", "asks for bfloat16")
    elif case == "temperature":
        changes, needles = {"temperature": 0.7}, ("replay is greedy only", "set temperature: 0")
    elif case == "truncated":
        traces = _trace_copy(trace_files, tmp_path)
        f = traces / "tokens.json.gz"
        f.write_bytes(f.read_bytes()[:-5])
        needles = ("tokens.json.gz is truncated", "record the trace again")
    elif case == "manifest":
        traces = _trace_copy(trace_files, tmp_path)
        (traces / "manifest.json").write_text((traces / "manifest.json").read_text()[:100])
        needles = ("manifest.json is not valid JSON",)
    elif case == "max_new_tokens":
        extra, needles = ["--max-new-tokens", str(N_NEW + 1)], (f"more than the trace holds ({N_NEW})",)
    elif case == "features":
        (tmp_path / "heads").mkdir()
        changes = {"strategies": [{"name": "ngram", "proposers": ["ngram"]},
                                  {"name": "eagle", "proposers": [{"name": "eagle", "weights": str(tmp_path / "heads")}]}]}
        needles = ("eagle",)  # a drafter folder without weights: the proposer's own config error, before any replay
    elif case == "chat":
        changes, needles = {"chat": False}, ("encoded with chat: True",)
    elif case == "strategy dtype":
        changes = {"strategies": [{"name": "ngram", "proposers": ["ngram"], "dtype": "bfloat16"}]}
        needles = ("strategy 'ngram' asks for bfloat16",)
    elif case == "strategy engine":  # issue 39, 4: llama.cpp's continuation is not a transformers trace's
        changes = {"strategies": [{"name": "ngram", "proposers": ["ngram"], "engine": "llama.cpp"}]}
        needles = ("strategy 'ngram' runs on llama.cpp", "recorded on transformers")
    cfg = config(trace_files, at=tmp_path, **changes)
    result = invoke("replay", "--traces", str(traces), "--config", str(cfg), "--output", str(tmp_path / "out"),
                    "--no-ray", *extra)
    assert_user_error(result, *needles)
    assert_nothing_written(tmp_path, "out")


def test_a_strategy_reading_features_the_trace_lacks_is_one_error_line(trace_files, tmp_path):
    from specframe.learned.medusa_heads import MedusaHeads

    MedusaHeads(32, 2, 1).save(tmp_path / "heads", "tiny-llama")
    cfg = config(trace_files, at=tmp_path,
                 strategies=[{"name": "medusa", "proposers": [{"name": "medusa", "heads": str(tmp_path / "heads")}]}])
    result = invoke("replay", "--traces", str(trace_files / "trace"), "--config", str(cfg), "--output",
                    str(tmp_path / "out"), "--no-ray")
    assert_user_error(result, "strategy 'medusa' reads the last hidden state", "--features-for medusa")
    assert_nothing_written(tmp_path, "out")


def test_features_recorded_for_medusa_replay_it_as_live(trace_files, tmp_path):
    from specframe.learned.medusa_heads import MedusaHeads

    MedusaHeads(32, 2, 1).save(tmp_path / "heads", "tiny-llama")  # zero heads: the LM head's top tokens
    med = {"name": "medusa", "heads": str(tmp_path / "heads")}
    # a name alone would build medusa with the heads shipped for the target (none for this model): a mapping gives options
    result = invoke("trace", "record", "--questions", str(trace_files / "q.jsonl"), "--output", str(tmp_path / "tr"),
                    "--model", str(trace_files / "tiny-llama"), "--max-new-tokens", str(N_NEW), "--no-profile",
                    "--threads", "1", "--features-for", json.dumps(med))
    assert result.exit_code == 0, result.output
    assert "for the features" in result.stderr
    cfg = config(trace_files, at=tmp_path, strategies=[{"name": "medusa", "proposers": [med]},
                                       {"name": "ngram+medusa", "proposers": ["ngram", med], "router": "none"}])
    live = invoke("bench", "--config", str(cfg), "--questions", str(trace_files / "q.jsonl"), "--output",
                  str(tmp_path / "live"), "--no-profile")
    assert live.exit_code == 0, live.output
    result = invoke("replay", "--traces", str(tmp_path / "tr"), "--config", str(cfg), "--output", str(tmp_path / "out"),
                    "--no-ray", "--compare", str(tmp_path / "live" / "results.json"))
    assert result.exit_code == 0, result.output
    comp = json.loads((tmp_path / "out" / "results.json").read_text())["replay"]["compare"]["strategies"]
    for name in ("medusa", "ngram+medusa"):
        tau_replay, tau_live = comp[name]["tau"]
        assert abs(tau_replay - tau_live) <= 0.02 * tau_live and tau_live > 1.0


def test_features_for_a_proposer_that_cannot_be_built_is_one_error_line(trace_files, tmp_path):
    result = invoke("trace", "record", "--questions", str(trace_files / "q.jsonl"), "--output", str(tmp_path / "tr"),
                    "--model", str(trace_files / "tiny-llama"), "--max-new-tokens", "8", "--no-profile", "--threads",
                    "1", "--features-for", "medusa")
    # the default medusa heads exist only for the shipped target's model
    assert_user_error(result, "medusa", "heads")
    assert_nothing_written(tmp_path, "tr")


@pytest.mark.parametrize("case", ["output is a file", "bad features-for", "bad dtype", "no such questions"])
def test_bad_record_input_is_one_error_line(trace_files, tmp_path, case):
    args = ["trace", "record", "--questions", str(trace_files / "q.jsonl"), "--output", str(tmp_path / "tr"), "--model",
            str(trace_files / "tiny-llama"), "--no-profile", "--max-new-tokens", "4"]
    if case == "output is a file":
        (tmp_path / "file").write_text("x")
        args[args.index(str(tmp_path / "tr"))] = str(tmp_path / "file")
        needle = "is a file"
    elif case == "bad features-for":
        args += ["--features-for", "medusaa"]
        needle = "medusaa"
    elif case == "bad dtype":
        args += ["--dtype", "half"]  # (float16 is a trace dtype: GPUs without native bf16)
        needle = "--dtype must be float32, bfloat16 or float16"
    else:
        args[args.index(str(trace_files / "q.jsonl"))] = str(tmp_path / "none.jsonl")
        needle = "none.jsonl"
    assert_user_error(invoke(*args), needle)
    assert_nothing_written(tmp_path, "tr")
