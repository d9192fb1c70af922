"""Greedy exactness check: specframe's proposers vs transformers ``model.generate(do_sample=False)``.

    python scripts/check_exactness.py --limit 20 --max-new-tokens 128 --dtype float32 --proposer ngram --proposer none
    python scripts/check_exactness.py --proposer ngram+medusa      # "+": proposers combined in one verification pass
    python scripts/check_exactness.py --device cuda --dtype bfloat16  # on a GPU (cuda:N: GPU N); reference there too
    python scripts/check_exactness.py --prepack on --proposer ngram  # pre-packed weights (reference: the packed model)
    python scripts/check_exactness.py --proposer '{"name": "eagle", "checkpoint": "DIR"}'   # a proposer with options
    python scripts/check_exactness.py --model gemma3-270m --limit-per-category 4 --limit 24 --router none \
        --proposer cross-draft --proposer ngram+cross-draft     # whole drafts every step (no router)

For each question (first turn, chat template applied) the generated token ids of every proposer must equal
transformers' greedy output. A mismatch is listed with the first divergent position and the target's top-2
logit gap there (a near-tie, relevant in bf16, is reported as such). Exit code 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import specframe
from specframe.errors import SpecframeError
from specframe.io.prompts import read_prompts

DEFAULT_QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "specbench" / "question.jsonl"


def top2_gap(model, ids: list[int]) -> float:
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids], device=model.device)).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def proposer_entries(spec: str) -> list[dict]:
    """A --proposer value as proposer configs: ``ngram``, ``a+b`` (a and b combined in one verification pass), or JSON:
    one config (``{"name": "eagle", "checkpoint": "DIR"}``) or a list of them (combined)."""
    if spec.lstrip().startswith(("{", "[")):
        data = json.loads(spec)
        return data if isinstance(data, list) else [data]
    return [{"name": n} for n in spec.split("+")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", default=str(DEFAULT_QUESTIONS))
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--limit-per-category", type=int, default=None,
                    help="First N questions of each category (the bench's dev set with 5), before --skip / --limit.")
    ap.add_argument("--skip", type=int, default=0, help="Leave out the first N of the --limit questions (resume).")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32", help="bfloat16 | float16 | float32 | auto (default float32).")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N: where the target (and the transformers "
                    "reference) runs (default cpu).")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--proposer", action="append", default=None)
    ap.add_argument("--prepack", choices=["on", "off", "auto"], default="auto",
                    help="Pre-packed oneDNN weights; with them the reference is transformers greedy on the packed model.")
    ap.add_argument("--threads", default="auto")
    ap.add_argument("--router", default=None, help="Router of every strategy: none = whole drafts every step (default: "
                    "the config's, which routes a lone proposer on a target with a measured cost curve).")
    args = ap.parse_args()
    proposers = args.proposer or ["ngram", "none"]

    try:
        sf = specframe.load(model=args.model, dtype=args.dtype, device=args.device,
                            prepack={"on": True, "off": False}.get(args.prepack, "auto"),
                            threads=args.threads if args.threads == "auto" else int(args.threads))
    except SpecframeError as exc:  # (a bad --device or --dtype, no CUDA device: one line, not a traceback)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    st = sf.target.settings
    print(f"target: {st.dtype} on {sf.target.device}, {st.threads} threads, prepack {'on' if st.prepack else 'off'}",
          file=sys.stderr)
    model = sf.target.model
    prompts = read_prompts(args.questions)
    if args.limit_per_category:
        from specframe.bench.runner import select_questions

        prompts = select_questions(prompts, None, args.limit_per_category)
    prompts = prompts[args.skip : args.limit]
    mismatches, rows = 0, []
    for p in prompts:
        ids = sf.encode(p.text)
        with torch.inference_mode():
            ref = model.generate(
                torch.tensor([ids], device=model.device),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=model.device),
                do_sample=False, max_new_tokens=args.max_new_tokens,
            )[0, len(ids):].tolist()
        row = {"question_id": p.question_id, "hf_tokens": len(ref)}
        for name in proposers:
            entries = proposer_entries(name)
            extra = {"router": args.router} if args.router else {}
            rec = sf.generate(ids, proposers=entries, max_new_tokens=args.max_new_tokens, temperature=0.0, **extra)
            got = rec["token_ids"]
            ok = got == ref
            entry = {"equal": ok, "tau": rec["metrics"]["tau"]}
            if len(entries) > 1:  # per-proposer attribution of the combination
                entry["proposers"] = {
                    k: {f: v[f] for f in ("drafted_nodes", "accepted_nodes", "accepted_alone", "skipped_steps") if f in v}
                    for k, v in rec["metrics"].get("proposers", {}).items()
                }
            if not ok:
                mismatches += 1
                first = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
                entry.update(first_divergence=first, top2_logit_gap=round(top2_gap(model, ids + ref[:first]), 6))
            row[name] = entry
        rows.append(row)
        print(json.dumps(row), flush=True)
    total = len(prompts) * len(proposers)
    print(f"{total - mismatches}/{total} (question, proposer) pairs token-identical to transformers greedy "
          f"({st.dtype} on {sf.target.device}, {args.max_new_tokens} new tokens)", file=sys.stderr)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
