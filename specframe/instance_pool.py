"""What each request has to itself: its plugin instances, from a pool.

A :class:`~specframe.api.Specframe` serves requests one after another or from several threads at once. Each request
gets its own plugin instances (proposers, merge policy, router, verifier: they keep per-request state between
``start`` and the last step), taken from an :class:`InstancePool` and given back when the request ends, so a
request never sees another's state and serial requests reuse instances instead of rebuilding them. The pool keeps
a bounded number of idle instances: memory follows the requests running now, not every option set ever asked for.
What requests share, their loaded weights, is :mod:`specframe.shared_weights`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable


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
