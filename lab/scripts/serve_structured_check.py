"""Structured output through ``specframe serve`` on the default model (issue 54 c): the official openai client sends
``response_format`` json_schema (strict), ``tools`` with ``tool_choice`` (required and named) and ``logprobs`` with
``top_logprobs: 5``, streamed and not, to a server started as a user would (``specframe serve --config``).

    python lab/scripts/serve_structured_check.py --questions lab/data/specbench-json/question.jsonl \
        --limit-per-category 2 --max-tokens 128 --output lab/results/serve-structured-fp32

Greedy, float32 by default. For every question (its ``constraint.json_schema`` is the schema):

* json_schema strict under each ``--proposer``, streamed and not: an answer that finished (``stop``) parses and
  validates against the schema; one cut by ``max_tokens`` (``length``) is recorded; every answer is identical to the
  ``none`` answer (speculation changes nothing);
* tools: the schema becomes the parameters of a function ``answer`` beside a decoy ``lookup``; ``tool_choice``
  ``required`` and named (``answer``), streamed and not: the reply is one OpenAI ``tool_calls`` entry whose arguments
  validate against that function's parameters (when the call finished);
* logprobs: the json_schema request with ``logprobs: true, top_logprobs: 5`` under each speculative proposer,
  streamed and not, against the same request under ``none``: the same tokens, the same 5 alternatives in the same
  order, every log-probability within ``--tolerance`` (1e-4), and the tokens' ``bytes`` joined are the content.

Requests go from ``--clients`` threads at once, so they share the server's batch. Writes ``results.json`` and
``report.md`` to ``--output``; exit code 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import jsonschema
import openai

from specframe.bench.runner import select_questions
from specframe.io.prompts import read_prompts
from specframe.target.machine import fingerprint

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # the serving check's helpers
from check_serve_exactness import entries, free_port, report, serve_jobs, start_server

DECOY = {"type": "function", "function": {"name": "lookup", "description": "Look a word up in a dictionary",
                                          "parameters": {"type": "object", "properties": {"word": {"type": "string"}},
                                                         "required": ["word"], "additionalProperties": False}}}


def answer_tool(schema: dict) -> dict:
    return {"type": "function", "function": {"name": "answer", "description": "Give the answer", "parameters": schema}}


def chat(client, stream: bool, **kw) -> dict:
    """One request's content, tool calls, logprobs and finish reason, streamed or not."""
    if not stream:
        c = client.chat.completions.create(**kw).choices[0]
        calls = [{"name": t.function.name, "arguments": t.function.arguments, "id": t.id}
                 for t in c.message.tool_calls or []]
        return {"content": c.message.content, "calls": calls, "finish": c.finish_reason,
                "logprobs": list(c.logprobs.content) if c.logprobs and c.logprobs.content else []}
    content, calls, logprobs, finish = "", {}, [], None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            content += c.delta.content or ""
            for t in c.delta.tool_calls or []:
                calls.setdefault(t.index, {"name": t.function.name, "arguments": "", "id": t.id})
                calls[t.index]["arguments"] += t.function.arguments or ""
            if c.logprobs is not None and c.logprobs.content:
                logprobs += c.logprobs.content
            finish = c.finish_reason or finish
    return {"content": content or None, "calls": [calls[i] for i in sorted(calls)], "finish": finish,
            "logprobs": logprobs}


def valid(text: str, schema: dict) -> str | None:
    """None when ``text`` parses and validates, else why not."""
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError) as e:
        return str(e).splitlines()[0]
    return None


def logprob_gap(got: list, want: list) -> tuple[bool, float]:
    """(same tokens and top alternatives, the largest log-probability difference)."""
    if len(got) != len(want) or not got:
        return False, float("inf")
    same, gap = True, 0.0
    for a, b in zip(got, want):
        same &= a.token == b.token and [t.token for t in a.top_logprobs] == [t.token for t in b.top_logprobs]
        same &= len(a.top_logprobs) == 5
        gap = max(gap, abs(a.logprob - b.logprob), *(abs(x.logprob - y.logprob)
                                                    for x, y in zip(a.top_logprobs, b.top_logprobs)))
    return same, gap


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--questions", type=Path, default=Path("lab/data/specbench-json/question.jsonl"))
    ap.add_argument("--limit-per-category", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--proposer", action="append", help="speculative strategies (default: ngram, grammar+ngram)")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args()
    spec = args.proposer or ["ngram", "grammar+ngram"]
    strategies = ["none", *spec]
    prompts = select_questions(read_prompts(args.questions), None, args.limit_per_category)
    schemas = [p.constraint["json_schema"] for p in prompts]

    port = free_port()
    proc = start_server(args.model, args.dtype, args.batch_size, port, sorted({n for s in strategies
                                                                               for n in s.split("+")}))
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=900)

    def request(job):
        kind, strategy, stream, i, choice = job
        kw = dict(model=args.model, messages=[{"role": "user", "content": prompts[i].text}],
                  max_tokens=args.max_tokens, temperature=0,
                  extra_body={"speculative": {"proposers": entries(strategy)}})
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schemas[i], "strict": True}}
        if kind == "tools":
            kw |= {"tools": [DECOY, answer_tool(schemas[i])],
                   "tool_choice": choice if choice == "required" else
                   {"type": "function", "function": {"name": "answer"}}}
        else:
            kw["response_format"] = fmt
        if kind == "logprobs":
            kw |= {"logprobs": True, "top_logprobs": 5}
        return chat(client, stream, **kw)

    jobs = [(kind, s, stream, i, None) for kind in ("schema", "logprobs") for s in strategies
            for stream in (False, True) for i in range(len(prompts))]
    jobs += [("tools", s, stream, i, choice) for s in spec for choice in ("required", "named")
             for stream in (False, True) for i in range(len(prompts))]
    answers, took, code = serve_jobs(proc, args.clients, jobs, request)
    replies = dict(zip(jobs, answers))

    rows, bad = [], 0
    for (kind, s, stream, i, choice), r in replies.items():
        row = {"kind": kind, "strategy": s, "stream": stream, "question_id": prompts[i].question_id,
               "tool_choice": choice, "finish": r["finish"]}
        if kind == "tools":
            if r["finish"] == "length":  # a call cut by max_tokens comes back as content (a prefix of the call)
                ok = not r["calls"] and r["content"] is not None
            else:
                ok = len(r["calls"]) == 1 and r["content"] is None
            if ok and r["calls"]:
                call = r["calls"][0]
                ok = call["name"] in ("answer", "lookup") and (choice == "required" or call["name"] == "answer")
                params = (answer_tool(schemas[i]) if call["name"] == "answer" else DECOY)["function"]["parameters"]
                why = valid(call["arguments"], params) if r["finish"] == "tool_calls" else None
                ok &= r["finish"] in ("tool_calls", "length") and why is None
                row |= {"name": call["name"], "arguments": call["arguments"], "invalid": why}
        else:
            base = replies[(kind, "none", False, i, None)]
            why = valid(r["content"], schemas[i]) if r["finish"] == "stop" else None
            ok = r["finish"] in ("stop", "length") and why is None and r["content"] == base["content"]
            row |= {"identical_to_none": r["content"] == base["content"], "invalid": why, "text": r["content"]}
            if kind == "logprobs":
                same, gap = logprob_gap(r["logprobs"], base["logprobs"])
                text_ok = bytes(b for t in r["logprobs"] for b in t.bytes).decode("utf-8") == r["content"]
                ok &= same and gap <= args.tolerance and text_ok
                row |= {"logprob_tokens": len(r["logprobs"]), "same_top5": same, "max_logprob_gap": gap}
        row["ok"] = bool(ok)
        bad += not ok
        rows.append(row)

    def cell(sel):
        done = [r for r in sel if r["finish"] in ("stop", "tool_calls")]
        return f"{sum(r['ok'] for r in sel)}/{len(sel)} | {len(done)}/{len(sel)}"

    table = ["| request | strategy | streamed | passed | finished (valid) | largest logprob gap vs none |",
             "|---|---|---|---:|---:|---:|"]
    for kind in ("schema", "logprobs", "tools"):
        for s in strategies:
            for choice in ((None,) if kind != "tools" else ("required", "named")):
                for stream in (False, True):
                    sel = [r for r in rows if r["kind"] == kind and r["strategy"] == s and r["stream"] == stream
                           and r["tool_choice"] == choice]
                    if not sel:
                        continue
                    gap = max((r.get("max_logprob_gap", 0.0) for r in sel), default=0.0)
                    label = {"schema": "json_schema strict", "logprobs": "json_schema + logprobs top 5",
                             "tools": f"tools, tool_choice {choice}"}[kind]
                    table.append(f"| {label} | {s} | {'yes' if stream else 'no'} | {cell(sel)} | "
                                 f"{f'{gap:.2e}' if kind == 'logprobs' else '–'} |")
    m = fingerprint()
    head = (f"{len(prompts)} Spec-Bench questions as JSON-schema tasks × {args.max_tokens} tokens, model "
            f"{args.model}, {args.dtype}, greedy; server batch {args.batch_size}, {args.clients} client threads; "
            f"{len(jobs)} requests in {took:.0f} s; server exit code on SIGTERM: {code}; {bad} failed. Machine: "
            f"{m['cpu']}, {m['cores']} cores, ISA {' '.join(m['isa'])}.")
    report(args, m, code, took, rows, "Structured output through specframe serve (openai client)", head, table,
           "A row passes when: json_schema — finished answers parse and validate and every answer equals the `none` "
           "answer; logprobs — also the same tokens and top-5 alternatives as `none`, every log-probability within "
           f"{args.tolerance:g}, and the tokens' bytes joined are the content; tools — one `tool_calls` entry, no "
           "content, arguments valid against the called function's parameters.\n\n"
           f"Command: `python lab/scripts/serve_structured_check.py {' '.join(sys.argv[1:])}`\n")
    return 1 if bad or code != 0 else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
