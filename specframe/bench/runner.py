"""Running a bench: strategies interleaved per question (A B C A B C ...) after a warm-up, so machine drift
hits all strategies alike; then the lossless check against the ``none`` baseline."""

from __future__ import annotations

import os
import platform
from datetime import datetime, timezone
from typing import Any, Callable

import torch

from .. import __version__
from ..contracts.optional import optional
from ..io.prompts import Prompt
from .config import BASELINE, LLAMACPP_PEERS, BenchConfig, Strategy
from .peers import run_peer

MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
MULTI_TURN = "multi-turn conversation"


def category_group(category: str | None, categories: list[str] | None = None) -> str:
    """The report column of a question's category. Spec-Bench reports the eight MT-bench categories together as
    multi-turn conversation; an MT-bench category named in ``categories`` (``--categories coding``) keeps its own
    column, so the report says what was run."""
    if category in MT_BENCH and category not in (categories or ()):
        return MULTI_TURN
    return str(category)


def question_group(q: Prompt, categories: list[str] | None = None) -> str:
    """The report column of a question. A question of SPEED-Bench's schema has its own category as its column (its 11
    categories are SPEED-Bench's columns), or its throughput split when it has one (``split: throughput_8k`` in
    specframe's SPEED-Bench-shaped workload: one column per input length); any other, Spec-Bench's grouping
    (:func:`category_group`)."""
    if not q.speed_bench:
        return category_group(q.category, categories)
    split = q.extra.get("split")
    return split if isinstance(split, str) and split.startswith("throughput") else str(q.category)


# fields of a SPEED-Bench-schema question copied into each of its bench records (per-category and per-length reports)
QUESTION_FIELDS = ("sub_category", "difficulty", "entropy_tier", "split", "context_tokens")


def select_questions(prompts: list[Prompt], categories: list[str] | None, limit_per_category: int | None) -> list[Prompt]:
    """Filter by category (a name or ``multi-turn conversation``) and keep the first N per report column (see
    :func:`question_group`)."""
    out, seen = [], {}
    for p in prompts:
        if categories and p.category not in categories and question_group(p) not in categories:
            continue
        key = question_group(p, categories)
        if limit_per_category is not None and seen.get(key, 0) >= limit_per_category:
            continue
        seen[key] = seen.get(key, 0) + 1
        out.append(p)
    return out


def environment() -> dict[str, Any]:
    import transformers

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "specframe": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


class BenchRunner:
    """Runs every strategy on every question; owns no model loading (``sf`` is a loaded ``Specframe``, or a dict
    strategy name -> ``Specframe`` when strategies run the target with different dtype / threads / layout)."""

    def __init__(self, sf: Any, cfg: BenchConfig, assistants: dict[str, Any] | None = None) -> None:
        self.cfg, self.assistants = cfg, assistants or {}
        self.synthetic: dict[str, Any] = {}  # strategy name -> its SyntheticVerifier
        self.by_strategy = sf if isinstance(sf, dict) else {s.name: sf for s in cfg.strategies}
        self.sf = self.by_strategy.get(BASELINE) or next(iter(self.by_strategy.values()))
        self.monitor = None
        try:
            from ..target.machine import LoadMonitor

            self.monitor = LoadMonitor()
            self.monitor.sample(settle_s=0.1)
        except Exception:  # noqa: BLE001 - load figures are informative only
            self.monitor = None

    def run_one(self, strategy: Strategy, ids: list[int], seed: int, max_new_tokens: int,
                constraint: dict[str, Any] | None = None) -> dict[str, Any]:
        """One strategy on one prompt; ``constraint``: the question's structured output (followed when the strategy
        is ``constrained``; peers decode without it)."""
        c = self.cfg
        constraint = constraint if strategy.constrained and strategy.peer is None else None
        sf = self.by_strategy[strategy.name]
        settings = optional(sf.target, "settings")
        if settings is not None and sf.target.device.type == "cpu":
            torch.set_num_threads(settings.threads)  # torch's thread count is global: each strategy sets its own
        if strategy.peer in LLAMACPP_PEERS:
            from ..target.llamacpp.peers import run_llamacpp_peer

            rec = run_llamacpp_peer(sf.target, strategy.peer, strategy.options, ids, max_new_tokens=max_new_tokens,
                                    temperature=c.temperature, top_p=c.top_p, top_k=c.top_k, seed=seed)
        elif strategy.peer is not None:
            rec = run_peer(
                sf.target, strategy.peer, strategy.options, ids, max_new_tokens=max_new_tokens,
                temperature=c.temperature, top_p=c.top_p, top_k=c.top_k, seed=seed,
                assistant=self.assistants.get(strategy.name),
            )
        elif strategy.synthetic is not None:
            rec = self._run_synthetic(sf, strategy, ids, seed, max_new_tokens)
        else:
            res = sf.generate_result(
                ids, proposers=strategy.proposers, max_new_tokens=max_new_tokens, temperature=c.temperature,
                top_p=c.top_p, top_k=c.top_k, seed=seed, merge=strategy.merge, router=strategy.router,
                constraint=constraint,
            )
            rec = {"token_ids": res.token_ids, "finish_reason": res.finish_reason, "metrics": res.metrics.to_dict()}
        rec["constrained"] = constraint is not None
        if settings is not None:
            rec["settings"] = {"engine": optional(sf.target, "engine"), "dtype": settings.dtype,
                               "threads": settings.threads, "prepack": settings.prepack}
            if sf.target.supports_trees and rec["settings"]["engine"] == "llama.cpp":
                rec["settings"]["trees"] = True  # (not bit-exact: compared with plain decoding all the same)
        if self.monitor is not None:
            rec["others_load"] = round(self.monitor.sample().others, 2)  # other processes' cores during this run
        return rec

    def _run_synthetic(self, sf: Any, strategy: Strategy, ids: list[int], seed: int, max_new_tokens: int) -> dict:
        """One run under imposed acceptance (:mod:`specframe.bench.synthetic`): the strategy's proposers draft, a
        :class:`~specframe.bench.synthetic.SyntheticVerifier` accepts. Not lossless (``synthetic: true``)."""
        from ..sampling import SamplingParams
        from .config import synthetic_k
        from .speculation_profile import read_profile
        from .synthetic import SyntheticVerifier, synthetic_marginals

        c = self.cfg
        verifier = self.synthetic.get(strategy.name)
        if verifier is None:  # one per strategy: its schedule runs on across the requests (see the module docstring)
            marginal, shapes = synthetic_marginals(strategy.synthetic, synthetic_k(strategy) or 1, read_profile)
            verifier = self.synthetic[strategy.name] = SyntheticVerifier(marginal, shapes,
                                                                         sorted(sf.target.eos_token_ids))
        sampling = SamplingParams(temperature=c.temperature, top_k=c.top_k or 0, top_p=c.top_p or 1.0)
        with sf.engine(strategy.proposers, strategy.merge, strategy.router, sampling, verifier=verifier) as engine, \
                torch.inference_mode():
            res = engine.generate(ids, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed)
        return {"token_ids": res.token_ids, "finish_reason": res.finish_reason, "metrics": res.metrics.to_dict(),
                "synthetic": True}

    def run(self, questions: list[Prompt], advance: Callable[[str], None] = lambda s: None,
            done: dict[tuple, dict[str, Any]] | None = None, on_record: Callable[[dict[str, Any]], None] = lambda r: None,
            on_question: Callable[[int, list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
        """Every strategy on every question, interleaved; returns the records in run order.

        ``done``: records of an earlier, interrupted run by :func:`~specframe.bench.journal.record_key`, used as
        they are instead of running again. ``on_record`` hears of each newly finished record, ``on_question`` of each
        finished question (its position and records).
        """
        c = self.cfg
        done = done or {}
        encoded = [self.sf.encode(q.text, c.chat) for q in questions]
        for q, ids in list(zip(questions, encoded))[: c.warmup]:
            for s in c.strategies:
                self.run_one(s, ids, c.seeds[0], min(16, c.max_new_tokens), q.constraint)
                advance(f"warm-up {s.name}")
        records = []
        for i, (q, ids) in enumerate(zip(questions, encoded)):
            first = len(records)
            for seed in c.seeds:
                for rep in range(c.repeats):
                    for s in c.strategies:  # interleaved: A B C A B C ...
                        if (i, seed, rep, s.name) in done:
                            records.append(done[(i, seed, rep, s.name)])
                            advance(s.name)
                            continue
                        rec = self.run_one(s, ids, seed, c.max_new_tokens, q.constraint)
                        # `question` (the position in the run) keys a record: ids may be missing or repeated
                        rec.update({k: q.extra[k] for k in QUESTION_FIELDS if k in q.extra})
                        rec.update(question=i, question_id=q.question_id, category=q.category,
                                   group=question_group(q, c.categories),
                                   strategy=s.name, kind="peer" if s.peer else "specframe", seed=seed, repeat=rep,
                                   prompt_tokens=len(ids), plain=s.proposers == [{"name": BASELINE}])
                        records.append(rec)
                        on_record(rec)
                        advance(s.name)
            if on_question is not None:
                on_question(i, records[first:])
        return records


def is_near_tie(gap: float, top1: float, dtype: torch.dtype) -> bool:
    """A top-2 gap within four units in the last place of the run's dtype at the top logit's magnitude: rounding
    differences between a 1-token and a k-token forward accumulate over the layers, so such a tie may break
    either way. In float32 four ulps are ~5e-7 relative: practically only exact ties."""
    import math

    mantissa = {torch.bfloat16: 7, torch.float16: 10}.get(dtype, 23)
    ulp = 2.0 ** (math.floor(math.log2(max(abs(top1), 1e-30))) - mantissa)
    return gap <= 4 * ulp


def lossless_check(sf: Any, records: list[dict[str, Any]], questions: list[Prompt], chat: bool,
                   float32: Callable[[], Any] | None = None) -> list[dict[str, Any]]:
    """Greedy runs: every strategy's token ids must equal the baseline's for the same question (by position:
    ``record["question"]`` indexes ``questions``, so questions without a ``question_id`` or with a repeated one are
    told apart), seed, repeat, run with the same dtype and weight layout (``none``, or another plain-decoding strategy for other settings; runs
    with no such reference are not compared). ``sf``: a ``Specframe``, or a callable strategy name -> ``Specframe``.

    Returns one entry per mismatch with the first divergent position and the target's top-2 logit gap there
    (computed in the run's dtype: a small gap marks a near-tie where a 1-token and a k-token forward may round
    differently in bf16). A bf16 divergence that is not a near-tie is explained or not with evidence (see
    :func:`rounding_evidence`) when ``float32`` gives the float32 target (loaded once, on first need).
    """
    fp32: list[Any] = []
    def layout(r: dict[str, Any]) -> tuple:  # the kernels a run used (and its constraint): outputs compare within one
        st = r.get("settings") or {}
        return st.get("engine", "transformers"), st.get("dtype"), st.get("prepack"), bool(r.get("constrained"))

    plain = [r for r in records if r["strategy"] == BASELINE]
    plain_layouts = {layout(r) for r in plain}
    for r in records:  # another plain-decoding strategy is the reference for a dtype / layout `none` did not use
        if r.get("plain") and layout(r) not in plain_layouts:
            plain.append(r)
    base: dict[tuple, dict[str, Any]] = {}
    for r in plain:
        base.setdefault((r["question"], r["seed"], r["repeat"], layout(r)), r)
    out = []
    for r in records:
        if r["strategy"] == BASELINE or r in plain or r.get("synthetic"):  # (synthetic: imposed acceptance, not lossless)
            continue
        b = base.get((r["question"], r["seed"], r["repeat"], layout(r)))
        if b is None:  # no plain-decoding run with the same dtype and layout: nothing to compare with
            continue
        got, ref = r["token_ids"], b["token_ids"]
        if got == ref:
            continue
        first = next((i for i, (x, y) in enumerate(zip(got, ref)) if x != y), min(len(got), len(ref)))
        one = sf(r["strategy"]) if callable(sf) else sf
        ids = one.encode(questions[r["question"]].text, chat) + ref[:first]
        target = one.target
        logits = target.last_logits(ids)
        top = torch.topk(logits, 2)
        gap = float(top.values[0] - top.values[1])
        out.append({
            "strategy": r["strategy"], "kind": r["kind"], "question": r["question"], "question_id": r["question_id"],
            "seed": r["seed"],
            "repeat": r["repeat"], "first_divergence": first, "baseline_token": ref[first] if first < len(ref) else None,
            "strategy_token": got[first] if first < len(got) else None,
            "top2_logit_gap": gap,
            "top1_logit": float(top.values[0]),
            "near_tie": is_near_tie(gap, float(top.values[0]), target.dtype),
            # settings asked for knowing they are not bit-exact (llama.cpp token trees)
            "inexact_by_choice": bool((r.get("settings") or {}).get("trees")),
        })
        m = out[-1]
        if (not m["near_tie"] and float32 is not None and target.dtype in (torch.bfloat16, torch.float16)
                and m["baseline_token"] is not None and m["strategy_token"] is not None):
            if not fp32:
                fp32.append(float32())
            m.update(rounding_evidence(logits, fp32[0].last_logits(ids), m["baseline_token"], m["strategy_token"]))
    return out


def rounding_evidence(low: torch.Tensor, fp32: torch.Tensor, base_token: int, strategy_token: int) -> dict[str, Any]:
    """Is a bf16 divergence between two greedy runs explained by rounding? The prefix both runs share is scored in the
    run's dtype (``low``, ``[V]``) and in float32 (``fp32``, ``[V]``). Rounding explains it when the two tokens are
    float32's top two and their float32 margin is at most twice what bf16 got wrong at that position (the largest
    ``|low - fp32|`` of the two tokens' logits): 30 layers of bf16 rounding moved the logits by more than the margin,
    so a 1-token and a k-token forward may each pick either. Otherwise (a token float32 ranks lower, or a margin
    bf16's error cannot reach) it is not explained: a real divergence.

    Returns ``{"fp32_gap", "bf16_error", "explained"}`` (logit units).
    """
    low, fp32 = low.float(), fp32.float()
    pair = torch.tensor([base_token, strategy_token])
    top2 = set(torch.topk(fp32, 2).indices.tolist())
    margin = float((fp32[base_token] - fp32[strategy_token]).abs())
    error = float((low[pair] - fp32[pair]).abs().max())
    return {"fp32_gap": margin, "bf16_error": error,
            "explained": {base_token, strategy_token} <= top2 and margin <= 2 * error}
