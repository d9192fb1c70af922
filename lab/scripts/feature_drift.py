"""How far a trace's recorded hidden states are from those a live speculative run computes, and how often that
changes a Medusa draft. Used for docs/replay.md ("Feature-based proposers").

A trace records the last hidden state at each committed position from the recording run's forwards (1-token
forwards when recorded with ``none``). Live, medusa gets it from its own verification forward: the newest token
and a token tree scored together (a tree mask, several rows). Same maths, other matrix shapes, so float rounding may
differ. For every recorded position this script scores the true continuation in blocks of ``--block`` tokens with
``--distractors`` extra tree nodes (siblings, as a medusa tree has), compares the rows' hidden states with the
recorded ones, and asks the medusa proposer for a draft from each.

    .venv/bin/python lab/scripts/feature_drift.py --traces traces/dev-fp32 [--block 3 --distractors 3]

The trace must hold the last hidden state (specframe trace record --features-for medusa).
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", required=True)
    ap.add_argument("--block", type=int, default=3, help="true continuation tokens per scored block")
    ap.add_argument("--distractors", type=int, default=3, help="extra tree nodes (children of the block's first node)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import specframe
    from specframe import DecodeState
    from specframe.replay.trace import read_trace
    from specframe.sampling import SamplingParams
    from specframe.target.kv_cache import rollback
    from specframe.token_tree import tree_attention_mask, tree_position_ids
    from specframe_plugins.medusa import MedusaConfig, MedusaProposer

    trace = read_trace(args.traces)
    import logging

    from transformers.utils import logging as hf_logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    hf_logging.disable_progress_bar()
    sf = specframe.load(model=trace.model, dtype=trace.dtype, threads=args.threads, prepack=False,
                        proposers=[{"name": "medusa"}])
    target = sf.target
    layer = int(trace.manifest["target"]["num_hidden_layers"])
    if layer not in trace.feature_layers:
        raise SystemExit("the trace holds no last hidden state: record it with --features-for medusa")
    medusa = MedusaProposer(MedusaConfig(), target.info)
    diffs, rels, same, total = [], [], 0, 0
    with torch.inference_mode():
        for q in trace.questions:
            tokens = q.tokens
            start, recorded = q.features[layer]
            cache = target.new_cache()
            p0 = len(q.prompt) - 1
            target.forward(torch.tensor([tokens[:p0]]), cache, logits_to_keep=1)
            while p0 < len(tokens) - 1:
                block = tokens[p0 : min(p0 + args.block, len(tokens) - 1)]
                k = len(block)
                # draft nodes: the chain block[1:], then siblings of its first node (children of the newest token)
                parent = list(range(-1, k - 2)) + [-1] * args.distractors
                extra = [(block[min(1, k - 1)] + 1 + i) % target.vocab_size for i in range(args.distractors)]
                ids = torch.tensor([block + extra])
                mask = tree_attention_mask(parent, p0, target.dtype, target.device)
                pos = tree_position_ids(parent, p0, target.device)
                _, hidden = target.forward(ids, cache, want_hidden=True, attention_mask=mask, position_ids=pos)
                rollback(cache, p0 + k)
                for i in range(k):
                    p = p0 + i
                    live, rec = hidden[:, i], recorded[p - start][None]
                    diffs.append(float((live - rec).abs().max()))
                    rels.append(diffs[-1] / float(rec.abs().max()))
                    state = lambda h: DecodeState(torch.tensor([tokens[: p + 2]]), len(q.prompt), SamplingParams(),  # noqa: E731
                                                  torch.Generator(), h)
                    a, b = medusa.propose(state(live), 64), medusa.propose(state(rec), 64)
                    same += int(torch.equal(a.token_ids, b.token_ids) and torch.equal(a.parent, b.parent))
                    total += 1
                p0 += k
    diffs_t = torch.tensor(diffs)
    print(f"{total} positions of {len(trace.questions)} questions ({trace.model}, {trace.dtype}); blocks of {args.block} "
          f"+ {args.distractors} tree nodes vs the recorded hidden states")
    print(f"max |difference|: {diffs_t.max():.3g} (median {diffs_t.median():.3g}); max relative {max(rels):.3g}")
    print(f"medusa drafts identical at {same} of {total} positions ({100 * same / total:.1f} %)")


if __name__ == "__main__":
    main()
