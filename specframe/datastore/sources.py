"""Where datastore text comes from: input files (``.txt``, ``.jsonl``), built-in presets, and the tokenizer.

- ``.txt``: the whole file is one document (UTF-8).
- ``.jsonl``: one JSON object per line, one document per line: its ``field`` (default ``"text"``), a string.
  Blank lines are skipped.
- preset ``pydoc``: the Python reference manual's topic texts, ``pydoc_data.topics``, one document per topic.
  They ship with every CPython (Debian: ``libpython3.X-stdlib``) under the PSF License 2.0, which allows
  commercial use. The text differs a little between Python versions; the default datastore's cache key
  includes a hash of it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..io.jsonl import jsonl_lines
from .store import DatastoreError

TEXT_SUFFIXES = (".txt",)
JSONL_SUFFIXES = (".jsonl",)


@dataclass(frozen=True)
class Documents:
    """Documents from one input, and how to describe it in the manifest."""

    texts: list[str]
    info: dict[str, Any]  # path or preset, documents, bytes, licence...


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    license: str
    load: Callable[[], list[str]]


def _pydoc_topics() -> list[str]:
    import pydoc_data.topics as topics

    return [topics.topics[k] for k in sorted(topics.topics)]


PRESETS: dict[str, Preset] = {
    "pydoc": Preset(
        "pydoc",
        f"pydoc_data.topics of CPython {sys.version_info.major}.{sys.version_info.minor} (the Python reference "
        "manual's topic texts, one document per topic)",
        "PSF-2.0",
        _pydoc_topics,
    ),
}
DEFAULT_PRESET = "pydoc"


def _nbytes(texts: list[str]) -> int:
    return sum(len(t.encode("utf-8")) for t in texts)


def read_preset(name: str) -> Documents:
    """The documents of a built-in preset.

    Raises:
        DatastoreError: unknown preset (lists the known ones).
    """
    if name not in PRESETS:
        raise DatastoreError(f"unknown preset {name!r}: use one of {', '.join(PRESETS)}")
    preset = PRESETS[name]
    texts = preset.load()
    return Documents(texts, {"preset": name, "source": preset.description, "license": preset.license,
                          "documents": len(texts), "bytes": _nbytes(texts)})


def read_file(path: Path, field: str = "text") -> Documents:
    """The documents of one input file (see the module docstring).

    Raises:
        DatastoreError: missing or unreadable file, unsupported suffix, a line that is not a JSON object, or a
            line whose ``field`` is missing or not a string (the message names file and line).
    """
    path = Path(path)
    if not path.is_file():
        raise DatastoreError(f"input {path} does not exist" if not path.exists() else f"input {path} is not a file")
    suffix = path.suffix.lower()
    if suffix not in TEXT_SUFFIXES + JSONL_SUFFIXES:
        raise DatastoreError(f"input {path}: unsupported file type {path.suffix or '(none)'!r}: use .txt or .jsonl")
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatastoreError(f"input {path} cannot be read as UTF-8 text: {exc}") from None
    if suffix in TEXT_SUFFIXES:
        texts = [raw] if raw.strip() else []
    else:
        texts = []
        for lineno, line in jsonl_lines(raw):
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise DatastoreError(f"{path}:{lineno}: not valid JSON ({exc})") from None
            if not isinstance(record, dict):
                raise DatastoreError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            if field not in record:
                keys = ", ".join(sorted(map(str, record))) or "none"
                raise DatastoreError(f"{path}:{lineno}: no field {field!r} (it has: {keys}); choose the field that holds the text")
            value = record[field]
            if not isinstance(value, str):
                raise DatastoreError(f"{path}:{lineno}: field {field!r} is a {type(value).__name__}, not a string")
            if value.strip():
                texts.append(value)
    info = {"path": str(path.resolve()), "documents": len(texts), "bytes": _nbytes(texts)}
    if suffix in JSONL_SUFFIXES:
        info["field"] = field
    return Documents(texts, info)


def fingerprint(tokenizer: Any) -> str:
    """A stable identity of a tokenizer's vocabulary: ``sha256:`` of its sorted ``(token, id)`` pairs.

    Two tokenizers with the same fingerprint map the same token strings to the same ids, so a datastore built
    with one drafts meaningful ids for the other.
    """
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return "sha256:" + hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()


def tokenizer_info(tokenizer: Any) -> dict[str, Any]:
    """The manifest's ``tokenizer`` entry."""
    return {"class": type(tokenizer).__name__, "fingerprint": fingerprint(tokenizer), "size": len(tokenizer)}


def load_tokenizer(model: str, log: Callable[[str], None] = lambda s: None) -> tuple[Any, str]:
    """The tokenizer of a target model, without loading its weights: ``(tokenizer, display name)``.

    A GGUF model is converted once into the model cache (as ``specframe generate`` would), then only its
    tokenizer files are read.

    Raises:
        UnknownModelError, ModelNotInstalledError: as :func:`specframe.target.models.resolve_model`.
    """
    from transformers import AutoTokenizer

    from ..target.models import model_directory, resolve_model

    source = resolve_model(model)
    directory = model_directory(source, log)
    return AutoTokenizer.from_pretrained(directory), source.name


def tokenize(tokenizer: Any, texts: list[str], progress: Callable[[int], None] = lambda n: None) -> list[list[int]]:
    """Token ids of each text (no special tokens). ``progress(bytes)`` is called after each text."""
    out = []
    for text in texts:
        out.append(list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]))
        progress(len(text.encode("utf-8")))
    return out
