"""A bounded load test of ``specframe serve`` on localhost: many concurrent streaming clients, some cancelling
mid-stream, some sending malformed requests; then SIGTERM.

    python lab/scripts/serve_load_test.py --clients 16 --requests 64 --max-new-tokens 32 \
        --output lab/results/serve-load

Each of ``--clients`` asyncio clients sends ``--requests`` requests one after the other (streamed, greedy, strategy
drawn from ``--proposer``, question drawn from the dev set; a fixed seed decides everything). One request in ten is
malformed (bad JSON, an unknown field, an unknown proposer, ``max_tokens`` over the limit, a negative temperature,
another model: each must get a 4xx with the OpenAI error object); one in ten is cancelled after a few chunks (its
pieces must be a prefix of the offline answer). Every other stream must carry exactly the offline answer (the same
question decoded alone in this process first: no lost or repeated piece) and its usage chunk the offline token
count. The server's RSS is read after a warm-up round and after the load; the process must exit 0 on SIGTERM with
requests still in flight. Exit code 1 on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from pathlib import Path

import httpx

import specframe
from specframe.bench.runner import environment, select_questions
from specframe.io.prompts import read_prompts
from specframe.target.machine import fingerprint

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # the serving check's helpers
from check_serve_exactness import DEFAULT_QUESTIONS, entries, free_port, start_server

MALFORMED = [
    ("bad JSON", b'{"prompt": "hi", "max_tokens": ', 400),
    ("unknown field", {"prompt": "hi", "max_tokens": 4, "best_of_all": 3}, 400),
    ("unknown proposer", {"prompt": "hi", "max_tokens": 4, "speculative": {"proposers": ["nosuch"]}}, 400),
    ("max_tokens over the limit", {"prompt": "hi", "max_tokens": 10 ** 6}, 400),
    ("negative temperature", {"prompt": "hi", "max_tokens": 4, "temperature": -1}, 400),
    ("another model", {"prompt": "hi", "max_tokens": 4, "model": "gpt-4o"}, 404),
]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


async def stream(http: httpx.AsyncClient, body: dict, cancel_after: int | None) -> dict:
    """One streamed completion: its pieces, usage and outcome (``ok``, ``cancelled`` or an error)."""
    pieces, usage, done = [], None, False
    async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            return {"outcome": f"http {r.status_code}", "pieces": pieces}
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            obj = json.loads(data)
            if "error" in obj:
                return {"outcome": f"error in stream: {obj['error']['message']}", "pieces": pieces}
            if obj.get("usage"):
                usage = obj["usage"]
            for c in obj.get("choices", []):
                if c.get("text"):
                    pieces.append(c["text"])
            if cancel_after is not None and len(pieces) >= cancel_after:
                return {"outcome": "cancelled", "pieces": pieces}  # leaving the block closes the connection
    return {"outcome": "ok" if done else "no [DONE]", "pieces": pieces, "usage": usage}


async def client(cid: int, args, base: str, plan: list[dict], offline: dict, log: list) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=600) as http:
        for job in plan:
            t0 = time.perf_counter()
            if job["kind"] == "malformed":
                name, body, status = MALFORMED[job["which"]]
                r = await (http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
                           if isinstance(body, bytes) else http.post("/v1/completions", json=body))
                err = r.json().get("error", {}) if r.headers.get("content-type", "").startswith("application/json") \
                    else {}
                ok = r.status_code == status and bool(err.get("message")) and "type" in err
                log.append({"client": cid, "kind": "malformed", "what": name, "status": r.status_code, "ok": ok,
                            "message": err.get("message")})
                continue
            body = {"prompt": job["text"], "max_tokens": args.max_new_tokens, "temperature": 0,
                    "speculative": {"proposers": entries(job["strategy"])}}
            res = await stream(http, body, job.get("cancel_after"))
            want_text, want_tokens = offline[job["strategy"], job["q"]]
            got = "".join(res["pieces"])
            if job["kind"] == "cancel":
                ok = res["outcome"] in ("cancelled", "ok") and want_text.startswith(got)
            else:
                ok = (res["outcome"] == "ok" and got == want_text
                      and (res.get("usage") or {}).get("completion_tokens") == want_tokens)
            log.append({"client": cid, "kind": job["kind"], "strategy": job["strategy"], "q": job["q"],
                        "outcome": res["outcome"], "ok": ok, "seconds": time.perf_counter() - t0,
                        **({} if ok else {"got": got, "want": want_text})})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    ap.add_argument("--limit-per-category", type=int, default=2)
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=64, help="requests per client")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--proposer", action="append")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args()
    strategies = args.proposer or ["none", "ngram"]
    prompts = select_questions(read_prompts(args.questions), None, args.limit_per_category)[: args.limit]

    sf = specframe.load(model=args.model, dtype=args.dtype)
    offline = {}
    for spec in strategies:
        for i, p in enumerate(prompts):
            r = sf.generate_result(p.text, proposers=entries(spec), max_new_tokens=args.max_new_tokens,
                                   temperature=0.0, chat=False)
            offline[spec, i] = (r.text, len(r.token_ids))
    sf.close()
    del sf

    rng = random.Random(args.seed)
    plans = []
    for _ in range(args.clients):
        plan = []
        for _ in range(args.requests):
            u = rng.random()
            job = {"kind": "malformed" if u < 0.1 else "cancel" if u < 0.2 else "full",
                   "strategy": rng.choice(strategies), "q": rng.randrange(len(prompts)),
                   "which": rng.randrange(len(MALFORMED))}
            job["text"] = prompts[job["q"]].text
            if job["kind"] == "cancel":
                job["cancel_after"] = rng.randint(1, 4)
            plan.append(job)
        plans.append(plan)

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    names = sorted({n for s in strategies for n in s.split("+")})
    proc = start_server(args.model, args.dtype, args.batch_size, port, names)
    try:
        warm: list = []  # one round of every client's first full request, then RSS
        asyncio.run(_all(args, base, [[j for j in p if j["kind"] == "full"][:1] for p in plans], offline, warm))
        rss0 = rss_kib(proc.pid)
        log: list = []
        t0 = time.perf_counter()
        half = args.requests // 2  # two rounds: RSS after each, so growth that levels off shows as such
        asyncio.run(_all(args, base, [p[:half] for p in plans], offline, log))
        time.sleep(1.0)
        rss_half = rss_kib(proc.pid)
        asyncio.run(_all(args, base, [p[half:] for p in plans], offline, log))
        took = time.perf_counter() - t0
        time.sleep(1.0)
        rss1 = rss_kib(proc.pid)
        pending = httpx.get(base + "/health").json()["pending"]
        metrics = httpx.get(base + "/metrics").text
        # SIGTERM with requests in flight: they must finish, then exit 0
        tail: list = []

        async def sigterm_round() -> None:
            task = asyncio.ensure_future(_all(args, base, [[j for j in p if j["kind"] == "full"][:1]
                                                           for p in plans[:4]], offline, tail))
            await asyncio.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            await task

        asyncio.run(sigterm_round())
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    kinds = {}
    for x in log:
        k = kinds.setdefault(x["kind"], {"requests": 0, "ok": 0})
        k["requests"] += 1
        k["ok"] += x["ok"]
    cancelled = [x for x in log if x["kind"] == "cancel"]
    m = fingerprint()
    lines = [f"{args.clients} streaming clients × {args.requests} requests each ({len(log)} in all: "
             f"{kinds.get('full', {}).get('requests', 0)} full, {len(cancelled)} cancelled mid-stream, "
             f"{kinds.get('malformed', {}).get('requests', 0)} malformed), {args.max_new_tokens} tokens, {args.dtype}, "
             f"greedy, strategies {', '.join(strategies)}, server batch {args.batch_size}; {took:.0f} s. Machine: "
             f"{m['cpu']}, {m['cores']} cores, ISA {' '.join(m['isa'])}.", "",
             "| requests | as required |", "|---|---|"]
    lines += [f"| {k} | {v['ok']}/{v['requests']} |" for k, v in sorted(kinds.items())]
    lines += [f"| in flight at SIGTERM, answered in full | {sum(x['ok'] for x in tail)}/{len(tail)} |", "",
              f"Server RSS after the warm-up round: {rss0 / 1024:.1f} MiB; after the first half of the load: "
              f"{rss_half / 1024:.1f} MiB; after the second half: {rss1 / 1024:.1f} MiB (second half "
              f"{(rss1 - rss_half) / 1024:+.1f} MiB). Requests in flight after the load: {pending}. Exit code on "
              f"SIGTERM: {code}."]
    report = "\n".join(lines)
    print(report)
    failures = [x for x in log + tail if not x["ok"]]
    for x in failures[:10]:
        print("FAILED:", json.dumps(x)[:400], file=sys.stderr)
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "results.json").write_text(json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "environment": environment(), "machine": m,
             "rss_kib": [rss0, rss_half, rss1], "exit_code": code, "seconds": took, "log": log, "sigterm_round": tail,
             "metrics": metrics}, indent=1))
        (args.output / "report.md").write_text("# specframe serve under a bounded load\n\n" + report + "\n\n"
                                               f"Command: `python lab/scripts/serve_load_test.py "
                                               f"{' '.join(sys.argv[1:])}`\n")
    return 1 if failures or code != 0 or pending else 0


async def _all(args, base: str, plans: list, offline: dict, log: list) -> None:
    await asyncio.gather(*(client(i, args, base, plan, offline, log) for i, plan in enumerate(plans)))


if __name__ == "__main__":
    sys.exit(main())
