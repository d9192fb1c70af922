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
