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
    errors = [line for line in res.output.splitlines() if "error:" in line]  # (after the "converting ..." note)
    assert res.exit_code == 2 and len(errors) == 1 and "Traceback" not in res.output, res.output
    line = errors[0]
    assert "transformers cannot convert odd.gguf" in line and "--engine llama.cpp" in line
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.suffix == ".safetensors"]


@pytest.mark.parametrize("chat", ["false", "no", 2, 0.0])
def test_chat_must_be_a_bool(chat):
    import specframe
    from specframe.target.hf import Target

    from .support import build_model, build_tokenizer

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
    root = Path(__file__).resolve().parents[1]
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

    from .support import build_model, build_tokenizer

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
