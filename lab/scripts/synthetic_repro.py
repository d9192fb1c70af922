"""Issue 67 must-show b: does synthetic acceptance set to a strategy's recorded profile reproduce its speed?

    python lab/scripts/synthetic_repro.py lab/results/profiles-dev-avx2/synthetic-repro

Reads a bench's results.json where each strategy ``S`` has a twin ``synthetic as S`` (same run) and prints, per
pair: AL per step, decode tokens/s (new tokens over the time after the prefill: what speculation changes) and
end-to-end tokens/s (the bench's, prefill included), each twin against its strategy. The twin never stops at an
end-of-sequence token (it runs to the token limit), so where the strategy stopped early its prefill is spread over
fewer tokens: the decode rate is the like-for-like comparison. Writes OUTPUT/synthetic_repro.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PREFIX = "synthetic as "


def rates(records: list[dict]) -> dict[str, float]:
    tokens = sum(r["metrics"]["new_tokens"] for r in records)
    wall = sum(r["metrics"]["wall_s"] for r in records)
    decode = sum(r["metrics"]["wall_s"] - r["metrics"]["prefill_s"] for r in records)
    steps = sum(r["metrics"]["target_forwards"] for r in records)
    return {"tokens": tokens, "tokens_per_s": tokens / wall, "decode_tokens_per_s": tokens / decode,
            "al": 1 + sum(r["metrics"]["accepted_nodes"] for r in records) / steps, "steps": steps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--tolerance", type=float, default=0.05)
    args = ap.parse_args()
    doc = json.loads((args.folder / "results.json").read_text())
    names = [s["name"] for s in doc["config"]["strategies"]]
    out, bad = [], False
    print("| strategy | AL | twin AL | decode tok/s | twin | Δ | end-to-end tok/s | twin | Δ |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for name in names:
        twin = PREFIX + name
        if twin not in names:
            continue
        a = rates([r for r in doc["records"] if r["strategy"] == name])
        b = rates([r for r in doc["records"] if r["strategy"] == twin])
        d_dec = b["decode_tokens_per_s"] / a["decode_tokens_per_s"] - 1
        d_e2e = b["tokens_per_s"] / a["tokens_per_s"] - 1
        bad |= abs(d_dec) > args.tolerance
        out.append({"strategy": name, "real": a, "synthetic": b, "decode_delta": d_dec, "end_to_end_delta": d_e2e})
        print(f"| {name} | {a['al']:.3f} | {b['al']:.3f} | {a['decode_tokens_per_s']:.2f} | "
              f"{b['decode_tokens_per_s']:.2f} | {100 * d_dec:+.1f} % | {a['tokens_per_s']:.2f} | "
              f"{b['tokens_per_s']:.2f} | {100 * d_e2e:+.1f} % |")
    (args.folder / "synthetic_repro.json").write_text(json.dumps(out, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
