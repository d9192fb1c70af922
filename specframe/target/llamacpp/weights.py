"""Requantizing a GGUF once for the llama.cpp engine (``llamacpp: {weights: q4_0}``).

llama.cpp's batched kernels (llamafile's tinyBLAS) read a weight once for several rows only for some tensor types —
``q8_0``, ``q4_0``, F16 / BF16 / F32 — while others (``Q4_1``, the K-quants) compute a k-row batch as k dot products
per weight row. The default model ships as Q4_1, so its wide forward costs about k one-row forwards; requantized to
``q4_0`` or ``q8_0`` it costs far less (docs/llamacpp.md, "The wide forward"). Requantizing changes the model's
numbers: the quality each type keeps is measured by ``lab/scripts/requant_quality.py`` and stated beside every speed
figure.

The file is written once into the cache (``$SPECFRAME_CACHE/models/<gguf stem>-<type>-<key>/model.gguf``, keyed by
the source's content and the type; written to a temporary folder and renamed when whole, with the manifest every
cache entry has) with llama.cpp's own ``llama_model_quantize``.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Callable

from ...errors import ConfigError

#: the weight types a GGUF can be requantized into here -> llama.cpp's ftype constant name
TYPES = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "bf16": "LLAMA_FTYPE_MOSTLY_BF16",
         "f16": "LLAMA_FTYPE_MOSTLY_F16"}
WEIGHTS = ("gguf", *TYPES)  # the setting's values: "gguf" = the file's own types


def requantized(source: Path, kind: str, log: Callable[[str], None] = lambda s: None) -> Path:
    """The GGUF ``source`` with its weights requantized to ``kind`` (a key of :data:`TYPES`), made once.

    Raises:
        ConfigError: an unknown ``kind``, or llama.cpp cannot requantize the file.
        CacheError: the cache cannot be written.
    """
    from ..models import build_entry, cache_root, entry_ok, file_sha256, writing_cache
    from .binding import holding_errors, import_llama_cpp

    if kind not in TYPES:
        raise ConfigError(f"llamacpp weights must be one of {', '.join(WEIGHTS)}, got {kind!r}")
    key = hashlib.sha256(f"{file_sha256(source)}:{kind}".encode()).hexdigest()[:16]
    entry = cache_root() / "models" / f"{source.stem}-{kind}-{key}"
    out = entry / "model.gguf"
    if entry_ok(entry, log):
        return out
    llama_cpp = import_llama_cpp()
    log(f"requantizing {source.name} to {kind} once into {entry}")

    def fill(tmp: Path) -> None:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, TYPES[kind])
        params.allow_requantize = True
        with holding_errors() as lines:
            rc = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp / "model.gguf").encode(), params)
        if rc != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            why = lines[-1] if lines else f"llama_model_quantize returned {rc}"
            raise ConfigError(f"llama.cpp cannot requantize {source.name} to {kind}: {why}")

    with writing_cache(f"{source.name} requantized to {kind}"):
        build_entry(entry, fill, source=str(source), weights=kind)
    return out
