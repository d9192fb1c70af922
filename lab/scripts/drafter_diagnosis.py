"""Why the learned drafters accept little on the dev set: teacher-forced acceptance of eagle and medusa, broken
down by context length, category, position in the answer, feature dtype and where the features come from.

For each prompt the target decodes its greedy answer one token at a time (1-token forwards, as a step verifying no
draft does live), keeping the hidden states it computes ("live" features); then one forward over prompt + answer
gives the same positions' hidden states as training computes them ("full" features). At every answer position ``p``
the drafters predict token ``p`` from what a live step would give them (features up to position ``p - 2`` and token
``p - 1``; see plugins/eagle.py, plugins/medusa.py):

- ``eagle`` first position: the drafter's top-1 (and whether the target's token is in its top-4, the first tree
  level) after catching up on the features; depth 2 / 3: its own unrolled passes (EAGLE-3 training-time test,
  :meth:`EagleDrafter.unrolled`), counted where the previous depth was right;
- ``medusa`` head 0 on the last layer's hidden state.

No speculation runs, so nothing here is timed; each record is one prompt (resumable: prompts already in the output
file are skipped).

    python lab/scripts/drafter_diagnosis.py --questions ../shared/specbench/question.jsonl --limit-per-category 5 \\
        --dtype float32 --output lab/results/drafter-diagnosis/dev-fp32.jsonl
    python lab/scripts/drafter_diagnosis.py --corpus-held-out 40 --dtype float32 \\
        --output lab/results/drafter-diagnosis/mix-fp32.jsonl       # the training mix, records not trained on
    python lab/scripts/drafter_diagnosis.py --summary lab/results/drafter-diagnosis/*.jsonl
    # another EAGLE drafter (e.g. one `specframe train eagle` wrote): --eagle DIR

Record fields: ``id``, ``category``, ``prompt_len``, ``answer`` (token ids), and per feature source (``live``,
``full``) and drafter lists over the answer positions: ``eagle1`` (top-1 right), ``eagle_top4``, ``eagle2``,
``eagle3`` (unrolled depth right, -1 where the depth before was wrong), ``medusa1``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import torch

BINS = [(0, 256), (256, 512), (512, 1024), (1024, 2048), (2048, 8192)]


def _prompts(args: argparse.Namespace, target) -> list[dict]:
    if args.questions:
        from specframe.bench.runner import category_group, select_questions
        from specframe.io.prompts import read_prompts

        qs = select_questions(read_prompts(args.questions), None, args.limit_per_category)
        return [{"id": q.question_id, "category": category_group(q.category), "ids": target.encode_prompt(q.text)}
                for q in qs]
    corpus = Path(__file__).resolve().parents[2] / "lab/data/smollm2-135m-instruct/corpus"
    out, seen = [], 0
    for shard in sorted(corpus.glob("shard-*.jsonl.gz")):
        for line in gzip.open(shard, "rt"):
            rec = json.loads(line)
            seen += 1
            if seen <= args.skip_records or rec.get("turn", 1) != 1:
                continue
            if (seen - args.skip_records) % args.stride == 0:
                out.append({"id": rec["id"], "category": f"mix:{rec['source']}", "ids": rec["prompt_ids"]})
            if len(out) >= args.corpus_held_out:
                return out
    return out


@torch.inference_mode()
def _decode(target, ids: list[int], n: int, layers: tuple[int, ...]) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """Greedy answer of ``n`` tokens by 1-token forwards; returns (answer, live features [A, F, H] of the positions
    ``len(ids) - 1 .. len(ids) + A - 2``, live last hidden [A, H] of the same positions)."""
    cache = target.new_cache()
    x = torch.tensor([ids])
    logits, _, _ = target.forward_features(x[:, :-1], cache, layers, logits_to_keep=1)
    answer, feats, hidden = [], [], []
    newest = x[:, -1:]
    eos = target.eos_token_ids
    for _ in range(n):
        logits, h, f = target.forward_features(newest, cache, layers, want_hidden=True)
        tok = int(logits[0, -1].float().argmax())
        feats.append(f[0, -1])
        hidden.append(h[0, -1])
        answer.append(tok)
        if tok in eos:
            break
        newest = torch.tensor([[tok]])
    return answer, torch.stack(feats), torch.stack(hidden)


@torch.inference_mode()
def _score(eagle, medusa, target, tokens: torch.Tensor, feats: torch.Tensor, hidden: torch.Tensor, start: int) -> dict:
    """Teacher-forced predictions of tokens ``start .. T-1`` (``tokens [T]``) from features of positions ``0..T-2``
    (``feats [T-1, F, H]``, ``hidden [T-1, H]``)."""
    d = eagle["drafter"]
    dtype = d.fuse.weight.dtype
    g = d.fuse_features(feats[None].to(dtype))  # [1, T-1, H]
    emb = eagle["embed"](tokens[None, 1:]).to(dtype)  # token after each position
    outs = d.unrolled(g, emb, 3)  # pass j at index t predicts token t + 2
    tm = eagle["token_map"]
    preds = [tm[d.logits(o[0], eagle["rows"]).float().topk(4, -1).indices] for o in outs]  # [T-1, 4] each
    res: dict[str, list[int]] = {"eagle1": [], "eagle_top4": [], "eagle2": [], "eagle3": [], "medusa1": []}
    h = hidden.to(medusa["dtype"])
    mlog = medusa["heads"](h[None])[0, :, 0]  # [T-1, S] or features, head 0
    mlog = mlog @ medusa["w"].T if medusa["w"] is not None else medusa["lm_head"](mlog)
    mpred = mlog.float().argmax(-1)
    if medusa["map"] is not None:
        mpred = medusa["map"][mpred]
    for p in range(start, tokens.shape[0]):
        t = p - 2  # the index whose drafter output predicts token p
        if t < 0:
            continue
        want = int(tokens[p])
        r1 = int(preds[0][t, 0]) == want
        res["eagle1"].append(int(r1))
        res["eagle_top4"].append(int(want in preds[0][t].tolist()))
        # depth 2: real features end at t, own output at t + 1 predicts token p + 1 (pass 2 at index t + 1)
        if p + 1 < tokens.shape[0] and t + 1 < preds[1].shape[0]:
            r2 = r1 and int(preds[1][t + 1, 0]) == int(tokens[p + 1])
            res["eagle2"].append(int(r2) if r1 else -1)
            if p + 2 < tokens.shape[0] and t + 2 < preds[2].shape[0]:
                res["eagle3"].append((int(preds[2][t + 2, 0]) == int(tokens[p + 2])) if r2 else -1)
        res["medusa1"].append(int(int(mpred[t]) == want))
    return res


def _load(args: argparse.Namespace):
    import logging

    from transformers.utils import logging as hf_logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    hf_logging.disable_progress_bar()
    from specframe.learned.eagle_drafter import EagleDrafter
    from specframe.learned.medusa_heads import MedusaHeads
    from specframe.target.loader import load_target

    target = load_target("smollm2-135m-instruct", args.dtype, "cpu", threads=args.threads, prepack=False)
    weights = Path(__file__).resolve().parents[2] / "plugins/weights/smollm2-135m-instruct"
    head = target.model.get_output_embeddings().weight
    folder = Path(args.eagle) if args.eagle else weights / "eagle"
    drafter = EagleDrafter.load(folder, int(head.shape[1]), target.vocab_size).to(dtype=target.dtype)
    tm = drafter.token_map
    eagle = {"drafter": drafter, "embed": target.model.get_input_embeddings(), "token_map": tm,
             "rows": head.detach()[tm].to(target.dtype)}
    heads = MedusaHeads.load(weights / "medusa", int(head.shape[1])).to(dtype=target.dtype)
    mmap = getattr(heads, "token_map", None)
    medusa = {"heads": heads, "dtype": target.dtype, "map": mmap,
              "w": head.detach()[mmap].to(target.dtype) if mmap is not None else None,
              "lm_head": target.model.get_output_embeddings()}
    return target, eagle, medusa


def run(args: argparse.Namespace) -> None:
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.exists():
        done = {json.loads(line)["id"] for line in out.read_text().splitlines() if line.strip()}
    target, eagle, medusa = _load(args)
    layers = tuple(sorted(set(eagle["drafter"].spec.feature_layers) | {target.model.config.num_hidden_layers}))
    fcols = [layers.index(i) for i in eagle["drafter"].spec.feature_layers]
    prompts = _prompts(args, target)
    for n, item in enumerate(prompts, 1):
        if item["id"] in done:
            continue
        ids = item["ids"]
        answer, live_f, live_h = _decode(target, ids, args.max_new_tokens, layers)
        tokens = torch.tensor(ids + answer)
        # full: one forward over everything but the newest token, as training computes features
        cache = target.new_cache()
        _, h_full, f_full = target.forward_features(tokens[None, :-1], cache, layers, want_hidden=True)
        f_full, h_full = f_full[0][:, fcols], h_full[0]
        start = len(ids)
        rec = {"id": item["id"], "category": item["category"], "prompt_len": len(ids), "answer": answer,
               "dtype": args.dtype}
        rec["full"] = _score(eagle, medusa, target, tokens, f_full, h_full, start)
        # live: the prompt's positions from the prefill (as live), the answer's from its 1-token forwards
        f_live, h_live = f_full.clone(), h_full.clone()
        a = live_f.shape[0]
        f_live[start - 1 : start - 1 + a] = live_f[: f_live.shape[0] - start + 1, fcols][: a]
        h_live[start - 1 : start - 1 + a] = live_h[: h_live.shape[0] - start + 1][: a]
        rec["live"] = _score(eagle, medusa, target, tokens, f_live, h_live, start)
        rec["feature_gap"] = float((live_f[: f_full.shape[0] - start + 1, fcols].float()
                                    - f_full[start - 1 :].float()).abs().max())
        with out.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")
        r = rec["live"]
        print(f"[{n}/{len(prompts)}] {item['category']} {item['id']}: prompt {len(ids)}, answer {len(answer)}, "
              f"eagle1 {sum(r['eagle1']) / max(len(r['eagle1']), 1):.2f}, medusa1 "
              f"{sum(r['medusa1']) / max(len(r['medusa1']), 1):.2f}", flush=True)


def _rate(xs: list[int]) -> tuple[float, int]:
    v = [x for x in xs if x >= 0]
    return (sum(v) / len(v) if v else float("nan")), len(v)


def summary(paths: list[str]) -> None:
    """Markdown tables of the records: by category, by context length bin, by position in the answer."""
    for path in paths:
        recs = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        if not recs:
            continue
        print(f"\n### {path} ({len(recs)} prompts, {recs[0]['dtype']})\n")
        print("| group | positions | eagle top-1 live | full | eagle in top-4 | depth 2 given 1 | depth 3 given 2 | "
              "medusa head 0 live | full |")
        print("|---|---|---|---|---|---|---|---|---|")
        groups: dict[str, list[tuple[dict, int, int]]] = {}
        for r in recs:
            n = len(r["live"]["eagle1"])
            for i in range(n):
                ctx = r["prompt_len"] + i
                b = next(f"context {lo}-{hi}" for lo, hi in BINS if lo <= ctx < hi)
                pos = "answer 0-31" if i < 32 else ("answer 32-63" if i < 64 else "answer 64+")
                for key in ("all", r["category"], b, pos):
                    groups.setdefault(key, []).append((r, i, 0))
        order = ["all"] + sorted(k for k in groups if not k.startswith(("context", "answer", "all"))) + \
            [k for lo, hi in BINS for k in [f"context {lo}-{hi}"] if k in groups] + \
            [k for k in ("answer 0-31", "answer 32-63", "answer 64+") if k in groups]
        for key in order:
            rows = groups[key]

            def col(src: str, name: str) -> str:
                vals = [r[src][name][i] for r, i, _ in rows if i < len(r[src][name])]
                rate, _ = _rate(vals)
                return f"{rate:.2f}"

            print(f"| {key} | {len(rows)} | {col('live', 'eagle1')} | {col('full', 'eagle1')} | "
                  f"{col('live', 'eagle_top4')} | {col('live', 'eagle2')} | {col('live', 'eagle3')} | "
                  f"{col('live', 'medusa1')} | {col('full', 'medusa1')} |")
        gaps = [r["feature_gap"] for r in recs]
        print(f"\nlargest |live - full| feature difference per prompt: median {sorted(gaps)[len(gaps) // 2]:.3g}, "
              f"max {max(gaps):.3g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", help="Spec-Bench question.jsonl")
    ap.add_argument("--limit-per-category", type=int, default=5)
    ap.add_argument("--corpus-held-out", type=int, default=0, help="records of the training mix not trained on")
    ap.add_argument("--skip-records", type=int, default=13000, help="corpus records the shipped drafters trained on")
    ap.add_argument("--stride", type=int, default=97, help="take every N-th record after the skipped ones")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--eagle", help="EAGLE drafter folder (default: the shipped one)")
    ap.add_argument("--output")
    ap.add_argument("--summary", nargs="*")
    args = ap.parse_args()
    if args.summary:
        summary(args.summary)
        return
    if not args.output or not (args.questions or args.corpus_held_out):
        sys.exit("error: give --output and --questions or --corpus-held-out (or --summary FILES)")
    run(args)


if __name__ == "__main__":
    main()
