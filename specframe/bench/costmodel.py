"""The target's verification cost curve and predicted speedups.

v(n) = T(n tokens) / T(1 token): the time of one target forward scoring n new tokens over a KV cache of
``context`` positions, relative to decoding one token. Generalising Leviathan et al. 2022 (§3.4, speedup
(1 − α^{γ+1}) / ((1 − α)(γc + 1))) to any proposer and a non-flat verification cost, a strategy that commits
τ tokens per step while verifying n̄ tokens per forward and spending d seconds per step drafting runs at

    predicted speedup = τ / (v(n̄) + d / T(1))

over plain decoding, with zero framework overhead (v(n) between measured points: :func:`specframe.target.cost.v_at`).
The measured speedup falls short of it by the framework's per-step overhead (bookkeeping, Python) — the report
shows both.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from ..target.cost import v_at
from ..target.kv_cache import rollback as _rollback


@torch.inference_mode()
def measure_cost_curve(target: Any, token_ids: list[int], context: int = 512, max_tokens: int = 32,
                       repeats: int = 5, progress: Any = None) -> dict[str, Any]:
    """Time target forwards of n = 1..max_tokens new tokens over a ``context``-position cache.

    Args:
        target: a :class:`specframe.target.hf.Target` (or any target with ``new_cache``, ``forward`` and, for a KV
            state of its own, ``rollback(cache, length)``).
        token_ids: real text tokens, cycled to fill the context and the scored block.

    Returns:
        ``{"context", "repeats", "t_ms": [T(1)..T(N)] (median ms), "v": [v(1)..v(N)]}``.
    """
    need = context + max_tokens
    ids = (token_ids * (need // max(len(token_ids), 1) + 1))[:need]
    seq = torch.tensor([ids], device=target.device)
    cache = target.new_cache()
    rollback = getattr(target, "rollback", None) or _rollback  # (an engine with its own KV state: llama.cpp)
    target.forward(seq[:, :context], cache)
    t_ms = []
    for n in range(1, max_tokens + 1):
        block = seq[:, context : context + n]
        target.forward(block, cache)  # warm-up for this shape
        rollback(cache, context)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            target.forward(block, cache)
            times.append(time.perf_counter() - t0)
            rollback(cache, context)
        t_ms.append(statistics.median(times) * 1e3)
        if progress is not None:
            progress()
    return {"context": context, "repeats": repeats, "t_ms": t_ms, "v": [t / t_ms[0] for t in t_ms]}


def predicted_speedup(tau: float, verified_per_step: float, draft_s_per_step: float, t1_s: float,
                      v: list[float]) -> float:
    """τ / (v(n̄) + d / T(1)); see the module docstring."""
    return tau / (v_at(v, verified_per_step) + draft_s_per_step / t1_s)
