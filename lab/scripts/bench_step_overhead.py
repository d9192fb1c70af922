"""Per-step cost of the decode loop with the ``none`` proposer on a tiny model (no observer registered).

    python lab/scripts/bench_step_overhead.py --steps 200 --repeats 7            # this checkout
    PYTHONPATH=/path/to/other/checkout python lab/scripts/bench_step_overhead.py  # another version, same script

Uses only the API every version has (``Engine(target, [proposer], verifier).generate``), so two versions can be
compared with one script. Prints one JSON line: the version's location, the median over repeats of the wall time
per verification step and of the loop's own time per step (everything but the target forward), in microseconds.
``--observer`` registers a counting observer (current version only) to show what an observer costs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import specframe
from specframe import DecodeState, DraftTree, ProposerBase, ProposerConfig

try:  # this layout (issue 27's floors) ...
    from specframe.acceptance import GreedyVerifier
    from specframe.decode.engine import Engine
    from specframe.target.hf import Target
except ImportError:  # ... or a checkout from before it
    from specframe.engine import Engine
    from specframe.target import Target
    from specframe.verifiers import GreedyVerifier


class NoProposer(ProposerBase):  # the built-in `none`, inlined so that any checkout can run this script
    name = "none"

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        return DraftTree.empty(state.tokens.shape[0])


def tiny_target() -> Target:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return Target(LlamaForCausalLM(config).float().eval(), None, name="tiny")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--observer", action="store_true", help="register a counting step observer")
    args = ap.parse_args()
    torch.set_num_threads(1)
    target = tiny_target()
    engine = Engine(target, [NoProposer(ProposerConfig(name="none"), target.info)], GreedyVerifier())
    kwargs = {}
    if args.observer:
        from specframe import hookimpl
        from specframe.registry import build_registry

        class Count:
            n = 0

            @hookimpl
            def specframe_observe_step(self, event) -> None:
                Count.n += 1

        registry = build_registry(entry_points=False, extra_plugins=(Count(),))
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    engine.generate(prompt, max_new_tokens=20)  # warm-up
    per_step, loop_only = [], []
    for _ in range(args.repeats):
        if args.observer:
            kwargs["observer"] = registry.observers()
        t0 = time.perf_counter()
        result = engine.generate(prompt, max_new_tokens=args.steps, **kwargs)
        wall = time.perf_counter() - t0
        m = result.metrics
        assert m.target_forwards == args.steps
        per_step.append((wall - m.prefill_s) / m.target_forwards * 1e6)
        loop_only.append((wall - m.prefill_s - m.forward_s) / m.target_forwards * 1e6)
    print(json.dumps({
        "specframe": specframe.__file__.rsplit("/specframe/", 1)[0],
        "observer": args.observer,
        "steps": args.steps,
        "repeats": args.repeats,
        "median_us_per_step": round(statistics.median(per_step), 1),
        "median_loop_us_per_step": round(statistics.median(loop_only), 1),
        "all_us_per_step": [round(x, 1) for x in per_step],
    }))


if __name__ == "__main__":
    main()
