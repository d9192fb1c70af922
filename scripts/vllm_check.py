"""Issue 15's checks: specframe proposers inside vLLM (run with the Python of an environment that has vLLM).

    specframe vllm export --output models/smollm2
    python scripts/vllm_check.py --model-dir models/smollm2 --output vllm-check

For each setting (vLLM alone; the specframe adapter with ngram, ngram+retrieval and the contrib proposer recall;
vLLM's own ngram method) a fresh process loads vLLM (float32, eager) and generates greedily: the first
``--limit`` dev questions (5 per category, first turns, chat template) one at a time (timed: tokens/s), then
``--batch`` of them as concurrent requests in one call. Written to OUTPUT/results.json and OUTPUT/report.md:
whether each setting's solo outputs equal vLLM alone's token for token, whether each batch row equals its solo
run, tokens/s, and the acceptance figures from vLLM's own counters (τ, α) beside the adapter's.
Exit code 1 when any output differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_QUESTIONS = ROOT.parent / "shared" / "specbench" / "question.jsonl"
SETTINGS = {  # name -> speculative setting
    "none": None,
    "specframe ngram": {"config": "docs/vllm/ngram.yaml"},
    "specframe ngram+retrieval": {"config": "docs/vllm/ngram-retrieval.yaml"},
    "specframe recall (contrib)": {"config": "docs/vllm/recall.yaml"},
    "vllm ngram": {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 5},
}


def prompts(path: str, limit: int, model_dir: str) -> list[list[int]]:
    from transformers import AutoTokenizer

    from specframe.bench.runner import select_questions
    from specframe.io.prompts import read_prompts

    tok = AutoTokenizer.from_pretrained(model_dir)
    chosen = select_questions(read_prompts(path), None, 5)[:limit]
    return [tok.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True,
                                    tokenize=True, return_dict=False) for p in chosen]


def run_one(args: argparse.Namespace) -> None:
    """One setting in this process; writes its JSON to --result."""
    from vllm import LLM, SamplingParams

    from specframe.integrations.vllm import spec_decode_report, speculative_config

    setting = SETTINGS[args.setting]
    k = args.k
    spec = None
    if setting is not None and "config" in setting:
        os.environ["SPECFRAME_VLLM_STATS"] = str(Path(args.result).with_suffix(".adapter.json"))
        spec = speculative_config(ROOT / setting["config"], k)
    elif setting is not None:
        spec = {**setting, "num_speculative_tokens": k}
    ids = prompts(args.questions, args.limit, args.model_dir)
    t0 = time.perf_counter()
    llm = LLM(model=args.model_dir, dtype="float32", max_model_len=2048, seed=0, gpu_memory_utilization=0.15,
              enforce_eager=True, disable_log_stats=False, speculative_config=spec)
    load_s = time.perf_counter() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens)
    llm.generate([{"prompt_token_ids": ids[0]}], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    solo, secs = [], 0.0
    for p in ids:
        t = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)
        secs += time.perf_counter() - t
        solo.append(list(out[0].outputs[0].token_ids))
    report = spec_decode_report(llm.get_metrics())
    t = time.perf_counter()
    batch = [list(o.outputs[0].token_ids) for o in
             llm.generate([{"prompt_token_ids": p} for p in ids[: args.batch]], sp, use_tqdm=False)]
    batch_s = time.perf_counter() - t
    tokens = sum(len(s) for s in solo)
    Path(args.result).write_text(json.dumps({
        "setting": args.setting, "spec": spec, "load_s": load_s, "solo": solo, "solo_s": secs,
        "tok_s": tokens / secs, "tokens": tokens, "batch": batch, "batch_s": batch_s,
        "batch_tok_s": sum(len(b) for b in batch) / batch_s, "vllm_metrics": report}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True, help="A transformers folder vLLM loads (specframe vllm export).")
    ap.add_argument("--questions", default=str(DEFAULT_QUESTIONS))
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("-k", type=int, default=5, help="num_speculative_tokens for every speculative setting.")
    ap.add_argument("--output", default="vllm-check")
    ap.add_argument("--setting", choices=list(SETTINGS), action="append", help="Run only these settings.")
    ap.add_argument("--run-one", dest="setting_one", choices=list(SETTINGS), help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.setting_one:
        args.setting = args.setting_one
        run_one(args)
        return 0
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in args.setting or list(SETTINGS):
        path = out / (name.replace(" ", "_").replace("+", "-").replace("(", "").replace(")", "") + ".json")
        cmd = [sys.executable, __file__, "--run-one", name, "--result", str(path), "--model-dir", args.model_dir,
               "--questions", args.questions, "--limit", str(args.limit), "--batch", str(args.batch),
               "--max-new-tokens", str(args.max_new_tokens), "-k", str(args.k)]
        print(f"== {name}", flush=True)
        with open(out / "log.txt", "a") as logf:
            rc = subprocess.call(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=ROOT)
        if rc != 0:
            print(f"   failed (exit {rc}); see {out / 'log.txt'}", flush=True)
            continue
        results[name] = json.loads(path.read_text())
        adapter = path.with_suffix(".adapter.json")
        if adapter.exists():
            results[name]["adapter"] = json.loads(adapter.read_text())
    base = results.get("none")
    ok = True
    lines = ["| setting | solo = vLLM alone | batch rows = solo | tok/s (solo) | tok/s (batch of %d) | τ (vLLM counters) | τ per draft (vLLM) | α (vLLM) "
             "| α (adapter) | accepted by position (vLLM) |" % args.batch, "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        same = base is not None and r["solo"] == base["solo"]
        rows = sum(b == s for b, s in zip(r["batch"], r["solo"]))
        ok &= (same or name == "none") and rows == len(r["batch"])
        m, a = r["vllm_metrics"], r.get("adapter") or {}
        alpha_adapter = f"{a['alpha']:.2f}" if a else "–"
        lines.append(f"| {name} | {'yes' if same else 'NO'} ({sum(x == y for x, y in zip(r['solo'], base['solo'])) if base else 0}"
                     f"/{len(r['solo'])}) | {rows}/{len(r['batch'])} | {r['tok_s']:.1f} | {r['batch_tok_s']:.1f} | "
                     f"{m['tau']:.2f} | {m['tau_per_draft']:.2f} | {m['alpha']:.2f} | {alpha_adapter} | {m['accepted_by_position']} |")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
