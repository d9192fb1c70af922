"""The bench under load (``concurrency: [1, 4, 8]``): every strategy decodes all the chosen questions with up to C
requests in each target forward (continuous batching, :mod:`specframe.decode.batch`), all requests arriving at the
start, for each C; strategies interleaved within each C.

Figures per (strategy, C): throughput (generated tokens of all requests / wall seconds), per-request time to first
token (TTFT: from the run's start, waiting for a row included) and time per output token (TPOT: the rest of the
request's time / its tokens after the first), τ, and the draft nodes each request verified per step (what the router
gave it: it shrinks as the batch grows). The peer ``hf-greedy`` runs as transformers' own batched decoding
(``generate`` over left-padded batches of C prompts, each batch until its longest answer ends), where TTFT is the
batch's time to its first token (not measured: left empty) and every request's TPOT is its batch's.

Each request's tokens are compared with the same question decoded alone by ``none`` (C = 1): greedy output must not
depend on the batch (:func:`~specframe.bench.runner.lossless_check`).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from ..contracts.optional import optional
from .config import BASELINE, BATCHED_PEERS, BenchConfig


def run_load(cfg: BenchConfig, chosen: list, by_strategy: dict[str, Any],
             advance: Callable[[str], None] = lambda s: None) -> list[dict[str, Any]]:
    """One record per (concurrency, strategy): its figures and its per-request records (see the module docstring)."""
    sf = by_strategy[BASELINE]
    encoded = [sf.encode(q.text, cfg.chat) for q in chosen]
    strategies = [s for s in cfg.strategies if s.peer is None or s.peer in BATCHED_PEERS]
    top = max(cfg.concurrency)
    for s in strategies:  # warm-up: the largest batch, short answers (not recorded)
        _run(cfg, s, by_strategy[s.name], encoded[: min(len(encoded), top)], top, 8)
        advance(f"warm-up {s.name}")
    out = []
    for c in cfg.concurrency:
        for s in strategies:
            rec = _run(cfg, s, by_strategy[s.name], encoded, c, cfg.max_new_tokens)
            rec.update(strategy=s.name, concurrency=c, kind="peer" if s.peer else "specframe",
                       plain=s.peer is None and s.proposers == [{"name": BASELINE}],
                       settings=_settings(by_strategy[s.name]))
            for i, r in enumerate(rec["requests"]):
                r.update(question=i, question_id=chosen[i].question_id, category=chosen[i].category)
            out.append(rec)
            advance(f"{s.name} ×{c}")
    return out


def _settings(sf: Any) -> dict[str, Any] | None:
    """The engine, dtype and weight layout a strategy's target runs with (outputs compare only within one)."""
    st = optional(sf.target, "settings")
    if st is None:
        return None
    return {"engine": optional(sf.target, "engine"), "dtype": st.dtype, "prepack": st.prepack}


def _run(cfg: BenchConfig, s: Any, sf: Any, encoded: list[list[int]], c: int, max_new: int) -> dict[str, Any]:
    settings = optional(sf.target, "settings")
    if settings is not None and sf.target.device.type == "cpu":
        torch.set_num_threads(settings.threads)
    if s.peer == "hf-greedy":
        return _hf_batched(sf.target, encoded, c, max_new)
    if s.peer == "economize-batch":
        return _economize(sf.target, encoded, c, max_new, s.options)
    t0 = time.perf_counter()
    ends: dict[int, float] = {}
    results = sf.generate_batch_results(
        encoded, batch_size=c, proposers=s.proposers, max_new_tokens=max_new, temperature=cfg.temperature,
        top_p=cfg.top_p, top_k=cfg.top_k, seed=cfg.seeds[0], merge=s.merge, router=s.router,
        on_result=lambda i, r: ends.__setitem__(i, time.perf_counter() - t0))
    wall = time.perf_counter() - t0
    requests = []
    for i, r in enumerate(results):
        m = r.metrics
        n = len(r.token_ids)
        ttft = m.queue_s + m.ttft_s
        requests.append({
            "token_ids": r.token_ids, "new_tokens": n, "ttft_s": ttft,
            "tpot_s": (ends[i] - ttft) / (n - 1) if n > 1 else None, "tau": m.tau,
            "target_forwards": m.target_forwards, "drafted_nodes": m.drafted_nodes,
            "nodes_per_step": m.drafted_nodes / m.target_forwards if m.target_forwards else 0.0})
    return _figures(requests, wall)


def _hf_batched(target: Any, encoded: list[list[int]], c: int, max_new: int) -> dict[str, Any]:
    """transformers' batched greedy ``generate``: batches of ``c`` left-padded prompts, one after the other."""
    model, eos = target.model, sorted(target.eos_token_ids)
    pad = eos[0] if eos else 0
    requests: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for start in range(0, len(encoded), c):
        group = encoded[start : start + c]
        width = max(len(p) for p in group)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in group], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=model.device)
        b0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                                 eos_token_id=eos or None, pad_token_id=pad)
        took = time.perf_counter() - b0
        steps = out.shape[1] - width
        for row in out[:, width:].tolist():
            cut = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
            n = cut
            requests.append({"token_ids": row[:cut], "new_tokens": n, "ttft_s": None,
                             "tpot_s": took / max(steps, 1), "tau": 1.0, "target_forwards": n, "drafted_nodes": 0,
                             "nodes_per_step": 0.0})
    return _figures(requests, time.perf_counter() - t0)


def _economize(target: Any, encoded: list[list[int]], c: int, max_new: int, options: dict[str, Any]) -> dict[str, Any]:
    """economize's ``decode_batch`` (PyPI) on the target's own HF model: groups of ``c`` prompts, each group until its
    last row ends (economize batches the prompts it is given; rows do not join mid-run). ``options``: ``lookup``
    (its prompt-lookup drafter) and ``cycle_length`` (tokens per verified cycle, default 5)."""
    import economize

    configs = []
    if options.get("lookup"):
        from economize.techniques.lookup.config import LookupConfig

        configs.append(LookupConfig())
    model = economize.apply(target.model, *configs)
    decoding = economize.DecodeConfig(cycle_length=int(options.get("cycle_length", 5)) if configs else 1)
    eos = sorted(target.eos_token_ids)
    requests: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for start in range(0, len(encoded), c):
        group = [torch.tensor(p) for p in encoded[start : start + c]]
        b0 = time.perf_counter()
        with torch.inference_mode():
            results = model.decode_batch(group, max_new, decoding=decoding, stop=eos or None)
        took = time.perf_counter() - b0
        for r in results:
            row = r.tokens.tolist()
            cut = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
            cycles = len(r.acceptance) if r.acceptance else cut
            requests.append({"token_ids": row[:cut], "new_tokens": cut, "ttft_s": None,
                             "tpot_s": took / max(cut, 1), "tau": cut / max(cycles, 1), "target_forwards": cycles,
                             "drafted_nodes": sum(d for d, _ in r.acceptance) if r.acceptance else 0,
                             "nodes_per_step": 0.0})
    return _figures(requests, time.perf_counter() - t0)


def _figures(requests: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    tokens = sum(r["new_tokens"] for r in requests)
    forwards = sum(r["target_forwards"] for r in requests)
    def med(key):
        return (statistics.median(v) if (v := [r[key] for r in requests if r[key] is not None]) else None)
    return {"wall_s": wall, "tokens": tokens, "throughput": tokens / wall if wall > 0 else 0.0,
            "ttft_median_s": med("ttft_s"), "tpot_median_s": med("tpot_s"),
            "tau": tokens / forwards if forwards else 0.0,
            "nodes_per_step": sum(r["drafted_nodes"] for r in requests) / forwards if forwards else 0.0,
            "requests": requests}


def lossless_records(load: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-request records in :func:`~specframe.bench.runner.lossless_check`'s form: ``none`` at the smallest
    concurrency is the reference (named ``none``), and for an engine, dtype or layout ``none`` did not run, that
    run's plain decoding at the smallest concurrency (a llama.cpp strategy is checked against llama.cpp decoding
    alone); every other (strategy, C) is named ``strategy ×C``."""
    low = min(r["concurrency"] for r in load)
    out = []
    for rec in load:
        name = BASELINE if rec["strategy"] == BASELINE and rec["concurrency"] == low else \
            f"{rec['strategy']} ×{rec['concurrency']}"
        for r in rec["requests"]:
            out.append({"strategy": name, "kind": rec["kind"], "question": r["question"],
                        "question_id": r["question_id"], "seed": 0, "repeat": 0, "token_ids": r["token_ids"],
                        "settings": rec.get("settings"), "plain": bool(rec.get("plain")) and rec["concurrency"] == low})
    return out


def load_table(load: list[dict[str, Any]]) -> list[str]:
    """report.md lines: per strategy and concurrency, throughput, × none at that concurrency, TTFT, TPOT, τ, nodes."""
    base = {r["concurrency"]: r["throughput"] for r in load if r["strategy"] == BASELINE}
    one = {r["strategy"]: r["throughput"] for r in load if r["concurrency"] == min(base or [1])}
    lines = ["| strategy | C | throughput tok/s | × none | × its C = 1 | TTFT median s | TPOT median ms | τ | "
             "nodes / request / step |", "|---|---|---|---|---|---|---|---|---|"]
    def fmt(v, f):
        return "—" if v is None else format(v, f)
    for r in sorted(load, key=lambda r: (r["strategy"] != BASELINE, r["strategy"], r["concurrency"])):
        b = base.get(r["concurrency"])
        lines.append(
            f"| {r['strategy']} | {r['concurrency']} | {r['throughput']:.1f} | "
            f"{fmt(r['throughput'] / b if b else None, '.2f')} | "
            f"{fmt(r['throughput'] / one[r['strategy']] if one.get(r['strategy']) else None, '.2f')} | "
            f"{fmt(r['ttft_median_s'], '.2f')} | {fmt(r['tpot_median_s'] and r['tpot_median_s'] * 1e3, '.1f')} | "
            f"{r['tau']:.2f} | {r['nodes_per_step']:.2f} |")
    return lines


def write_load_plots(load: list[dict[str, Any]], out: Any) -> list[str]:
    """``throughput_by_concurrency.png`` and ``nodes_by_concurrency.png`` (the router's draft nodes per request per
    step against the batch size); returns the file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    strategies = list(dict.fromkeys(r["strategy"] for r in load))
    for key, label, fname in (("throughput", "throughput (tokens/s, all requests)", "throughput_by_concurrency.png"),
                              ("nodes_per_step", "draft nodes per request per step", "nodes_by_concurrency.png")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for s in strategies:
            pts = sorted((r["concurrency"], r[key]) for r in load if r["strategy"] == s)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s)
        ax.set_xlabel("concurrency (requests per forward, at most)")
        ax.set_ylabel(label)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title(label.split(" (")[0] + " by concurrency")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=120)
        plt.close(fig)
        names.append(fname)
    return names
