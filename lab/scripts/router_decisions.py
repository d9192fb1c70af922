"""Record every decision of the ``adaptive`` router on replayed traces: the node budgets ``route`` gives and the
numbers ``revise`` returns, per request and step, so a refactor of the router can be checked to decide the same
(issue 41 b).

    python lab/scripts/router_decisions.py --traces TRACE_DIR --config REPLAY.yaml --out decisions.json
    python lab/scripts/router_decisions.py --compare before.json after.json

``--router-file`` records another version of the router in the same engine: a file defining ``AdaptiveRouter``
(e.g. ``git show 823fae3:plugins/router.py > /tmp/router_before.py``), registered in place of the installed one.

The router reads two clocks live: the target's forward time (a replay models it from the trace's cost curve, so it
is the same every run) and each proposer's draft seconds (measured). For a replay that decides the same on every run
the draft seconds the router learns from are replaced, in ``on_step``'s report, by a fixed model: a per-label
constant plus 0.1 ms per proposed node (``DRAFT_S``). Everything else is the real router on the real engine.
``--compare`` exits 1 on the first difference and prints where it is.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

DRAFT_S = {"ngram": 1e-4, "retrieval": 3e-4, "lookahead": 1e-3, "medusa": 4e-3, "eagle": 8e-3, "draft-model": 2e-2}


def _draft_s(label: str, proposed: int) -> float:
    return DRAFT_S.get(label.split("#")[0], 2e-3) + 1e-4 * proposed


def install(log: list, router_file: str | None = None) -> None:
    """Wrap the adaptive router's start / route / revise / on_step (found through its plugin module) to log; with
    ``router_file``, the ``AdaptiveRouter`` of that file registers in place of the installed one."""
    module = importlib.import_module("specframe_plugins.router.adaptive")
    if router_file:
        spec = importlib.util.spec_from_file_location("specframe_plugins._router_under_test", router_file)
        other = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # (pydantic resolves names there)
        spec.loader.exec_module(other)
        module.AdaptiveRouter = other.AdaptiveRouter  # what specframe_register_routers registers
    cls = module.AdaptiveRouter
    start, route, revise, on_step = cls.start, cls.route, cls.revise, cls.on_step

    def w_start(self, proposers, seed, greedy=True):
        log.append({"request": list(proposers), "steps": []})
        return start(self, proposers, seed, greedy)

    def w_route(self, budget, max_nodes, available):
        out = route(self, budget, max_nodes, available)
        log[-1]["steps"].append({"budget": budget, "route": list(out)})
        return out

    def w_revise(self, budget, max_nodes, available, drafts, budgets):
        out = revise(self, budget, max_nodes, available, drafts, budgets)
        log[-1]["steps"][-1].setdefault("revise", []).append(list(out))
        return out

    def w_on_step(self, report):
        fixed = tuple(replace(s, draft_s=_draft_s(s.name, s.proposed) if s.asked else 0.0, feedback_s=0.0)
                      for s in report.proposers)
        return on_step(self, replace(report, proposers=fixed))

    cls.start, cls.route, cls.revise, cls.on_step = w_start, w_route, w_revise, w_on_step


def record(traces: str, config: str, out: str, router_file: str | None = None) -> None:
    log: list = []
    install(log, router_file)
    from specframe.cli import app

    with tempfile.TemporaryDirectory() as tmp:
        app(["replay", "--traces", traces, "--config", config, "--output", str(Path(tmp) / "r"), "--no-ray"],
            standalone_mode=False)
    steps = sum(len(r["steps"]) for r in log)
    Path(out).write_text(json.dumps({"traces": traces, "config": config, "requests": log}))
    print(f"{len(log)} routed requests, {steps} steps -> {out}")


def compare(a: str, b: str) -> int:
    ra, rb = json.loads(Path(a).read_text())["requests"], json.loads(Path(b).read_text())["requests"]
    if len(ra) != len(rb):
        print(f"differ: {len(ra)} vs {len(rb)} routed requests")
        return 1
    steps = 0
    for i, (x, y) in enumerate(zip(ra, rb)):
        if x["request"] != y["request"] or len(x["steps"]) != len(y["steps"]):
            print(f"request {i} {x['request']}: {len(x['steps'])} vs {len(y['steps'])} steps")
            return 1
        for k, (s, t) in enumerate(zip(x["steps"], y["steps"])):
            if s != t:
                print(f"request {i} {x['request']} step {k}: {s} vs {t}")
                return 1
        steps += len(x["steps"])
    print(f"identical: {len(ra)} routed requests, {steps} steps (route and revise budgets)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces")
    ap.add_argument("--config")
    ap.add_argument("--out")
    ap.add_argument("--router-file", help="record this file's AdaptiveRouter instead of the installed one")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    record(args.traces, args.config, args.out, args.router_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
