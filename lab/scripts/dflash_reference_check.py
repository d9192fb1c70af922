"""The ``dflash`` proposer against the reference decoding loop (issue 66, must-show a): the same target and the same
DFlash / DFlash2 drafter folder decode the same dev questions in specframe and in the ``dflash`` package's
``dflash_generate``, fp32 greedy, with the same output and the same acceptance length at every step.

    # the reference, beside the venv (not a specframe requirement; its pinned deps are not needed):
    .venv/bin/pip install --no-deps --target /tmp/dflash-ref dflash==0.1.0
    PYTHONPATH=/tmp/dflash-ref .venv/bin/python lab/scripts/dflash_reference_check.py --drafter DIR \
        [--model smollm2-135m-instruct] [--limit 12] [--per-category 2] [--max-new-tokens 128] [--k K] [--output OUT]

``--drafter``: a folder in z-lab's layout (``config.json`` + ``model.safetensors``) made for ``--model``; ``--k``:
draft rows per step (the reference runs with ``block_size = k + 1``; default: the drafter's block). Questions: the
first turn of each, chat template, first ``--per-category`` per report column, ``--limit`` in all (the selection
``scripts/drafter_vllm_check.py`` uses). Prints one line per question and a summary; writes ``OUT/report.json``
(per question: prompt ids, both outputs, both acceptance-length lists, whether they agree) when ``--output`` is
given. Exit code 1 on any difference.

Alignment: ``dflash_generate`` takes its first token from the prefill and drafts from then on; specframe's engine
prefills all but the last prompt token, so the proposer runs with ``first_step: false`` (a target-only first step
commits that same token) and specframe's steps after the first are compared with the reference's
``acceptance_lengths`` (tokens committed per step: accepted drafts + the target's token, cut at a stop or at the
token budget). ``router: none``, so every step verifies the whole block. On a machine without CUDA the reference's
timing helper (``torch.cuda.synchronize``) is replaced by ``time.perf_counter``; nothing is timed here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

DEFAULT_QUESTIONS = Path(__file__).resolve().parents[3] / "shared" / "specbench" / "question.jsonl"


def reference(folder: Path) -> tuple[object, object]:
    """``(dflash.model module, its drafter for folder in float32)``; exits with one line when the package is absent."""
    import torch

    try:
        import dflash.model as ref
    except ImportError as e:
        raise SystemExit(f"error: the reference is not importable ({e}): pip install --no-deps --target "
                         f"/tmp/dflash-ref dflash==0.1.0 and run with PYTHONPATH=/tmp/dflash-ref") from None
    if not torch.cuda.is_available():
        ref._cuda_time = time.perf_counter  # (it synchronizes CUDA around its timers)
    config = json.loads((folder / "config.json").read_text())
    cls = ref.DFlash2DraftModel if "DFlash2" in " ".join(config.get("architectures") or []) else ref.DFlashDraftModel
    return ref, cls.from_pretrained(str(folder)).float().eval()


def load_specframe(model: str, threads: int):
    """specframe with an observer of each step's committed tokens (and the dflash plugin, when the installed
    metadata predates its entry point)."""
    import specframe
    from specframe import hookimpl
    from specframe.services import build_registry

    class Steps:
        def __init__(self) -> None:
            self.committed: list[int] = []
            self.drafted: list[int] = []

        @hookimpl
        def specframe_observe_step(self, event) -> None:
            self.committed.append(len(event.committed))
            self.drafted.append(int(event.drafted))

    obs = Steps()
    registry = build_registry(extra_plugins=(obs,))
    if "dflash" not in registry.proposers:
        import specframe_plugins.dflash

        registry = build_registry(extra_plugins=(obs, specframe_plugins.dflash))
    sf = specframe.load(model=model, dtype="float32", threads=threads, prepack=False, registry=registry)
    return sf, obs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", type=Path, required=True)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args()

    import torch

    from specframe.bench.runner import select_questions
    from specframe.io.prompts import read_prompts

    ref, drafter = reference(args.drafter)
    sf, obs = load_specframe(args.model, args.threads)
    target = sf.target.model
    eos = sorted(sf.target.eos_token_ids) or None
    entry = {"name": "dflash", "checkpoint": str(args.drafter), "first_step": False,
             **({"k": args.k} if args.k else {})}
    prompts = select_questions(read_prompts(args.questions), None, args.per_category)[: args.limit]
    rows, bad = [], 0
    for p in prompts:
        ids = sf.encode(p.text)
        obs.committed, obs.drafted = [], []
        rec = sf.generate(ids, proposers=[entry], max_new_tokens=args.max_new_tokens, temperature=0.0, router="none")
        ours_steps = list(obs.committed)
        out = ref.dflash_generate(drafter, target, torch.tensor([ids], device=target.device), args.max_new_tokens,
                                  eos, block_size=None if args.k is None else args.k + 1, return_stats=True)
        theirs = out.output_ids[0, len(ids):].tolist()
        theirs_steps = [int(n) for n in out.acceptance_lengths]
        same_tokens = rec["token_ids"] == theirs
        same_steps = ours_steps[:1] == [1] and ours_steps[1:] == theirs_steps
        bad += not (same_tokens and same_steps)
        tau = len(theirs) / max(1, len(theirs_steps) + 1)
        rows.append({"question_id": p.question_id, "category": p.category, "prompt_ids": ids,
                     "specframe": {"token_ids": rec["token_ids"], "steps": ours_steps},
                     "reference": {"token_ids": theirs, "steps": theirs_steps},
                     "same_tokens": same_tokens, "same_steps": same_steps})
        print(json.dumps({"question_id": p.question_id, "category": p.category, "tokens": len(theirs),
                          "steps": len(theirs_steps), "tau_reference": round(tau, 3), "same_tokens": same_tokens,
                          "same_steps": same_steps}), flush=True)
    print(f"{len(rows) - bad}/{len(rows)} questions with the same output and the same acceptance length at every step",
          file=sys.stderr)
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "report.json").write_text(json.dumps(rows) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
