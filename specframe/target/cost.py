"""The one owner of the target's verification cost curve v(n) = T(n tokens) / T(1 token).

A speculative step costs one target forward over n = 1 + (draft nodes) tokens; v(n) says what that costs relative
to decoding one token, and it differs by machine far more than by model (docs/machine.md). Everything that needs
v(n) reads it here, as a :class:`CostCurve`:

- the machine profile (:mod:`specframe.target.profile`) measures T(n) at :data:`NS` and the loader hands the
  chosen settings' curve to the target (``TargetInfo.cost``), where routers read it; for a CUDA target the loader
  measures T(n) once per GPU model, dtype and model (:func:`specframe.target.profile.cuda_cost_curve`, timed by
  :func:`time_points`) and hands that curve over the same way;
- ``specframe bench`` measures T(1..N) with :func:`measure` and predicts speedups with :func:`predicted_speedup`;
- replay models the time of a recorded forward with :meth:`CostCurve.seconds` from a trace's manifest;
- a router configured with a curve of its own (``cost_curve``) or none at all uses :meth:`CostCurve.from_v` or
  :meth:`CostCurve.linear`.

Pure arithmetic, no model (:func:`measure` imports torch when called).
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Mapping, Sequence

from ..contracts.optional import optional

NS = (1, 2, 4, 8, 16, 32, 64, 128)  # tokens per forward the machine profile measures (batched steps: all rows)
REF_ACCEPT = 0.6  # reference per-token acceptance for judging settings (between lookup and learned drafters)


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """``y(x)`` by linear interpolation over ascending points ``xs``; below ``xs[0]`` it is ``ys[0]``, past the last
    point the last segment's slope extends it (a single point: constant).

    Example: ``interpolate([1, 2, 4], [1.0, 1.2, 1.6], 3) == 1.4``; ``interpolate([1, 2], [1.0, 1.5], 4) == 2.5``.
    """
    if x <= xs[0] or len(xs) == 1:
        return float(ys[0])
    for i in range(1, len(xs)):
        if x <= xs[i]:
            f = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
            return ys[i - 1] * (1 - f) + ys[i] * f
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return ys[-1] + slope * (x - xs[-1])


def v_at(v: Sequence[float], n: float) -> float:
    """v(n) from ``v[i]`` = v(i + 1) (``v[0]`` = 1.0 for one token), for any ``n`` (tokens per forward, a float):
    linear interpolation, and past the measured range the last step's slope."""
    return interpolate(range(1, len(v) + 1), v, n)


class CostCurve:
    """v(n) = T(n) / T(1) of a target, from measured forward times (mutable: the thread count may change).

    Args:
        t_ms: context (KV-cache length) -> ``[T(n) for n in ns]``, median ms; v is averaged over the contexts.
        fixed: the same for a curve that never follows the thread count (the machine's own, at its most threads),
            for decisions that must not depend on the load — a router under sampling, where its decisions pick how
            many random draws a step makes (docs/machine.md, "What a seed pins down"). Default: ``t_ms``.
        ns: the token counts of each row, ascending, starting at 1 (default :data:`NS`); a shorter row holds the
            first ``len(row)`` of them.
        plain_t1_ms: T(1) in ms of plain decoding's best settings on this machine (the machine profile's choice
            for plain decoding, :attr:`specframe.target.profile.Settings.plain_t1_ms`), the reference speculation
            must beat; None when unknown (the curve's own T(1) is then the reference).

    ``v(n)`` for any n >= 1 (a float) interpolates linearly between measured points and extends the last segment's
    slope past them; an empty curve is falsy and reads v(n) = 1.0.
    """

    def __init__(self, t_ms: Mapping[int, Sequence[float]] | None = None,
                 fixed: Mapping[int, Sequence[float]] | None = None, ns: Sequence[int] = NS,
                 plain_t1_ms: float | None = None) -> None:
        self.ns = tuple(int(n) for n in ns)
        self.t_ms: dict[int, list[float]] = {}
        self.set(t_ms or {})
        self.fixed = {int(c): list(v) for c, v in (fixed if fixed is not None else self.t_ms).items()}
        self.plain_t1_ms = float(plain_t1_ms) if plain_t1_ms else None

    @classmethod
    def from_v(cls, v: Sequence[float], t1_ms: float = 1.0) -> "CostCurve":
        """A curve from ``v[i]`` = v(i + 1) (normalised here so that v(1) = 1), e.g. a configured ``cost_curve``."""
        return cls({0: [t1_ms * x / v[0] for x in v]}, ns=range(1, len(v) + 1))

    @classmethod
    def linear(cls, slope: float) -> "CostCurve":
        """v(n) = 1 + slope * (n - 1): a guess for a target with no measured curve."""
        return cls({0: [1.0, 1.0 + slope]}, ns=(1, 2))

    @classmethod
    def from_manifest(cls, cost: Mapping[str, Any] | None) -> "CostCurve":
        """From a replay trace's ``manifest["cost"]`` (``{"t_ms": {context: [T(n) for n in ns]}, "ns": [...]}``;
        ``ns`` defaults to :data:`NS`); empty when the trace has none."""
        cost = cost or {}
        return cls({int(k): v for k, v in cost.get("t_ms", {}).items()}, ns=cost.get("ns") or NS)

    def set(self, t_ms: Mapping[int, Sequence[float]]) -> None:
        """Replace the load-following curve (the thread governor changed the thread count)."""
        self.t_ms = {int(c): list(v) for c, v in t_ms.items()}

    def __bool__(self) -> bool:
        return bool(self.t_ms)

    def t1_ms(self) -> float:
        """T(1) in ms, mean over contexts (0.0 for an empty curve)."""
        return sum(v[0] for v in self.t_ms.values()) / len(self.t_ms) if self.t_ms else 0.0

    def plain_share(self) -> float:
        """Plain decoding's best time per token in this curve's one-token forwards, ``plain_t1_ms / T(1)``, at most
        1.0 (plain decoding's best is never slower than plain decoding on these settings, which it could have
        chosen); 1.0 when either is unknown. Below 1.0 these settings are not plain decoding's best: speculation on
        them pays only where it commits more than ``1 / plain_share()`` tokens per one-token forward.

        Example: ``CostCurve({128: [50.0, 55.0]}, plain_t1_ms=45.0).plain_share() == 0.9``.
        """
        t1 = self.t1_ms()
        return min(1.0, self.plain_t1_ms / t1) if self.plain_t1_ms and t1 > 0 else 1.0

    def v(self, n: float) -> float:
        return self._v(self.t_ms, n)

    def v_fixed(self, n: float) -> float:
        return self._v(self.fixed, n)

    def _v(self, t_ms: dict[int, list[float]], n: float) -> float:
        if not t_ms:
            return 1.0
        # a row may be shorter than ns (measured before NS grew): its points are the first ns
        return sum(interpolate(self.ns[: len(row)], [t / row[0] for t in row], n) for row in t_ms.values()) / len(t_ms)

    def seconds(self, n: int) -> float:
        """Modeled seconds of a forward over ``n`` new tokens, T(1) * v(n) (0.0 for an empty curve)."""
        return self.t1_ms() / 1e3 * self.v(n) if self else 0.0

    def profile(self, max_tokens: int = 32) -> dict[str, Any] | None:
        """The curve in ``specframe bench``'s profile shape (``t_ms``, ``v`` for n = 1..max_tokens, ``contexts``),
        or None when empty."""
        if not self:
            return None
        v = [self.v(n) for n in range(1, max_tokens + 1)]
        return {"t_ms": [self.t1_ms() * x for x in v], "v": v, "contexts": sorted(self.t_ms)}


def expected_tokens(n: int, accept: float = REF_ACCEPT) -> float:
    """Tokens a forward over n tokens commits when each of its n - 1 draft nodes is accepted with ``accept``:
    (1 - a^n) / (1 - a) (Leviathan et al. 2022, eq. 1, with gamma = n - 1)."""
    return (1 - accept ** n) / (1 - accept)


def token_cost_ms(t_ms: Mapping[int, Sequence[float]], speculative: bool, accept: float = REF_ACCEPT,
                  ns: Sequence[int] = NS) -> float:
    """ms per committed token: T(1) for plain decoding, else ``min_n T(n) / E(n)``; mean over contexts."""
    per_ctx = [row[0] if not speculative else min(t / expected_tokens(n, accept) for n, t in zip(ns, row))
               for row in t_ms.values()]
    return sum(per_ctx) / len(per_ctx)


def predicted_speedup(tau: float, verified_per_step: float, draft_s_per_step: float, t1_s: float,
                      v: Sequence[float]) -> float:
    """Predicted speedup over plain decoding, with zero framework overhead: τ / (v(n̄) + d / T(1)).

    Generalises Leviathan et al. 2022 (§3.4, speedup (1 − α^{γ+1}) / ((1 − α)(γc + 1))) to any proposer and a
    non-flat verification cost: a strategy committing ``tau`` tokens per step while verifying ``verified_per_step``
    tokens per forward (n̄) and drafting ``draft_s_per_step`` seconds per step (d); ``t1_s`` is T(1) in seconds and
    ``v`` is v(1..N) (:func:`v_at`). The measured speedup falls short of it by the framework's per-step overhead.
    """
    return tau / (v_at(v, verified_per_step) + draft_s_per_step / t1_s)


def measure(target: Any, token_ids: list[int], context: int = 512, max_tokens: int = 32, repeats: int = 5,
            progress: Callable[[], None] | None = None) -> dict[str, Any]:
    """Time target forwards of n = 1..max_tokens new tokens over a ``context``-position cache (:func:`time_points`:
    synchronised with the target's device, so on CUDA a time is the forward's work, not its kernel launches).

    Args:
        target: a :class:`specframe.target.hf.Target` (or any target with ``new_cache``, ``forward``, ``device`` and,
            for a KV state of its own, ``rollback(cache, length)``).
        token_ids: real text tokens, cycled to fill the context and the scored block.

    Returns:
        ``{"context", "repeats", "t_ms": [T(1)..T(N)] (median ms), "v": [v(1)..v(N)]}``.
    """
    t_ms = time_points(target, token_ids, context, range(1, max_tokens + 1), repeats, progress)
    return {"context": context, "repeats": repeats, "t_ms": t_ms, "v": [t / t_ms[0] for t in t_ms]}


def time_points(target: Any, token_ids: list[int], context: int, ns: Sequence[int], repeats: int = 5,
                progress: Callable[[], None] | None = None) -> list[float]:
    """Median ms of one target forward over n new tokens after a ``context``-position cache, for each n of ``ns``.

    One prefill of ``context`` tokens, then per n one warm-up forward and ``repeats`` timed ones, each rolled back
    to ``context``. Every clock read waits for the target's device (:func:`specframe.target.device_sync.clock`:
    a no-op on the CPU), so on CUDA a time covers the forward's kernels, not only their launches, and no earlier
    work (the prefill, a warm-up, a rollback) is counted in it. ``token_ids`` are cycled to fill the context and
    the block; ``progress`` is called after each n.

    Raises:
        ValueError: ``ns`` empty or ``repeats`` < 1.
    """
    import torch

    from .device_sync import clock
    from .kv_cache import rollback as kv_rollback

    if not ns or repeats < 1:
        raise ValueError(f"time_points needs token counts and repeats >= 1, got ns={list(ns)}, repeats={repeats}")
    need = context + max(ns)
    ids = (token_ids * (need // max(len(token_ids), 1) + 1))[:need]
    rollback = optional(target, "rollback") or kv_rollback  # (an engine with its own KV state: llama.cpp)
    device = target.device
    with torch.inference_mode():
        seq = torch.tensor([ids], device=device)
        cache = target.new_cache()
        target.forward(seq[:, :context], cache)
        t_ms = []
        for n in ns:
            block = seq[:, context: context + n]
            target.forward(block, cache)  # warm-up for this shape
            rollback(cache, context)
            times = []
            for _ in range(repeats):
                t0 = clock(device)  # (waits for the warm-up, the prefill and the last rollback)
                target.forward(block, cache)
                times.append(clock(device) - t0)
                rollback(cache, context)
            t_ms.append(statistics.median(times) * 1e3)
            if progress is not None:
                progress()
    return t_ms
