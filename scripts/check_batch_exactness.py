"""Batched decoding leaves every request's output unchanged: each dev question decoded in a batch (requests joining
and leaving as others finish) against the same question decoded alone, per strategy.

    python scripts/check_batch_exactness.py --dtype float32 --limit-per-category 4 --limit 24 --batch-size 8 \
        --max-new-tokens 128 --proposer none --proposer ngram --proposer medusa --proposer draft-model \
        --proposer ngram+medusa

``--gate off`` makes every batched step draft: with the per-batch speculation gate on (the default, as served), a
batch whose measured costs say drafting does not pay decodes without drafts, and the check then covers no draft.
Greedy unless ``--temperature`` is given (then each request's seed is its index, alone and batched alike, so the
sampled tokens must be the same too). A mismatch is listed with its first divergent position and the target's top-2
logit gap there. Printed per strategy: requests identical, tau alone and batched, verification forwards alone and
batched (forwards that served several requests count once). Exit code 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import specframe
from specframe.bench.runner import select_questions
from specframe.io.prompts import read_prompts

DEFAULT_QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "specbench" / "question.jsonl"


def entries(spec: str) -> list[dict]:
    if spec.lstrip().startswith(("{", "[")):
        v = json.loads(spec)
        return v if isinstance(v, list) else [v]
    return [{"name": n} for n in spec.split("+")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--engine", default="transformers")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    ap.add_argument("--limit-per-category", type=int, default=4)
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--router", default=None)
    ap.add_argument("--gate", choices=["on", "off"], default="on",
                    help="The per-batch speculation gate; off: every batched step drafts (a check that batches drafts).")
    ap.add_argument("--proposer", action="append")
    args = ap.parse_args()

    sf = specframe.load(model=args.model, dtype=args.dtype, engine=args.engine)
    prompts = select_questions(read_prompts(args.questions), None, args.limit_per_category)[: args.limit]
    ids = [sf.encode(p.text) for p in prompts]
    # mixed lengths, so that requests leave the batch at different steps and others join
    budgets = [args.max_new_tokens - 16 * (i % 4) for i in range(len(ids))]
    bad = 0
    print("| strategy | identical | τ alone | τ batched | forwards alone | batched forwards | s alone | s batched |")
    print("|---|---|---|---|---|---|---|---|")
    for spec in args.proposer or ["none", "ngram"]:
        kw = dict(proposers=entries(spec), temperature=args.temperature)
        if args.router:
            kw["router"] = args.router
        t0 = time.perf_counter()
        alone = [sf.generate_result(p, max_new_tokens=b, seed=i, **kw) for i, (p, b) in enumerate(zip(ids, budgets))]
        t1 = time.perf_counter()
        steps = []  # one entry per batched verification forward
        batched = _batched(sf, ids, budgets, args.batch_size, kw, steps, args.gate == "on")
        t2 = time.perf_counter()
        same = 0
        for i, (a, r) in enumerate(zip(alone, batched)):
            if a.token_ids == r.token_ids:
                same += 1
                continue
            bad += 1
            at = next((j for j, (x, y) in enumerate(zip(a.token_ids, r.token_ids)) if x != y),
                      min(len(a.token_ids), len(r.token_ids)))
            with torch.inference_mode():
                logits = sf.target.last_logits(ids[i] + a.token_ids[:at])
            top = torch.topk(logits, 2).values
            print(f"  {spec}: question {prompts[i].question_id} differs at token {at} "
                  f"(top-2 logit gap {float(top[0] - top[1]):.4g})", file=sys.stderr)
        def tau(rs):
            return sum(len(r.token_ids) for r in rs) / max(1, sum(r.metrics.target_forwards for r in rs))
        fw_alone = sum(r.metrics.target_forwards for r in alone)
        fw_batched = len(steps)
        print(f"| {spec} | {same}/{len(ids)} | {tau(alone):.2f} | {tau(batched):.2f} | {fw_alone} | {fw_batched} | "
              f"{t1 - t0:.1f} | {t2 - t1:.1f} |", flush=True)
    return 1 if bad else 0


def _batched(sf, ids, budgets, batch_size, kw, steps, gate=True):
    """The decode loop itself (each request its own budget and seed, as alone); each request's engine is taken as it
    joins and given back as it leaves."""
    from specframe.decode.batch import BatchRequest, decode_batch
    from specframe.decode.options import DecodeOptions
    from specframe.sampling import SamplingParams

    sampling = SamplingParams(temperature=kw.get("temperature", 0.0))

    def items():
        for i, (p, b) in enumerate(zip(ids, budgets)):
            lease = sf.lease(kw["proposers"], None, kw.get("router"), sampling)  # its verifier: for this sampling
            yield BatchRequest(lease.engine, p, DecodeOptions(b, sampling, seed=i), release=lease.release)

    import specframe.decode.batch as loop

    real = loop.new_batch

    def counted(target, rows):  # count the batch's forwards (one per step, whatever the engine)
        batch = real(target, rows)
        forward = batch.forward
        batch.forward = lambda items: (steps.append(len(items)), forward(items))[1]
        return batch

    loop.new_batch = counted
    try:
        out = dict(decode_batch(sf.target, items(), batch_size, gate=gate))
    finally:
        loop.new_batch = real
    return [out[i] for i in range(len(ids))]


if __name__ == "__main__":
    raise SystemExit(main())
