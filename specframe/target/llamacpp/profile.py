"""The machine profile of a llama.cpp target: T(n) per thread count, measured where it runs.

The same :class:`specframe.target.profile.MachineProfile` as the transformers engine's (its candidates are ``gguf/<t>t``: the
GGUF's own tensor types at ``t`` threads), cached per machine fingerprint, model, engine and llama.cpp build under
``$SPECFRAME_CACHE/machine/``. The router reads v(n) = T(n) / T(1) from it, so speculation on llama.cpp pays only
where this machine's llama.cpp kernels batch well.
"""

from __future__ import annotations

import hashlib
import logging
import statistics
import time
from typing import Any, Callable, Iterable

from ..machine import LoadMonitor, fingerprint, fingerprint_key, usable_cores
from ..profile import (
    BUDGET_S,
    CONTEXTS,
    NS,
    PROFILE_VERSION,
    REPEATS,
    ROUNDS,
    Candidate,
    MachineProfile,
    Measured,
    interleave,
    load_profile,
    profile_path,
)
from .binding import LlamaContext

log = logging.getLogger("specframe")

DTYPE = "gguf"  # the candidates' dtype label: the tensor types stored in the GGUF


def profile_key(model_name: str, target: Any) -> str:
    """The cache key: machine fingerprint, model, engine and the llama.cpp build (its version and features)."""
    build = hashlib.sha256(target.build.system_info.encode()).hexdigest()[:12]
    return fingerprint_key(model_name, "cpu", "llama.cpp", target.build.version, build)


class _Decoder:
    """Times decodes at ``threads`` threads: each row in a llama.cpp context of its own (prefilled anew, untimed;
    one context at a time, so interleaving thread counts holds one KV cache)."""

    def __init__(self, target: Any, threads: int, ns: Iterable[int] = NS) -> None:
        import random

        self.target, self.threads, self.ns = target, threads, list(ns)
        self.rng = random.Random(0)

    def row(self, length: int, warm_up: bool, repeats: int = REPEATS) -> list[float]:
        """``[T(n) for n in ns]`` after ``length`` cached tokens: the median ms of ``repeats`` decodes each, after
        one untimed decode when ``warm_up``."""
        target = self.target
        ctx = LlamaContext(target.llama, target.n_ctx, max(512, max(self.ns)), self.threads,
                           padding=target.build.row_padding)
        try:
            ids = [self.rng.randrange(target.vocab_size) for _ in range(length + max(self.ns))]
            for i in range(0, length, ctx.n_batch):
                chunk = ids[i:min(i + ctx.n_batch, length)]
                ctx.decode(chunk, list(range(i, i + len(chunk))), logits="last")
            row = []
            for n in self.ns:
                times = []
                for r in range(repeats + int(warm_up)):
                    t0 = time.perf_counter()
                    ctx.decode(ids[length:length + n], list(range(length, length + n)))
                    if r or not warm_up:
                        times.append(time.perf_counter() - t0)
                    ctx.remove(0, length)
                row.append(statistics.median(times) * 1e3)
            return row
        finally:
            ctx.close()


def contexts_of(target: Any, contexts: Iterable[int] = CONTEXTS, ns: Iterable[int] = NS) -> list[int]:
    """The context lengths measured: ``contexts`` clipped to what ``target.n_ctx`` holds besides the largest n."""
    return [min(length, target.n_ctx - max(ns) - 1) for length in contexts]


def time_decodes(target: Any, threads: int, contexts: Iterable[int] = CONTEXTS, ns: Iterable[int] = NS,
                 repeats: int = 3, tick: Callable[[], None] = lambda: None) -> dict[int, list[float]]:
    """Median ms of one ``llama_decode`` over n new tokens (a logits row each) after ``context`` cached tokens, for
    each context and n, at ``threads`` threads (``repeats`` timed decodes after a warm-up; one thread count alone:
    :func:`measure` interleaves)."""
    ns = list(ns)
    dec = _Decoder(target, threads, ns)
    out: dict[int, list[float]] = {}
    for length in contexts_of(target, contexts, ns):
        out[length] = dec.row(length, True, repeats)
        tick()
    return out


def measure(target: Any, model_name: str, progress: Any = None, budget_s: float = BUDGET_S,
            rounds: int = ROUNDS) -> MachineProfile:
    """Measure T(n) of ``target`` at 1, cores / 2 and cores threads, in ``rounds`` interleaved rounds (as
    :func:`specframe.target.profile.measure_profile`; ``budget_s`` bounds the time spent timing)."""
    cores, _ = usable_cores()
    monitor = LoadMonitor()
    monitor.sample()
    threads = sorted({1, max(1, cores // 2), cores})
    task = progress.add_task("measuring llama.cpp on this machine", total=len(threads) * len(CONTEXTS) * rounds) \
        if progress else None
    tick = (lambda k: progress.advance(task, k)) if progress else (lambda k: None)
    start = time.perf_counter()
    label = getattr(target, "weights", DTYPE)  # the tensor types run: "gguf" (the file's own) or a requantization
    slots = [(Candidate(label, t, False), lambda: None, lambda length, warm, d=_Decoder(target, t): d.row(length, warm))
             for t in threads]
    got, _ = interleave(slots, contexts_of(target), rounds, budget_s, tick=tick)
    if progress:
        progress.update(task, completed=len(threads) * len(CONTEXTS) * rounds)
    measured = [Measured.of_rounds(c, got[c]) for c, _, _ in slots if c in got]
    return MachineProfile(profile_key(model_name, target), model_name, "cpu", fingerprint(), measured,
                          monitor.sample().others, time.perf_counter() - start, rounds=rounds)


def get_profile(target: Any, model_name: str, progress: Any = None, refresh: bool = False) -> MachineProfile:
    """The cached profile of this machine, model and build, measured (and cached) when missing, or taken under load
    or of an older format while the machine is quiet now (as :func:`specframe.target.profile.get_profile`)."""
    key = profile_key(model_name, target)
    prof = None if refresh else load_profile(key)
    if prof is not None and ((prof.others_load <= 0.3 and prof.version == PROFILE_VERSION)
                             or LoadMonitor().sample().others > 0.3):
        return prof
    prof = measure(target, model_name, progress)
    if prof.others_load > 0.3:
        log.warning("llama.cpp profile measured while other processes used %.1f cores: kept as provisional",
                    prof.others_load)
    try:
        prof.save(profile_path(key))
    except OSError as exc:
        log.warning("could not save the llama.cpp machine profile (%s): it is measured again next time", exc)
    return prof


ROWS_CONTEXT, ROWS_K = 64, 16  # the load-time check: batches after 64 cached tokens, against 16 one-token steps
ROWS_SIZES = (2, 3, 5, 16)  # batch sizes checked (odd ones too: padding rounds them up to the kernel's groups)
ROWS_VERSION = 2  # (2: output rows padded too; verdicts kept by an earlier version are measured again)


def row_check(target: Any, threads: int) -> dict[str, Any]:
    """Does every row of a k-token batch (k in ``ROWS_SIZES``) get the logits one-token decoding gives, bit for bit,
    on this model and build, decoding as the engine does (padded to the build's :attr:`row_padding`)? (random tokens
    after ``ROWS_CONTEXT`` cached ones.) Returns ``{"equal_rows", "rows", "first_differing_row", "max_abs_diff",
    "sizes", "padding"}`` (rows counted over every size)."""
    import random

    import torch

    rng = random.Random(0)
    ids = [rng.randrange(target.vocab_size) for _ in range(ROWS_CONTEXT + ROWS_K)]
    padding = target.build.row_padding
    ctx = LlamaContext(target.llama, ROWS_CONTEXT + ROWS_K + 8, 512, threads, padding=padding)
    same: list[bool] = []
    worst = 0.0
    try:
        ctx.decode(ids[:ROWS_CONTEXT], list(range(ROWS_CONTEXT)), logits="last")
        one = torch.cat([ctx.decode([ids[ROWS_CONTEXT + i]], [ROWS_CONTEXT + i]) for i in range(ROWS_K)])
        for k in ROWS_SIZES:
            ctx.remove(0, ROWS_CONTEXT)
            batch = ctx.decode(ids[ROWS_CONTEXT:ROWS_CONTEXT + k], list(range(ROWS_CONTEXT, ROWS_CONTEXT + k)))
            same += [bool(torch.equal(batch[i], one[i])) for i in range(k)]
            worst = max(worst, float((batch - one[:k]).abs().max()))
    finally:
        ctx.close()
    return {"equal_rows": sum(same), "rows": len(same), "first_differing_row": same.index(False) if not all(same) else None,
            "max_abs_diff": worst, "sizes": list(ROWS_SIZES), "padding": list(padding), "version": ROWS_VERSION}


def cached_row_check(target: Any, model_name: str, threads: int) -> dict[str, Any]:
    """:func:`row_check`, run once per machine, model and build (kept beside the profile)."""
    import json

    path = profile_path(profile_key(model_name, target)).with_suffix(".rows.json")
    try:
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and isinstance(doc.get("equal_rows"), int) and doc.get("version") == ROWS_VERSION:
            return doc
    except (OSError, ValueError):
        pass
    doc = row_check(target, threads)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(path)
    except OSError as exc:
        log.warning("could not save the llama.cpp row check (%s): it runs again next time", exc)
    return doc
