"""Files a user hands specframe, read the same way by every command: JSON Lines split at "\\n" only (a raw U+2028 in a
string is data, not a line end), config files that are not UTF-8, YAML mappings that give a key twice, and numeric
settings beyond any sane value. Each bad file is one ``error:`` line naming the file, exit 2, before a model loads; a
prompts file with a byte order mark and Windows line ends reads as one without."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import specframe
from specframe import cli
from specframe.bench.config import load_bench_config
from specframe.config import load_config
from specframe.datastore.sources import read_file as read_source
from specframe.errors import ConfigError
from specframe.io.jsonl import jsonl_lines
from specframe.io.prompts import read_prompts
from specframe.training.common import final_means

from tests.fakes import assert_user_error

TRACE = Path(specframe.__file__).parent / "testing" / "traces" / "smollm2-135m-instruct-fp32-dev"
# every character str.splitlines() breaks at that JSON allows raw inside a string (it escapes those below U+0020)
SEPARATORS = ["\u2028", "\u2029", "\u0085"]

runner = CliRunner()


# --- 1. JSON Lines ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sep", SEPARATORS)
def test_prompts_with_unicode_line_separators_are_one_record(tmp_path, sep):
    path = tmp_path / "q.jsonl"
    rows = [{"question_id": 1, "category": "qa", "turns": [f"first{sep}line"]}, {"question_id": 2, "turns": ["b"]}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert sep in path.read_text(encoding="utf-8")  # raw, as an ensure_ascii=False writer leaves it
    prompts = read_prompts(path)
    assert [p.text for p in prompts] == [f"first{sep}line", "b"]
    assert [p.question_id for p in prompts] == [1, 2]


def test_jsonl_lines_keeps_numbers_and_windows_line_ends():
    text = '{"a": "x\u2028y"}\r\n\n  \n{"b": 1}'
    assert list(jsonl_lines(text)) == [(1, '{"a": "x\u2028y"}'), (4, '{"b": 1}')]


def test_a_bad_line_after_a_separator_is_named_by_its_real_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"turns": ["a\u2028b"]}, ensure_ascii=False) + "\n{bad\n", encoding="utf-8")
    with pytest.raises(specframe.errors.PromptsFileError, match=r"q.jsonl:2: invalid JSON"):
        read_prompts(path)


def test_datastore_jsonl_input_with_a_line_separator(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"text": "one\u2029two"}, ensure_ascii=False) + "\n" + json.dumps({"text": "3"}) + "\n",
                    encoding="utf-8")
    assert read_source(path, "text").texts == ["one\u2029two", "3"]


def test_training_log_with_a_line_separator(tmp_path):
    rows = [{"step": i, "loss": 1.0 + i, "acc": 0.5, "note": "a\u2028b"} for i in range(2)]
    (tmp_path / "train-log.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                              encoding="utf-8")
    assert final_means(tmp_path) == (1.5, 0.5)


def test_bench_questions_with_a_line_separator_reach_the_bench(tmp_path, no_model_load):
    """The bench reads its questions with the same reader: a U+2028 question is accepted (the run then stops at the
    unknown model, not at the questions file)."""
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["a\u2028b"]}, ensure_ascii=False) + "\n",
                 encoding="utf-8")
    cfg = tmp_path / "b.yaml"
    cfg.write_text(json.dumps({"model": "no-such-model-dir", "strategies": [{"name": "n", "proposers": ["ngram"]}]}))
    line = assert_user_error(runner.invoke(cli.app, ["bench", "--config", str(cfg), "--questions", str(q)]))
    assert "unknown model" in line and "JSON" not in line


# --- 2. config files that are not UTF-8 ---------------------------------------------------------------------------


LATIN1 = "model: smollm2-135m-instruct\nstop: ['caf\u00e9']\n".encode("latin-1")


def test_a_latin1_config_is_one_line_in_generate(tmp_path, no_model_load):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(LATIN1)
    assert_user_error(runner.invoke(cli.app, ["generate", "hi", "--config", str(cfg)]), str(cfg), "not UTF-8",
                      "line 2", "0xe9")


def test_a_latin1_config_in_the_python_api(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(LATIN1)
    with pytest.raises(ConfigError, match="not UTF-8") as info:
        specframe.load(config=cfg)
    assert str(cfg) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("command", ["bench", "replay"])
def test_a_latin1_bench_config_is_one_line(tmp_path, command, no_model_load):
    cfg = tmp_path / "b.yaml"
    cfg.write_bytes("strategies: [{name: 'caf\u00e9', proposers: [ngram]}]\n".encode("latin-1"))
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "turns": ["hi"]}) + "\n")
    args = (["bench", "--config", str(cfg), "--questions", str(q)] if command == "bench" else
            ["replay", "--traces", str(TRACE), "--config", str(cfg), "--output", str(tmp_path / "o"), "--no-ray"])
    assert_user_error(runner.invoke(cli.app, args), str(cfg), "not UTF-8")
    assert not (tmp_path / "o").exists()


def test_a_utf8_bom_is_accepted(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes("\ufeffmax_new_tokens: 7\n".encode("utf-8"))
    assert load_config(cfg).max_new_tokens == 7


# --- 3. duplicate keys, upper bounds --------------------------------------------------------------------------------


def test_a_duplicate_key_is_refused_with_its_line(tmp_path, no_model_load):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_new_tokens: 64\nmodel: smollm2-135m-instruct\nmax_new_tokens: 128\n")
    assert_user_error(runner.invoke(cli.app, ["generate", "hi", "--config", str(cfg)]), str(cfg), "line 3",
                      "duplicate key 'max_new_tokens'", "line 1")


def test_a_duplicate_key_in_the_python_api(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_new_tokens: 64\nmax_new_tokens: 128\n")
    with pytest.raises(ConfigError, match="line 2: duplicate key 'max_new_tokens'"):
        specframe.load(config=cfg)


def test_a_duplicate_key_in_a_nested_mapping(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("sampling:\n  temperature: 0.5\n  temperature: 0.7\n")
    with pytest.raises(ConfigError, match=r"line 3: duplicate key 'temperature' \(first given on line 2\)"):
        load_config(cfg)


@pytest.mark.parametrize("command", ["bench", "replay"])
def test_a_duplicate_key_in_a_bench_config(tmp_path, command):
    cfg = tmp_path / "b.yaml"
    cfg.write_text("max_new_tokens: 8\nstrategies:\n  - {name: a, proposers: [ngram], name: b}\n")
    with pytest.raises(ConfigError, match="line 3: duplicate key 'name'"):
        load_bench_config(cfg)
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "turns": ["hi"]}) + "\n")
    args = (["bench", "--config", str(cfg), "--questions", str(q)] if command == "bench" else
            ["replay", "--traces", str(TRACE), "--config", str(cfg), "--output", str(tmp_path / "o"), "--no-ray"])
    assert_user_error(runner.invoke(cli.app, args), "duplicate key 'name'")


def test_a_merge_key_may_still_be_overridden(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("sampling:\n  <<: {temperature: 0.5, top_k: 3}\n  temperature: 0.7\n")
    s = load_config(cfg).sampling
    assert (s.temperature, s.top_k) == (0.7, 3)


def test_a_duplicate_key_in_a_features_for_mapping(no_model_load, tmp_path):
    res = runner.invoke(cli.app, ["trace", "record", "--questions", str(tmp_path / "q.jsonl"), "--output",
                                  str(tmp_path / "t"), "--features-for", "{name: medusa, name: eagle}"])
    assert_user_error(res, "duplicate key 'name'")


@pytest.mark.parametrize("threads", [10**6, 2**40])
def test_threads_have_an_upper_bound(tmp_path, threads, no_model_load):
    with pytest.raises(ConfigError, match=r"threads must be in \[1, 1024\]"):
        load_config(None, threads=threads)
    assert_user_error(runner.invoke(cli.app, ["generate", "hi", "--threads", str(threads)]), "--threads", "1024")
    cfg = tmp_path / "b.yaml"
    cfg.write_text(json.dumps({"threads": threads, "strategies": [{"name": "n", "proposers": ["ngram"]}]}))
    with pytest.raises(ConfigError, match="threads"):
        load_bench_config(cfg)
    cfg.write_text(json.dumps({"strategies": [{"name": "n", "proposers": ["ngram"], "threads": threads}]}))
    with pytest.raises(ConfigError, match="threads"):
        load_bench_config(cfg)


def test_the_cost_profile_context_has_an_upper_bound(tmp_path):
    cfg = tmp_path / "b.yaml"
    cfg.write_text(json.dumps({"profile": {"context": 10**12}, "strategies": [{"name": "n", "proposers": ["ngram"]}]}))
    with pytest.raises(ConfigError, match="profile.context"):
        load_bench_config(cfg)


# --- from issue 39's fourth round of reports (each failed on the code before its fix) ---------------------------------


def test_a_prompts_file_with_a_byte_order_mark_and_windows_line_ends_reads_as_without(tmp_path):
    lines = [json.dumps({"question_id": i, "category": "qa", "turns": [t]}) for i, t in enumerate(["Hi there.", "2+2?"])]
    plain, windows = tmp_path / "p.jsonl", tmp_path / "w.jsonl"
    plain.write_text("\n".join(lines) + "\n", encoding="utf-8")
    windows.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    assert read_prompts(windows) == read_prompts(plain) and read_prompts(plain)[0].text == "Hi there."
