"""Does the machine profile give the same choice twice? (issue 67, must-show e: "five profile measurements pick the
same settings or report them as within noise").

Measures the machine profile ``--runs`` times in a row (``specframe.target.profile.measure_profile``, as
``specframe tune --refresh`` does, interleaved rounds and all; the cache is not touched) and, for plain decoding
and for speculation, reports each run's choice (all settings ``auto``, threads up to the usable cores) and a
verdict:

- ``same``: every run chose the same settings;
- ``within noise``: they differ, but in every run each other run's choice is within noise of its own (neither
  beats the other outside noise by :func:`specframe.target.profile.faster`, on that run's measurements, on the
  cost that choice is made by: T(1) for plain decoding, the cost per token at the reference acceptance for
  speculation);
- ``differ``: some run's choice beats another run's outside noise in its own measurements (listed).

Also each candidate's cost per run and its spread over the runs (max / min), which shows the drift between
measurements that the rounds within one measurement cannot see. A table on stdout, everything (each run's whole
profile included) in ``--output`` (JSON).

Usage (on a quiet machine: timings taken while other heavy jobs run say nothing)::

    python lab/scripts/profile_stability.py --output stability.json              # 5 runs of the default model
    python lab/scripts/profile_stability.py --runs 2 --rounds 2 --contexts 16 --model DIR --output s.json  # a smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from specframe.target.machine import fingerprint, usable_cores
from specframe.target.profile import (
    BUDGET_S,
    CONTEXTS,
    ROUNDS,
    MachineProfile,
    faster,
    measure_profile,
)

MODES = (("plain", False), ("speculative", True))


def picks(prof: MachineProfile, cores: int) -> dict[str, dict[str, str]]:
    """Each mode's choice on ``prof``: ``{mode: {"label", "reason"}}``."""
    out = {}
    for mode, spec in MODES:
        c, _, why = prof.choose(max_threads=cores, speculative=spec)
        out[mode] = {"label": c.label, "reason": why}
    return out


def verdict(profiles: list[MachineProfile], chosen: list[str], speculative: bool) -> dict[str, Any]:
    """``{"verdict": "same" | "within noise" | "differ", "outside": [...]}`` for one mode's choices (one per run);
    ``outside`` lists ``"run i: A beats B"`` where run i's own measurements put a choice outside noise of another."""
    if len(set(chosen)) <= 1:
        return {"verdict": "same", "outside": []}
    outside = []
    for i, prof in enumerate(profiles):
        by_label = {m.candidate.label: m for m in prof.measured}
        for other in sorted(set(chosen) - {chosen[i]}):
            a, b = by_label.get(chosen[i]), by_label.get(other)
            if a is None or b is None:
                outside.append(f"run {i + 1}: {other if b is None else chosen[i]} not measured")
                continue
            if faster(a, b, speculative):
                outside.append(f"run {i + 1}: {chosen[i]} beats {other}")
            elif faster(b, a, speculative):
                outside.append(f"run {i + 1}: {other} beats {chosen[i]}")
    return {"verdict": "differ" if outside else "within noise", "outside": outside}


def cost_table(profiles: list[MachineProfile], speculative: bool) -> dict[str, dict[str, Any]]:
    """Per candidate label: its cost per token in each run (None where not measured) and max / min over the runs."""
    labels = sorted({m.candidate.label for p in profiles for m in p.measured})
    out = {}
    for label in labels:
        costs = [next((round(m.cost(speculative), 3) for m in p.measured if m.candidate.label == label), None)
                 for p in profiles]
        got = [c for c in costs if c is not None]
        out[label] = {"costs": costs, "max_over_min": round(max(got) / min(got), 3) if got else None}
    return out


def main(argv: list[str] | None = None) -> int:
    from specframe.target.models import model_directory, resolve_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a built-in model, a model folder or a GGUF")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--runs", type=int, default=5, help="profile measurements (default 5)")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"interleaved rounds per measurement ({ROUNDS})")
    ap.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS), help="KV-cache lengths measured")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="timing budget of one measurement, s")
    ap.add_argument("--pause-s", type=float, default=0.0, help="seconds to wait between measurements")
    ap.add_argument("--output", type=Path, help="the JSON report (each run's profile included)")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.rounds < 1:
        print("error: --runs and --rounds must be at least 1", file=sys.stderr)
        return 2
    source = resolve_model(args.model)
    directory = model_directory(source, lambda s: print(s, file=sys.stderr))
    cores, cores_why = usable_cores()
    profiles, runs = [], []
    for i in range(args.runs):
        if i and args.pause_s > 0:
            time.sleep(args.pause_s)
        prof = measure_profile(directory, source.name, args.device, budget_s=args.budget_s, rounds=args.rounds,
                               contexts=args.contexts)
        profiles.append(prof)
        runs.append({"run": i + 1, "seconds": round(prof.seconds, 1), "others_load": round(prof.others_load, 2),
                     "rounds": min((m.n_rounds for m in prof.measured), default=0), "picks": picks(prof, cores),
                     "profile": prof.to_json()})
        p = runs[-1]["picks"]
        print(f"run {i + 1}: {prof.seconds:.0f} s, others' load {prof.others_load:.2f} cores; plain "
              f"{p['plain']['label']}, speculative {p['speculative']['label']}", file=sys.stderr)
    verdicts = {mode: verdict(profiles, [r["picks"][mode]["label"] for r in runs], spec) for mode, spec in MODES}
    costs = {mode: cost_table(profiles, spec) for mode, spec in MODES}
    fp = fingerprint()
    print(f"{fp['cpu']} | ISA {' '.join(fp['isa']) or '-'} | {cores} usable cores ({cores_why}) | torch {fp['torch']}")
    print(f"{args.runs} measurements of {source.name}, {args.rounds} interleaved rounds each, contexts "
          f"{' '.join(map(str, args.contexts))}")
    print()
    print("| run | s | others' load | rounds | plain decoding | speculation |")
    print("|---|---:|---:|---:|---|---|")
    for r in runs:
        cells = []
        for mode, _ in MODES:
            pick = r["picks"][mode]
            cells.append(pick["label"] + (" (within noise of the fastest)" if "within noise of the fastest"
                                          in pick["reason"] else ""))
        print(f"| {r['run']} | {r['seconds']:.0f} | {r['others_load']:.2f} | {r['rounds']} | {cells[0]} | {cells[1]} |")
    print()
    for mode, _ in MODES:
        v = verdicts[mode]
        print(f"{mode}: {v['verdict']}" + (f" ({'; '.join(v['outside'])})" if v["outside"] else ""))
    print()
    for mode, _ in MODES:
        print(f"{mode} cost per token (ms) per run, max / min over the runs:")
        for label, row in costs[mode].items():
            shown = " ".join("-" if c is None else f"{c:.1f}" for c in row["costs"])
            print(f"  {label:<16} {shown}   {row['max_over_min']}")
    if args.output:
        doc = {"machine": fp, "cores": cores, "args": {k: (str(v) if isinstance(v, Path) else v)
                                                        for k, v in vars(args).items()},
               "verdicts": verdicts, "costs": costs, "runs": runs}
        args.output.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
