"""The boundary inventory (issue 55 b): each public entry × argument, a bad (or unusual) value a new user sends, and
what specframe answers — the Python API on a tiny model, the HTTP server in-process, the CLI as a subprocess (bad
flags only: each must fail before a model loads).

    python lab/scripts/boundary_inventory.py [--out inventory.md]

Prints a markdown table: entry, argument, input, answer (exception type or HTTP status or exit code) and its first
line. Nothing is asserted here (tests/ assert the fixed cases); this is the table to read for a gap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TEMPLATE = ("{% for m in messages %}{{ 'aa ' if m['role'] == 'user' else 'ab ' }}{{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}ac{% endif %}")


def _first(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:160].replace("|", "\\|")


def python_rows(sf) -> list[tuple[str, str, str, str]]:
    g = sf.generate_result
    cases = [
        ("generate_result", "prompt", "5", lambda: g(5)),
        ("generate_result", "prompt", "[1.5]", lambda: g([1.5])),
        ("generate_result", "prompt", "'hi \\ud800'", lambda: g("hi \ud800")),
        ("generate_result", "proposers", "5", lambda: g([5, 6], proposers=5)),
        ("generate_result", "proposers", "['nosuch']", lambda: g([5, 6], proposers=["nosuch"])),
        ("generate_result", "stop", "['']", lambda: g([5, 6], stop=[""])),
        ("generate_result", "seed", "-1", lambda: g([5, 6], seed=-1)),
        ("generate_result", "temperature", "nan", lambda: g([5, 6], temperature=float("nan"))),
        ("generate_result", "top_p", "0", lambda: g([5, 6], top_p=0)),
        ("generate_result", "top_k", "-1", lambda: g([5, 6], top_k=-1)),
        ("generate_result", "max_new_tokens", "2.5", lambda: g([5, 6], max_new_tokens=2.5)),
        ("generate_result", "chat", "'yes'", lambda: g("hi", chat="yes")),
        ("generate_result", "merge", "5", lambda: g([5, 6], proposers=["ngram", "none"], merge=5)),
        ("generate_result", "router", "'nosuch'", lambda: g([5, 6], proposers=["ngram", "none"], router="nosuch")),
        ("generate_result", "on_text", "5", lambda: g([5, 6], on_text=5)),
        ("submit", "cancel", "True", lambda: sf.submit([5, 6, 7], cancel=True)),
        ("generate_batch_results", "prompts", "iter([[5], [6]])", lambda: sf.generate_batch_results(iter([[5], [6]]))),
        ("generate_batch_results", "prompts", "5", lambda: sf.generate_batch_results(5)),
        ("generate_batch_results", "question_ids", "5", lambda: sf.generate_batch_results([[5, 6]], question_ids=5)),
        ("generate_batch_results", "on_result", "5", lambda: sf.generate_batch_results([[5, 6]], on_result=5)),
        ("generate_batch_results", "batch_size", "0", lambda: sf.generate_batch_results([[5, 6]], batch_size=0)),
    ]
    rows = []
    for entry, arg, value, call in cases:
        try:
            out = call()
            rows.append((entry, arg, value, "ok " + _first(str(getattr(out, "token_ids", type(out).__name__)))))
        except Exception as exc:  # noqa: BLE001 - the answer is what is inventoried
            rows.append((entry, arg, value, f"{type(exc).__name__}: {_first(str(exc))}"))
    return rows


def http_rows(sf) -> list[tuple[str, str, str, str]]:
    import httpx

    from specframe.serve.app import create_app

    app = create_app(sf, model_name="tiny", max_tokens_limit=64, max_pending=8)
    c, ch = "/v1/completions", "/v1/chat/completions"
    cases = [
        (c, "prompt", {"prompt": "hi \ud800", "max_tokens": 4}),
        (c, "prompt", {"prompt": ["aa"], "max_tokens": 4}),
        (c, "prompt", {"prompt": ["aa", "ab"], "max_tokens": 4}),
        (c, "prompt", {"prompt": [-1, 5], "max_tokens": 4}),
        (c, "prompt", {"prompt": [], "max_tokens": 4}),
        (c, "max_tokens", {"prompt": "aa", "max_tokens": 400}),
        (c, "max_tokens", {"prompt": "aa", "max_tokens": 0}),
        (c, "temperature", {"prompt": "aa", "max_tokens": 4, "temperature": 7}),
        (c, "top_k", {"prompt": "aa", "max_tokens": 4, "top_k": -1}),
        (c, "seed", {"prompt": "aa", "max_tokens": 4, "seed": 2 ** 64}),
        (c, "stop", {"prompt": "aa", "max_tokens": 4, "stop": ["a", "b", "c", "d", "e"]}),
        (c, "logprobs", {"prompt": "aa", "max_tokens": 4, "logprobs": 0}),
        (c, "stream_options", {"prompt": "aa", "max_tokens": 4, "stream_options": {"include_usage": True}}),
        (c, "n", {"prompt": "aa", "max_tokens": 4, "n": 2}),
        (c, "model", {"prompt": "aa", "max_tokens": 4, "model": "gpt-9"}),
        (c, "logit_bias", {"prompt": "aa", "max_tokens": 4, "logit_bias": {"5": 1}}),
        (c, "speculative", {"prompt": "aa", "max_tokens": 4, "speculative": {"proposers": []}}),
        (c, "speculative", {"prompt": "aa", "max_tokens": 4, "speculative": {"proposers": [{"name": "ngram", "k": -3}]}}),
        (c, "body", "[1, 2]"),
        (c, "body", "{not json"),
        (ch, "messages", {"messages": [], "max_tokens": 4}),
        (ch, "messages.role", {"messages": [{"role": "tool", "content": "x"}], "max_tokens": 4}),
        (ch, "messages.content", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}], "max_tokens": 4}),
        (ch, "messages.content", {"messages": [{"role": "user", "content": "a \udc00"}], "max_tokens": 4}),
    ]

    async def run() -> list[tuple[str, str, str, str]]:
        rows = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as cl:
            for path, arg, body in cases:
                data = body if isinstance(body, str) else json.dumps(body)
                r = await cl.post(path, content=data, headers={"content-type": "application/json"})
                try:
                    msg = r.json().get("error", {}).get("message") if r.status_code >= 400 else "ok"
                except ValueError:
                    msg = r.text
                shown = data if len(data) < 70 else data[:67] + "..."
                rows.append((f"POST {path}", arg, f"`{shown}`".replace("|", "\\|"), f"{r.status_code}: {_first(str(msg))}"))
            r = await cl.get("/v1/models/gpt-9")
            rows.append(("GET /v1/models/{id}", "id", "gpt-9", f"{r.status_code}: {_first(r.json()['error']['message'])}"))
        return rows

    return asyncio.run(run())


def cli_rows() -> list[tuple[str, str, str, str]]:
    cases = [
        ("generate", "--max-new-tokens", ["generate", "hi", "--max-new-tokens", "0"]),
        ("generate", "--temperature", ["generate", "hi", "--temperature", "-1"]),
        ("generate", "--seed", ["generate", "hi", "--seed", "-5"]),
        ("generate", "--top-p", ["generate", "hi", "--top-p", "2"]),
        ("generate", "--threads", ["generate", "hi", "--threads", "0"]),
        ("generate", "--engine", ["generate", "hi", "--engine", "nosuch"]),
        ("generate", "--proposer", ["generate", "hi", "--proposer", "nosuch"]),
        ("generate", "--stop", ["generate", "hi", "--stop", ""]),
        ("generate", "--prompts-file", ["generate", "--prompts-file", "/nonexistent.jsonl"]),
        ("bench", "--config", ["bench", "--config", "/nonexistent.yaml"]),
        ("serve", "--port", ["serve", "--port", "70000"]),
        ("serve", "--host", ["serve", "--host", "999.1.1.1"]),
        ("serve", "--batch-size", ["serve", "--batch-size", "0"]),
        ("tune", "--engine", ["tune", "--engine", "foo"]),
    ]
    rows = []
    for entry, arg, args in cases:
        r = subprocess.run([sys.executable, "-m", "specframe", *args], capture_output=True, text=True, timeout=300)
        rows.append((f"specframe {entry}", arg, " ".join(args[1:]), f"exit {r.returncode}: {_first(r.stderr)}"))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    import specframe
    from specframe.target.hf import Target

    from tests.fakes import build_model, build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = TEMPLATE
    sf = specframe.load(target=Target(build_model("llama", initializer_range=0.2), tok, name="tiny"), batch_size=2,
                        max_new_tokens=4)
    try:
        rows = python_rows(sf) + http_rows(sf) + cli_rows()
    finally:
        sf.close()
    lines = ["| entry | argument | input | answer |", "|---|---|---|---|"]
    lines += [f"| {e} | {g} | {v} | {r} |" for e, g, v, r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
