"""Timing that means something on an accelerator: wait for the device's queued work before reading the clock.

On CUDA a kernel launch returns before the kernel runs, so ``time.perf_counter()`` around a forward measures the
launches, not the work (gpt-fast's ``device_sync`` and vLLM's timers synchronise for this reason). Every timing the
router, the metrics, the machine profile and bench read goes through :func:`synchronize` (or :func:`clock`), which
is a no-op on the CPU: there the work is done when the call returns.

A synchronisation is a host sync (the host waits for the device); the engine takes one per step after the target's
forward, where the verifier needs the logits on the host anyway.
"""

from __future__ import annotations

import time

import torch

__all__ = ["clock", "is_async", "synchronize"]


def is_async(device: torch.device | str | None) -> bool:
    """Whether work queued on ``device`` may still be running when the call that queued it returns (CUDA, XPU,
    MPS: True; CPU, ``meta`` or None: False)."""
    if device is None:
        return False
    return torch.device(device).type in ("cuda", "xpu", "mps")


def synchronize(device: torch.device | str | None) -> None:
    """Wait until every kernel queued on ``device`` has finished; a no-op on the CPU (and on ``meta``).

    Raises:
        RuntimeError: what the device's runtime raises (a failed kernel surfaces here on CUDA).
    """
    if not is_async(device):
        return
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "xpu":  # pragma: no cover - no XPU here
        torch.xpu.synchronize(dev)
    elif dev.type == "mps":  # pragma: no cover - no MPS here
        torch.mps.synchronize()


def clock(device: torch.device | str | None) -> float:
    """``time.perf_counter()`` (seconds) after :func:`synchronize` of ``device``: the time at which the work queued
    so far has finished."""
    synchronize(device)
    return time.perf_counter()
