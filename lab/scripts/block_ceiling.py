"""Issue 66 must-show c: beside each block strategy of a ``specframe bench`` run, the ceiling of its block size — the
speed it would reach if every draft were accepted at the step cost it paid — so a miss shows whether τ or the step
cost is short.

    python lab/scripts/block_ceiling.py bench-block/results.json [--reference llamacpp-greedy]

For a strategy whose proposers include a block drafter of ``b`` drafts (``dflash``: the drafter's ``block_size -
1``, read from its checkpoint, or ``k``; ``draft-model`` with ``k``), measured at ``S`` target forwards per second
over the run: ceiling tok/s = ``(b + 1) * S`` (every step committing the whole block and the bonus token at the
measured step cost). An honest upper bound only for the step cost measured: a step whose block were all accepted
would verify the same nodes, so its cost is the same (the router's trims aside). A strategy whose router ran the
block drafter in fewer than 90 % of its steps gets no ceiling (its steps cost what the other proposers' do): read
the ceiling of the same drafter with ``router: none``. Prints a Markdown table: τ,
tok/s, the ratio to the reference, the ceiling and its ratio, per strategy and per category for the best one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def block_drafts(proposers: list) -> tuple[int, str]:
    """The block's drafts of a strategy's block drafter and its proposer name, or ``(0, "")`` when it has none."""
    for p in proposers or []:
        if not isinstance(p, dict):
            continue
        if p.get("name") == "dflash":
            if p.get("k"):
                return int(p["k"]), "dflash"
            cfg = json.loads((Path(p["checkpoint"]) / "config.json").read_text())
            block = cfg.get("block_size") or cfg.get("dflash_config", {}).get("block_size")
            return int(block) - 1, "dflash"
        if p.get("name") == "draft-model" and p.get("k"):
            return int(p["k"]), "draft-model"
    return 0, ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--reference", default="llamacpp-greedy")
    args = ap.parse_args()
    doc = json.loads(args.results.read_text())
    summary = doc["summary"]["strategies"]
    ref = summary[args.reference]["by_column"]["overall"]["tokens_per_s"]
    print(f"reference {args.reference}: {ref:.1f} tok/s\n")
    print("| strategy | block drafts b | τ | tok/s | × reference | ceiling tok/s ((b + 1) · steps/s) | ceiling × reference |")
    print("|---|---|---|---|---|---|---|")
    for s in doc["config"]["strategies"]:
        o = summary.get(s["name"], {}).get("by_column", {}).get("overall")
        if o is None:
            continue
        b, name = block_drafts(s.get("proposers") or [])
        steps_s = o["target_forwards"] / o["wall_s"]
        share = summary[s["name"]].get("attribution", {}).get(name, {}).get("run_share", 1.0) if b else 0.0
        if not b:
            ceiling = "- | -"
        elif share < 0.9:  # the router left it out of most steps: their cost is not a block step's
            ceiling = f"- (the drafter ran in {share:.0%} of steps) | -"
        else:
            ceiling = f"{(b + 1) * steps_s:.1f} | {(b + 1) * steps_s / ref:.2f}×"
        print(f"| {s['name']} | {b or '-'} | {o['tau']:.2f} | {o['tokens_per_s']:.1f} | {o['tokens_per_s'] / ref:.2f}× "
              f"| {ceiling} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
