"""Per-step framework overhead of the decode loop, with a target whose forward is nearly free.

    python lab/scripts/step_overhead.py [--requests 12] [--tokens 192] [--repeats 3]

A tiny randomly initialised Llama (2 layers, hidden 64, vocabulary 512; fp32, 1 thread) is the target, so a
step's time is mostly specframe's own: the framework's part of proposing (routing, validation, merging: the
propose time minus the proposers' own draft time), verification + commit + KV keep + feedback (``verify_s``) and
the rest of the loop (``other_s``), in microseconds per step, for plain decoding (``none``), ``ngram``, and two
proposers merged (``ngram`` + ``none``, priority policy). It uses only ``Engine``'s public constructor, so the
same script measures any checkout (``PYTHONPATH`` pointing at another tree's packages). Medians over repeats.
Run it alone: other processes change the figures more than the loop does.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from transformers import LlamaConfig, LlamaForCausalLM

try:  # this layout (issue 27's floors) ...
    from specframe.acceptance import GreedyVerifier
    from specframe.decode.engine import Engine
    from specframe.target.hf import Target
except ImportError:  # ... or a checkout from before it
    from specframe.engine import Engine
    from specframe.target import Target
    from specframe.verifiers import GreedyVerifier
from specframe_plugins.autoregressive import NoneConfig, NoProposer
from specframe_plugins.merge_policies import PriorityConfig, PriorityPolicy
from specframe_plugins.ngram import NgramConfig, NgramProposer


def tiny_target() -> Target:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    return Target(LlamaForCausalLM(cfg).eval())


def engines(target: Target) -> dict[str, Engine]:
    info = target.info
    return {
        "none": Engine(target, [NoProposer(NoneConfig(), info)], GreedyVerifier()),
        "ngram": Engine(target, [NgramProposer(NgramConfig(), info)], GreedyVerifier()),
        "ngram+none": Engine(target, [NgramProposer(NgramConfig(), info), NoProposer(NoneConfig(), info)],
                             GreedyVerifier(), merge=PriorityPolicy(PriorityConfig(), info)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    target = tiny_target()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (24,), generator=g).tolist() for _ in range(args.requests)]
    by: dict[str, list[tuple[float, ...]]] = {}
    for _ in range(args.repeats):
        for name, engine in engines(target).items():  # interleaved: every strategy in every repeat
            engine.generate(prompts[0], max_new_tokens=16)  # warm-up
            tot = dict(steps=0, tokens=0, propose=0.0, draft=0.0, forward=0.0, verify=0.0, other=0.0)
            for p in prompts:
                m = engine.generate(p, max_new_tokens=args.tokens).metrics
                d = m.to_dict()
                tot["steps"] += m.target_forwards
                tot["tokens"] += m.new_tokens
                tot["propose"] += m.propose_s
                tot["draft"] += sum(pm.draft_s for pm in m.proposers.values())
                tot["forward"] += m.forward_s
                tot["verify"] += m.verify_s
                tot["other"] += d["other_s"]
            us = 1e6 / tot["steps"]
            frame = (tot["propose"] - tot["draft"]) * us
            by.setdefault(name, []).append((frame, tot["verify"] * us, tot["other"] * us,
                                            frame + (tot["verify"] + tot["other"]) * us, tot["forward"] * us,
                                            tot["tokens"] / tot["steps"]))
    print("| strategy | framework part of propose (us) | verify+commit+feedback (us) | other (us) | overhead/step (us) "
          "| forward (us) | tau |")
    print("|---|---|---|---|---|---|---|")
    for name, rows in by.items():
        med = [statistics.median(r[i] for r in rows) for i in range(6)]
        print(f"| {name} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} | {med[3]:.1f} | {med[4]:.1f} | {med[5]:.3f} |")


if __name__ == "__main__":
    main()
