"""Sweep every causal-LM type of the installed transformers through specframe (issue 52 a) and write the table.

    python scripts/decoder_sweep.py [--out lab/results/decoder-sweep] [--tokens 16] [TYPE ...]

Each type's tiny random model (float32) against transformers' own greedy ``generate``, under ``none``, ``ngram``,
``lookahead``, ``layer-skip``, ``early-exit`` and ``retrieval`` (:mod:`specframe.testing.decoder_sweep` says what each cell means).
Rows go to ``rows.jsonl`` as they finish (a rerun skips the types already there: delete the file to start over);
``table.md`` is rewritten from it after each row, with counts per family. Exits 1 when any row has a traceback, a
divergence or lost drafts.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import platform
import sys
import warnings
from dataclasses import asdict
from pathlib import Path

import torch
import transformers

from specframe.testing.decoder_sweep import PROPOSERS, SweepRow, check_type
from specframe.testing.decoder_types import causal_lm_types


def _isa() -> str:
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return platform.machine()
    return " ".join(sorted({f for f in flags if f.startswith(("avx2", "avx512", "amx"))}))


def write_table(rows: list[SweepRow], path: Path) -> None:
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in rows:
        counts[r.family or "-"][r.status] += 1
    lines = [f"# Decoder-type sweep (transformers {transformers.__version__}, torch {torch.__version__}, "
             f"{len(rows)} types; ISA {_isa()})", "",
             "| family | " + " | ".join(("exact", "refused", "broken", "unbuildable")) + " |", "|---|---:|---:|---:|---:|"]
    for fam in sorted(counts):
        c = counts[fam]
        lines.append(f"| {fam} | {c['exact']} | {c['refused']} | {c['broken']} | {c['unbuildable']} |")
    lines += ["", "| type | family | status | " + " | ".join(PROPOSERS) + " | reason |",
              "|---|---|---|" + "---|" * len(PROPOSERS) + "---|"]
    for r in sorted(rows, key=lambda r: r.model_type):
        cells = " | ".join(r.cells.get(p, "") for p in PROPOSERS)
        lines.append(f"| {r.model_type} | {r.family} | {r.status} | {cells} | {r.reason.replace('|', '/')} |")
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("types", nargs="*", help="model types (default: every causal-LM type)")
    ap.add_argument("--out", type=Path, default=Path("lab/results/decoder-sweep"))
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "rows.jsonl"
    rows = [SweepRow(**json.loads(line)) for line in store.read_text().splitlines()] if store.exists() else []
    done = {r.model_type for r in rows}
    todo = [t for t in (args.types or causal_lm_types()) if t not in done]
    for i, model_type in enumerate(todo, 1):
        row = check_type(model_type, tokens=args.tokens)
        rows.append(row)
        with store.open("a") as f:
            f.write(json.dumps(asdict(row)) + "\n")
        write_table(rows, args.out / "table.md")
        print(f"[{i}/{len(todo)}] {model_type}: {row.status} {row.reason[:80]}", flush=True)
    write_table(rows, args.out / "table.md")
    bad = [r.model_type for r in rows if not r.ok]
    print(f"{len(rows)} types: " + ", ".join(f"{k} {v}" for k, v in collections.Counter(r.status for r in rows).items())
          + (f"; broken: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
