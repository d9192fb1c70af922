"""The machine profile: measured target forward times T(n) for each dtype, thread count and weight layout this
machine can run, and the settings ``auto`` picks from them.

A speculative step costs one target forward over n = 1 + (draft nodes) tokens, and what that costs relative to
one token, v(n) = T(n) / T(1), differs by machine far more than by model: with native bf16 (AVX-512 BF16 / AMX) a
bf16 forward over 8 tokens costs ~1.1-1.2x one token; on an AVX2-only CPU 2.9x (bf16) or 2.2x (fp32). So
specframe measures T(n) where it runs, for n in :data:`NS` at the contexts :data:`CONTEXTS`, for every candidate
(dtype x threads x pre-packed weights), once per machine fingerprint (CPU model, ISA flags, usable cores, torch
version), model and device, and caches it as JSON under ``$SPECFRAME_CACHE/machine/``. Building it takes well
under a minute for a 135M model (:data:`BUDGET_S` bounds it); ``specframe tune`` builds or shows it explicitly.

Choosing (:meth:`MachineProfile.choose`): a candidate's cost per committed token is ``min_n T(n) / E(n)`` with
``E(n) = (1 - a^n) / (1 - a)`` the expected tokens committed by a forward over n tokens when each draft node is
accepted with a reference probability ``a`` (:data:`REF_ACCEPT`; Leviathan et al. 2022, eq. 1, with gamma = n - 1);
n = 1 is plain decoding, so a machine where verification never pays is judged by T(1). For plain decoding
(only ``none`` configured) the cost is T(1). Explicit settings always win; ``auto`` threads never exceed the
cores free of other processes' load (:mod:`specframe.target.machine`).

The cost curve v(n) of the chosen candidate is what the router uses to decide how many draft nodes pay
(:class:`specframe.target.cost.CostCurve`; :data:`~specframe.target.cost.NS` are the measured token counts).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from .cost import NS, REF_ACCEPT, CostCurve, token_cost_ms
from .machine import LoadMonitor, choose_threads, fingerprint, fingerprint_key, usable_cores

log = logging.getLogger("specframe")

PROFILE_VERSION = 1
CONTEXTS = (128, 512)  # KV-cache lengths measured
REPEATS = 3  # timed repeats per point (median), after one warm-up
BUDGET_S = 90.0  # stop measuring further candidates after this long (those measured so far are kept)
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


@dataclass
class Measured:
    candidate: Candidate
    t_ms: dict[int, list[float]]  # context -> [T(n) for n in NS], median ms


@dataclass
class Settings:
    """What the target runs with and why (part of every ``--json`` record and bench report)."""

    dtype: str
    threads: int
    prepack: bool
    dtype_reason: str = ""
    threads_reason: str = ""
    prepack_reason: str = ""
    profile: str | None = None  # the profile file the choice came from

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


class MachineProfile:
    """Measured T(n) per candidate for one machine fingerprint, model and device (see the module docstring)."""

    def __init__(self, key: str, model: str, device: str, fp: dict, measured: list[Measured], others_load: float,
                 seconds: float, path: Path | None = None) -> None:
        self.key, self.model, self.device, self.fingerprint = key, model, device, fp
        self.measured, self.others_load, self.seconds, self.path = measured, others_load, seconds, path

    # --- storage -------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "version": PROFILE_VERSION, "key": self.key, "model": self.model, "device": self.device,
            "fingerprint": self.fingerprint, "others_load": self.others_load, "seconds": round(self.seconds, 1),
            "ns": list(NS), "candidates": [
                {**asdict(m.candidate), "label": m.candidate.label, "t_ms": {str(c): [round(t, 3) for t in v]
                                                                                for c, v in m.t_ms.items()}}
                for m in self.measured],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any], path: Path | None = None) -> "MachineProfile":
        if doc.get("version") != PROFILE_VERSION or list(doc.get("ns", [])) != list(NS):
            raise ValueError("profile version differs")
        measured = [Measured(Candidate(c["dtype"], int(c["threads"]), bool(c["prepack"])),
                             {int(k): [float(x) for x in v] for k, v in c["t_ms"].items()})
                    for c in doc["candidates"]]
        if not measured:
            raise ValueError("no candidates")
        return cls(doc["key"], doc["model"], doc["device"], doc["fingerprint"], measured,
                   float(doc.get("others_load", 0.0)), float(doc.get("seconds", 0.0)), path)

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
               max_threads: int | None = None, speculative: bool = True) -> tuple[Candidate, Measured | None, str]:
        """The measured candidate with the lowest :func:`token_cost_ms` among those that match the explicit
        settings (``auto`` = any) and, for ``auto`` threads, use at most ``max_threads``.

        Returns:
            ``(candidate, its measurement or None, reason)``; with nothing measured that matches, the explicit
            settings themselves (auto parts filled with bfloat16 / ``max_threads`` / no packing) and no measurement.
        """
        pool = [m for m in self.measured
                if (dtype == "auto" or m.candidate.dtype == dtype)
                and (prepack == "auto" or m.candidate.prepack == bool(prepack))
                and (m.candidate.threads == threads if threads != "auto"
                     else max_threads is None or m.candidate.threads <= max_threads)]
        if not pool and threads == "auto" and self.measured:  # even the fewest measured threads exceed the free cores
            fewest = min(m.candidate.threads for m in self.measured)
            pool = [m for m in self.measured if m.candidate.threads == fewest
                    and (dtype == "auto" or m.candidate.dtype == dtype)
                    and (prepack == "auto" or m.candidate.prepack == bool(prepack))]
        if not pool:
            c = Candidate("bfloat16" if dtype == "auto" else dtype,
                          int(threads) if threads != "auto" else max(1, max_threads or 1),
                          prepack is True)
            return c, None, "not measured on this machine: as given"
        cost = {id(m): token_cost_ms(m.t_ms, speculative, REF_ACCEPT) for m in pool}
        best = min(pool, key=lambda m: cost[id(m)])
        what = "ms per token at the reference acceptance" if speculative else "ms per token, plain decoding"
        ranked = sorted(pool, key=lambda m: cost[id(m)])[:3]
        reason = f"fastest measured ({what}: " + ", ".join(f"{m.candidate.label} {cost[id(m)]:.1f}" for m in ranked) + ")"
        return best.candidate, best, reason


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
                  repeats: int = REPEATS, tick: Callable[[], None] = lambda: None) -> dict[int, list[float]]:
    """Median ms of one forward over n new tokens after a ``context``-token KV cache, for each context and n."""
    from .kv_cache import new_cache, rollback

    ns = list(ns)
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)
    out: dict[int, list[float]] = {}
    max_pos = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
    for ctx in contexts:
        ctx = min(ctx, max_pos - max(ns) - 1)
        ids = torch.randint(0, vocab, (1, ctx + max(ns)), generator=gen).to(device)
        cache = new_cache(model.config)
        model(input_ids=ids[:, :ctx], cache=cache, use_cache=True, logits_to_keep=1)
        row = []
        for n in ns:
            block = ids[:, ctx: ctx + n]
            times = []
            for r in range(repeats + 1):  # the first is a warm-up
                t0 = time.perf_counter()
                model(input_ids=block, cache=cache, use_cache=True)
                if r:
                    times.append(time.perf_counter() - t0)
                rollback(cache, ctx)
            times.sort()
            row.append(times[len(times) // 2] * 1e3)
        out[ctx] = row
        tick()
    return out


def measure_profile(directory: Path, model_name: str, device: str, progress: Any = None,
                    budget_s: float = BUDGET_S) -> MachineProfile:
    """Measure every candidate (see :func:`candidates`) for the model in ``directory`` and return the profile.

    ``progress``: a ``rich.progress.Progress`` to show a bar on (None: no bar).
    """
    from .models import load_model
    from .packed import pack_linears

    fp = fingerprint()
    key = fingerprint_key(model_name, device)
    cores, _ = usable_cores()
    monitor = LoadMonitor()
    monitor.sample()
    todo = candidates(device, cores)
    task = progress.add_task("measuring this machine", total=len(todo) * len(CONTEXTS)) if progress else None
    tick = (lambda: progress.advance(task)) if progress else (lambda: None)
    start, measured, measuring = time.perf_counter(), [], 0.0  # the time limit counts timing, not model loading
    old_threads = torch.get_num_threads()
    try:
        for dtype in DTYPES:
            mine = [c for c in todo if c.dtype == dtype]
            if not mine:
                continue
            model, _ = load_model(directory, DTYPES[dtype], device, tokenizer=False)
            vocab = int(model.get_output_embeddings().weight.shape[0])
            for packed in (False, True):
                group = [c for c in mine if c.prepack == packed]
                if not group:
                    continue
                if packed:
                    pack_linears(model)
                for c in group:
                    if measuring > budget_s:
                        log.warning("machine profile: its %.0f s time limit is spent; %s not measured", budget_s, c.label)
                        tick(), tick()
                        continue
                    torch.set_num_threads(c.threads)
                    t0 = time.perf_counter()
                    measured.append(Measured(c, time_forwards(model, vocab, tick=tick)))
                    measuring += time.perf_counter() - t0
            del model
    finally:
        torch.set_num_threads(old_threads)
    others = monitor.sample().others
    return MachineProfile(key, model_name, device, fp, measured, others, time.perf_counter() - start)


def get_profile(directory: Path, model_name: str, device: str, progress: Any = None,
                refresh: bool = False) -> MachineProfile:
    """The cached profile for this machine, model and device, measured (and cached) when missing, unreadable,
    ``refresh`` is set, or the cached one was measured while other processes kept a core busy."""
    key = fingerprint_key(model_name, device)
    prof = None if refresh else load_profile(key)
    if prof is not None and prof.others_load <= 0.3:
        return prof
    if prof is not None:  # a provisional profile taken under load: measure again if the machine is quiet now
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


def resolve_settings(directory: Path, model_name: str, device: str, dtype: str = "auto", threads: int | str = "auto",
                     prepack: bool | str = "auto", speculative: bool = True, progress: Any = None,
                     measure: bool | None = None) -> tuple[Settings, MachineProfile | None, float]:
    """Settle dtype, threads and weight layout for a target on this machine.

    The machine profile is measured (once, then cached) when ``measure`` is True, or when it is None and ``dtype``
    is ``auto``; otherwise a cached profile is used when there is one. Explicit settings always win.

    Returns:
        ``(settings, profile or None, others' load in cores at the time)``.

    Raises:
        ConfigError: ``prepack`` asked for where oneDNN pre-packing is not available.
    """
    from ..errors import ConfigError
    from .machine import LoadMonitor
    from .packed import packing_available

    if prepack is True and dtype != "auto" and not packing_available(DTYPES[dtype], device):
        raise ConfigError(f"prepack: on needs oneDNN pre-packing, not available here for {dtype} on {device}: "
                          "use prepack: auto or off")
    if device != "cpu":
        if dtype == "auto":
            dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"
        return Settings(dtype, torch.get_num_threads(), False, "device default", "torch default",
                        "CPU only"), None, 0.0
    cores, cores_why = usable_cores()
    others = LoadMonitor().sample(settle_s=0.2).others
    fit = choose_threads(cores, others)
    load_why = f"{cores_why}; others using {others:.1f}"
    if measure or (measure is None and dtype == "auto"):
        profile = get_profile(directory, model_name, device, progress)
    else:
        profile = load_profile(fingerprint_key(model_name, device))
    if profile is not None:
        cand, m, reason = profile.choose(dtype, threads, prepack, fit, speculative)
        if prepack is True and not cand.prepack:
            cand = Candidate(cand.dtype, cand.threads, True)
        s = Settings(cand.dtype, cand.threads, cand.prepack,
                     "as given" if dtype != "auto" else reason,
                     "as given" if threads != "auto" else f"{load_why}; {reason if dtype != 'auto' else 'see dtype'}",
                     "as given" if prepack != "auto" else ("see dtype" if dtype == "auto" else reason),
                     str(profile.path) if profile.path else None)
        return s, profile, others
    if dtype == "auto":  # unreachable unless measuring failed: the old rule
        from .models import resolve_dtype

        dtype = "bfloat16" if resolve_dtype("auto", device) == torch.bfloat16 else "float32"
    t = int(threads) if threads != "auto" else fit
    return Settings(dtype, t, prepack is True, "as given", "as given" if threads != "auto" else load_why,
                    "as given" if prepack != "auto" else "no machine profile (run `specframe tune`)"), None, others
