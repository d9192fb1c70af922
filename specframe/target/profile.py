"""The machine profile: measured target forward times T(n) for each dtype, thread count and weight layout this
machine can run, with their spread, and the settings ``auto`` picks from them.

A speculative step costs one target forward over n = 1 + (draft nodes) tokens, and what that costs relative to
one token, v(n) = T(n) / T(1), differs by machine far more than by model: with native bf16 (AVX-512 BF16 / AMX) a
bf16 forward over 8 tokens costs ~1.1-1.2x one token; on an AVX2-only CPU 2.9x (bf16) or 2.2x (fp32). So
specframe measures T(n) where it runs, for n in :data:`NS` at the contexts :data:`CONTEXTS`, for every candidate
(dtype x threads x pre-packed weights), once per machine fingerprint (CPU model, ISA flags, usable cores, torch
version), model and device, and caches it as JSON under ``$SPECFRAME_CACHE/machine/``. ``specframe tune`` builds
or shows it explicitly.

Measuring (:func:`measure_profile`): :data:`ROUNDS` interleaved rounds. Each round times every candidate once
(round-robin, the order rotated by one candidate per round; :data:`REPEATS` timed forwards per point, their median),
so a drift of the machine's speed during the measurement hits every candidate alike. The first round times every
point of :data:`NS` (the whole curve the router reads) after one warm-up forward per point; the later rounds time
only the points a choice is priced on (:data:`DECISIVE_NS`, n <= 16: a forward over 16 tokens commits 99.99 % of
what any longer one does at the reference acceptance), which cost about a tenth of a whole round on an AVX2 CPU, so
a slow machine still gets the rounds a spread needs (one whole round of six candidates took ~100 s on a 2-core AVX2
EPYC). A point's value T(n) is the median of the rounds that timed it, and its spread the distribution-free
confidence interval of that median (:func:`median_ci`). Both dtypes' models are kept loaded
at once when memory allows (else each dtype's candidates are interleaved among themselves: a ``session`` each),
and a model's plain and pre-packed layouts are the same weights with the linear modules swapped. :data:`BUDGET_S`
bounds the time spent timing: a candidate the first round could not reach is not measured, and rounds stop when
it is spent (a profile of one round has no spread). Costs and their ratios (:meth:`Measured.costs`,
:func:`cost_ratio`) are priced on the decisive points of every round alike.

Choosing (:meth:`MachineProfile.choose`): a candidate's cost per committed token is ``min_n T(n) / E(n)`` with
``E(n) = (1 - a^n) / (1 - a)`` the expected tokens committed by a forward over n tokens when each draft node is
accepted with a reference probability ``a`` (:data:`REF_ACCEPT`; Leviathan et al. 2022, eq. 1, with gamma = n - 1);
n = 1 is plain decoding, so a machine where verification never pays is judged by T(1). For plain decoding
(only ``none`` configured) the cost is T(1). Measured noise decides nothing (:func:`faster`): among the
candidates that no other beats outside noise, the first in a fixed order wins (:func:`preference`: for
speculation plain decoding's own choice first, then bf16 before other dtypes, more threads before fewer, plain
weights before pre-packed ones), and the reason says "within noise of" the fastest. Speculation runs on other
settings than plain decoding's only where its cost per token at the reference acceptance beats plain decoding's
best T(1), and the speculative cost on plain decoding's settings, outside noise. Explicit settings always win;
``auto`` threads never exceed the cores free of other processes' load (:mod:`specframe.target.machine`).

The cost curve v(n) of the chosen candidate is what the router uses to decide how many draft nodes pay
(:class:`specframe.target.cost.CostCurve`; :data:`~specframe.target.cost.NS` are the measured token counts); it
carries plain decoding's best T(1) as ``plain_t1_ms`` (:attr:`Settings.plain_t1_ms`).

CUDA targets (``cuda``, ``cuda:N``) have no candidates to choose among: dtype ``auto`` is bf16 where the GPU computes
it natively, else fp16 (:func:`specframe.target.models.resolve_dtype`). Their curve is measured once per GPU model
(name and compute capability, torch and CUDA versions), dtype and model by :func:`cuda_cost_curve` (T(n) at
:data:`CUDA_NS` over a :data:`CUDA_CONTEXT`-token cache, :data:`CUDA_REPEATS` synchronised forwards each: a second or
two) and cached beside the CPU profiles as ``machine/cuda-<key>.json``; the loader hands it to the target as
``TargetInfo.cost``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from .cost import NS, REF_ACCEPT, CostCurve, token_cost_ms
from .machine import LoadMonitor, choose_threads, fingerprint, fingerprint_key, usable_cores

log = logging.getLogger("specframe")

PROFILE_VERSION = 2  # 2: interleaved rounds, each point's rounds and spread kept (1: one median per point)
READABLE_VERSIONS = (1, 2)  # a version-1 file is read as one round (no spread) and measured again when measuring
CONTEXTS = (128, 512)  # KV-cache lengths measured
ROUNDS = 5  # interleaved rounds: every candidate timed once per round at every point
REPEATS = 1  # timed forwards per point and round (their median is the round's value)
BUDGET_S = 150.0  # stop timing after this long (what was measured is kept; see the module docstring)
DECISIVE_NS = tuple(n for n in NS if n <= 16)  # the points every round times (the first round: all of NS)
NOISE_FLOOR = 0.03  # a cost ratio within 3 % of 1 is within noise however tight its interval (drift the rounds
# cannot see: two measurements 10 minutes apart differed by 17-33 % per step on a quiet 2-core Xeon, issue 67)
CONFIDENCE = 0.95  # of the interval of a median (:func:`median_ci`), where the rounds allow it
MEMORY_SHARE = 0.5  # keep both dtypes' models loaded at once only while they fit in this share of free memory
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(frozen=True)
class Candidate:
    """One way to run the target: dtype name, torch threads, pre-packed linear weights."""

    dtype: str
    threads: int
    prepack: bool

    @property
    def label(self) -> str:
        short = {"bfloat16": "bf16", "float32": "fp32"}.get(self.dtype, self.dtype)  # (llama.cpp: "gguf")
        return f"{short}/{self.threads}t{'/packed' if self.prepack else ''}"


def preference(c: Candidate) -> tuple:
    """The tie-break among candidates within noise of each other (smaller first): bf16 before other dtypes (then by
    name), more threads before fewer, plain weights before pre-packed ones; the settings specframe ran before it had
    a profile come first. Stable: it reads no measurement."""
    return (c.dtype != "bfloat16", c.dtype, -c.threads, c.prepack)


def median_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A distribution-free confidence interval of the median of ``values``: the order statistics ``x(j)`` and
    ``x(k + 1 - j)`` of the ``k`` sorted values, with ``j`` the largest for which the binomial(k, 1/2) tails keep
    the coverage at least ``confidence``. Fewer than 6 values cannot reach 95 %: the interval is then their range
    (coverage ``1 - 2^(1 - k)``: 75 % for 3 values, 94 % for 5).

    Example: ``median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)``.

    Raises:
        ValueError: ``values`` is empty.
    """
    xs = sorted(values)
    k = len(xs)
    if not k:
        raise ValueError("no values")
    j, tail = 1, 0.0  # tail: P(Binom(k, 1/2) <= j - 1), the chance the median lies below x(j)
    while j < (k + 1) // 2:
        tail_next = tail + math.comb(k, j) / 2 ** k
        if 1 - 2 * tail_next < confidence:
            break
        j, tail = j + 1, tail_next
    return xs[j - 1], xs[k - j]


@dataclass
class Measured:
    """One candidate's measured forward times.

    ``t_ms``: context -> ``[T(n) for n in NS]``, ms, the median of the rounds. ``rounds``: context -> one such row
    per interleaved round (each the median of :data:`REPEATS` forwards); empty for a profile of one round (a
    version-1 file, a synthetic profile). ``session``: candidates of the same session were measured in the same
    interleaved rounds, so their rounds pair up (round r of each was measured within one pass over them).
    """

    candidate: Candidate
    t_ms: dict[int, list[float]]
    rounds: dict[int, list[list[float]]] = field(default_factory=dict)
    session: int = 0

    @classmethod
    def of_rounds(cls, candidate: Candidate, rounds: dict[int, list[list[float]]], session: int = 0) -> "Measured":
        """From per-round rows (context -> ``[row of round 1, row of round 2, ...]``, the same count per context;
        a row may stop short of :data:`NS`, as the later rounds' do at :data:`DECISIVE_NS`): ``t_ms`` is each
        point's median over the rounds that timed it."""
        t_ms = {c: [statistics.median(col) for col in _columns(rows)] for c, rows in rounds.items()}
        return cls(candidate, t_ms, {c: [list(r) for r in rows] for c, rows in rounds.items()}, session)

    @property
    def n_rounds(self) -> int:
        """Rounds measured (1 without per-round rows)."""
        return min((len(rows) for rows in self.rounds.values()), default=0) or 1

    def round_curves(self) -> list[dict[int, list[float]]]:
        """Each round's ``{context: row}``, or ``[t_ms]`` without per-round rows."""
        if not self.rounds:
            return [self.t_ms]
        return [{c: rows[r] for c, rows in self.rounds.items()} for r in range(self.n_rounds)]

    def costs(self, speculative: bool, accept: float = REF_ACCEPT) -> list[float]:
        """ms per committed token (:func:`token_cost_ms` on the :data:`DECISIVE_NS` points) of each round."""
        return [token_cost_ms(_decisive(curve), speculative, accept) for curve in self.round_curves()]

    def cost(self, speculative: bool, accept: float = REF_ACCEPT) -> float:
        """ms per committed token of the median row ``t_ms`` on the :data:`DECISIVE_NS` points (what candidates
        are ranked by)."""
        return token_cost_ms(_decisive(self.t_ms), speculative, accept)

    def spread(self) -> dict[int, list[list[float]]]:
        """Each point's confidence interval (:func:`median_ci` over its rounds): context -> ``[[lo per n],
        [hi per n]]``; without per-round rows the interval is the point itself."""
        if not self.rounds:
            return {c: [list(row), list(row)] for c, row in self.t_ms.items()}
        out = {}
        for c, rows in self.rounds.items():
            cis = [median_ci(col) for col in _columns(rows)]
            out[c] = [[lo for lo, _ in cis], [hi for _, hi in cis]]
        return out


def _columns(rows: Sequence[Sequence[float]]) -> list[list[float]]:
    """Each point's values over the rows that reach it (rows may stop short; the first is the longest)."""
    return [[row[i] for row in rows if len(row) > i] for i in range(max((len(r) for r in rows), default=0))]


def _decisive(curve: dict[int, Sequence[float]]) -> dict[int, Sequence[float]]:
    """``curve`` cut to the :data:`DECISIVE_NS` points."""
    return {c: row[:len(DECISIVE_NS)] for c, row in curve.items()}


def cost_ratio(a: Measured, b: Measured, a_speculative: bool, b_speculative: bool, accept: float = REF_ACCEPT,
               paired: bool = True) -> tuple[float, float, float]:
    """``(median, lo, hi)`` of ``a``'s cost per token over ``b``'s (:meth:`Measured.costs`, each speculative or
    plain as given), with its confidence interval. Candidates of one session of one profile are paired by round
    (the ratio of round r's costs, :func:`median_ci` of those ratios): what drifted between rounds cancels.
    Otherwise (other sessions; ``paired`` False: other profiles) each median's interval is taken apart: ``[lo_a /
    hi_b, hi_a / lo_b]``. One round each gives a point."""
    ca, cb = a.costs(a_speculative, accept), b.costs(b_speculative, accept)
    if paired and a.session == b.session and a.rounds and b.rounds:
        k = min(len(ca), len(cb))
        ratios = [x / y for x, y in zip(ca[:k], cb[:k])]
        lo, hi = median_ci(ratios)
        return statistics.median(ratios), lo, hi
    (la, ha), (lb, hb) = median_ci(ca), median_ci(cb)
    return statistics.median(ca) / statistics.median(cb), la / hb, ha / lb


def faster(a: Measured, b: Measured, a_speculative: bool = True, b_speculative: bool | None = None,
           accept: float = REF_ACCEPT, paired: bool = True) -> bool:
    """``a`` costs less per token than ``b`` outside noise: the upper end of the confidence interval of their cost
    ratio (:func:`cost_ratio`; ``paired`` False for measurements of two profiles) is below ``1 - NOISE_FLOOR``.
    ``b_speculative`` defaults to ``a_speculative``.

    Example: with one round each (no spread), costs 10.0 and 10.2 are within noise, 9.0 and 10.0 are not."""
    b_spec = a_speculative if b_speculative is None else b_speculative
    _, _, hi = cost_ratio(a, b, a_speculative, b_spec, accept, paired)
    return hi < 1 - NOISE_FLOOR


@dataclass
class Settings:
    """What the target runs with and why (part of every ``--json`` record and bench report).

    ``plain`` and ``plain_t1_ms``: plain decoding's own choice under the same explicit settings and free cores (its
    label, and its T(1) in ms, mean over the measured contexts): the reference speculation must beat (the router
    reads it from ``CostCurve.plain_t1_ms``); None without a measured profile."""

    dtype: str
    threads: int
    prepack: bool
    dtype_reason: str = ""
    threads_reason: str = ""
    prepack_reason: str = ""
    profile: str | None = None  # the profile file the choice came from
    plain: str | None = None
    plain_t1_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_independent(profile: "MachineProfile | None", candidate: Candidate) -> dict[int, list[float]] | None:
    """The measured T(n) of ``candidate``'s dtype and layout at the most threads measured: the same curve whatever
    the load was when the target was loaded (see :class:`CostCurve`), or None."""
    if profile is None:
        return None
    same = [m for m in profile.measured if m.candidate.dtype == candidate.dtype
            and m.candidate.prepack == candidate.prepack]
    return max(same, key=lambda m: m.candidate.threads).t_ms if same else None


def t1_ms(m: Measured) -> float:
    """T(1) of ``m`` in ms, mean over its contexts."""
    return token_cost_ms(m.t_ms, False)


def _r(x: float) -> float:
    return round(x, 3)


class MachineProfile:
    """Measured T(n) per candidate for one machine fingerprint, model and device (see the module docstring).

    ``version``: the file format it was read from (:data:`PROFILE_VERSION` for one measured now); ``rounds``:
    the interleaved rounds planned (each candidate's own count is :attr:`Measured.n_rounds`)."""

    def __init__(self, key: str, model: str, device: str, fp: dict, measured: list[Measured], others_load: float,
                 seconds: float, path: Path | None = None, version: int = PROFILE_VERSION, rounds: int = 1) -> None:
        self.key, self.model, self.device, self.fingerprint = key, model, device, fp
        self.measured, self.others_load, self.seconds, self.path = measured, others_load, seconds, path
        self.version, self.rounds = version, rounds

    # --- storage -------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The profile as JSON (format :data:`PROFILE_VERSION`). Per candidate: ``t_ms`` (context -> the medians
        per n), and where it has rounds ``t_rounds`` (context -> one row per round), ``t_ci`` (context -> ``[lo
        row, hi row]``, each point's :func:`median_ci`) and ``session``; times in ms, rounded to 1 us."""
        cands = []
        for m in self.measured:
            c: dict[str, Any] = {**asdict(m.candidate), "label": m.candidate.label,
                                 "t_ms": {str(k): [_r(t) for t in v] for k, v in m.t_ms.items()}}
            if m.rounds:
                c["session"] = m.session
                c["t_rounds"] = {str(k): [[_r(t) for t in row] for row in rows] for k, rows in m.rounds.items()}
                c["t_ci"] = {str(k): [[_r(t) for t in row] for row in lohi] for k, lohi in m.spread().items()}
            cands.append(c)
        return {
            "version": PROFILE_VERSION, "key": self.key, "model": self.model, "device": self.device,
            "fingerprint": self.fingerprint, "others_load": self.others_load, "seconds": round(self.seconds, 1),
            "ns": list(NS), "rounds": self.rounds, "repeats": REPEATS, "confidence": CONFIDENCE, "candidates": cands,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any], path: Path | None = None) -> "MachineProfile":
        """Read :meth:`to_json`'s output, or a version-1 file (one median per point, read as one round).

        Raises:
            ValueError: another version, other token counts than :data:`NS`, no candidates, rounds whose counts
                differ between contexts, or a round's row shorter than :data:`DECISIVE_NS` or longer than :data:`NS`.
            KeyError, TypeError, AttributeError: a document of another shape.
        """
        version = doc.get("version")
        if version not in READABLE_VERSIONS or list(doc.get("ns", [])) != list(NS):
            raise ValueError("profile version differs")
        measured = []
        for c in doc["candidates"]:
            cand = Candidate(c["dtype"], int(c["threads"]), bool(c["prepack"]))
            t_ms = {int(k): [float(x) for x in v] for k, v in c["t_ms"].items()}
            rounds = {int(k): [[float(x) for x in row] for row in rows] for k, rows in c.get("t_rounds", {}).items()}
            if len({len(rows) for rows in rounds.values()}) > 1:
                raise ValueError(f"{cand.label}: rounds differ between contexts")
            if any(not len(DECISIVE_NS) <= len(row) <= len(NS) for rows in rounds.values() for row in rows):
                raise ValueError(f"{cand.label}: a round times fewer points than {DECISIVE_NS} or more than {NS}")
            measured.append(Measured(cand, t_ms, rounds, int(c.get("session", 0))))
        if not measured:
            raise ValueError("no candidates")
        return cls(doc["key"], doc["model"], doc["device"], doc["fingerprint"], measured,
                   float(doc.get("others_load", 0.0)), float(doc.get("seconds", 0.0)), path, int(version),
                   int(doc.get("rounds", 1)))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        os.replace(tmp, path)  # never a half-written profile
        self.path = path

    # --- choice --------------------------------------------------------------------------------------------
    def find(self, c: Candidate) -> Measured | None:
        return next((m for m in self.measured if m.candidate == c), None)

    def choose(self, dtype: str = "auto", threads: int | str = "auto", prepack: bool | str = "auto",
               max_threads: int | None = None, speculative: bool = True,
               runnable: Callable[[Candidate], bool] | None = None) -> tuple[Candidate, Measured | None, str]:
        """The settings to run with, among the measured candidates that match the explicit settings (``auto`` =
        any), for ``auto`` threads use at most ``max_threads``, and pass ``runnable`` (None: all).

        Plain decoding (``speculative`` False) is judged by T(1), speculation by :func:`token_cost_ms` at
        :data:`REF_ACCEPT`. Noise decides nothing: the choice is the first, in the tie-break order
        (:func:`preference`; for speculation plain decoding's own choice P first), of the candidates that no other
        beats outside noise (:func:`faster`); so a candidate is taken over the one first in that order only where
        it (or another) beats that one outside noise, and the reason says when the choice is "within noise of"
        the fastest. Speculation runs on settings other than P only where they beat both P's T(1) and P's own
        speculative cost outside noise (the first such candidate that nothing beats); else on P, and the reason
        says why.

        Returns:
            ``(candidate, its measurement or None, reason)``; with nothing measured that matches, the explicit
            settings themselves (auto parts filled with bfloat16 / ``max_threads`` / no packing) and no measurement.
        """
        pool = self._pool(dtype, threads, prepack, max_threads, runnable)
        if not pool:
            c = Candidate("bfloat16" if dtype == "auto" else dtype,
                          int(threads) if threads != "auto" else max(1, max_threads or 1),
                          prepack is True)
            return c, None, "not measured on this machine: as given"
        plain, plain_why, _ = _pick(pool, False)
        if not speculative:
            return plain.candidate, plain, plain_why
        spec, why, free = _pick(pool, True, first=plain)
        if spec is plain:
            return spec.candidate, spec, why
        # plain decoding's settings are beaten outside noise: the first candidate nothing beats that pays against them
        p_t1, p_spec = t1_ms(plain), plain.cost(True)
        pays_t1 = [m for m in free if faster(m, plain, True, False)]
        pays = [m for m in pays_t1 if faster(m, plain, True, True)]
        if not pays:
            return plain.candidate, plain, (
                f"plain decoding's settings, {plain.candidate.label}: speculation's fastest, {spec.candidate.label} "
                f"({spec.cost(True):.1f} ms per token at the reference acceptance), "
                + (f"does not beat plain decoding's best T(1) ({p_t1:.1f} ms) outside noise" if not pays_t1 else
                   f"is within noise of speculation on them ({p_spec:.1f})"))
        best = pays[0]
        if best is not spec:
            why = (f"{best.candidate.label}: the first within noise of the fastest measured, {spec.candidate.label}, "
                   f"to beat plain decoding's settings outside noise ({best.cost(True):.1f} ms per token at the "
                   "reference acceptance)")
        return best.candidate, best, (f"{why}; beats plain decoding's best, {plain.candidate.label} (T(1) "
                                      f"{p_t1:.1f} ms, {p_spec:.1f} speculative), outside noise")

    def _pool(self, dtype: str, threads: int | str, prepack: bool | str, max_threads: int | None,
              runnable: Callable[[Candidate], bool] | None) -> list[Measured]:
        """The measured candidates :meth:`choose` picks among."""
        def fits(m: Measured) -> bool:
            return ((dtype == "auto" or m.candidate.dtype == dtype)
                    and (prepack == "auto" or m.candidate.prepack == bool(prepack))
                    and (runnable is None or runnable(m.candidate)))

        pool = [m for m in self.measured if fits(m)
                and (m.candidate.threads == threads if threads != "auto"
                     else max_threads is None or m.candidate.threads <= max_threads)]
        if not pool and threads == "auto" and self.measured:  # even the fewest measured threads exceed the free cores
            fewest = min(m.candidate.threads for m in self.measured)
            pool = [m for m in self.measured if m.candidate.threads == fewest and fits(m)]
        return pool

    def plain_reference(self, dtype: str = "auto", threads: int | str = "auto", prepack: bool | str = "auto",
                        max_threads: int | None = None,
                        runnable: Callable[[Candidate], bool] | None = None) -> tuple[str, float] | None:
        """Plain decoding's choice under these settings (:meth:`choose` with ``speculative`` False): ``(label, T(1)
        ms, mean over contexts)``, or None when nothing measured matches."""
        c, m, _ = self.choose(dtype, threads, prepack, max_threads, False, runnable)
        return (c.label, round(t1_ms(m), 3)) if m is not None else None


def _pick(pool: list[Measured], speculative: bool,
          first: Measured | None = None) -> tuple[Measured, str, list[Measured]]:
    """The choice among ``pool`` by cost per token (speculative or plain): the first in the tie-break order
    (``first``, then :func:`preference`) of the candidates no other beats outside noise (:func:`faster`); so the
    default is left only for one that beats it outside noise, and never for one that another beats.

    Returns:
        ``(choice, reason, the candidates no other beats, in the tie-break order)``.
    """
    cost = {id(m): m.cost(speculative) for m in pool}
    order = sorted(pool, key=lambda m: (m is not first, preference(m.candidate)))
    fastest = min(order, key=lambda m: cost[id(m)])  # (equal costs: the earlier in the tie-break)
    free = [m for m in order if not any(faster(o, m, speculative) for o in pool if o is not m)] or [fastest]
    chosen = free[0]
    what = "ms per token at the reference acceptance" if speculative else "ms per token, plain decoding"
    ranked = sorted(pool, key=lambda m: cost[id(m)])[:3]
    listed = ", ".join(f"{m.candidate.label} {cost[id(m)]:.1f}" for m in ranked)
    if chosen is fastest:
        why = f"fastest measured ({what}: {listed})"
        others = [m.candidate.label for m in free if m is not chosen]
        return chosen, why + (f"; within noise of it: {', '.join(others)}" if others else ""), free
    med, lo, hi = cost_ratio(fastest, chosen, speculative, speculative)
    rule = ("plain decoding's settings first, then " if first is not None else "") + \
        "bf16, more threads, plain weights first"
    return chosen, (f"{chosen.candidate.label}: within noise of the fastest measured, {fastest.candidate.label} "
                    f"({what}: {listed}; {fastest.candidate.label} / {chosen.candidate.label} {med:.2f}, interval "
                    f"{lo:.2f}-{hi:.2f}); kept by the tie-break ({rule})"), free


def profile_path(key: str) -> Path:
    from .models import cache_root

    return cache_root() / "machine" / f"{key}.json"


def load_profile(key: str) -> MachineProfile | None:
    path = profile_path(key)
    try:
        return MachineProfile.from_json(json.loads(path.read_text()), path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def candidates(device: str, cores: int) -> list[Candidate]:
    """What a CPU profile measures: bf16 and fp32, plain and pre-packed weights where oneDNN has them, threads
    1, cores / 2 and cores (at most three counts)."""
    from .packed import packing_available

    threads = sorted({1, max(1, cores // 2), cores})
    out = []
    for dtype in DTYPES:
        for packed in (False, True):
            if packed and not packing_available(DTYPES[dtype], device):
                continue
            for t in threads:
                out.append(Candidate(dtype, t, packed))
    return out


@torch.inference_mode()
def time_forwards(model: Any, vocab: int, contexts: Iterable[int] = CONTEXTS, ns: Iterable[int] = NS,
                  repeats: int = 3, tick: Callable[[], None] = lambda: None) -> dict[int, list[float]]:
    """Median ms of one forward over n new tokens after a ``context``-token KV cache, for each context and n
    (``repeats`` timed forwards after one warm-up; one candidate alone: :func:`measure_profile` interleaves)."""
    bench = _Bench(model, vocab, contexts, ns)
    out = {}
    for ctx in bench.contexts:
        out[ctx] = bench.row(ctx, repeats, warm_up=True)
        tick()
    return out


class _Bench:
    """One loaded model being measured: a prefilled KV cache per context (kept across rounds: each forward is
    rolled back) and, when ``layouts``, its plain and pre-packed linear modules to swap between (the same weights;
    the packed copy made once)."""

    def __init__(self, model: Any, vocab: int, contexts: Iterable[int], ns: Iterable[int],
                 layouts: bool = False) -> None:
        from .kv_cache import new_cache

        self.model, self.ns = model, list(ns)
        device = next(model.parameters()).device
        gen = torch.Generator().manual_seed(0)
        max_pos = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self.caches: dict[int, tuple[Any, Any]] = {}
        self.swaps: list[tuple[Any, str, Any, Any]] = []  # (parent, name, nn.Linear, PackedLinear)
        with torch.inference_mode():
            for ctx in contexts:
                ctx = min(ctx, max_pos - max(self.ns) - 1)
                ids = torch.randint(0, vocab, (1, ctx + max(self.ns)), generator=gen).to(device)
                cache = new_cache(model.config)
                model(input_ids=ids[:, :ctx], cache=cache, use_cache=True, logits_to_keep=1)
                self.caches[ctx] = (cache, ids)
        if layouts:
            from torch import nn

            from .packed import PackedLinear

            for parent in list(model.modules()):
                for name, child in list(parent.named_children()):
                    if type(child) is nn.Linear:
                        self.swaps.append((parent, name, child, PackedLinear(child)))

    @property
    def contexts(self) -> list[int]:
        return list(self.caches)

    def use(self, packed: bool) -> None:
        """Run with the pre-packed (True) or the plain linear modules."""
        for parent, name, plain, pre in self.swaps:
            setattr(parent, name, pre if packed else plain)

    @torch.inference_mode()
    def row(self, ctx: int, repeats: int, warm_up: bool, points: int | None = None) -> list[float]:
        """``[T(n) for n in ns[:points]]`` (None: all) after ``ctx`` cached tokens: the median ms of ``repeats``
        forwards each (after one untimed forward when ``warm_up``)."""
        from .kv_cache import rollback

        cache, ids = self.caches[ctx]
        row = []
        for n in self.ns[:points]:
            block = ids[:, ctx: ctx + n]
            times = []
            for r in range(repeats + int(warm_up)):
                t0 = time.perf_counter()
                self.model(input_ids=block, cache=cache, use_cache=True)
                if r or not warm_up:
                    times.append(time.perf_counter() - t0)
                rollback(cache, ctx)
            row.append(statistics.median(times) * 1e3)
        return row


def free_memory() -> int | None:
    """Bytes of memory available to new allocations (``MemAvailable`` of ``/proc/meminfo``; psutil elsewhere),
    or None where neither says."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 (no psutil, or a platform it cannot read)
        return None


def interleave(slots: Sequence[tuple[Candidate, Callable[[], None], Callable[[int, bool], list[float]]]],
               contexts: Sequence[int], rounds: int, budget_s: float, spent_s: float = 0.0,
               tick: Callable[[int], None] = lambda k: None) -> tuple[dict[Candidate, dict[int, list[list[float]]]], float]:
    """Time every slot's candidate in ``rounds`` interleaved rounds (the order rotated by one slot per round; the
    first round warms each point up).

    Args:
        slots: ``(candidate, select, row)``: ``select()`` makes the candidate the one that runs (threads, layout);
            ``row(context, first)`` times one row of ms: in the first round (``first``) warmed up and over all of
            :data:`NS`, later over :data:`DECISIVE_NS`.
        contexts: the contexts each round times.
        budget_s: seconds of timing allowed in all (``spent_s`` of it already spent): a slot the first round
            reaches after that is not measured; later rounds stop there.
        tick: called with 1 after each (candidate, context) row.

    Returns:
        ``({candidate: {context: [row per round]}}, seconds spent timing, spent_s included)``.
    """
    done: dict[Candidate, dict[int, list[list[float]]]] = {}
    alive = list(slots)
    for r in range(rounds):
        k = len(alive)
        order = [alive[(i + r) % k] for i in range(k)] if k else []
        for cand, select, row in order:
            if spent_s > budget_s:
                if r == 0:
                    log.warning("machine profile: its %.0f s time limit is spent; %s not measured", budget_s, cand.label)
                    alive = [s for s in alive if s[0] != cand]
                    continue
                log.info("machine profile: its %.0f s time limit is spent after %d of %d rounds", budget_s, r, rounds)
                return done, spent_s
            select()
            t0 = time.perf_counter()
            rows = done.setdefault(cand, {})
            for ctx in contexts:
                rows.setdefault(ctx, []).append(row(ctx, r == 0))
                tick(1)
            spent_s += time.perf_counter() - t0
    return done, spent_s


def measure_profile(directory: Path, model_name: str, device: str, progress: Any = None,
                    budget_s: float = BUDGET_S, rounds: int = ROUNDS,
                    contexts: Sequence[int] = CONTEXTS) -> MachineProfile:
    """Measure every candidate (see :func:`candidates`) for the model in ``directory`` in ``rounds`` interleaved
    rounds (module docstring) and return the profile (not saved).

    ``progress``: a ``rich.progress.Progress`` to show a bar on (None: no bar). ``budget_s``: seconds of timing
    allowed (model loading and packing not counted). Both dtypes' models are loaded at once where the second fits in
    :data:`MEMORY_SHARE` of the free memory (each pre-packed layout adds a copy of its linear weights); else each
    dtype is measured in a session of its own.
    """
    from .models import load_model

    fp = fingerprint()
    key = fingerprint_key(model_name, device)
    cores, _ = usable_cores()
    monitor = LoadMonitor()
    monitor.sample()
    todo = candidates(device, cores)
    task = progress.add_task("measuring this machine", total=len(todo) * len(contexts) * rounds) if progress else None
    tick = (lambda k: progress.advance(task, k)) if progress else (lambda k: None)
    start, spent, measured = time.perf_counter(), 0.0, []
    old_threads = torch.get_num_threads()
    dtypes = [d for d in DTYPES if any(c.dtype == d for c in todo)]
    loaded: dict[str, _Bench] = {}
    session = 0

    def run_session() -> None:
        nonlocal spent, session
        slots = []
        for c in todo:
            bench = loaded.get(c.dtype)
            if bench is None:
                continue

            def select(c: Candidate = c, bench: _Bench = bench) -> None:
                torch.set_num_threads(c.threads)
                bench.use(c.prepack)

            slots.append((c, select, lambda ctx, first, bench=bench: bench.row(
                ctx, REPEATS, first, None if first else len(DECISIVE_NS))))
        ctxs = next(iter(loaded.values())).contexts
        got, spent = interleave(slots, ctxs, rounds, budget_s, spent, tick)
        measured.extend(Measured.of_rounds(c, got[c], session) for c, _, _ in slots if c in got)
        loaded.clear()
        session += 1

    try:
        per_param = 0
        for dtype in dtypes:
            packs = any(c.dtype == dtype and c.prepack for c in todo)
            if loaded and per_param:
                need = per_param * torch.finfo(DTYPES[dtype]).bits // 8 * (2 if packs else 1)
                free = free_memory()
                if free is None or need > MEMORY_SHARE * free:
                    run_session()
            model, _ = load_model(directory, DTYPES[dtype], device, tokenizer=False)
            per_param = per_param or sum(p.numel() for p in model.parameters())
            vocab = int(model.get_output_embeddings().weight.shape[0])
            loaded[dtype] = _Bench(model, vocab, contexts, NS, layouts=packs)
        if loaded:
            run_session()
    finally:
        torch.set_num_threads(old_threads)
    if progress:
        progress.update(task, completed=len(todo) * len(contexts) * rounds)  # (what the time limit left out)
    others = monitor.sample().others
    return MachineProfile(key, model_name, device, fp, measured, others, time.perf_counter() - start, rounds=rounds)


def get_profile(directory: Path, model_name: str, device: str, progress: Any = None,
                refresh: bool = False) -> MachineProfile:
    """The cached profile for this machine, model and device, measured (and cached) when missing, unreadable,
    ``refresh`` is set, or, when the machine is quiet now, the cached one was measured while other processes kept
    a core busy or is of an older format (version 1: no rounds, no spread)."""
    key = fingerprint_key(model_name, device)
    prof = None if refresh else load_profile(key)
    if prof is not None and prof.others_load <= 0.3 and prof.version == PROFILE_VERSION:
        return prof
    if prof is not None:  # provisional (taken under load) or old: measure again if the machine is quiet now
        if LoadMonitor().sample().others > 0.3:
            return prof
    prof = measure_profile(directory, model_name, device, progress)
    if not prof.measured:  # nothing fitted the time limit: nothing to cache (choose() then returns the defaults)
        return prof
    if prof.others_load > 0.3:
        log.warning("machine profile measured while other processes used %.1f cores: kept as provisional, measured "
                    "again on a later start when the machine is quiet", prof.others_load)
    try:
        prof.save(profile_path(key))
    except OSError as exc:  # a cache that cannot be written costs a measurement next time, not this run
        log.warning("machine profile not saved to %s (%s): this run uses it; the next one measures again",
                    profile_path(key), exc.strerror or type(exc).__name__)
    return prof


def measured_threads(profile: MachineProfile | None, candidate: Candidate) -> list[int]:
    """Thread counts measured for ``candidate``'s dtype and layout (what a thread change may switch between)."""
    if profile is None:
        return []
    return sorted({m.candidate.threads for m in profile.measured
                   if m.candidate.dtype == candidate.dtype and m.candidate.prepack == candidate.prepack})


@dataclass
class ThreadGovernor:
    """Keeps torch's thread count within the cores other processes leave free, during a run.

    ``check()`` (called before each request and after every decoding step; cheap: a clock read, and one
    ``/proc/stat`` read at most every ``every_s`` seconds) re-measures others' load over the time since the last
    check, and when the best thread count changes sets it
    (``torch.set_num_threads``, or ``apply`` for an engine with threads of its own) and points ``curve`` at that thread
    count's measured v(n).
    """

    settings: Settings
    auto: bool  # threads were chosen automatically (an explicit --threads is never changed)
    cores: int
    profile: MachineProfile | None = None
    curve: CostCurve = field(default_factory=CostCurve)
    every_s: float = 1.0
    monitor: LoadMonitor = field(default_factory=LoadMonitor)
    last_check: float = 0.0
    last_load: float = 0.0
    warned: bool = False
    _lock: Any = field(default_factory=threading.Lock, repr=False, compare=False)  # requests on several threads
    apply: Callable[[int], None] | None = None  # sets the engine's thread count (None: torch.set_num_threads)

    def check(self, force: bool = False) -> float:
        """Others' load in cores (the latest sample); adjusts threads when ``auto``. Called from several threads at
        once (one Specframe serving them), one check runs and the others return the latest sample."""
        if not self._lock.acquire(blocking=False):
            return self.last_load
        try:
            return self._check(force)
        finally:
            self._lock.release()

    def _check(self, force: bool) -> float:
        now = time.monotonic()
        if not force and now - self.last_check < self.every_s:
            return self.last_load
        self.last_check = now
        self.last_load = self.monitor.sample(settle_s=0.1).others
        s = self.settings
        if self.auto:
            c = Candidate(s.dtype, s.threads, s.prepack)
            want = choose_threads(self.cores, self.last_load, measured_threads(self.profile, c) or None)
            if want != s.threads:
                log.warning("other processes use %.1f of %d cores: %s from %d to %d torch threads",
                            self.last_load, self.cores, "down" if want < s.threads else "up", s.threads, want)
                (self.apply or torch.set_num_threads)(want)
                s.threads = want
                s.threads_reason = f"{self.cores} usable cores, others using {self.last_load:.1f} (re-checked during the run)"
                m = self.profile.find(Candidate(s.dtype, want, s.prepack)) if self.profile else None
                if m is not None:
                    self.curve.set(m.t_ms)
        elif self.last_load + s.threads > self.cores + 0.3 and not self.warned:
            self.warned = True
            log.warning("other processes use %.1f of %d cores and threads is set to %d: the target may run several times "
                        "slower; use threads auto (or fewer threads)", self.last_load, self.cores, s.threads)
        return self.last_load


def runnable_on(device: str) -> Callable[[Candidate], bool]:
    """Whether this machine can run a candidate on ``device`` (for :meth:`MachineProfile.choose`'s ``runnable``):
    pre-packed weights only where oneDNN packs that dtype here. A profile measured here holds nothing else; one
    forced from another machine may."""
    from .packed import packing_available

    def runnable(c: Candidate) -> bool:
        return not c.prepack or (c.dtype in DTYPES and packing_available(DTYPES[c.dtype], device))

    return runnable


def resolve_settings(directory: Path, model_name: str, device: str, dtype: str = "auto", threads: int | str = "auto",
                     prepack: bool | str = "auto", speculative: bool = True, progress: Any = None,
                     measure: bool | None = None) -> tuple[Settings, MachineProfile | None, float]:
    """Settle dtype, threads and weight layout for a target on this machine.

    The machine profile is measured (once, then cached) when ``measure`` is True, or when it is None and ``dtype``
    is ``auto``; otherwise a cached profile is used when there is one. Explicit settings always win.

    With a profile, ``settings.plain`` / ``plain_t1_ms`` are plain decoding's choice under the same settings and
    free cores (:meth:`MachineProfile.plain_reference`). Candidates this machine cannot run (pre-packed weights
    where oneDNN has no packing for their dtype: a profile file from another machine) are never chosen.

    Returns:
        ``(settings, profile or None, others' load in cores at the time)``.

    Raises:
        ConfigError: ``prepack`` asked for where oneDNN pre-packing is not available.
    """
    from ..errors import ConfigError
    from .machine import LoadMonitor
    from .packed import packing_available

    if prepack is True and dtype != "auto" and (dtype not in DTYPES or not packing_available(DTYPES[dtype], device)):
        raise ConfigError(f"prepack: on needs oneDNN pre-packing, not available here for {dtype} on {device}: "
                          "use prepack: auto or off")
    if device != "cpu":  # (a GPU: no thread or layout choice; its cost curve is measured by cuda_cost_curve)
        why = "as given"
        if dtype == "auto":
            from .models import resolve_dtype

            dtype = "bfloat16" if resolve_dtype("auto", device) == torch.bfloat16 else "float16"
            why = ("native bf16 on this GPU" if dtype == "bfloat16" else
                   "this GPU has no native bf16 (compute capability below 8.0): fp16")
        return Settings(dtype, torch.get_num_threads(), False, why, "torch default", "CPU only"), None, 0.0
    cores, cores_why = usable_cores()
    others = LoadMonitor().sample(settle_s=0.2).others
    fit = choose_threads(cores, others)
    load_why = f"{cores_why}; others using {others:.1f}"
    if measure or (measure is None and dtype == "auto"):
        profile = get_profile(directory, model_name, device, progress)
    else:
        profile = load_profile(fingerprint_key(model_name, device))
    if profile is not None:
        runnable = runnable_on(device)  # (a profile from another machine, forced: lab/data/machine-profiles)
        cand, m, reason = profile.choose(dtype, threads, prepack, fit, speculative, runnable)
        if prepack is True and not cand.prepack:
            cand = Candidate(cand.dtype, cand.threads, True)
        plain = profile.plain_reference(dtype, threads, prepack, fit, runnable)
        s = Settings(cand.dtype, cand.threads, cand.prepack,
                     "as given" if dtype != "auto" else reason,
                     "as given" if threads != "auto" else f"{load_why}; {reason if dtype != 'auto' else 'see dtype'}",
                     "as given" if prepack != "auto" else ("see dtype" if dtype == "auto" else reason),
                     str(profile.path) if profile.path else None,
                     *(plain or (None, None)))
        return s, profile, others
    if dtype == "auto":  # unreachable unless measuring failed: the old rule
        from .models import resolve_dtype

        dtype = "bfloat16" if resolve_dtype("auto", device) == torch.bfloat16 else "float32"
    t = int(threads) if threads != "auto" else fit
    return Settings(dtype, t, prepack is True, "as given", "as given" if threads != "auto" else load_why,
                    "as given" if prepack != "auto" else "no machine profile (run `specframe tune`)"), None, others


# --- CUDA targets: one measured T(n) curve per GPU model, dtype and model -----------------------------------------
CUDA_NS = (1, 2, 4, 8, 16, 32, 64)  # tokens per forward a CUDA curve times (the router interpolates between them)
CUDA_CONTEXT = 512  # KV-cache length it times them at (fewer where the model's context is shorter)
CUDA_REPEATS = 5  # timed forwards per point (their median), after one warm-up forward
CUDA_CURVE_VERSION = 1


def gpu_fingerprint(device: str | torch.device) -> dict[str, Any]:
    """What decides the speed of a forward on the CUDA GPU ``device``: its name, compute capability, the torch and
    CUDA versions. Not its index: two GPUs of one model share a curve.

    Raises:
        RuntimeError: what torch raises for a device it cannot see.
    """
    dev = torch.device(device)
    return {"gpu": torch.cuda.get_device_name(dev), "capability": list(torch.cuda.get_device_capability(dev)),
            "torch": torch.__version__, "cuda": torch.version.cuda}


def cuda_curve_key(model_name: str, dtype: str, device: str | torch.device) -> str:
    """The cache key of a CUDA curve: ``cuda-`` and a short hash of :func:`gpu_fingerprint`, the model's identity
    (its name, as CPU profiles key it) and the dtype name."""
    import hashlib

    blob = json.dumps([gpu_fingerprint(device), str(model_name), str(dtype)], sort_keys=True)
    return "cuda-" + hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_cuda_curve(key: str) -> dict[str, Any] | None:
    """The cached CUDA curve document of ``key`` (:func:`measure_cuda_curve`'s), or None when missing, unreadable
    or of another format."""
    try:
        doc = json.loads(profile_path(key).read_text())
        if doc.get("version") != CUDA_CURVE_VERSION or doc.get("key") != key:
            return None
        ns, t_ms = [int(n) for n in doc["ns"]], [float(t) for t in doc["t_ms"]]
        if not t_ms or len(ns) != len(t_ms) or ns[0] != 1 or ns != sorted(set(ns)) or min(t_ms) <= 0:
            return None
        return {**doc, "ns": ns, "t_ms": t_ms, "context": int(doc["context"])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def measure_cuda_curve(target: Any, key: str, model_name: str, dtype: str, ns: Sequence[int] = CUDA_NS,
                       context: int = CUDA_CONTEXT, repeats: int = CUDA_REPEATS) -> dict[str, Any]:
    """Time ``target``'s forwards (on its CUDA device) over n of ``ns`` new tokens after a ``context``-token cache,
    synchronised (:func:`specframe.target.cost.time_points`), on seeded random token ids; the context is cut to
    what the model's positions allow. About ``len(ns) * (repeats + 1)`` forwards: a second or two.

    Returns:
        the curve's JSON document: ``version``, ``key``, ``model``, ``dtype``, ``gpu`` (:func:`gpu_fingerprint`),
        ``context``, ``ns``, ``repeats``, ``t_ms`` (median ms per n), ``seconds`` (the measurement's wall time).

    Raises:
        RuntimeError: a forward failed (out of GPU memory among them).
    """
    from .cost import time_points

    start = time.perf_counter()
    ns = [int(n) for n in ns]
    context = max(1, min(int(context), int(getattr(target, "max_context", context + max(ns))) - max(ns)))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, int(target.vocab_size), (context + max(ns),), generator=gen).tolist()
    t_ms = time_points(target, ids, context, ns, repeats)
    return {"version": CUDA_CURVE_VERSION, "key": key, "model": model_name, "dtype": dtype,
            "gpu": gpu_fingerprint(target.device), "context": context, "ns": ns, "repeats": repeats,
            "t_ms": [_r(t) for t in t_ms], "seconds": round(time.perf_counter() - start, 2)}


def cuda_cost_curve(target: Any, model_name: str, dtype: str, measure: bool | None = None, refresh: bool = False,
                    log_line: Callable[[str], None] = lambda s: None) -> CostCurve | None:
    """The cost curve v(n) of a CUDA target, for the router (``TargetInfo.cost``): the cached curve of this GPU model,
    dtype and model (:func:`cuda_curve_key`, under ``$SPECFRAME_CACHE/machine/`` beside the CPU profiles), measured
    (:func:`measure_cuda_curve`) and cached when missing or ``refresh`` is set, unless ``measure`` is False (then
    only a cached one). A CUDA target has no thread or layout choice, so where a CPU profile measures candidates
    this measures the one way the target runs.

    Returns:
        the curve (``plain_t1_ms`` None: its own T(1) is plain decoding's), or None when none is cached and
        ``measure`` is False, or measuring failed (logged; routers then use their configured slope).
    """
    key = cuda_curve_key(model_name, dtype, target.device)
    doc = None if refresh else load_cuda_curve(key)
    if doc is None and measure is not False:
        path = profile_path(key)
        log_line(f"measuring target forward times T(n) on {torch.cuda.get_device_name(target.device)} ({dtype}, "
                 f"once; cached in {path})")
        try:
            doc = measure_cuda_curve(target, key, model_name, dtype)
        except RuntimeError as exc:  # (out of GPU memory at n = 64 among them): run on without a curve
            log.warning("CUDA cost curve not measured (%s: %s): routers use their configured slope",
                        type(exc).__name__, str(exc).splitlines()[0][:160] if str(exc) else "")
            return None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc, indent=1))
            os.replace(tmp, path)  # never a half-written curve
        except OSError as exc:  # a cache that cannot be written costs a measurement next time, not this run
            log.warning("CUDA cost curve not saved to %s (%s): this run uses it; the next one measures again",
                        path, exc.strerror or type(exc).__name__)
    if doc is None:
        return None
    return CostCurve({doc["context"]: doc["t_ms"]}, ns=doc["ns"])
