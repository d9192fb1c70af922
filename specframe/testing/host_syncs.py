"""Count host syncs: the points where the host reads a tensor's values or copies data between host and device.

Each one stalls the host until the device has caught up (a read), or queues a copy from pageable host memory (a
host-to-device copy). A decoding step that does a few of them per draft node spends its time waiting, not computing.
:func:`count_host_syncs` counts them on the torch side while it is active::

    with count_host_syncs() as syncs:
        request.step()
    syncs.by_kind     # {"item": 2, "tolist": 3, "h2d": 4}
    syncs.total       # 9
    per_step(syncs, steps=1)   # {"item": 2.0, "tolist": 3.0, "h2d": 4.0, "total": 9.0}

How: a :class:`torch.overrides.TorchFunctionMode`. In torch 2.13 every call counted here goes through
``__torch_function__`` (``Tensor.item``, ``tolist``, ``__int__``, ``__float__``, ``__bool__``, ``__index__``,
``cpu``, ``numpy``, ``__array__``, ``to``, ``cuda``, ``copy_``, ``__setitem__``, ``torch.tensor``,
``torch.as_tensor``, ``torch.asarray``, ``Tensor.new_tensor``, ``nonzero``, ``torch.equal`` ...), so nothing is
patched; a call made by torch itself while handling a counted call (``tolist`` reading elements) is not counted
again. Only the thread that entered the context is counted (torch keeps its function-mode stack per thread).
Contexts nest: a call inside two active contexts counts in both (count a part of a step, e.g. drafting, inside a
context around the whole step).

Kinds (keys of :attr:`HostSyncs.by_kind`; a kind with no call is absent):

- ``"item"``, ``"tolist"``: ``Tensor.item()``, ``Tensor.tolist()``.
- ``"int"``, ``"float"``, ``"bool"``, ``"index"``: ``int(t)``, ``float(t)``, ``bool(t)`` (also ``if t:``),
  ``operator.index(t)`` (also a tensor used as a Python list index or in ``range``).
- ``"cpu"``: ``Tensor.cpu()``, and a copy from a device tensor to the host (``.to("cpu")``, ``cpu_t.copy_(dev_t)``).
  ``.cpu()`` of a tensor already on the host is counted too (the call is the same in device code).
- ``"numpy"``: ``Tensor.numpy()`` and ``numpy.asarray(t)`` (``__array__``).
- ``"nonzero"``: calls whose output size depends on the values: ``nonzero``, one-argument ``torch.where``,
  ``masked_select``, ``unique``, and indexing with a bool tensor (``t[mask]``).
- ``"compare"``: ``torch.equal``, ``torch.allclose``, ``torch.is_nonzero`` (a Python bool from tensor values).
- ``"format"``: ``str(t)``, ``repr(t)``, ``f"{t}"``.
- ``"h2d"``: a copy of host data to a device, by this rule:

  With an accelerator (a *device run*): ``t.to(...)`` / ``t.cuda()`` of a host tensor to a device;
  ``dev_t.copy_(host_t)``; ``dev_t[...] = host_t``; ``torch.tensor`` / ``torch.as_tensor`` / ``torch.asarray`` /
  ``Tensor.new_tensor`` of Python or NumPy data (or of a host tensor) placed on a device, by an explicit ``device``
  or, for ``new_tensor``, by the device of ``self``. A copy between two devices is not counted.

  On a CPU-only run nothing is really copied, so the rule counts the calls that would copy had the target been on a
  device, as the code names them: ``t.to(<device>)`` / ``t.to(device=...)`` (a device given as a
  ``torch.device``, a string or an int; ``.to(dtype)`` alone and ``.to(other_tensor)`` are not counted), and
  ``torch.tensor`` / ``torch.as_tensor`` / ``torch.asarray`` / ``Tensor.new_tensor`` calls with an explicit
  ``device``. It is an upper bound: a ``.to(dev)`` of a tensor already on ``dev`` is free on a device and counted
  here. Allocating factories (``zeros``, ``ones``, ``full``, ``empty``, ``arange``, ``*_like``) are never counted,
  on any run: they fill memory on the device without reading the host's.

Not counted: indexing a device tensor with a Python list or host tensor (an implicit copy of the index; on a device
run it is one, so keep indices on the device), ``torch.multinomial`` and other kernels that do not return data to
the host, and anything outside torch (NumPy, the tokenizer, llguidance).
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["HostSyncs", "count_host_syncs", "per_step"]

KINDS = ("item", "tolist", "int", "float", "bool", "index", "cpu", "numpy", "nonzero", "compare", "format", "h2d")

T = torch.Tensor
# calls that read values to the host, whatever the arguments
_READS: dict[Any, str] = {
    T.item: "item", T.tolist: "tolist", T.__int__: "int", T.__float__: "float", T.__bool__: "bool",
    T.__index__: "index", T.numpy: "numpy", T.__array__: "numpy",
    T.nonzero: "nonzero", torch.nonzero: "nonzero", T.masked_select: "nonzero", torch.masked_select: "nonzero",
    T.unique: "nonzero", torch.unique: "nonzero",
    torch.equal: "compare", torch.allclose: "compare", T.allclose: "compare", torch.is_nonzero: "compare",
    T.__format__: "format", T.__repr__: "format", T.__str__: "format",
}
_DATA_FACTORIES = (torch.tensor, torch.as_tensor, torch.asarray)


@dataclass
class HostSyncs:
    """What one :func:`count_host_syncs` context counted (updated live while it is active).

    Attributes:
        by_kind: kind -> calls (see the module docstring for the kinds); kinds never seen are absent.
        sites: ``(kind, "file:line")`` -> calls, the first caller outside torch and this module; filled only with
            ``count_host_syncs(sites=True)`` (finding the caller costs a stack walk per call).
    """

    by_kind: dict[str, int] = field(default_factory=dict)
    sites: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        """All counted calls, every kind."""
        return sum(self.by_kind.values())

    def add(self, kind: str, site: str | None = None) -> None:
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        if site is not None:
            self.sites[(kind, site)] += 1


def per_step(counts: HostSyncs | Mapping[str, int], steps: int) -> dict[str, float]:
    """Calls per decoding step: each kind of ``counts`` divided by ``steps``, plus ``"total"``.

    Args:
        counts: a :class:`HostSyncs` or its ``by_kind`` mapping.
        steps: decoding steps the counts cover.

    Raises:
        ValueError: ``steps < 1``.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    kinds = counts.by_kind if isinstance(counts, HostSyncs) else dict(counts)
    out = {k: v / steps for k, v in sorted(kinds.items())}
    out["total"] = sum(kinds.values()) / steps
    return out


def _is_host(device: torch.device) -> bool:
    return device.type == "cpu"


def _device_of(value: Any) -> torch.device | None:
    """A ``device`` argument as a ``torch.device`` (None when not given)."""
    if value is None:
        return None
    if isinstance(value, torch.device):
        return value
    if isinstance(value, (str, int)):
        return torch.device(value)
    return None


def _has_accelerator() -> bool:
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "current_accelerator"):
        return acc.current_accelerator() is not None
    return torch.cuda.is_available()


def _bool_index(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool and i.dim() > 0 for i in items)


class _Mode(TorchFunctionMode):
    def __init__(self, record: Callable[[str], None], cpu_only: bool) -> None:
        super().__init__()
        self.record, self.cpu_only = record, cpu_only

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            kind = self._kind(func, args, kwargs)
        except (IndexError, AttributeError, TypeError, ValueError, RuntimeError):  # torch will raise its own error
            kind = None
        if kind is not None:
            self.record(kind)
        return func(*args, **kwargs)

    def _kind(self, func: Any, args: tuple, kwargs: dict) -> str | None:
        kind = _READS.get(func)
        if kind is not None:
            return kind
        if func is torch.where and len(args) + len(kwargs) == 1:
            return "nonzero"
        if func is T.__getitem__:
            return "nonzero" if _bool_index(args[1]) else None
        if func is T.cpu:
            return "cpu"
        if func is T.to:
            return self._to(args[0], args[1:], kwargs)
        if func is T.cuda:
            return None if self.cpu_only or not _is_host(args[0].device) else "h2d"
        if func is T.copy_:
            return self._copy(args[0].device, args[1].device if isinstance(args[1], torch.Tensor) else None)
        if func is T.__setitem__:
            value = args[2]
            if isinstance(value, torch.Tensor):
                return self._copy(args[0].device, value.device)
            return None
        if func in _DATA_FACTORIES or func is T.new_tensor:
            return self._factory(func, args, kwargs)
        return None

    def _copy(self, dst: torch.device, src: torch.device | None) -> str | None:
        if src is None or self.cpu_only or _is_host(dst) == _is_host(src):
            return None
        return "h2d" if _is_host(src) else "cpu"

    def _to(self, tensor: torch.Tensor, args: tuple, kwargs: dict) -> str | None:
        named = args[0] if args and isinstance(args[0], (torch.device, str, int)) else kwargs.get("device")
        if args and isinstance(args[0], torch.Tensor):
            if self.cpu_only:
                return None  # .to(other) names no device
            return self._copy(args[0].device, tensor.device)
        dst = _device_of(named)
        if dst is None:
            return None
        if self.cpu_only:
            return "h2d"
        return self._copy(dst, tensor.device)

    def _factory(self, func: Any, args: tuple, kwargs: dict) -> str | None:
        device = kwargs.get("device")
        if device is None and func is torch.as_tensor and len(args) >= 3:
            device = args[2]
        dst = _device_of(device)
        data = args[1] if func is T.new_tensor else (args[0] if args else kwargs.get("data", kwargs.get("obj")))
        if self.cpu_only:
            return "h2d" if dst is not None else None
        if dst is None and func is T.new_tensor:
            dst = args[0].device
        if dst is None or _is_host(dst):
            return None
        src = data.device if isinstance(data, torch.Tensor) else torch.device("cpu")
        return self._copy(dst, src)


_HERE = __file__.rsplit(".", 1)[0]
_TORCH = torch.__file__.rsplit("/", 1)[0]


def _caller() -> str:
    import sys

    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_TORCH) and not name.startswith(_HERE) and "contextlib" not in name:
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


@contextlib.contextmanager
def count_host_syncs(*, cpu_only: bool | None = None, sites: bool = False) -> Iterator[HostSyncs]:
    """Count the host syncs this thread makes on the torch side while the context is active (see the module
    docstring for what counts, by kind).

    Args:
        cpu_only: which ``"h2d"`` rule applies: True the CPU-only rule, False the device-run rule; None (default):
            the CPU-only rule when torch sees no accelerator (``torch.accelerator.current_accelerator()`` is None).
        sites: also count each call by its caller's ``file:line`` in :attr:`HostSyncs.sites` (slower).

    Yields:
        a :class:`HostSyncs`, updated as calls happen; read it after the block.
    """
    counts = HostSyncs()
    if cpu_only is None:
        cpu_only = not _has_accelerator()
    owner = threading.get_ident()

    def record(kind: str) -> None:
        if threading.get_ident() == owner:
            counts.add(kind, _caller() if sites else None)

    with _Mode(record, cpu_only):
        yield counts
