"""Synthetic acceptance: the engine's speed at a chosen acceptance, on any target and machine, without a drafter
that earns it — what vLLM (``rejection_sample_method: synthetic``), llama.cpp (``--spec-synthetic-acceptance-*``),
TRT-LLM and SGLang offer so that engines are compared at equal acceptance. **Not lossless**: the committed tokens
are the drafts the schedule accepts, not the target's; every table labels such a run and the lossless check skips it.

A bench strategy with ``synthetic:`` keeps its proposers (their drafting time and draft sizes are real) and replaces
the acceptance rule with :class:`SyntheticVerifier`. What it accepts, given:

- ``acceptance_length: L`` (vLLM's ``synthetic_acceptance_length``; L counts the bonus token, ``1 <= L <= k + 1``):
  the constant conditional rate p with ``p + p^2 + ... + p^k = L - 1``
  (:func:`~specframe.bench.speculation_profile.rates_for_length`), k the strategy's deepest draft;
- ``acceptance_rates: [c_1, ..., c_k]`` (vLLM's ``synthetic_acceptance_rates``): per-position conditional rates,
  non-increasing;
- ``profile: FILE`` (a ``speculation_profile.json``, ours or another engine's): its marginals, or where the profile
  is specframe's own, its joint histogram of (verified nodes N, accepted A) per step, so that with the ``synthetic``
  proposer (``widths`` from the same profile) a run reproduces both the forward sizes and the acceptance of the
  strategy it was recorded from.

Schedules are deterministic and of minimum variance (a low-discrepancy credit scheme, not random draws): after t
steps, the steps of each accepted count (and with a joint histogram, of each (N, A)) are within about one of
their share — so a short run already has the asked mean.
A step accepts at most the depth of its draft's first chain (root, first child, ...); a shorter draft than the
schedule asks for accepts what it has (the shortfall is not made up later).

The bonus token is the target's most likely token that is not an end-of-sequence token, so a synthetic request
runs to its token limit, as benchmarks run with ``ignore_eos``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

import torch
from torch import Tensor

from ..contracts import DraftTree, VerifyResult
from ..errors import ConfigError
from ..sampling import SamplingParams
from ..token_tree import children_of


def marginals_from_conditional(conditional: Sequence[float]) -> list[float]:
    """``marginal[i] = prod(conditional[:i + 1])``."""
    out, run = [], 1.0
    for c in conditional:
        run *= float(c)
        out.append(run)
    return out


class CreditSchedule:
    """Minimum-variance acceptance counts for per-position marginals ``m`` ``[K]`` (non-increasing, in [0, 1]).

    The marginals are a distribution of accepted counts, ``P(A = j) = m[j - 1] - m[j]`` (``m[-1] = 1``,
    ``m[K] = 0``); each step adds every count's probability to its credit, takes the count of largest credit (ties:
    the smaller) and pays 1 from it. So each count's credit stays within one step of its share, the steps that
    accepted at least i drafts follow ``t * m[i]`` to within a few steps, and no step accepts a position without
    those before it. A step whose draft is shorter (``cap``) accepts what it has.
    """

    def __init__(self, marginal: Sequence[float]) -> None:
        m = [min(max(float(x), 0.0), 1.0) for x in marginal]
        m = [min(x, min(m[:i]) if i else 1.0) for i, x in enumerate(m)]  # (a survival function never increases)
        reach = [1.0, *m, 0.0]
        self.p = {j: reach[j] - reach[j + 1] for j in range(len(m) + 1) if reach[j] - reach[j + 1] > 0}
        self.credit = dict.fromkeys(self.p, 0.0)

    def next(self, cap: int) -> int:
        for j, p in self.p.items():
            self.credit[j] += p
        best = max(sorted(self.credit), key=lambda j: self.credit[j])
        self.credit[best] -= 1.0
        return min(best, cap)


class ShapeSchedule:
    """Minimum-variance accepted counts A given the verified node count N, from a joint histogram
    ``{"N/A": steps}``: per N, each step adds P(A | N) to each A's credit and takes the A of largest credit (ties:
    the smaller A), paying 1. An N the histogram never saw falls back to ``fallback``."""

    def __init__(self, steps_by_shape: dict[str, int], fallback: CreditSchedule) -> None:
        table: dict[int, dict[int, int]] = {}
        for key, n in steps_by_shape.items():
            nodes, accepted = (int(x) for x in key.split("/"))
            table.setdefault(nodes, {})[accepted] = table.setdefault(nodes, {}).get(accepted, 0) + int(n)
        self.p = {nodes: {a: n / sum(row.values()) for a, n in row.items()} for nodes, row in table.items()}
        self.credit = {nodes: dict.fromkeys(row, 0.0) for nodes, row in self.p.items()}
        self.fallback = fallback

    def next(self, nodes: int, cap: int) -> int:
        row = self.p.get(nodes)
        if row is None:
            return self.fallback.next(cap)
        credit = self.credit[nodes]
        for a, p in row.items():
            credit[a] += p
        best = max(sorted(credit), key=lambda a: credit[a])
        credit[best] -= 1.0
        return min(best, cap)


def _first_chain(parent: list[int]) -> list[int]:
    """Node indices of the draft's first chain: the first root, its first child, ..."""
    kids = children_of(parent)
    path, row = [], 0
    while kids[row]:
        path.append(kids[row][0])
        row = path[-1] + 1
    return path


class SyntheticVerifier:
    """The acceptance rule of a synthetic run (see the module docstring). The bench keeps one per strategy, so its
    schedule runs on across requests (restarting it per request would favour the commonest counts at every start).

    Args:
        marginal: ``[K]`` per-position marginal acceptance (P(the first i + 1 drafts accepted)).
        steps_by_shape: optional joint histogram ``{"N/A": steps}`` (specframe's profiles); when given, A follows
            it for every N it holds.
        eos_token_ids: never chosen as the bonus token.
    """

    name: ClassVar[str] = "synthetic"
    supports_trees: ClassVar[bool] = True

    def __init__(self, marginal: Sequence[float], steps_by_shape: dict[str, int] | None = None,
                 eos_token_ids: Sequence[int] = ()) -> None:
        self.credit = CreditSchedule(marginal)
        self.shapes = ShapeSchedule(steps_by_shape, self.credit) if steps_by_shape else None
        self.eos = sorted(set(int(t) for t in eos_token_ids))

    def verify(self, draft: DraftTree, target_logits: Tensor, sampling: SamplingParams,
               generator: torch.Generator) -> VerifyResult:
        """``target_logits`` ``[B, N + 1, V]``: only the bonus token is read from it."""
        paths, bonus = [], []
        for b in range(target_logits.shape[0]):
            parent = draft.parent[b].tolist()
            real = [i for i, t in enumerate(draft.token_ids[b].tolist()) if t >= 0]  # (padding: -1)
            chain = _first_chain(parent[: len(real)])
            n = len(real)
            a = self.shapes.next(n, len(chain)) if self.shapes is not None else self.credit.next(len(chain))
            path = chain[:a]
            row = target_logits[b, path[-1] + 1 if path else 0].float().clone()
            if self.eos:
                row[self.eos] = float("-inf")
            paths.append(tuple(path))
            bonus.append(int(row.argmax()))
        return VerifyResult(tuple(paths), tuple(bonus))


def synthetic_marginals(spec: Any, k: int, read_profile: Any) -> tuple[list[float], dict[str, int] | None]:
    """``(marginal [k'], steps_by_shape or None)`` of a bench strategy's ``synthetic`` section (see the module
    docstring); ``k``: the strategy's deepest draft, for ``acceptance_length``.

    Raises:
        ConfigError: an acceptance length outside ``[1, k + 1]``, rates that increase or leave [0, 1], or a profile
            that does not read (:func:`~specframe.bench.speculation_profile.read_profile`).
    """
    from .speculation_profile import rates_for_length

    if spec.profile is not None:
        doc = read_profile(spec.profile)
        shapes = (doc.get("specframe") or {}).get("steps_by_shape") or None
        return list(doc["marginal_accept_rates"]), shapes
    if spec.acceptance_rates is not None:
        rates = list(spec.acceptance_rates)
        return marginals_from_conditional(rates), None
    return marginals_from_conditional(rates_for_length(float(spec.acceptance_length), k)), None


def check_rates(rates: Sequence[float], where: str) -> None:
    """Raises ConfigError naming the first rate outside [0, 1] or above the one before it."""
    for i, r in enumerate(rates):
        if not 0.0 <= r <= 1.0:
            raise ConfigError(f"{where}: acceptance_rates[{i}] = {r} is not a probability in [0, 1]")
        if i and r > rates[i - 1] + 1e-9:
            raise ConfigError(f"{where}: acceptance_rates[{i}] = {r} > acceptance_rates[{i - 1}] = {rates[i - 1]}: "
                              "per-position rates must not increase (vLLM's rule)")
