"""Per-token cost of the shipped learned proposers vs one target forward (issue 5: the draft must cost <= 1/8).

    python lab/scripts/draft_cost.py --dtype bfloat16 --context 256 --repeats 50

Times, at a context of ``--context`` tokens (median of ``--repeats``): one target forward of 1 token with a KV
cache; one draft-model forward of 1 token with its own KV cache; one Medusa proposal (heads + LM head + tree).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specframe.contracts import DecodeState
from specframe.sampling import SamplingParams
from specframe.target.kv_cache import new_cache, rollback
from specframe.target.loader import load_target
from specframe_plugins.draft_model import DraftModelConfig, DraftModelProposer
from specframe_plugins.medusa import MedusaConfig, MedusaProposer


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    target = load_target("smollm2-135m-instruct", dtype=args.dtype)
    ids = torch.randint(100, 20000, (1, args.context), generator=torch.Generator().manual_seed(0))

    cache = target.new_cache()
    target.forward(ids, cache, logits_to_keep=1)
    one = ids[:, :1]

    def target_step():
        target.forward(one, cache)
        rollback(cache, args.context)

    t_target = median_ms(target_step, args.repeats)
    dm = DraftModelProposer(DraftModelConfig(), target.info)
    dcache = new_cache(dm.draft.config)
    dm.draft(ids, dcache)

    def draft_step():
        dm.draft(one, dcache)
        rollback(dcache, args.context)

    t_draft = median_ms(draft_step, args.repeats)
    med = MedusaProposer(MedusaConfig(), target.info)
    _, hidden = target.forward(ids[:, -1:], target.new_cache(), want_hidden=True)
    state = DecodeState(ids, args.context, SamplingParams(), torch.Generator(), hidden[:, -1])
    t_medusa = median_ms(lambda: med.propose(state, 16), args.repeats)
    print(f"context {args.context}, {args.dtype}, {torch.get_num_threads()} threads, median of {args.repeats}:")
    print(f"  target forward, 1 token:        {t_target:6.2f} ms")
    print(f"  draft-model forward, 1 token:   {t_draft:6.2f} ms  = 1/{t_target / t_draft:.1f} of the target")
    print(f"  medusa proposal (16-node tree): {t_medusa:6.2f} ms  = 1/{t_target / t_medusa:.1f} of the target")


if __name__ == "__main__":
    main()
