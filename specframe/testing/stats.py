"""Total-variation tests with thresholds calibrated by simulating the null hypothesis.

For ``M`` samples of a distribution ``p`` the total-variation distance between the empirical and the true
distribution is not near 0 even when nothing is wrong: its expectation is about
``0.5 * sum_v sqrt(p_v (1 - p_v) / M)`` over the outcomes ``v``. So rather than a fixed cut-off, each test draws
the same number of samples from the distribution that *should* hold, ``replicates`` times, and fails when the
observed distance is above the simulated mean plus ``sigmas`` standard deviations (a correct proposer fails with
probability about 1e-7 at 5 sigmas; seeds are fixed, so a run is reproducible). A proposer with an exactness bug
lands far above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

SIGMAS = 5.0
REPLICATES = 300


def tv_distance(a: Tensor, b: Tensor) -> float:
    """``0.5 * sum |a - b|`` over all entries (two distributions of the same shape)."""
    return 0.5 * float((a.double() - b.double()).abs().sum())


@dataclass(frozen=True)
class TVTest:
    """Outcome of one total-variation test."""

    observed: float  # TV(empirical, expected)
    threshold: float  # null mean + SIGMAS * null std
    null_mean: float
    samples: int

    @property
    def passed(self) -> bool:
        return self.observed <= self.threshold

    def summary(self) -> str:
        return (f"TV = {self.observed:.4f} over {self.samples} samples; a correct proposer stays below "
                f"{self.threshold:.4f} (typical {self.null_mean:.4f})")


def tv_test_fixed(counts: Tensor, probs: Tensor, seed: int = 0) -> TVTest:
    """Empirical ``counts`` (any shape) against one fixed distribution ``probs`` (same shape)."""
    flat_p = probs.double().flatten()
    n = int(counts.sum())
    g = torch.Generator().manual_seed(seed)
    draws = torch.multinomial(flat_p.float().expand(REPLICATES, -1), n, replacement=True, generator=g)
    sim = torch.zeros(REPLICATES, flat_p.numel(), dtype=torch.float64).scatter_add_(
        1, draws, torch.ones_like(draws, dtype=torch.float64)
    ) / n
    null = 0.5 * (sim - flat_p).abs().sum(1)
    observed = tv_distance(counts.double().flatten() / n, flat_p)
    return TVTest(observed, float(null.mean() + SIGMAS * null.std()), float(null.mean()), n)


CALIBRATION_BINS = 10


def _marginal(tokens: Tensor, rows: Tensor) -> Tensor:
    """``[R, V]`` token frequencies minus the mean row, per replicate (``tokens`` is ``[R, M]``)."""
    r, m = tokens.shape
    hist = torch.zeros(r, rows.shape[1], dtype=torch.float64).scatter_add_(
        1, tokens, torch.ones(r, m, dtype=torch.float64)
    )
    return hist / m - rows.mean(0)


def _calibration(tokens: Tensor, rows: Tensor) -> Tensor:
    """``[R, CALIBRATION_BINS]``: per bin of reported probability, how often a token with that probability was drawn
    minus how often it should have been (a reliability diagram). Catches a draft sampled sharper or flatter than
    reported."""
    r, m = tokens.shape
    bins = (rows * CALIBRATION_BINS).long().clamp(max=CALIBRATION_BINS - 1)  # [M, V]
    expected = torch.zeros(CALIBRATION_BINS, dtype=torch.float64).scatter_add_(0, bins.flatten(), rows.flatten())
    drawn = bins.gather(1, tokens.T).T  # [R, M] bin of each drawn token
    observed = torch.zeros(r, CALIBRATION_BINS, dtype=torch.float64).scatter_add_(
        1, drawn, torch.ones(r, m, dtype=torch.float64)
    )
    return (observed - expected) / m


def tv_tests_mixture(tokens: Tensor, rows: Tensor, seed: int = 0) -> dict[str, TVTest]:
    """Tokens each drawn from its own reported distribution: is ``tokens[m] ~ rows[m]``?

    Two statistics, each calibrated by drawing one token from every row, ``REPLICATES`` times:

    - ``marginal``: TV between the token histogram and the mean row;
    - ``calibration``: TV-like distance between how often tokens of each reported-probability bin were drawn and
      how often they should have been — sensitive to sampling from a sharpened or flattened distribution
      even when the rows differ from sample to sample.

    Args:
        tokens: ``[M]`` int64.
        rows: ``[M, V]`` probabilities.
    """
    rows = rows.double()
    g = torch.Generator().manual_seed(seed)
    sims = torch.multinomial(rows.float(), REPLICATES, replacement=True, generator=g).T  # [R, M]
    out = {}
    for name, stat in (("marginal", _marginal), ("calibration", _calibration)):
        null = 0.5 * stat(sims, rows).abs().sum(1)
        observed = 0.5 * float(stat(tokens[None], rows).abs().sum())
        out[name] = TVTest(observed, float(null.mean() + SIGMAS * null.std()), float(null.mean()), len(tokens))
    return out


def calibration_table(tokens: Tensor, rows: Tensor) -> list[tuple[float, float, int, float]]:
    """Per bin of reported probability ``[lo, hi)``: how many drawn tokens fell in it and how many were expected."""
    dev = _calibration(tokens[None], rows.double())[0] * len(tokens)  # observed - expected
    bins = (rows.double() * CALIBRATION_BINS).long().clamp(max=CALIBRATION_BINS - 1)
    expected = torch.zeros(CALIBRATION_BINS, dtype=torch.float64).scatter_add_(0, bins.flatten(), rows.double().flatten())
    return [
        (b / CALIBRATION_BINS, (b + 1) / CALIBRATION_BINS, int(round(float(dev[b] + expected[b]))), float(expected[b]))
        for b in range(CALIBRATION_BINS)
    ]


def worst_outcomes(empirical: Tensor, expected: Tensor, top: int = 3) -> list[tuple[int, float, float]]:
    """The ``top`` outcomes (flat index, empirical, expected) with the largest absolute difference."""
    e, x = empirical.double().flatten(), expected.double().flatten()
    order = (e - x).abs().argsort(descending=True)[:top]
    return [(int(i), float(e[i]), float(x[i])) for i in order]
