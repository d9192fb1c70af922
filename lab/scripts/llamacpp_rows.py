"""Is row i of a k-token llama.cpp batch bit-identical to one-token decoding? (docs/llamacpp.md, "Exactness")

For each context length c: prefill c tokens, decode the next 16 one at a time (the reference rows), roll back, then
decode them as one k-token batch for each k and compare every row with its reference, bit for bit; again after a
rollback (the batch decoded twice), and with the k tokens as one branch of a two-branch token tree (sequence ids).
Prints a table (k x context: rows equal / rows, the largest |logit difference|) and writes JSON with --output.

    python lab/scripts/llamacpp_rows.py --model smollm2-135m-instruct --output rows.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys

import torch


def prefill(ctx, ids):
    for i in range(0, len(ids), ctx.n_batch):
        chunk = ids[i:i + ctx.n_batch]
        ctx.decode(chunk, list(range(i, i + len(chunk))), logits="last")


def compare(rows: torch.Tensor, ref: torch.Tensor) -> tuple[int, float]:
    equal = sum(bool(torch.equal(rows[i], ref[i])) for i in range(rows.shape[0]))
    return equal, float((rows - ref).abs().max())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or .gguf file")
    ap.add_argument("--ks", default="1,2,4,8,16")
    ap.add_argument("--contexts", default="100,500,1500,2000")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--output", default=None, help="write the table as JSON here")
    a = ap.parse_args()
    from specframe.target.llamacpp.binding import LlamaContext, LlamaModel, build_info
    from specframe.target.machine import fingerprint
    from specframe.target.models import resolve_model

    ks = [int(x) for x in a.ks.split(",")]
    contexts = [int(x) for x in a.contexts.split(",")]
    source = resolve_model(a.model)
    model = LlamaModel(source.gguf)
    build = build_info()
    ctx = LlamaContext(model, max(contexts) + 64, 512, a.threads, n_seq_max=4)
    rng = random.Random(0)
    table = []
    print(f"llama.cpp build: {build.to_dict()}\nmachine: {fingerprint().get('cpu')} {fingerprint().get('isa')}")
    print(f"{'context':>7} {'k':>3} {'batch':>9} {'rerun':>9} {'tree':>9} {'max |diff|':>11}")
    for c in contexts:
        ids = [rng.randrange(model.n_vocab) for _ in range(c + max(ks))]
        ctx.clear()
        prefill(ctx, ids[:c])
        ref = torch.cat([ctx.decode([ids[c + i]], [c + i]) for i in range(max(ks))])
        ctx.remove(0, c)
        for k in ks:
            block, pos = ids[c:c + k], list(range(c, c + k))
            first = ctx.decode(block, pos)
            ctx.remove(0, c)
            again = ctx.decode(block, pos)
            ctx.remove(0, c)
            # the same k tokens as branch 0 of a tree whose branch 1 (k other tokens) comes first in the batch
            other = [rng.randrange(model.n_vocab) for _ in range(k)]
            ctx.copy_seq(0, 1)
            tree = ctx.decode(other + block, pos + pos, [(1,)] * k + [(0,)] * k)[k:]
            ctx.remove(-1, c)
            ctx.keep_seq(0)
            eq1, d1 = compare(first, ref[:k])
            eq2, d2 = compare(again, ref[:k])
            eq3, d3 = compare(tree, ref[:k])
            table.append({"context": c, "k": k, "batch_equal": eq1, "rerun_equal": eq2, "tree_equal": eq3,
                          "rows": k, "max_abs_diff": max(d1, d2), "tree_max_abs_diff": d3})
            print(f"{c:>7} {k:>3} {eq1:>4}/{k:<4} {eq2:>4}/{k:<4} {eq3:>4}/{k:<4} {max(d1, d2):>11.4g}"
                  f"{'' if d3 == 0 else f'  (tree {d3:.3g})'}")
    if a.output:
        with open(a.output, "w") as f:
            json.dump({"build": build.to_dict(), "machine": fingerprint(), "threads": a.threads, "rows": table}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
