"""``specframe serve`` answers as ``specframe generate`` does: the official openai client against a running server,
completions and chat, streamed and not, per strategy, against the same questions decoded offline (the Python API
that ``specframe generate`` runs) in this process first.

    python scripts/check_serve_exactness.py --dtype float32 --limit 12 --max-new-tokens 64 \
        --proposer none --proposer ngram --proposer ngram+medusa --output lab/results/serve-exactness

Greedy. Requests go to the server from ``--clients`` threads at once (so they share the batch). A request matches
when its text equals the offline answer's text and its ``usage.completion_tokens`` the offline token count; a stream
when its pieces joined are that text. Writes ``results.json`` and ``report.md`` (a table per strategy × endpoint ×
streamed) to ``--output``; exit code 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai

import specframe
from specframe.bench.runner import environment, select_questions
from specframe.io.prompts import read_prompts
from specframe.target.machine import fingerprint

DEFAULT_QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "specbench" / "question.jsonl"


def entries(spec: str) -> list[dict]:
    return [{"name": n} for n in spec.split("+")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, dtype: str, batch_size: int, port: int, allow: list[str]) -> subprocess.Popen:
    cfg = Path(tempfile.mkdtemp()) / "serve.yaml"
    cfg.write_text(f"model: {model}\ndtype: {dtype}\nproposers: [none]\n")
    cmd = [sys.executable, "-m", "specframe", "serve", "--config", str(cfg), "--port", str(port),
           "--batch-size", str(batch_size), "--served-model-name", model]
    for a in allow:
        cmd += ["--allow-proposer", a]
    log = cfg.with_name("serve.log")  # (a pipe nobody reads would fill and stall the server)
    proc = subprocess.Popen(cmd, stderr=open(log, "w"), text=True)
    proc.log = log
    for _ in range(1200):
        if proc.poll() is not None:
            raise SystemExit(f"the server exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.25)
    proc.kill()
    raise SystemExit("the server did not come up in 300 s")


def serve_jobs(proc: subprocess.Popen, clients: int, jobs: list, ask_one) -> tuple[list, float, int]:
    """``ask_one`` over ``jobs`` from ``clients`` threads at once against the running server ``proc``, then SIGTERM:
    (answers in job order, seconds, the server's exit code). The server is killed if anything fails."""
    try:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            answers = list(pool.map(ask_one, jobs))
        took = time.perf_counter() - t0
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return answers, took, code


def report(args: argparse.Namespace, machine: dict, code: int, took: float, requests: list[dict], title: str,
           head: str, table: list[str], tail: str) -> None:
    """Print ``head`` and ``table``; with ``args.output``, write ``results.json`` (every request) and ``report.md``
    (``title``, ``head``, ``table``, ``tail``) there."""
    print(head)
    print("\n".join(table))
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "results.json").write_text(json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "environment": environment(), "machine": machine,
             "server_exit_code": code, "seconds": took, "requests": requests}, indent=1))
        (args.output / "report.md").write_text(f"# {title}\n\n{head}\n\n" + "\n".join(table) + "\n\n" + tail)


def ask(client: openai.OpenAI, model: str, text: str, chat: bool, stream: bool, props: list[dict],
        max_tokens: int) -> tuple[str, int]:
    """(text, completion tokens) of one greedy request."""
    kw = dict(model=model, max_tokens=max_tokens, temperature=0, extra_body={"speculative": {"proposers": props}})
    if chat:
        kw["messages"] = [{"role": "user", "content": text}]
        make = client.chat.completions.create
    else:
        kw["prompt"] = text
        make = client.completions.create
    if not stream:
        r = make(**kw)
        return (r.choices[0].message.content if chat else r.choices[0].text), r.usage.completion_tokens
    pieces, tokens = [], None
    for chunk in make(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for c in chunk.choices:
            pieces.append((c.delta.content if chat else c.text) or "")
    return "".join(pieces), tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    ap.add_argument("--limit-per-category", type=int, default=2)
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--proposer", action="append")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args()
    strategies = args.proposer or ["none", "ngram", "ngram+medusa"]
    prompts = select_questions(read_prompts(args.questions), None, args.limit_per_category)[: args.limit]

    # 1. offline, in this process: what `specframe generate` prints (chat: the template; completions: the raw text)
    t0 = time.perf_counter()
    sf = specframe.load(model=args.model, dtype=args.dtype)
    offline = {}
    for spec in strategies:
        for chat in (True, False):
            for i, p in enumerate(prompts):
                r = sf.generate_result(p.text, proposers=entries(spec), max_new_tokens=args.max_new_tokens,
                                       temperature=0.0, chat=chat)
                offline[spec, chat, i] = (r.text, len(r.token_ids))
    sf.close()
    del sf
    print(f"offline: {len(offline)} answers in {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    # 2. the server, asked by the openai client from several threads at once
    port = free_port()
    names = sorted({n for s in strategies for n in s.split("+")})
    proc = start_server(args.model, args.dtype, args.batch_size, port, names)
    bad = 0
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    jobs = [(spec, chat, stream, i) for spec in strategies for chat in (True, False) for stream in (False, True)
            for i in range(len(prompts))]
    answers, took, code = serve_jobs(proc, args.clients, jobs, lambda j: ask(
        client, args.model, prompts[j[3]].text, j[1], j[2], entries(j[0]), args.max_new_tokens))
    results = []
    for (spec, chat, stream, i), (text, tokens) in zip(jobs, answers):
        want_text, want_tokens = offline[spec, chat, i]
        ok = text == want_text and tokens == want_tokens
        bad += not ok
        results.append({"strategy": spec, "endpoint": "chat" if chat else "completions", "stream": stream,
                        "question_id": prompts[i].question_id, "identical": ok, "tokens": tokens,
                        "offline_tokens": want_tokens, **({} if ok else {"text": text, "offline_text": want_text})})
    table = ["| strategy | endpoint | streamed | identical to offline |", "|---|---|---|---|"]
    for spec in strategies:
        for ep in ("completions", "chat"):
            for stream in (False, True):
                sel = [r for r in results if r["strategy"] == spec and r["endpoint"] == ep and r["stream"] == stream]
                table.append(f"| {spec} | /v1/{'chat/' if ep == 'chat' else ''}completions | "
                             f"{'yes' if stream else 'no'} | {sum(r['identical'] for r in sel)}/{len(sel)} |")
    m = fingerprint()
    head = (f"{len(prompts)} dev questions × {args.max_new_tokens} tokens, {args.dtype}, greedy; server batch "
            f"{args.batch_size}, {args.clients} client threads; {len(jobs)} requests in {took:.0f} s; server exit "
            f"code on SIGTERM: {code}. Machine: {m['cpu']}, {m['cores']} cores, ISA {' '.join(m['isa'])}.")
    report(args, m, code, took, results, "specframe serve against offline generation", head, table,
           f"Command: `python scripts/check_serve_exactness.py {' '.join(sys.argv[1:])}`\n")
    return 1 if bad or code != 0 else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
