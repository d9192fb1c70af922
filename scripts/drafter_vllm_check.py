"""Cross-check a published-layout drafter: the same drafter folder decodes the same dev questions in specframe and in
vLLM, with the same greedy output and the same accepted length at every step (docs/drafters.md).

    # 1. specframe (its own venv): prompts, outputs and accepted lengths per step
    .venv/bin/python scripts/drafter_vllm_check.py specframe --method eagle3 --draft DIR -k 3 --output OUT
    # 2. vLLM (its venv, docs/vllm.md; the model folder from `specframe vllm export`)
    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python scripts/drafter_vllm_check.py vllm --method eagle3 --draft DIR \
        -k 3 --model-dir models/smollm2 --output OUT
    # 2b. economize (PyPI, a scratch install: pip install --no-deps economize --target /tmp/econ-site), the same way
    PYTHONPATH=/tmp/econ-site .venv/bin/python scripts/drafter_vllm_check.py economize --method eagle3 --draft DIR \
        -k 3 --model-dir models/smollm2 --output OUT
    # 3. the comparison: OUT/report.md (each peer that ran), exit code 1 on any difference
    .venv/bin/python scripts/drafter_vllm_check.py report --output OUT

Alignment: vLLM's prefill runs over the whole prompt and samples the first token, so its first draft follows that
token; specframe's engine prefills all but the last prompt token and drafts in its first verification step. Both
runs therefore start from the prompt plus the target's first greedy token (vLLM's first token, checked equal to
transformers'), and every later step verifies the same kind of draft: ``k`` chained tokens (``eagle`` / ``medusa``
with ``top_k: 1``, no router). vLLM's accepted lengths per step are read in-process from its scheduler's
``SpecDecodingStats.observe_draft`` (one call per request and step), one request at a time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "specbench" / "question.jsonl"


def proposer(method: str, draft: str, k: int) -> dict:
    if method == "eagle3":
        return {"name": "eagle", "checkpoint": draft, "top_k": 1, "depth": k, "max_nodes": k}
    if method == "medusa":
        return {"name": "medusa", "checkpoint": draft, "top_k": 1, "num_heads": k, "max_nodes": k}
    raise SystemExit(f"error: --method {method!r}: eagle3 or medusa")


def run_specframe(args) -> None:
    import torch

    import specframe
    from specframe import hookimpl
    from specframe.bench.runner import select_questions
    from specframe.io.prompts import read_prompts

    class Steps:
        def __init__(self):
            self.steps: list[tuple[int, int]] = []

        @hookimpl
        def specframe_observe_step(self, event) -> None:
            self.steps.append((int(event.drafted), int(event.accepted)))

    obs = Steps()
    sf = specframe.load(model=args.model, dtype="float32", threads=2, prepack=False,
                        registry=specframe.services.build_registry(extra_plugins=(obs,)))
    prompts = select_questions(read_prompts(args.questions), None, args.per_category)[: args.limit]
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for p in prompts:
        ids = sf.encode(p.text)
        with torch.inference_mode():  # the target's first greedy token (vLLM's prefill samples it)
            first = int(sf.target.model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        obs.steps = []
        rec = sf.generate(ids + [first], proposers=[proposer(args.method, args.draft, args.k)],
                          max_new_tokens=args.max_new_tokens - 1, temperature=0.0, router="none")
        rows.append({"question_id": p.question_id, "category": p.category, "prompt_ids": ids, "first": first,
                     "token_ids": [first, *rec["token_ids"]], "steps": obs.steps, "tau": rec["metrics"]["tau"]})
        print(json.dumps({"question_id": p.question_id, "steps": len(obs.steps), "tau": rec["metrics"]["tau"]}),
              flush=True)
    (out / "specframe.json").write_text(json.dumps(rows) + "\n")


def run_vllm(args) -> None:
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process: its stats are seen
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.spec_decode import metrics as spec_metrics

    steps: list[tuple[int, int]] = []
    original = spec_metrics.SpecDecodingStats.observe_draft

    def observe(self, num_draft_tokens, num_accepted_tokens):
        steps.append((int(num_draft_tokens), int(num_accepted_tokens)))
        return original(self, num_draft_tokens, num_accepted_tokens)

    spec_metrics.SpecDecodingStats.observe_draft = observe
    out = Path(args.output)
    rows_in = json.loads((out / "specframe.json").read_text())
    llm = LLM(model=args.model_dir, dtype="float32", max_model_len=2048, gpu_memory_utilization=0.15,
              disable_log_stats=False, seed=0, enable_prefix_caching=False,
              speculative_config={"method": args.method, "model": args.draft, "num_speculative_tokens": args.k})
    rows = []
    for r in rows_in:
        steps.clear()
        o = llm.generate([TokensPrompt(prompt_token_ids=r["prompt_ids"])],
                         SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens), use_tqdm=False)[0]
        rows.append({"question_id": r["question_id"], "token_ids": list(o.outputs[0].token_ids), "steps": list(steps)})
        print(json.dumps({"question_id": r["question_id"], "steps": len(steps)}), flush=True)
    (out / "vllm.json").write_text(json.dumps(rows) + "\n")


def run_economize(args) -> None:
    import economize
    import torch

    out = Path(args.output)
    rows_in = json.loads((out / "specframe.json").read_text())
    fmt = {"eagle3": "eagle3", "medusa": "medusa"}[args.method]
    model = economize.from_pretrained(args.draft, base_model=args.model_dir, format=fmt, dtype=torch.float32)
    rows = []
    for r in rows_in:
        got: list = []
        ids = torch.tensor([r["prompt_ids"]])
        seq = model.generate(ids, max_new_tokens=args.max_new_tokens, use_cache=False,
                             do_sample=False, decoding=economize.DecodeConfig(cycle_length=args.k + 1),
                             on_results=got.extend)
        steps = [(int(d), int(a)) for d, a in got[0].acceptance] if got else []
        rows.append({"question_id": r["question_id"], "token_ids": seq[0, ids.shape[1]:].tolist(), "steps": steps})
        print(json.dumps({"question_id": r["question_id"], "steps": len(steps)}), flush=True)
    (out / "economize.json").write_text(json.dumps(rows) + "\n")


def report(args) -> int:
    out = Path(args.output)
    bad, lines = 0, []
    for peer, label in (("vllm", "vLLM"), ("economize", "economize")):
        if (out / f"{peer}.json").is_file():
            n, table = _compare(out, peer, label)
            bad += n
            lines += [f"## specframe vs {label}", "", *table, ""]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if bad else 0


def _compare(out: Path, peer: str, label: str) -> tuple[int, list[str]]:
    sf = {r["question_id"]: r for r in json.loads((out / "specframe.json").read_text())}
    vl = {r["question_id"]: r for r in json.loads((out / f"{peer}.json").read_text())}
    lines = [f"| question | category | tokens | output | steps (specframe / {label}) | accepted per step | "
             f"tau specframe | tau {label} |", "|---|---|---|---|---|---|---|---|"]
    bad = 0
    for qid, s in sf.items():
        v = vl.get(qid)
        if v is None:
            continue
        same_out = s["token_ids"] == v["token_ids"][: len(s["token_ids"])]
        # specframe's steps after the first token; vLLM's steps likewise (its prefill drafts nothing to verify)
        sa, va = [a for _, a in s["steps"]], [a for _, a in v["steps"]]
        n = min(len(sa), len(va))
        first_diff = next((i for i in range(n) if sa[i] != va[i]), None)
        same_steps = first_diff is None and len(sa) == len(va)
        # the last step alone, where the token limit cut specframe's draft (it drafts no more than the tokens left;
        # vLLM drafts k, accepts, and cuts the output): the same drafter, a different end of the request
        cut = (not same_steps and len(sa) == len(va) and first_diff == len(sa) - 1
               and len(s["token_ids"]) == len(v["token_ids"]) and s["steps"][-1][0] < v["steps"][-1][0])
        bad += (not same_out) + (not same_steps and not cut)
        tau = lambda acc: (sum(acc) + len(acc)) / len(acc) if acc else 0.0  # noqa: E731 (tokens per verification)
        lines.append(f"| {qid} | {s['category']} | {len(s['token_ids'])} | {'same' if same_out else 'DIFFERS'} | "
                     f"{len(sa)} / {len(va)} | {'same' if same_steps else 'same but the last (cut by the token limit)' if cut else f'first differs at step {first_diff}'} | "
                     f"{tau(sa):.2f} | {tau(va):.2f} |")
    lines.append("")
    lines.append(f"{len(sf)} questions; {bad} difference(s).")
    return bad, lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("side", choices=["specframe", "vllm", "economize", "report"])
    ap.add_argument("--method", default="eagle3")
    ap.add_argument("--draft", default="")
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--model-dir", default="models/smollm2")
    ap.add_argument("--questions", default=str(DEFAULT_QUESTIONS))
    ap.add_argument("--per-category", type=int, default=2, help="Dev questions per category (2 x 6 = 12).")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    if args.side == "specframe":
        run_specframe(args)
    elif args.side == "vllm":
        run_vllm(args)
    elif args.side == "economize":
        run_economize(args)
    else:
        return report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
