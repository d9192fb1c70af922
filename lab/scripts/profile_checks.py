"""Issue 67 must-shows a and c from a bench or replay output folder: every speculation profile passes the schema's
rules; the chain_analytic extrapolation of each swept chain proposer's longest draft predicts its measured AL at
the shorter ones; and the ceilings table (measured or predicted speed-up, oracle, entropy bound, fraction, top-K).

    python lab/scripts/profile_checks.py lab/results/profiles-dev-avx2/replay [--tolerance 0.05]

Prints markdown tables and writes OUTPUT/profile_checks.json. Exit 1 when a profile fails its checks or a prediction
misses by more than the tolerance (relative).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specframe.bench.speculation_profile import check_profile, predict_accept_length


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--tolerance", type=float, default=0.05)
    args = ap.parse_args()
    doc = json.loads((args.folder / "results.json").read_text())
    profiles = doc.get("speculation_profiles") or {}
    out: dict = {"profiles": {}, "extrapolation": [], "ceilings": doc.get("ceilings")}
    bad = False
    print("| strategy | AL per step | AL per request | K | model | identity | monotone |\n|---|---|---|---|---|---|---|")
    for name, p in profiles.items():
        check_profile(p, name)
        v = p["validation"]
        ok = v["mean_consistency"]["passed"] and v["marginal_monotonicity"]["passed"]
        bad |= not ok
        out["profiles"][name] = {"al": p["mean_accept_length"], "al_per_request": p["mean_accept_length_per_request"],
                                 "k": p["num_speculative_tokens"], "model": p["accept_length_model"], "passed": ok}
        print(f"| {name} | {p['mean_accept_length']:.3f} | {p['mean_accept_length_per_request']:.3f} | "
              f"{p['num_speculative_tokens']} | {p['accept_length_model']} | "
              f"{v['mean_consistency']['abs_delta']:.4f} | {'yes' if v['marginal_monotonicity']['passed'] else 'NO'} |")
    # the swept chain strategies: "<family> k=<k>" from a grid on one proposer's k
    families: dict[str, dict[int, str]] = {}
    for st in doc["config"]["strategies"]:
        point = st.get("grid_point") or {}
        ks = [v for key, v in point.items() if key.endswith(".k")]
        if st.get("grid_of") and len(ks) == 1 and st["name"] in profiles:
            families.setdefault(st["grid_of"], {})[int(ks[0])] = st["name"]
    print("\n| chain strategy | from k | at k | measured AL | re-segmented | error | truncated (schema 1.0) | error |\n"
          "|---|---|---|---|---|---|---|---|")
    for family, by_k in families.items():
        top = max(by_k)
        base = profiles[by_k[top]]
        if base["accept_length_model"] != "chain_analytic":
            continue
        for k in sorted(by_k):
            if k == top:
                continue
            kk = min(k, base["num_speculative_tokens"])
            pred, trunc = predict_accept_length(base, kk), predict_accept_length(base, kk, "truncate")
            meas = profiles[by_k[k]]["mean_accept_length"]
            err, terr = (pred - meas) / meas, (trunc - meas) / meas
            bad |= abs(err) > args.tolerance
            out["extrapolation"].append({"family": family, "from_k": top, "k": k, "measured": meas, "resegmented": pred,
                                         "error": err, "truncated": trunc, "truncated_error": terr})
            print(f"| {family} | {top} | {k} | {meas:.3f} | {pred:.3f} | {100 * err:+.1f} % | {trunc:.3f} | "
                  f"{100 * terr:+.1f} % |")
    c = doc.get("ceilings")
    if c and c.get("oracle"):
        e = c.get("entropy_bound") or {}
        print(f"\noracle {c['oracle']['speedup']:.2f}x (k = {c['oracle']['k']}); entropy bound "
              f"{e.get('speedup', float('nan')):.2f}x (P = {e.get('p')}, mean entropy {e.get('mu', float('nan')):.3f} nats)")
        print("\n| strategy | speed-up | of oracle | top-K oracle τ | top-K oracle speed-up |\n|---|---|---|---|---|")
        for name, st in c["strategies"].items():
            ap_ = st.get("any_path") or {}
            sp = st.get("speedup")
            print(f"| {name} | {sp:.2f}x | {100 * (st.get('fraction_of_oracle') or 0):.0f} % | "
                  f"{ap_.get('tau', float('nan')):.2f} | {ap_.get('speedup', float('nan')):.2f}x |")
    (args.folder / "profile_checks.json").write_text(json.dumps(out, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
