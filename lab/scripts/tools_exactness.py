"""Tool calling under speculation, exact (issue 68, must-show c): dev prompts with two tools, each asked under
``tool_choice`` auto, required, a named function and none, greedy, once without speculation and once with the
grammar proposer + ngram, through ``specframe serve``'s app in process (the HTTP layer included). Every pair must give
the same message (content, tool calls with their arguments, finish reason); τ is reported for answers that are tool
calls and for those that are text.

    python lab/scripts/tools_exactness.py --questions ../shared/specbench/question.jsonl --limit 24 \
        --output lab/results/tools-exactness-issue68
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                      "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                                      "b": {"type": "integer"}},
                                                     "required": ["a", "b"]}}},
]
CHOICES = {"auto": "auto", "required": "required",
           "named": {"type": "function", "function": {"name": "get_weather"}}, "none": "none"}
STRATEGIES = {"none": ["none"], "grammar+ngram": ["grammar", "ngram"]}


def questions(path: Path, limit: int) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    per: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        per.setdefault(r["category"], []).append(r)
    out, i = [], 0
    while len(out) < limit and any(i < len(v) for v in per.values()):  # round-robin over the categories
        out += [v[i] for v in per.values() if i < len(v)][: limit - len(out)]
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--output", type=Path, required=True)
    args = ap.parse_args(argv)

    from starlette.testclient import TestClient

    import specframe
    from specframe.serve.app import create_app

    sf = specframe.load(model=args.model, dtype="float32", prepack=False, batch_size=1, proposers=["none"],
                        router="none", max_new_tokens=args.max_tokens)
    app = create_app(sf, max_tokens_limit=args.max_tokens)
    f = app.state.formats
    print(f"tool parser: {f.tool.name if f.tool else None} ({f.why['tool']}); reasoning: "
          f"{f.reasoning.name if f.reasoning else None}", file=sys.stderr)
    rows = []
    start = time.perf_counter()
    with TestClient(app) as client:
        for qi, q in enumerate(questions(args.questions, args.limit)):
            for cname, choice in CHOICES.items():
                got = {}
                for sname, proposers in STRATEGIES.items():
                    body = {"messages": [{"role": "user", "content": q["turns"][0]}], "tools": TOOLS,
                            "tool_choice": choice, "max_tokens": args.max_tokens, "temperature": 0.0,
                            "speculative": {"proposers": proposers}}
                    r = client.post("/v1/chat/completions", json=body)
                    r.raise_for_status()
                    doc = r.json()
                    msg = doc["choices"][0]["message"]
                    got[sname] = {"content": msg.get("content"), "finish": doc["choices"][0]["finish_reason"],
                                  "calls": [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                            for c in msg.get("tool_calls") or []],
                                  "tau": doc["usage"]["speculation"]["tau"],
                                  "tokens": doc["usage"]["completion_tokens"]}
                same = got["none"]["content"] == got["grammar+ngram"]["content"] and \
                    got["none"]["calls"] == got["grammar+ngram"]["calls"] and \
                    got["none"]["finish"] == got["grammar+ngram"]["finish"]
                rows.append({"question_id": q["question_id"], "category": q["category"], "choice": cname,
                             "same": same, **{s: g for s, g in got.items()}})
                print(f"[{qi + 1}] {q['category']:>14} {cname:>8}: same {same}, calls "
                      f"{[n for n, _ in got['none']['calls']]}, tau {got['grammar+ngram']['tau']:.2f} "
                      f"({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    sf.close()
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "rows.json").write_text(json.dumps(rows, indent=1))
    lines = [f"model {args.model}, float32, greedy, {args.max_tokens} tokens, tool parser "
             f"{f.tool.name if f.tool else None}; strategies compared: none vs grammar+ngram", "",
             "| tool_choice | requests | identical | answers with calls | τ (calls) | τ (text) |",
             "|---|---:|---:|---:|---:|---:|"]
    for cname in CHOICES:
        sel = [r for r in rows if r["choice"] == cname]
        calls = [r["grammar+ngram"]["tau"] for r in sel if r["none"]["calls"]]
        text = [r["grammar+ngram"]["tau"] for r in sel if not r["none"]["calls"]]
        lines.append(f"| {cname} | {len(sel)} | {sum(r['same'] for r in sel)} | {len(calls)} | "
                     f"{statistics.mean(calls) if calls else float('nan'):.2f} | "
                     f"{statistics.mean(text) if text else float('nan'):.2f} |")
    same = sum(r["same"] for r in rows)
    lines += ["", f"identical: {same} / {len(rows)}"]
    (args.output / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if same == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
