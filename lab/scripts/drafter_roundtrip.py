"""A drafter exported and reloaded drafts the same: tau and tokens before and after a format round trip.

    python lab/scripts/drafter_roundtrip.py plugins/weights/smollm2-135m-instruct/eagle3 --kind eagle3 \
        --limit-per-category 5 --max-new-tokens 128 --dtype float32

The source folder is exported with ``specframe export`` to every other format of its kind (eagle3: native EAGLE-3,
then back to speculators; medusa: vLLM's layout, then back to FasterDecoding's), each export is read with the proposer's
``checkpoint:`` option, and every dev question (first turn, chat template, greedy, ``router: none`` so whole drafts are
verified every step) is decoded with each. Printed per category: tau of each folder; then the number of questions
whose token ids differ from the source's. Exit code 1 when any tau or token differs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import specframe
from specframe.bench.runner import category_group, select_questions
from specframe.io.prompts import read_prompts

DEFAULT_QUESTIONS = Path(__file__).resolve().parents[3] / "shared" / "specbench" / "question.jsonl"
ROUTES = {"eagle3": ("eagle", ["eagle3", "speculators"]), "medusa": ("medusa", ["vllm-medusa", "medusa"])}


def export(kind: str, src: Path, fmt: str, out: Path, model: str) -> None:
    cmd = [sys.executable, "-m", "specframe", "export", kind, str(src), "--format", fmt, "--output", str(out),
           "--model", model]
    subprocess.run(cmd, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", type=Path)
    ap.add_argument("--kind", choices=sorted(ROUTES), default="eagle3")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    ap.add_argument("--limit-per-category", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()

    proposer, formats = ROUTES[args.kind]
    work = Path(tempfile.mkdtemp(prefix="roundtrip-"))
    folders = {"source": args.source}
    prev = args.source
    for fmt in formats:
        out = work / fmt
        export(args.kind, prev, fmt, out, args.model)
        folders[fmt] = out
        prev = out

    sf = specframe.load(model=args.model, dtype=args.dtype)
    records = select_questions(read_prompts(args.questions), None, args.limit_per_category)
    accepted: dict[str, dict[str, list[int]]] = {name: defaultdict(lambda: [0, 0]) for name in folders}
    tokens: dict[str, list[list[int]]] = {name: [] for name in folders}
    for i, rec in enumerate(records):
        for name, folder in folders.items():  # interleaved: each question decoded with every folder in turn
            r = sf.generate_result(rec.text, proposers=[{"name": proposer, "checkpoint": str(folder)}],
                                   router="none", max_new_tokens=args.max_new_tokens, temperature=0.0)
            row = accepted[name][category_group(rec.category)]
            row[0] += len(r.token_ids)
            row[1] += r.metrics.target_forwards
            tokens[name].append(r.token_ids)
        print(f"[{i + 1}/{len(records)}] {category_group(rec.category)}", file=sys.stderr, flush=True)

    names = list(folders)
    print("| category | " + " | ".join(f"τ {n}" for n in names) + " |")
    print("|---" * (len(names) + 1) + "|")
    same = True
    for cat in accepted["source"]:
        taus = [accepted[n][cat][0] / accepted[n][cat][1] for n in names]
        same &= len({round(t, 6) for t in taus}) == 1
        print(f"| {cat} | " + " | ".join(f"{t:.3f}" for t in taus) + " |")
    for n in names[1:]:
        diff = sum(a != b for a, b in zip(tokens["source"], tokens[n]))
        same &= diff == 0
        print(f"{n}: {diff}/{len(records)} questions with other token ids than the source's")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
