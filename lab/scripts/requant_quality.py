"""What requantizing the default model's GGUF costs in quality (issue 53 1): top-1 agreement and perplexity against the
bfloat16 transformers model, on the dev set.

    python lab/scripts/requant_quality.py --questions ../shared/specbench/question.jsonl [--per-category 5]
        [--tokens 128] [--gguf NAME=FILE ...] [--out quality.json]

The dev set is the bench's: the first ``--per-category`` questions of each category, first turn, in the chat
template. For each, the bfloat16 model (the default model as specframe's transformers engine runs it) writes
``--tokens`` greedy tokens; every GGUF then reads prompt + that continuation in one teacher-forced pass on llama.cpp.
Per GGUF: top-1 agreement (its argmax equals bfloat16's, at every continuation position) and perplexity of the
continuation (bfloat16's own perplexity beside it). Requantized files are made with ``specframe.target.llamacpp.weights``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import torch


def dev_prompts(path: Path, per_category: int) -> list[tuple[str, str]]:
    seen: dict[str, int] = defaultdict(int)
    out = []
    for line in path.read_text().splitlines():
        q = json.loads(line)
        if seen[q["category"]] < per_category:
            seen[q["category"]] += 1
            out.append((q["category"], q["turns"][0]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", required=True, type=Path)
    ap.add_argument("--per-category", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--gguf", action="append", default=[], help="NAME=FILE (default: the shipped Q4_1, bf16, q8_0, q4_0)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    from specframe.target.llamacpp.binding import LlamaContext, LlamaModel
    from specframe.target.llamacpp.weights import requantized
    from specframe.target.loader import load_target
    from specframe.target.models import resolve_model

    source = resolve_model("smollm2-135m-instruct").gguf
    ggufs = dict(g.split("=", 1) for g in a.gguf) or {
        "Q4_1 (shipped)": str(source), **{k: str(requantized(source, k)) for k in ("bf16", "q8_0", "q4_0")}}
    target = load_target("smollm2-135m-instruct", dtype="bfloat16", threads=2, measure=False)
    model = target.model
    seqs = []
    bf16_nll, bf16_argmax = [], []
    for category, text in dev_prompts(a.questions, a.per_category):
        prompt = target.encode_prompt(text)
        with torch.inference_mode():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=a.tokens, do_sample=False)
            seq = out[0].tolist()
            logits = model(torch.tensor([seq])).logits[0].float()
        n = len(prompt)
        cont = torch.tensor(seq[n:])
        logp = torch.log_softmax(logits[n - 1:-1], -1)
        bf16_nll.append(-logp.gather(1, cont[:, None]).squeeze(1))
        bf16_argmax.append(logits[n - 1:-1].argmax(-1))
        seqs.append((category, n, seq))
    nll_all = torch.cat(bf16_nll)
    result = {"dev_questions": len(seqs), "tokens": a.tokens, "reference": "bfloat16 transformers (greedy writer)",
              "bfloat16": {"perplexity": round(math.exp(float(nll_all.mean())), 4), "top1_agreement": 1.0}}
    print(f"{'weights':<16} {'top-1 agree':>11} {'perplexity':>10}")
    print(f"{'bfloat16':<16} {1.0:>11.4f} {result['bfloat16']['perplexity']:>10.4f}")
    for name, path in ggufs.items():
        llama = LlamaModel(Path(path))
        ctx = LlamaContext(llama, 2048, 512, 2)
        agree = total = 0
        nll = []
        for (_category, n, seq), ref in zip(seqs, bf16_argmax):
            ctx.clear()
            rows = []
            for i in range(0, len(seq), 512):
                chunk = seq[i:i + 512]
                rows.append(ctx.decode(chunk, list(range(i, i + len(chunk)))))
            logits = torch.cat(rows)[n - 1:-1]
            cont = torch.tensor(seq[n:])
            nll.append(-torch.log_softmax(logits, -1).gather(1, cont[:, None]).squeeze(1))
            agree += int((logits.argmax(-1) == ref).sum())
            total += len(cont)
        ppl = math.exp(float(torch.cat(nll).mean()))
        result[name] = {"file": Path(path).name, "perplexity": round(ppl, 4), "top1_agreement": round(agree / total, 4)}
        print(f"{name:<16} {agree / total:>11.4f} {ppl:>10.4f}")
        ctx.close()
    if a.out:
        a.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
