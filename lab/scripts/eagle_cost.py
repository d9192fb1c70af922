"""What one eagle proposal costs, against one target forward: the steady state of a decode step (the drafter
catches up on the newest committed position, then drafts its tree), at several context lengths.

    python lab/scripts/eagle_cost.py [--dtype auto] [--contexts 128,512,1536] [--repeats 30] [--output FILE.json]

For each context T: a real prompt's tokens (Spec-Bench-style text from ``--questions``, repeated to length) are
prefilled once, with the target's features; then, per repeat, the drafter forgets its newest cached position and
``propose`` runs (greedy: the EAGLE-2 dynamic tree, default depth 6, top_k 4, max_nodes 16). Reported, in ms
(median of ``--repeats``): the target's 1-token forward, the whole proposal, the part of it spent in drafter passes
(``EagleDrafter.step``), and the rest (tree bookkeeping, top-k, masks: Python). Uses only the proposer's public
constructor, so it measures any checkout (``PYTHONPATH`` at a folder holding ``specframe`` and
``specframe_plugins``). Run it alone: other processes change the figures more than the code does.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--contexts", default="128,512,1536")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--questions", default="../shared/specbench/question.jsonl")
    ap.add_argument("--output")
    args = ap.parse_args()

    import logging

    from transformers.utils import logging as hf_logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    hf_logging.disable_progress_bar()
    from specframe import DecodeState
    from specframe.sampling import SamplingParams
    from specframe.target.kv_cache import rollback
    from specframe.target.loader import load_target
    from specframe_plugins.eagle import EagleConfig, EagleProposer

    target = load_target("smollm2-135m-instruct", args.dtype, "cpu")
    text = " ".join(json.loads(line)["turns"][0] for line in open(args.questions) if '"summarization"' in line)
    base = target.encode_prompt(text, chat=False)
    p = EagleProposer(EagleConfig(), target.info)
    layers = tuple(sorted(p.feature_layers))
    inner = p.drafter.step
    spent = [0.0]

    def timed_step(*a, **k):
        t0 = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t0

    p.drafter.step = timed_step
    rows = []
    for t in [int(x) for x in args.contexts.split(",")]:
        ids = torch.tensor([(base * (t // len(base) + 1))[:t]])
        cache = target.new_cache()
        _, _, feats = target.forward_features(ids[:, :-1], cache, layers)
        state = DecodeState(ids, t, SamplingParams(), torch.Generator().manual_seed(0), None, feats, layers)
        p.start(state)
        p.propose(state, 16)  # the drafter's cache over the context

        def forget_newest() -> None:
            p._done -= 1  # the drafter forgets its newest position: the next propose catches up on one
            past = getattr(p, "_past", None)  # (the older layout keeps a growing tuple)
            if past is not None:
                p._past = (past[0][:, :, :-1], past[1][:, :, :-1])

        one = ids[:, -1:]
        fwd, prop, inner_s = [], [], []
        for _ in range(3 + args.repeats):
            t0 = time.perf_counter()
            target.forward(one, cache)
            fwd.append(time.perf_counter() - t0)
            rollback(cache, t - 1)
            forget_newest()
            spent[0] = 0.0
            t0 = time.perf_counter()
            draft = p.propose(state, 16)
            prop.append(time.perf_counter() - t0)
            inner_s.append(spent[0])
        med = lambda xs: round(1000 * statistics.median(xs[3:]), 3)  # noqa: E731
        row = {"context": t, "target_1tok_ms": med(fwd), "propose_ms": med(prop), "drafter_passes_ms": med(inner_s),
               "nodes": draft.num_nodes}
        row["other_ms"] = round(row["propose_ms"] - row["drafter_passes_ms"], 3)
        rows.append(row)
        print(f"context {t}: target 1-token forward {row['target_1tok_ms']:.2f} ms; eagle proposal "
              f"{row['propose_ms']:.2f} ms ({row['nodes']} nodes; drafter passes {row['drafter_passes_ms']:.2f}, "
              f"other {row['other_ms']:.2f}) = {row['propose_ms'] / row['target_1tok_ms']:.3f} of a forward",
              flush=True)
    doc = {"dtype": str(target.dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
           "machine": platform.processor() or platform.machine(), "torch": torch.__version__, "rows": rows}
    if args.output:
        with open(args.output, "w") as fh:
            json.dump(doc, fh, indent=1)


if __name__ == "__main__":
    main()
