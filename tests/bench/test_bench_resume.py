"""Long benches: a line per finished question when stderr is not a terminal, each finished run appended to
``records.jsonl`` in the output folder, Ctrl-C keeps what is done and says how to resume, and ``--resume`` finishes the
run so that its records are those of an uninterrupted run: nothing lost, nothing run or counted twice."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specframe.bench import runner as bench_runner
from specframe.cli import app

from tests.fakes import WORDS, build_model, build_tokenizer

N_QUESTIONS = 4
SAME = ("question", "question_id", "strategy", "seed", "repeat", "token_ids", "finish_reason")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-resume")
    build_model("llama").save_pretrained(root / "model")
    build_tokenizer().save_pretrained(root / "model")
    q = root / "q.jsonl"
    q.write_text("".join(json.dumps({"question_id": 10 + i, "category": "qa",
                                     "turns": [" ".join(WORDS[(7 * i + k) % 60 + 1] for k in range(9))]}) + "\n"
                         for i in range(N_QUESTIONS)))
    return root


def bench(files, tmp_path, out: str, *extra: str, max_new_tokens: int = 6):
    cfg = tmp_path / f"b{max_new_tokens}.yaml"
    cfg.write_text(json.dumps({
        "model": str(files / "model"), "dtype": "float32", "threads": 1, "prepack": False, "chat": False, "warmup": 0,
        "max_new_tokens": max_new_tokens, "strategies": [{"name": "ngram", "proposers": ["ngram"]}]}))
    return CliRunner().invoke(app, ["bench", "--config", str(cfg), "--questions", str(files / "q.jsonl"), "--output",
                                    str(tmp_path / out), *extra])


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))


def journal(path):
    lines = path.read_text().splitlines()
    return json.loads(lines[0]), [json.loads(x) for x in lines[1:]]


def test_a_line_per_question_and_records_appended_as_they_finish(files, tmp_path, monkeypatch):
    seen: list[int] = []
    real = bench_runner.BenchRunner.run_one

    def counting(self, *args, **kwargs):  # the journal holds every earlier run while the next one runs
        out = tmp_path / "out" / "records.jsonl"
        seen.append(len(journal(out)[1]))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(bench_runner.BenchRunner, "run_one", counting)
    res = bench(files, tmp_path, "out")
    assert res.exit_code == 0, (res.output, res.exception)
    assert seen == list(range(2 * N_QUESTIONS))
    lines = [x for x in res.stderr.splitlines() if x.startswith("question ")]
    assert [x.split(":")[0] for x in lines] == [f"question {i + 1}/{N_QUESTIONS} (id {10 + i}, qa)"
                                                 for i in range(N_QUESTIONS)]
    assert all("none " in x and "ngram " in x and "tok/s" in x for x in lines)
    head, records = journal(tmp_path / "out" / "records.jsonl")
    final = json.loads((tmp_path / "out" / "results.json").read_text())["records"]
    assert head["journal"] == 1 and records == final


def test_an_interrupted_bench_resumes_to_the_uninterrupted_records(files, tmp_path, monkeypatch):
    whole = bench(files, tmp_path, "whole")
    assert whole.exit_code == 0, (whole.output, whole.exception)
    expected = json.loads((tmp_path / "whole" / "results.json").read_text())["records"]

    calls: list[int] = []
    real = bench_runner.BenchRunner.run_one

    def interrupt_at_5(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(bench_runner.BenchRunner, "run_one", interrupt_at_5)
    cut = bench(files, tmp_path, "out")
    assert cut.exit_code == 130, (cut.output, cut.exception)
    assert "interrupted" in cut.stderr and "--resume" in cut.stderr
    assert not (tmp_path / "out" / "results.json").exists()
    _, kept = journal(tmp_path / "out" / "records.jsonl")
    assert len(kept) == 4

    calls.clear()
    monkeypatch.setattr(bench_runner.BenchRunner, "run_one", lambda self, *a, **k: (calls.append(1), real(self, *a, **k))[1])
    again = bench(files, tmp_path, "out", "--resume")
    assert again.exit_code == 0, (again.output, again.exception)
    assert len(calls) == 2 * N_QUESTIONS - 4  # only what was missing ran
    records = json.loads((tmp_path / "out" / "results.json").read_text())["records"]
    assert [{k: r[k] for k in SAME} for r in records] == [{k: r[k] for k in SAME} for r in expected]
    assert records[:4] == kept  # the runs done before the interruption, as they were
    summary = json.loads((tmp_path / "out" / "results.json").read_text())["summary"]
    assert summary["strategies"]["ngram"]["by_column"]["overall"]["questions"] == N_QUESTIONS
    assert "lossless check: all specframe strategies identical to plain decoding" in again.stderr


def test_resume_of_another_config_is_one_error_line(files, tmp_path):
    assert bench(files, tmp_path, "out").exit_code == 0
    res = bench(files, tmp_path, "out", "--resume", max_new_tokens=7)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --resume:") and "another config" in lines[0]


def test_resume_without_a_journal_runs_everything(files, tmp_path):
    res = bench(files, tmp_path, "fresh", "--resume")
    assert res.exit_code == 0, (res.output, res.exception)
    assert len(json.loads((tmp_path / "fresh" / "results.json").read_text())["records"]) == 2 * N_QUESTIONS
