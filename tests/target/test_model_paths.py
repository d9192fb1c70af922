"""A model path that names no usable model (issue 39's fourth round of reports: each test failed on the code before
its fix): a folder with two GGUF files names them, an empty folder says what a model folder needs, a file named
``.gguf`` that is not one, a GGUF transformers cannot convert and one llama.cpp cannot load are each one error line,
on either engine."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from specframe.errors import ConfigError, UnknownModelError
from specframe.target.models import resolve_model

from tests.fakes import assert_user_error


def test_a_folder_with_two_ggufs_names_them(tmp_path):
    for name in ("a.Q4_0.gguf", "b.Q8_0.gguf"):
        (tmp_path / name).write_bytes(b"GGUF" + bytes(16))
    with pytest.raises(UnknownModelError, match=r"holds 2 \.gguf files \(a\.Q4_0\.gguf, b\.Q8_0\.gguf\).*give the file"):
        resolve_model(str(tmp_path))
    from specframe.cli import app

    for engine in ("transformers", "llama.cpp"):
        result = CliRunner().invoke(app, ["generate", "hi", "--model", str(tmp_path), "--engine", engine])
        line = assert_user_error(result)
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
        result = CliRunner().invoke(app, ["generate", "hi", "--model", str(bad), "--engine", engine])
        line = assert_user_error(result)
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
