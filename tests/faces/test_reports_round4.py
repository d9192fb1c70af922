"""Robustness from real reports, round four (issue 39): each test fails on the code before its fix."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from specframe.errors import ConfigError, UnknownModelError
from specframe.target.models import resolve_model


def _one_error_line(res) -> str:
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), res.output
    return lines[0]


def test_a_folder_with_two_ggufs_names_them(tmp_path):
    for name in ("a.Q4_0.gguf", "b.Q8_0.gguf"):
        (tmp_path / name).write_bytes(b"GGUF" + bytes(16))
    with pytest.raises(UnknownModelError, match=r"holds 2 \.gguf files \(a\.Q4_0\.gguf, b\.Q8_0\.gguf\).*give the file"):
        resolve_model(str(tmp_path))
    from specframe.cli import app

    for engine in ("transformers", "llama.cpp"):
        line = _one_error_line(CliRunner().invoke(app, ["generate", "hi", "--model", str(tmp_path), "--engine", engine]))
        assert "a.Q4_0.gguf" in line and "unknown model" not in line


def test_an_empty_folder_says_what_a_model_folder_needs(tmp_path):
    with pytest.raises(UnknownModelError, match="neither a config.json"):
        resolve_model(str(tmp_path))


def test_a_file_named_gguf_that_is_not_one_is_one_error_line_on_either_engine(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_text("<html>404 Not Found</html>")
    with pytest.raises(ConfigError, match="not a GGUF file"):
        resolve_model(str(bad))
    from specframe.cli import app

    for engine in ("transformers", "llama.cpp"):
        line = _one_error_line(CliRunner().invoke(app, ["generate", "hi", "--model", str(bad), "--engine", engine]))
        assert "GGUF magic" in line


def test_a_gguf_transformers_cannot_convert_is_one_error_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "odd.gguf"
    bad.write_bytes(b"GGUF" + bytes(64))  # the magic, then nothing a reader can use
    from specframe.cli import app

    res = CliRunner().invoke(app, ["generate", "hi", "--model", str(bad)])
    # (issue 55 (8): the header is read before "converting ... once" is announced: the error is all there is)
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "Traceback" not in res.output, res.output
    assert lines[0].startswith("error: odd.gguf is not a readable GGUF file") and "converting" not in res.output
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.suffix == ".safetensors"]


@pytest.mark.parametrize("chat", ["false", "no", 2, 0.0])
def test_chat_must_be_a_bool(chat):
    import specframe
    from specframe.target.hf import Target

    from tests.fakes import build_model, build_tokenizer

    sf = specframe.load(target=Target(build_model("llama"), build_tokenizer(), name="tiny"), max_new_tokens=4)
    with pytest.raises(ConfigError, match="chat must be True or False"):
        sf.generate("ba bb", chat=chat)
    assert len(sf.generate_result("ba bb", chat=False).token_ids) == 4  # a bool still works


# --- 3. the config's JSON Schema and the loader agree --------------------------------------------------------------

GOOD = ["router: adaptive", "router: none", "router: null", "router: false", "merge: confidence",
        "proposers: [ngram]", "proposers: ngram", "proposers: [ngram, {name: medusa}]", "threads: 2",
        "max_new_tokens: 1", "sampling: {temperature: 0.7, top_p: 1.0, top_k: 0, seed: 0}", "stop: ['\\n\\n']",
        "merge: {name: confidence, max_nodes: 16}", "router: {name: adaptive, explore: 0.0}"]
BAD = ["max_new_tokens: 0", "threads: 2000", "threads: 0", "sampling: {temperature: -1}", "sampling: {top_p: 1.5}",
       "sampling: {top_p: 0}", "sampling: {top_k: -3}", "sampling: {seed: -1}", "stop: ['']", "proposers: nosuch",
       "proposers: []", "router: sometimes", "merge: nosuch", "unknown_key: 1"]


@pytest.fixture(scope="module")
def schema_and_loader():
    jsonschema = pytest.importorskip("jsonschema")
    from specframe.config import config_schema, load_config, resolve_plugins
    from specframe.registry import build_registry

    registry = build_registry()
    validator = jsonschema.Draft202012Validator(config_schema(registry))

    def loader_ok(path) -> bool:
        try:
            resolve_plugins(load_config(path), registry)
        except Exception:  # noqa: BLE001 - the loader's refusal, whatever its kind
            return False
        return True

    return validator, loader_ok


@pytest.mark.parametrize("snippet", GOOD + BAD)
def test_the_schema_and_the_loader_agree_on_a_snippet(snippet, schema_and_loader, tmp_path):
    import yaml

    validator, loader_ok = schema_and_loader
    path = tmp_path / "c.yaml"
    path.write_text(snippet + "\n")
    want = snippet in GOOD
    assert loader_ok(path) is want
    assert validator.is_valid(yaml.safe_load(snippet)) is want, list(validator.iter_errors(yaml.safe_load(snippet)))


def test_every_shipped_config_passes_the_schema(schema_and_loader):
    import re
    from pathlib import Path

    import yaml

    validator, _ = schema_and_loader
    root = Path(__file__).resolve().parents[2]
    configs = [p.read_text() for p in sorted((root / "docs").glob("*.yaml"))]
    for doc in sorted((root / "docs").glob("*.md")) + [root / "README.md"]:
        configs += re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)
    checked = 0
    for text in configs:
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict) or {"strategies", "servers", "grid"} & set(data) or "train" in data:
            continue  # bench and training configs have schemas of their own
        errors = [e.message for e in validator.iter_errors(data)]
        assert not errors, (text[:200], errors)
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize("mode", [["--stream"], ["--json"], []])
def test_generate_into_a_closed_pipe_exits_0(mode, tmp_path):
    """``specframe generate ... | head -c 20``: the reader leaves early; the command ends quietly with status 0."""
    import os
    import subprocess
    import sys

    from tests.fakes import build_model, build_tokenizer

    model_dir = tmp_path / "tiny"
    build_model("llama").save_pretrained(model_dir)
    build_tokenizer().save_pretrained(model_dir)
    env = {**os.environ, "SPECFRAME_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "specframe", "generate", "ba bb bc", "--model", str(model_dir),
                             "--max-new-tokens", "64", "--no-chat", "--threads", "1", *mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # the reader is gone before the first byte
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_bench_output_folder_holding_someone_elses_report_is_refused_before_anything_runs(tmp_path):
    import json

    from specframe.cli import app

    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").write_text("# my own notes\n")
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["hi"]}) + "\n")
    from pathlib import Path

    args = ["bench", "--config", str(Path(__file__).resolve().parents[2] / "docs" / "bench.example.yaml"), "--questions", str(questions), "--output", str(out)]
    line = _one_error_line(CliRunner().invoke(app, args))
    assert "already holds a report.md that specframe bench did not write" in line
    assert (out / "report.md").read_text() == "# my own notes\n"
    (out / "results.json").write_text(json.dumps({"config": {}, "environment": {}}))  # a bench's own folder: rerun
    from specframe.bench.command import _check_output_is_ours

    _check_output_is_ours(out)


def test_a_train_resume_with_a_changed_setting_is_refused_before_any_stage_and_names_it(tmp_path, monkeypatch):
    from dataclasses import asdict, replace

    import torch

    from specframe.training import recipe
    from specframe.training.draft import DraftSettings

    out = tmp_path / "td"
    out.mkdir()
    before = DraftSettings()
    torch.save({"settings": {"draft": asdict(before), "records": 5}, "step": 3}, out / "ckpt.pt")
    monkeypatch.setattr(recipe, "build_corpus", lambda *a, **k: pytest.fail("the corpus stage ran"))
    monkeypatch.setattr(recipe, "teacher_pass", lambda *a, **k: pytest.fail("the teacher stage ran"))
    with pytest.raises(ConfigError, match=rf"other settings: lr {before.lr!r} \(now 0\.123\): run the same command"):
        recipe.run_recipe("draft", None, "t", out, tmp_path / "corpus", None, replace(before, lr=0.123),
                          lambda *a: None)


def test_an_unloadable_gguf_on_llamacpp_is_one_error_line_with_nothing_before_it(tmp_path):
    """llama.cpp's own "error loading model" line used to reach stderr before specframe's error: now its reason is
    part of the one line."""
    import os
    import subprocess
    import sys

    pytest.importorskip("llama_cpp")
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(64))
    env = {**os.environ, "SPECFRAME_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "specframe", "generate", "hi", "--model", str(bad), "--engine",
                           "llama.cpp", "--threads", "1"], capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: llama.cpp cannot load {bad}")


def test_a_prompts_file_with_a_byte_order_mark_and_windows_line_ends_reads_as_without(tmp_path):
    import json

    from specframe.io.prompts import read_prompts

    lines = [json.dumps({"question_id": i, "category": "qa", "turns": [t]}) for i, t in enumerate(["Hi there.", "2+2?"])]
    plain, windows = tmp_path / "p.jsonl", tmp_path / "w.jsonl"
    plain.write_text("\n".join(lines) + "\n", encoding="utf-8")
    windows.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    assert read_prompts(windows) == read_prompts(plain) and read_prompts(plain)[0].text == "Hi there."
