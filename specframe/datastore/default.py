"""The default datastore: the ``pydoc`` preset tokenized with the target's tokenizer, built once into the cache.

``$SPECFRAME_CACHE/datastores/pydoc-<key>/``, where the key hashes the tokenizer's fingerprint, the preset's
text and the datastore format version, so another tokenizer, another Python's topics or a new format get
their own entry. An entry that does not open is rebuilt.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from typing import Any

from .sources import DEFAULT_PRESET, read_preset, tokenize, tokenizer_info
from .store import VERSION, Datastore, DatastoreError, build_datastore

log = logging.getLogger(__name__)


def default_path(tokenizer: Any, preset: str = DEFAULT_PRESET, root: Path | None = None,
                 info: dict[str, Any] | None = None) -> tuple[Path, Any, dict[str, Any]]:
    """``(folder, source, tokenizer info)`` of the default datastore for ``tokenizer`` (``info``: its
    :func:`~specframe.datastore.sources.tokenizer_info`, if already computed)."""
    from ..target.models import cache_root

    source = read_preset(preset)
    info = info or tokenizer_info(tokenizer)
    h = hashlib.sha256(f"{info['fingerprint']}:{VERSION}".encode())
    for text in source.texts:
        h.update(text.encode("utf-8"))
    return (root or cache_root()) / "datastores" / f"{preset}-{h.hexdigest()[:16]}", source, info


def default_datastore(tokenizer: Any, model: str = "", preset: str = DEFAULT_PRESET,
                      root: Path | None = None, info: dict[str, Any] | None = None) -> Datastore:
    """Open the default datastore for ``tokenizer``, building it first if the cache has none (a few seconds).

    Args:
        tokenizer: the target's transformers tokenizer.
        model: the target's name (recorded in the manifest).
        preset: which built-in text (see :data:`specframe.datastore.sources.PRESETS`).
        root: cache root (default ``$SPECFRAME_CACHE``).
        info: the tokenizer's :func:`~specframe.datastore.sources.tokenizer_info`, if already computed.
    """
    path, source, info = default_path(tokenizer, preset, root, info)
    if path.exists():
        try:
            return Datastore.open(path)
        except DatastoreError as exc:
            log.warning("rebuilding the default datastore: %s", exc)
    log.info("building the default %s datastore into %s", preset, path)
    t0 = time.perf_counter()
    ids = tokenize(tokenizer, source.texts)
    from ..target.models import writing_cache

    with writing_cache(f"the default {preset} datastore"):
        return build_datastore(
            ids, path, vocab_size=len(tokenizer), model=model, tokenizer=info, sources=[source.info],
            input_bytes=source.info["bytes"], force=True, extra_build_s=time.perf_counter() - t0,
        )
