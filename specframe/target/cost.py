"""The target's verification cost curve v(n) = T(n tokens) / T(1 token), read at any n.

Measured by :mod:`specframe.target.profile` (the machine profile) and :mod:`specframe.bench.costmodel` (a bench's profile);
read by routers that size node budgets against it. Pure functions, no model.
"""

from __future__ import annotations

from typing import Sequence


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
