"""What requests share, and what each request has to itself: loaded weights vs. plugin instances.

A :class:`~specframe.api.Specframe` serves requests one after another or from several threads at once. Each request
gets its own plugin instances (proposers, merge policy, router, verifier: they keep per-request state between
``start`` and the last step), taken from an :class:`InstancePool` and given back when the request ends, so a
request never sees another's state and serial requests reuse instances instead of rebuilding them. The pool keeps
a bounded number of idle instances: memory follows the requests running now, not every option set ever asked for.

The expensive part of a learned proposer — its weights — depends only on where they come from and how they are
placed (folder, dtype, device, target), not on its options (``k``, thresholds, ...). :func:`shared` loads such an
object once and hands the same one to every instance that asks while any of them holds it (a weak reference here):
eight option sets of ``draft-model`` hold one copy of the draft. Shared objects are read-only after they are
built (requests on several threads use them at once).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
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


class InstancePool:
    """Idle plugin instances by key (kind + class + options), handed out one request at a time.

    Args:
        max_idle: most idle instances kept in all (the least recently returned go first); instances in use are
            not counted (a request always gets one: built when none is idle).
    """

    def __init__(self, max_idle: int = 16) -> None:
        self.max_idle = max_idle
        self._idle: OrderedDict[tuple[Hashable, int], Any] = OrderedDict()
        self._serial = 0
        self._lock = threading.Lock()

    def take(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """An idle instance for ``key`` (removed from the pool), or a new one from ``build()``."""
        with self._lock:
            for k in reversed(self._idle):  # the most recently returned first
                if k[0] == key:
                    return self._idle.pop(k)
        return build()

    def give(self, key: Hashable, obj: Any) -> None:
        """Return ``obj`` (taken for ``key``) for later requests."""
        with self._lock:
            self._serial += 1
            self._idle[(key, self._serial)] = obj
            while len(self._idle) > self.max_idle:
                self._idle.popitem(last=False)

    def __len__(self) -> int:
        return len(self._idle)
