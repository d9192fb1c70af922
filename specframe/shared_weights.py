"""Loaded weights that requests share: the expensive part of a learned proposer depends only on where its weights
come from and how they are placed (folder, dtype, device, target), not on its options (``k``, thresholds, ...).
:func:`shared` loads such an object once and hands the same one to every instance that asks while any of them holds
it (a weak reference here): eight option sets of ``draft-model`` hold one copy of the draft. Shared objects are
read-only after they are built (requests on several threads use them at once). What each request has to itself,
its plugin instances, is :mod:`specframe.instance_pool`.
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Hashable

_live: "weakref.WeakValueDictionary[Hashable, Any]" = weakref.WeakValueDictionary()
_building: dict[Hashable, threading.Lock] = {}
_lock = threading.Lock()


def shared(key: Hashable, build: Callable[[], Any]) -> Any:
    """The live object for ``key``, or ``build()`` once (concurrent callers with the same key wait for one build).

    ``key`` must name everything the object depends on (see :func:`folder_key`); the object must accept weak
    references (plain Python classes and ``torch.nn.Module`` do) and must not be changed after it is built.
    """
    with _lock:
        obj = _live.get(key)
        if obj is not None:
            return obj
        building = _building.setdefault(key, threading.Lock())
    with building:
        obj = _live.get(key)
        if obj is None:
            obj = build()
            _live[key] = obj
    with _lock:
        _building.pop(key, None)
    return obj


def folder_key(folder: Path) -> tuple:
    """Identity of a weights folder: its resolved path and the size and modification time of each file in it (so a
    folder retrained in place is loaded afresh)."""
    folder = Path(folder).resolve()
    files = []
    if folder.is_dir():
        for p in sorted(folder.iterdir()):
            if p.is_file():
                st = p.stat()
                files.append((p.name, st.st_size, st.st_mtime_ns))
    return (str(folder), tuple(files))
