"""A bounded soak of ``specframe serve`` (issue 65): the default model, float32, under mixed traffic from a bounded
local client for ``--minutes``, with a tiny random hybrid target (recurrent and attention layers) in a second server.

    python lab/scripts/serve_soak.py --minutes 30 --output lab/results/serve-soak

Two servers on 127.0.0.1 (``scripts/check_serve_exactness.py``'s ``start_server``): the default model (``--model``,
``--dtype float32`` so greedy answers compare exactly) and a tiny random ``--hybrid-type`` model (qwen3_next:
gated-delta linear attention beside full attention; ``specframe.testing.decoder_types.build_tiny`` with the default
model's vocabulary) saved with the default model's tokenizer to a temporary folder and served from it. ``--clients``
asyncio clients send to the first and ``--hybrid-clients`` to the second (no faster than one request per
``--hybrid-interval`` seconds each: the tiny model answers in about a second and would take the CPU), one request at a
time each, every request bounded by ``--request-timeout``; a fixed ``--seed`` draws each client's requests from this
mix (what goes with a prompt — its stops, its logprobs count, its named tool — is fixed by the prompt, so that the
distinct requests stay a few hundred):

* greedy ``/v1/completions`` and ``/v1/chat/completions``, streamed or not, under ``none``, ``ngram`` or
  ``ngram+medusa`` (the request's ``speculative`` field);
* ``stop`` strings, emoji among them ("🔥"), some on prompts that make the model write emoji;
* ``response_format`` json_schema (the schemas of ``lab/data/specbench-json``) and ``tools`` with ``tool_choice``
  ``required`` or a named function, under ``grammar+ngram`` or ``none``;
* ``logprobs``: chat ``top_logprobs`` and completions ``logprobs: N``;
* cancellations: a stream left after a few pieces, a whole request left after a fraction of a second;
* bad requests (serve_load_test's six and more for chat, tools, logprobs and stops): each must be a 4xx with
  OpenAI's error object;
* to the hybrid server: greedy completions and chat (``none`` / ``ngram``), json_schema (``grammar+ngram``) and
  cancelled streams.

Every greedy answer is checked against the same request decoded alone: the body is read by the server's own schemas
and decoded by ``Specframe.generate_result`` (batch 1) in a worker process, once per distinct request (cached), while
the soak runs. Checked: text (a stream's pieces joined: a lost or repeated piece shows), ``usage.completion_tokens``,
finish reason, tool calls, log-probabilities (within ``--tolerance``); independently of the reference, a stop answer
is the stop-free answer cut at the first stop string, a finished json_schema answer or tool call validates, and
log-probabilities are well formed (N distinct alternatives per token, completions' ``tokens`` join to the text and
``text_offset`` indexes it, chat's ``bytes`` join to the content). A cancelled stream's pieces must be a prefix of
the answer.

Figures: each server's RSS every ``--rss-every`` seconds (growth after ``--warmup-minutes``; the slope of a line
fit over the second half of what follows the warm-up, judged flat when at most ``--rss-slope-limit`` MiB/min and
judged at all when that half spans 5 minutes), requests by kind × HTTP status (or cancelled / timeout / stream
error), p50 / p99 latency per kind, the greedy answers checked equal and the mismatches, 5xx answers. At the end a
few short streams (``--sigterm-tokens``) are left in flight and each server gets SIGTERM: the streams must finish
(one cut when the server's drain bound, 55 s, runs out is counted apart) and the server exit 0. The machine's load
average is sampled with the RSS: on a shared machine, latencies are mostly other processes' doing.

A line of progress a minute; ``results.json`` is rewritten each minute and ``report.md`` at the end (Ctrl-C ends
the soak early, as if its time were up). Exit code 1 on any failure: a mismatch, a 5xx, an error inside a stream, a
bad request not refused with a 4xx error object, a request past its time bound, RSS not flat, a server not exiting 0.

``--edge-cases`` adds requests for bugs known and being fixed (issue 65 items 1, 2, 4, 5, 6): schemas nested too
deep or satisfied by no finite JSON (must be a 4xx), ``stop: ["\\ufffd"]`` on emoji, completions ``logprobs`` on
emoji. Off by default until those fixes land.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import math
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from specframe.bench.runner import environment, select_questions
from specframe.io.prompts import read_prompts
from specframe.serve.app import create_app
from specframe.target.machine import fingerprint

_HERE = Path(__file__).resolve()
sys.path.insert(0, str(_HERE.parents[2] / "scripts"))  # the serving check's helpers
sys.path.insert(0, str(_HERE.parent))  # the load test's and the structured check's
from check_serve_exactness import DEFAULT_QUESTIONS, entries, free_port, start_server
from serve_load_test import MALFORMED, rss_kib
from serve_structured_check import DECOY, answer_tool, valid

DRAIN_S = inspect.signature(create_app).parameters["drain_s"].default  # a stream's time to finish after SIGTERM
STRUCTURED_QUESTIONS = _HERE.parents[1] / "data" / "specbench-json" / "question.jsonl"
STRATEGIES = ["none", "ngram", "ngram+medusa"]
STRUCTURED_STRATEGIES = ["grammar+ngram", "none"]
HYBRID_STRATEGIES = ["none", "ngram"]
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"

# prompts that make the model write emoji, and stops to try on them
EMOJI_CHAT = ["Repeat exactly: 🔥🔥🔥 🎉🎉🎉",
              "Write one cheerful sentence about summer with a sun emoji and a fire emoji in it.",
              "List three fruits, each followed by its emoji.",
              "Describe a campfire in five words and three emoji."]
EMOJI_COMPLETIONS = ["Fire emoji party: 🔥🔥🔥 🔥🔥🔥 🔥🔥", "Weather report in emoji only: ☀️ 🌧️ ⛅ 🔥",
                     "My favourite emoji are 😀, 🔥, 🎉 and", "🔥 Hot take 🔥: pineapple on pizza is"]
EMOJI_STOPS = [["🔥"], ["🔥", "\n"], ["🎉", "!"], ["😀"], ["☀️", "."]]
TEXT_STOPS = [["."], ["\n"], [" and"], ["!", "?"], ["\n\n", "🔥"], [","]]

# tools: the structured check's decoy beside a weather function (named calls pick either)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TOOL_PROMPTS = ["What is the weather in Paris right now?", "Is it cold in Oslo today? Use celsius.",
                "Look up the word 'serendipity'.", "What does 'ephemeral' mean?"]


def _deep(depth: int, kind: str) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = ({"type": "object", "properties": {"a": schema}, "required": ["a"]} if kind == "object"
                  else {"type": "array", "items": schema, "minItems": 1})
    return schema


def _chat(text: str, **kw: Any) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 8, **kw}


# bad requests beyond serve_load_test's MALFORMED (which go to /v1/completions): (name, method, path, body, status)
BAD = [(name, "POST", COMPLETIONS, body, status) for name, body, status in MALFORMED] + [
    ("chat: bad JSON", "POST", CHAT, b'{"messages": [', 400),
    ("chat: no messages", "POST", CHAT, {"messages": [], "max_tokens": 4}, 400),
    ("chat: unknown role", "POST", CHAT, {"messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 4}, 400),
    ("chat: another model", "POST", CHAT, _chat("hi", model="gpt-4o"), 404),
    ("chat: tool_choice auto", "POST", CHAT, _chat("hi", tools=[WEATHER], tool_choice="auto"), 400),
    ("chat: tools without tool_choice", "POST", CHAT, _chat("hi", tools=[WEATHER]), 400),
    ("chat: tool_choice names no tool", "POST", CHAT,
     _chat("hi", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nosuch"}}), 400),
    ("chat: tools and response_format", "POST", CHAT,
     _chat("hi", tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}), 400),
    ("chat: top_logprobs without logprobs", "POST", CHAT, _chat("hi", top_logprobs=3), 400),
    ("chat: top_logprobs 21", "POST", CHAT, _chat("hi", logprobs=True, top_logprobs=21), 400),
    ("chat: json_schema without schema", "POST", CHAT, _chat("hi", response_format={"type": "json_schema"}), 400),
    ("chat: schema of an unknown type", "POST", CHAT, _chat("hi", response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nosuch"}}}), 400),
    ("chat: image content", "POST", CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}], "max_tokens": 4}, 400),
    ("completions: logprobs true", "POST", COMPLETIONS, {"prompt": "hi", "max_tokens": 4, "logprobs": True}, 400),
    ("completions: five stops", "POST", COMPLETIONS,
     {"prompt": "hi", "max_tokens": 4, "stop": ["a", "b", "c", "d", "e"]}, 400),
    ("completions: empty stop", "POST", COMPLETIONS, {"prompt": "hi", "max_tokens": 4, "stop": [""]}, 400),
    ("completions: n 2", "POST", COMPLETIONS, {"prompt": "hi", "max_tokens": 4, "n": 2}, 400),
    ("completions: max_tokens 0", "POST", COMPLETIONS, {"prompt": "hi", "max_tokens": 0}, 400),
    ("completions: top_p 0", "POST", COMPLETIONS, {"prompt": "hi", "max_tokens": 4, "top_p": 0}, 400),
    ("completions: lone surrogate", "POST", COMPLETIONS, b'{"prompt": "a\\ud800b", "max_tokens": 4}', 400),
    ("completions: stream_options without stream", "POST", COMPLETIONS,
     {"prompt": "hi", "max_tokens": 4, "stream_options": {"include_usage": True}}, 400),
    ("completions: bad proposer option", "POST", COMPLETIONS,
     {"prompt": "hi", "max_tokens": 4, "speculative": {"proposers": [{"name": "ngram", "k": -3}]}}, 400),
    ("completions: proposer not allowed", "POST", COMPLETIONS,
     {"prompt": "hi", "max_tokens": 4, "speculative": {"proposers": ["draft-model"]}}, 400),
    ("completions: longer than the context", "POST", COMPLETIONS,
     {"prompt": "word " * 7000, "max_tokens": 4000}, 400),
    ("unknown path", "POST", "/v1/nosuch", {"prompt": "hi"}, 404),
    ("GET on completions", "GET", COMPLETIONS, None, 405),
]
# --edge-cases: bugs known and being fixed (issue 65 items 1 and 2): each must be a 4xx too
EDGE_BAD = [
    ("edge: schema 200 objects deep", "POST", CHAT, _chat("hi", response_format={
        "type": "json_schema", "json_schema": {"name": "deep", "schema": _deep(200, "object")}}), 400),
    ("edge: schema 300 arrays deep", "POST", CHAT, _chat("hi", response_format={
        "type": "json_schema", "json_schema": {"name": "deep", "schema": _deep(300, "array")}}), 400),
    ("edge: tool parameters 200 deep", "POST", CHAT, _chat("hi", tools=[{"type": "function", "function": {
        "name": "deep", "parameters": _deep(200, "object")}}], tool_choice="required"), 400),
    ("edge: schema no finite JSON satisfies", "POST", CHAT, _chat("hi", response_format={
        "type": "json_schema", "json_schema": {"name": "loop", "schema": {
            "type": "array", "items": {"$ref": "#"}, "minItems": 1}}}), 400),
    ("edge: required property refers to itself", "POST", CHAT, _chat("hi", response_format={
        "type": "json_schema", "json_schema": {"name": "loop", "schema": {
            "type": "object", "properties": {"self": {"$ref": "#"}}, "required": ["self"]}}}), 400),
]


# ---------------------------------------------------------------------------------------------------------------
# the reference: the same request decoded alone, in a worker process (its own copy of each model)

_REF: dict[str, Any] = {}


def _ref_init(model: str, dtype: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C ends the soak, which then drains this worker)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import specframe
    import specframe.serve.schemas
    import specframe.serve.structured  # (now, as the server did: not later, half-way through someone's edit)

    _REF["main"] = specframe.load(model=model, dtype=dtype)


def _build_hybrid(model_type: str, folder: str) -> dict:
    """Save a tiny random ``model_type`` model with the default model's vocabulary and tokenizer to ``folder``, and
    load it here for the references."""
    import specframe
    from specframe.testing.decoder_types import build_tiny, family

    tok = _REF["main"].target.tokenizer
    model = build_tiny(model_type, seed=0, vocab_size=len(tok))
    if model.config.vocab_size != len(tok):
        raise SystemExit(f"build_tiny({model_type!r}, vocab_size={len(tok)}) built a vocabulary of "
                         f"{model.config.vocab_size}")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    _REF["hybrid"] = specframe.load(model=folder, dtype="float32")
    return {"model_type": model_type, "family": family(model_type, model.config),
            "parameters": sum(p.numel() for p in model.parameters()), "vocab_size": model.config.vocab_size,
            "max_positions": int(_REF["hybrid"].target.max_context)}


def _reference(server: str, path: str, body: dict) -> dict:
    """The answer to ``body`` (without streaming) decoded alone, in the normal form of :func:`_normal`."""
    from specframe.serve.schemas import ChatRequest, CompletionRequest
    from specframe.serve.structured import chat_logprobs, completion_logprobs, request_constraint, tool_calls

    sf = _REF[server]
    tok = sf.target.tokenizer
    chat = path == CHAT
    try:
        req = (ChatRequest if chat else CompletionRequest).model_validate(body)
        constraint, calls = request_constraint(req)
        if chat:
            tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
            ids = tok.apply_chat_template([m.for_template() for m in req.messages], tools=tools,
                                          add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        else:
            ids = sf.encode(req.prompt, False) if isinstance(req.prompt, str) else req.prompt
        spec = req.speculative
        r = sf.generate_result(list(ids), chat=False, proposers=spec.proposers if spec else None,
                               merge=spec.merge if spec else None, router=spec.router if spec else None,
                               max_new_tokens=req.limit, temperature=req.temperature, stop=req.stop or None,
                               constraint=constraint, logprobs=req.top_logprobs_n)
    except Exception as exc:  # noqa: BLE001 - reported beside what the server said
        return {"raised": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"}
    made = tool_calls(r.text, calls) if calls is not None and r.finish_reason == "stop" else None
    return {"text": "" if made else r.text, "tokens": r.metrics.new_tokens,
            "finish": "tool_calls" if made else r.finish_reason,
            "tool_calls": [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
                           for c in made or []],
            "logprobs": chat_logprobs(r, tok) if chat else completion_logprobs(r, tok)}


# ---------------------------------------------------------------------------------------------------------------
# the traffic


@dataclass
class Job:
    server: str  # "main" | "hybrid"
    kind: str  # the label figures are kept under
    path: str
    body: Any  # a dict (sent as JSON), bytes (sent as they are) or None
    method: str = "POST"
    stream: bool = False
    expect: str = "answer"  # "answer" | "cancel" | "bad"
    status: int = 200  # a bad request's expected status
    name: str = ""  # a bad request's name
    cancel_after: int | None = None  # a stream: leave after this many pieces
    cancel_s: float | None = None  # a whole request: leave after this many seconds
    schema: dict | None = None  # validate a finished answer against it
    tools: list | None = None  # a tool call's functions
    plain: dict | None = None  # a stop request: the same body without its stops

    def sent(self) -> dict:
        """The body as sent (streaming fields added)."""
        if not isinstance(self.body, dict) or not self.stream:
            return self.body
        return {**self.body, "stream": True, "stream_options": {"include_usage": True}}


class Traffic:
    """Draws requests: the pools and the mix."""

    def __init__(self, args: argparse.Namespace, questions: list[str], structured: list[tuple[str, dict]]) -> None:
        self.args, self.questions, self.structured = args, questions, structured
        self.hybrid_questions = [" ".join(q.split()[:40]) for q in questions]  # (the tiny model: 512 positions)
        self.bad = BAD + (EDGE_BAD if args.edge_cases else [])

    def _greedy(self, rng: random.Random, strategies: list[str], max_tokens: int, **kw: Any) -> dict:
        return {"max_tokens": max_tokens, "temperature": 0,
                "speculative": {"proposers": entries(rng.choice(strategies))}, **kw}

    def draw(self, rng: random.Random, server: str) -> Job:
        return self._hybrid(rng) if server == "hybrid" else self._main(rng)

    def _main(self, rng: random.Random) -> Job:
        a = self.args
        u = rng.random()
        stream = rng.random() < 0.5
        chat = rng.random() < 0.5
        path = CHAT if chat else COMPLETIONS
        ep = "chat" if chat else "completions"
        i = rng.randrange(len(self.questions))  # (what goes with a prompt is fixed by its index: fewer references)
        q = self.questions[i]
        prompt = {"messages": [{"role": "user", "content": q}]} if chat else {"prompt": q}
        s = "+stream" if stream else ""
        if u < 0.26:  # plain greedy
            return Job("main", ep + s, path, self._greedy(rng, STRATEGIES, a.max_new_tokens, **prompt), stream=stream)
        if u < 0.40:  # stops, with emoji
            emoji = rng.random() < 0.6
            if emoji:
                i = rng.randrange(len(EMOJI_CHAT))
                text = (EMOJI_CHAT if chat else EMOJI_COMPLETIONS)[i]
                prompt = {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}
            stops = EMOJI_STOPS[i % len(EMOJI_STOPS)] if emoji else TEXT_STOPS[i % len(TEXT_STOPS)]
            kind = f"stop:{ep}{s}"
            if a.edge_cases and emoji and rng.random() < 0.3:  # issue 65 item 6
                stops, kind = ["\ufffd"], f"edge:stop-fffd:{ep}{s}"
            plain = self._greedy(rng, STRATEGIES, a.max_new_tokens, **prompt)
            return Job("main", kind, path, {**plain, "stop": stops}, stream=stream, plain=plain)
        if u < 0.50:  # json_schema
            text, schema = rng.choice(self.structured)
            body = self._greedy(rng, STRUCTURED_STRATEGIES, a.structured_tokens,
                                messages=[{"role": "user", "content": text}],
                                response_format={"type": "json_schema", "json_schema": {
                                    "name": "answer", "strict": True, "schema": schema}})
            return Job("main", "json_schema" + s, CHAT, body, stream=stream, schema=schema)
        if u < 0.60:  # tools
            if rng.random() < 0.5:
                j = rng.randrange(len(self.structured))
                (text, schema), tools = self.structured[j], [DECOY, answer_tool(self.structured[j][1])]
            else:
                j = rng.randrange(len(TOOL_PROMPTS))
                text, tools = TOOL_PROMPTS[j], [DECOY, WEATHER]
            named = rng.random() < 0.5
            choice = {"type": "function", "function": {"name": tools[1 - j % 2]["function"]["name"]}} if named \
                else "required"
            body = self._greedy(rng, STRUCTURED_STRATEGIES, a.structured_tokens,
                                messages=[{"role": "user", "content": text}], tools=tools, tool_choice=choice)
            return Job("main", f"tools:{'named' if named else 'required'}{s}", CHAT, body, stream=stream, tools=tools)
        if u < 0.72:  # logprobs
            kind = f"logprobs:{ep}{s}"
            if a.edge_cases and not chat and rng.random() < 0.3:  # issue 65 items 4 and 5
                i = rng.randrange(len(EMOJI_COMPLETIONS))
                prompt, kind = {"prompt": EMOJI_COMPLETIONS[i]}, f"edge:logprobs-emoji:{ep}{s}"
            extra = {"logprobs": True, "top_logprobs": [0, 2, 5][i % 3]} if chat else {"logprobs": [1, 3, 5][i % 3]}
            return Job("main", kind, path, self._greedy(rng, STRATEGIES, a.max_new_tokens, **prompt, **extra),
                       stream=stream)
        if u < 0.84:  # cancellations
            body = self._greedy(rng, STRATEGIES, a.max_new_tokens, **prompt)
            if rng.random() < 0.6:
                return Job("main", "cancel:stream", path, body, stream=True, expect="cancel",
                           cancel_after=rng.randint(1, 4))
            return Job("main", "cancel:whole", path, body, expect="cancel", cancel_s=rng.uniform(0.2, 3.0))
        name, method, bpath, body, status = rng.choice(self.bad)
        return Job("main", "edge:bad" if name.startswith("edge:") else "bad", bpath, body, method=method,
                   expect="bad", status=status, name=name)

    def _hybrid(self, rng: random.Random) -> Job:
        a = self.args
        u = rng.random()
        stream = rng.random() < 0.5
        chat = rng.random() < 0.5
        q = rng.choice(self.hybrid_questions)
        prompt = {"messages": [{"role": "user", "content": q}]} if chat else {"prompt": q}
        path, s = (CHAT if chat else COMPLETIONS), ("+stream" if stream else "")
        if u < 0.75:
            return Job("hybrid", f"hybrid:{'chat' if chat else 'completions'}{s}", path,
                       self._greedy(rng, HYBRID_STRATEGIES, a.max_new_tokens, **prompt), stream=stream)
        if u < 0.9:
            text, schema = rng.choice(self.structured)
            body = self._greedy(rng, ["grammar+ngram"], a.max_new_tokens,
                                messages=[{"role": "user", "content": " ".join(text.split()[-30:])}],
                                response_format={"type": "json_schema", "json_schema": {
                                    "name": "answer", "schema": schema}})
            return Job("hybrid", "hybrid:json_schema" + s, CHAT, body, stream=stream, schema=schema)
        return Job("hybrid", "hybrid:cancel:stream", path, self._greedy(rng, HYBRID_STRATEGIES, a.max_new_tokens,
                                                                          **prompt),
                   stream=True, expect="cancel", cancel_after=rng.randint(1, 4))


# ---------------------------------------------------------------------------------------------------------------
# one request


def _error_object(r: httpx.Response) -> str | None:
    """None when ``r`` carries OpenAI's error object, else what is wrong with it."""
    try:
        err = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        return f"no error object: {r.text[:200]!r}"
    missing = [k for k in ("message", "type", "param", "code") if k not in err]
    if missing or not isinstance(err.get("message"), str) or not err["message"]:
        return f"error object without {', '.join(missing) or 'a message'}: {json.dumps(err)[:200]}"
    return None


def _merge_logprobs(have: dict | None, more: dict, chat: bool) -> dict:
    if have is None:
        return more
    if chat:
        return {"content": (have.get("content") or []) + (more.get("content") or [])}
    return {k: (have.get(k) or []) + (more.get(k) or []) for k in ("tokens", "token_logprobs", "top_logprobs",
                                                                   "text_offset")}


def _calls(raw: list) -> list:
    out = []
    for c in raw:
        try:
            args = json.loads(c["function"]["arguments"])
        except (ValueError, KeyError, TypeError):
            args = {"unparsed": (c.get("function") or {}).get("arguments")}
        out.append({"name": (c.get("function") or {}).get("name"), "arguments": args})
    return out


async def _whole(http: httpx.AsyncClient, job: Job) -> dict:
    req = http.post(job.path, json=job.body)
    if job.cancel_s is not None:
        try:
            r = await asyncio.wait_for(req, job.cancel_s)
        except asyncio.TimeoutError:
            return {"status": "cancelled"}
    else:
        r = await req
    if r.status_code != 200:
        return {"status": r.status_code, "error": r.text[:1000]}
    d = r.json()
    c = d["choices"][0]
    chat = job.path == CHAT
    text = (c["message"].get("content") if chat else c.get("text")) or ""
    return {"status": 200, "answer": {
        "text": text, "tokens": (d.get("usage") or {}).get("completion_tokens"), "finish": c.get("finish_reason"),
        "tool_calls": _calls(c["message"].get("tool_calls") or []) if chat else [],
        "logprobs": c.get("logprobs")}}


async def _streamed(http: httpx.AsyncClient, job: Job) -> dict:
    chat = job.path == CHAT
    pieces: list[str] = []
    calls: dict[int, dict] = {}
    logprobs, finish, finishes, usage, done = None, None, 0, None, False
    async with http.stream("POST", job.path, json=job.sent()) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "error": (await r.aread()).decode("utf-8", "replace")[:1000]}
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            obj = json.loads(data)
            if "error" in obj:
                return {"status": "stream error", "error": json.dumps(obj["error"])[:1000], "pieces": pieces}
            usage = obj.get("usage") or usage
            for c in obj.get("choices", []):
                delta = c.get("delta") or {}
                piece = delta.get("content") if chat else c.get("text")
                if piece:
                    pieces.append(piece)
                for t in delta.get("tool_calls") or []:
                    have = calls.setdefault(t.get("index", 0), {"function": {"name": None, "arguments": ""}})
                    fn = t.get("function") or {}
                    have["function"]["name"] = fn.get("name") or have["function"]["name"]
                    have["function"]["arguments"] += fn.get("arguments") or ""
                if c.get("logprobs"):
                    logprobs = _merge_logprobs(logprobs, c["logprobs"], chat)
                if c.get("finish_reason"):
                    finish, finishes = c["finish_reason"], finishes + 1
            if job.cancel_after is not None and len(pieces) >= job.cancel_after:
                return {"status": "cancelled", "pieces": pieces}  # leaving the block closes the connection
    if not done or finishes != 1:
        return {"status": "stream error", "error": f"[DONE] {'seen' if done else 'missing'}, {finishes} finish "
                                                   "chunks", "pieces": pieces}
    return {"status": 200, "pieces": pieces, "answer": {
        "text": "".join(pieces), "tokens": (usage or {}).get("completion_tokens"), "finish": finish,
        "tool_calls": _calls([calls[i] for i in sorted(calls)]), "logprobs": logprobs}}


async def _bad(http: httpx.AsyncClient, job: Job) -> dict:
    kw: dict[str, Any] = {}
    if isinstance(job.body, bytes):
        kw = {"content": job.body, "headers": {"content-type": "application/json"}}
    elif job.body is not None:
        kw = {"json": job.body}
    r = await http.request(job.method, job.path, **kw)
    return {"status": r.status_code, "error": r.text[:1000], "why": _error_object(r)}


async def run_job(http: httpx.AsyncClient, job: Job) -> dict:
    if job.expect == "bad":
        return await _bad(http, job)
    return await (_streamed(http, job) if job.stream else _whole(http, job))


# ---------------------------------------------------------------------------------------------------------------
# checks


def _same_logprobs(got: Any, want: Any, chat: bool, tol: float) -> str | None:
    """None when the two ``logprobs`` objects agree (tokens and alternatives equal, values within ``tol``)."""
    if (got is None) != (want is None):
        return f"logprobs {'missing' if got is None else 'unexpected'}"
    if got is None:
        return None

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= tol or a == b

    if chat:
        g, w = got.get("content") or [], want.get("content") or []
        if len(g) != len(w):
            return f"{len(g)} logprob entries, alone {len(w)}"
        for i, (a, b) in enumerate(zip(g, w)):
            if a["token"] != b["token"] or a["bytes"] != b["bytes"] or not close(a["logprob"], b["logprob"]):
                return f"logprob entry {i}: {a['token']!r} {a['logprob']:.6f}, alone {b['token']!r} {b['logprob']:.6f}"
            ta = sorted((t["token"], tuple(t["bytes"] or ()), t["logprob"]) for t in a["top_logprobs"])
            tb = sorted((t["token"], tuple(t["bytes"] or ()), t["logprob"]) for t in b["top_logprobs"])
            if [t[:2] for t in ta] != [t[:2] for t in tb] or not all(close(x[2], y[2]) for x, y in zip(ta, tb)):
                return f"top_logprobs of entry {i} differ: {ta} vs alone {tb}"
        return None
    if got.get("tokens") != want.get("tokens") or got.get("text_offset") != want.get("text_offset"):
        return f"logprob tokens {got.get('tokens')} / offsets {got.get('text_offset')}, alone {want.get('tokens')} " \
               f"/ {want.get('text_offset')}"
    if len(got["token_logprobs"]) != len(want["token_logprobs"]) or not all(
            close(a, b) for a, b in zip(got["token_logprobs"], want["token_logprobs"])):
        return "token_logprobs differ beyond the tolerance"
    for i, (a, b) in enumerate(zip(got["top_logprobs"], want["top_logprobs"])):
        if sorted(a) != sorted(b) or not all(close(a[k], b[k]) for k in a):
            return f"top_logprobs of token {i} differ: {a} vs alone {b}"
    return None


def _logprobs_shape(answer: dict, job: Job) -> str | None:
    """What is wrong with an answer's log-probabilities on their own (None: nothing): N distinct alternatives per
    token; completions' tokens join to the text and text_offset indexes it; chat's bytes join to the content."""
    lp, body = answer.get("logprobs"), job.body
    if lp is None:
        return "no logprobs"
    if job.path == CHAT:
        n = body.get("top_logprobs") or 0
        content = lp.get("content") or []
        for i, e in enumerate(content):
            if len(e["top_logprobs"]) != n or len({(t["token"], tuple(t["bytes"] or ())) for t in e["top_logprobs"]}) \
                    != n:
                return f"entry {i}: {len(e['top_logprobs'])} top_logprobs, asked {n}"
        joined = bytes(b for e in content for b in e["bytes"] or ())
        if answer["text"] and joined.decode("utf-8", "replace") != answer["text"]:
            return f"the tokens' bytes join to {joined.decode('utf-8', 'replace')!r}, not the content"
        return None
    n = body.get("logprobs") or 0
    for i, top in enumerate(lp.get("top_logprobs") or []):
        if len(top) != n:
            return f"token {i}: {len(top)} distinct alternatives, asked {n} ({top})"
    tokens, offsets = lp.get("tokens") or [], lp.get("text_offset") or []
    if "".join(tokens) != answer["text"]:
        return f"tokens join to {''.join(tokens)!r}, not the text {answer['text']!r}"
    at = 0
    for i, (t, o) in enumerate(zip(tokens, offsets)):
        if o != at:
            return f"text_offset[{i}] = {o}, the token starts at {at}"
        at += len(t)
    return None


def _cut_at_stops(text: str, stops: list[str]) -> str:
    at = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return text if at < 0 else text[:at]


def compare(job: Job, answer: dict, ref: dict, tol: float) -> list[str]:
    """What differs between the server's answer and the same request decoded alone (empty: nothing)."""
    out = []
    if answer["text"] != ref["text"]:
        out.append(("stream text" if job.stream else "text") + f" {answer['text']!r}, alone {ref['text']!r}")
    if answer["tokens"] != ref["tokens"]:
        out.append(f"usage.completion_tokens {answer['tokens']}, alone {ref['tokens']}")
    if answer["finish"] != ref["finish"]:
        out.append(f"finish {answer['finish']}, alone {ref['finish']}")
    if answer["tool_calls"] != ref["tool_calls"]:
        out.append(f"tool calls {answer['tool_calls']}, alone {ref['tool_calls']}")
    why = _same_logprobs(answer["logprobs"], ref["logprobs"], job.path == CHAT, tol)
    if why:
        out.append(why)
    return out


def own_checks(job: Job, answer: dict) -> list[str]:
    """Checks of an answer on its own: validity of finished structured answers, well-formed logprobs, no stop string
    in a stop answer."""
    out = []
    if job.schema is not None and answer["finish"] == "stop":
        why = valid(answer["text"], job.schema)
        if why:
            out.append(f"finished json_schema answer does not validate: {why}")
    if job.tools is not None and answer["finish"] == "tool_calls":
        if len(answer["tool_calls"]) != 1:
            out.append(f"{len(answer['tool_calls'])} tool calls")
        for c in answer["tool_calls"]:
            fn = next((t["function"] for t in job.tools if t["function"]["name"] == c["name"]), None)
            choice = job.body.get("tool_choice")
            if fn is None or (isinstance(choice, dict) and choice["function"]["name"] != c["name"]):
                out.append(f"call of {c['name']!r}, tool_choice {choice}")
            elif (why := valid(json.dumps(c["arguments"]), fn["parameters"])) is not None:
                out.append(f"arguments do not validate: {why}")
    if job.body.get("logprobs") not in (None, False):
        why = _logprobs_shape(answer, job)
        if why:
            out.append(f"logprobs: {why}")
    for s in job.body.get("stop") or []:
        if s in answer["text"]:
            out.append(f"stop string {s!r} in the text")
    return out


# ---------------------------------------------------------------------------------------------------------------
# the soak's state and figures


def percentile(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[max(0, math.ceil(p / 100 * len(xs)) - 1)]


def slope_per_min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute."""
    if len(points) < 3:
        return None
    n = len(points)
    mx, my = sum(t for t, _ in points) / n, sum(v for _, v in points) / n
    sxx = sum((t - mx) ** 2 for t, _ in points)
    return 60 * sum((t - mx) * (v - my) for t, v in points) / sxx if sxx else None


@dataclass
class Soak:
    args: argparse.Namespace
    pool: ProcessPoolExecutor
    servers: dict = field(default_factory=dict)  # name -> {"proc", "base", "model", ...}
    t0: float = field(default_factory=time.monotonic)
    status: Counter = field(default_factory=Counter)  # (kind, status) -> requests
    latency: dict = field(default_factory=lambda: defaultdict(list))
    bad_seen: dict = field(default_factory=lambda: defaultdict(Counter))  # bad request name -> status -> n
    refs: dict = field(default_factory=dict)  # key -> Future of the reference
    waiting: list = field(default_factory=list)  # (job, result, kind of check) awaiting a reference
    checked: Counter = field(default_factory=Counter)  # figures of the greedy checks
    failures: list = field(default_factory=list)
    failure_count: Counter = field(default_factory=Counter)
    notes: list = field(default_factory=list)  # a bad request answered by another 4xx than expected
    rss: dict = field(default_factory=lambda: defaultdict(list))  # server -> [(seconds, KiB)]
    loadavg: list = field(default_factory=list)  # [(seconds, the machine's 1-minute load average)]
    requests: int = 0
    interrupted: bool = False
    finished: bool = False
    sigterm: dict = field(default_factory=dict)
    hybrid: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    machine: dict = field(default_factory=fingerprint)
    env: dict = field(default_factory=environment)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def fail(self, what: str, job: Job, detail: Any) -> None:
        self.failure_count[what] += 1
        if len(self.failures) < 200:
            self.failures.append({"what": what, "at_s": round(self.elapsed(), 1), "server": job.server,
                                  "kind": job.kind, "method": job.method, "path": job.path,
                                  "body": job.sent() if not isinstance(job.body, bytes) else job.body.decode(),
                                  "detail": detail})

    def reference(self, server: str, path: str, body: dict) -> str:
        key = json.dumps([server, path, body], sort_keys=True, ensure_ascii=False)
        if key not in self.refs:
            self.refs[key] = self.pool.submit(_reference, server, path, body)
        return key

    def record(self, job: Job, res: dict, seconds: float) -> None:
        self.requests += 1
        st = res["status"]
        self.status[job.kind, str(st)] += 1
        if isinstance(st, int) and st < 500 and st != 499:
            self.latency[job.kind].append(seconds)
        if isinstance(st, int) and st >= 500:
            self.fail("5xx", job, res)
            return
        if job.expect == "bad":
            self.bad_seen[job.name][str(st)] += 1
            if not (isinstance(st, int) and 400 <= st < 500) or res["why"]:
                self.fail("bad request not refused with a 4xx error object", job, res)
            elif st != job.status:
                self.notes.append(f"{job.name}: {st}, expected {job.status}")
            return
        if st == "cancelled" and job.expect == "cancel":
            if job.cancel_after is not None:
                self.waiting.append((job, res, "prefix", self.reference(job.server, job.path, job.body)))
            return
        if st != 200:
            self.fail({"timeout": "request past its time bound", "stream error": "error in a stream"}.get(
                str(st), f"status {st}"), job, res)
            return
        self.waiting.append((job, res, "answer", self.reference(job.server, job.path, job.body)))
        if job.plain is not None:
            self.waiting.append((job, res, "stop", self.reference(job.server, job.path, job.plain)))
        whys = own_checks(job, res["answer"])
        for why in whys:
            self.fail("answer not well formed", job, {"why": why, "answer": res["answer"]})
        if not whys and (job.schema is not None or job.tools is not None) and \
                res["answer"]["finish"] in ("stop", "tool_calls"):
            self.checked["structured answers finished and valid"] += 1

    def check_ready(self) -> None:
        still = []
        for job, res, how, key in self.waiting:
            fut = self.refs[key]
            if not fut.done():
                still.append((job, res, how, key))
                continue
            try:
                ref = fut.result()
            except Exception as exc:  # noqa: BLE001 - the worker died: every waiting check fails with it
                ref = {"raised": f"reference worker: {type(exc).__name__}: {exc}"}
            if how == "prefix":
                got = "".join(res["pieces"])
                ok = "raised" not in ref and ref["text"].startswith(got)
                self.checked["cancelled streams, prefix of the answer" if ok else "cancelled streams, NOT a prefix"] += 1
                if not ok:
                    self.fail("cancelled stream not a prefix of the answer", job, {"pieces": res["pieces"],
                                                                                   "alone": ref})
                continue
            if how == "stop":
                if "raised" in ref:
                    continue
                want = _cut_at_stops(ref["text"], job.body["stop"])
                ok = res["answer"]["text"] == want
                self.checked["stop answers = the stop-free answer cut at the stop" if ok else "stop cut wrong"] += 1
                if not ok:
                    self.fail("stop answer is not the stop-free answer cut at the first stop", job, {
                        "answer": res["answer"]["text"], "stop-free answer": ref["text"], "cut": want})
                continue
            if "raised" in ref:  # nothing to compare with: a failure of its own
                self.checked["answers with no reference (decoding alone raised)"] += 1
                self.fail("the same request alone raised", job, {"answer": res["answer"], "alone": ref})
                continue
            diff = compare(job, res["answer"], ref, self.args.tolerance)
            self.checked["greedy answers checked"] += 1
            self.checked["greedy answers equal to alone" if not diff else "greedy MISMATCHES"] += 1
            if job.stream:
                self.checked["streams checked"] += 1
                if res["answer"]["text"] != ref.get("text"):
                    self.checked["streams with lost or repeated text"] += 1
                if res["answer"]["tokens"] != ref.get("tokens"):
                    self.checked["streams with a wrong usage count"] += 1
            if diff:
                self.fail("greedy answer differs from the same request alone", job, {
                    "differences": diff, "answer": res["answer"], "alone": ref})
        self.waiting = still

    def rss_figures(self) -> dict:
        out = {}
        warm = self.args.warmup_minutes * 60
        for name, samples in self.rss.items():
            after = [(t, kib / 1024) for t, kib in samples if t >= warm]
            fig: dict[str, Any] = {"samples": len(samples), "first_mib": round(samples[0][1] / 1024, 1) if samples
                                   else None, "last_mib": round(samples[-1][1] / 1024, 1) if samples else None}
            if len(after) >= 2:
                mid = after[0][0] + (after[-1][0] - after[0][0]) / 2
                half = [p for p in after if p[0] >= mid]
                slope = slope_per_min(half)
                span = (half[-1][0] - half[0][0]) if half else 0
                fig.update(at_warmup_mib=round(after[0][1], 1), growth_after_warmup_mib=round(after[-1][1] -
                                                                                               after[0][1], 1),
                           peak_mib=round(max(v for _, v in after), 1),
                           slope_second_half_mib_per_min=None if slope is None else round(slope, 3),
                           second_half_s=round(span))
                if slope is None or span < 300 or len(half) < 10:
                    fig["verdict"] = "too short to judge (the second half after warm-up spans under 5 minutes)"
                else:
                    fig["verdict"] = "flat" if slope <= self.args.rss_slope_limit else "GROWING"
            else:
                fig["verdict"] = "no samples after the warm-up"
            out[name] = fig
        return out

    def summary(self) -> dict:
        kinds = sorted({k for k, _ in self.status})
        by_kind = {k: {s: n for (kk, s), n in sorted(self.status.items()) if kk == k} for k in kinds}
        lat = {k: {"n": len(v), "p50_s": round(percentile(v, 50), 3), "p99_s": round(percentile(v, 99), 3),
                   "max_s": round(max(v), 3)} for k, v in sorted(self.latency.items()) if v}
        five = sum(n for (_, s), n in self.status.items() if s.isdigit() and int(s) >= 500)
        return {"elapsed_s": round(self.elapsed(), 1), "requests": self.requests, "by_kind_status": by_kind,
                "latency": lat, "checks": dict(self.checked), "awaiting_reference": len(self.waiting),
                "references": len(self.refs), "references_done": sum(f.done() for f in self.refs.values()),
                "http_5xx": five, "rss": self.rss_figures(), "failures_by_kind": dict(self.failure_count),
                "bad_requests": {k: dict(v) for k, v in sorted(self.bad_seen.items())},
                "unexpected_4xx": sorted(set(self.notes))}

    def failed(self, s: dict) -> list[str]:
        why = [f"{n} × {what}" for what, n in sorted(self.failure_count.items())]
        for name, fig in s["rss"].items():
            if fig["verdict"] == "GROWING":
                why.append(f"RSS of the {name} server grows {fig['slope_second_half_mib_per_min']} MiB/min over the "
                           "second half after warm-up")
        for name, st in self.sigterm.items():
            if st.get("exit_code") != 0:
                why.append(f"the {name} server exited {st.get('exit_code')} on SIGTERM")
            if st.get("drained", 0) + st.get("cut_by_drain_bound", 0) != st.get("in_flight"):
                why.append(f"{name}: {st.get('drained')}/{st.get('in_flight')} streams in flight at SIGTERM finished")
        if self.waiting:
            why.append(f"{len(self.waiting)} answers never checked (no reference)")
        return why

    def write(self, out: Path | None) -> dict:
        s = self.summary()
        if out is None:
            return s
        out.mkdir(parents=True, exist_ok=True)
        data = {"args": {k: str(v) for k, v in vars(self.args).items()}, "command": command(),
                "commit": commit(), "environment": self.env, "machine": self.machine,
                "finished": self.finished, "interrupted": self.interrupted,
                "servers": {n: {k: v for k, v in x.items() if k != "proc"} for n, x in self.servers.items()},
                "hybrid": self.hybrid, "sigterm": self.sigterm, **s, "failed": self.failed(s),
                "failures": self.failures, "rss_samples_kib": {k: v for k, v in self.rss.items()},
                "loadavg_samples": self.loadavg,
                "metrics": self.metrics}
        tmp = out / "results.json.tmp"
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False))
        tmp.replace(out / "results.json")
        return s

    def progress(self, s: dict) -> str:
        c = s["checks"]
        rss = ", ".join(f"{n} {f['last_mib']} MiB" + (f" ({f['growth_after_warmup_mib']:+.1f} after warm-up)"
                                                      if "growth_after_warmup_mib" in f else "")
                        for n, f in s["rss"].items())
        m = self.args.minutes
        el = s["elapsed_s"]
        return (f"[{int(el // 60):3d}:{int(el % 60):02d} / {m:g} min] {s['requests']} requests, "
                f"{sum(self.failure_count.values())} failures | greedy {c.get('greedy answers equal to alone', 0)}/"
                f"{c.get('greedy answers checked', 0)} equal to alone, {s['awaiting_reference']} awaiting a "
                f"reference ({s['references_done']}/{s['references']} computed) | 5xx {s['http_5xx']} | RSS {rss}")


FIGURES = ["greedy answers checked", "greedy answers equal to alone", "greedy MISMATCHES", "streams checked",
           "streams with lost or repeated text", "streams with a wrong usage count",
           "stop answers = the stop-free answer cut at the stop", "cancelled streams, prefix of the answer",
           "structured answers finished and valid"]


def command() -> str:
    return "python lab/scripts/serve_soak.py " + " ".join(sys.argv[1:])


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=_HERE.parent,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# ---------------------------------------------------------------------------------------------------------------
# the run


async def client(soak: Soak, traffic: Traffic, server: str, cid: int, stop: asyncio.Event, deadline: float) -> None:
    a = soak.args
    rng = random.Random(f"{a.seed}:{server}:{cid}")
    base = soak.servers[server]["base"]
    while not stop.is_set() and time.monotonic() < deadline:
        # (a fresh connection after a 5xx: uvicorn closes the one an unhandled error was on, and the next request
        # sent on it would fail too)
        async with httpx.AsyncClient(base_url=base, timeout=a.request_timeout,
                                     limits=httpx.Limits(max_connections=2)) as http:
            while not stop.is_set() and time.monotonic() < deadline:
                job = traffic.draw(rng, server)
                t = time.perf_counter()
                try:
                    res = await asyncio.wait_for(run_job(http, job), a.request_timeout)
                except asyncio.TimeoutError:
                    res = {"status": "timeout"}
                except httpx.HTTPError as exc:
                    res = {"status": "transport error", "error": f"{type(exc).__name__}: {exc}"}
                except Exception as exc:  # noqa: BLE001 - an answer this client cannot read: recorded, it goes on
                    res = {"status": "unreadable answer", "error": f"{type(exc).__name__}: {exc}"}
                took = time.perf_counter() - t
                soak.record(job, res, took)
                if not isinstance(res["status"], int) or res["status"] >= 500:
                    break
                if server == "hybrid" and took < a.hybrid_interval:  # (its answers come fast: leave the CPU to the
                    try:                                              # default model's server)
                        await asyncio.wait_for(stop.wait(), a.hybrid_interval - took)
                    except asyncio.TimeoutError:
                        pass


async def sample_rss(soak: Soak, stop: asyncio.Event) -> None:
    while True:
        soak.loadavg.append((round(soak.elapsed(), 1), round(os.getloadavg()[0], 2)))
        for name, s in soak.servers.items():
            try:
                soak.rss[name].append((round(soak.elapsed(), 1), rss_kib(s["proc"].pid)))
            except OSError:  # (gone)
                pass
        try:
            await asyncio.wait_for(stop.wait(), soak.args.rss_every)
            return
        except asyncio.TimeoutError:
            pass


async def sigterm_round(soak: Soak, traffic: Traffic, name: str) -> dict:
    """A few short streams in flight, then SIGTERM: they must finish (and equal the answer alone) and the server
    exit 0. A stream still going when the server's drain bound (``create_app``'s ``drain_s``) runs out is cut by
    design: counted apart, not a failure."""
    s = soak.servers[name]
    rng = random.Random(f"{soak.args.seed}:sigterm:{name}")
    jobs = [Job(name, f"{'hybrid:' if name == 'hybrid' else ''}in flight at SIGTERM", COMPLETIONS,
                traffic._greedy(rng, HYBRID_STRATEGIES if name == "hybrid" else STRATEGIES, soak.args.sigterm_tokens,
                                prompt=rng.choice(traffic.hybrid_questions)), stream=True) for _ in range(3)]
    sent = 0.0
    done: list[bool] = []
    cut: list[float] = []

    async def one(job: Job) -> None:
        async with httpx.AsyncClient(base_url=s["base"], timeout=soak.args.request_timeout) as http:
            t = time.perf_counter()
            try:
                res = await asyncio.wait_for(_streamed(http, job), soak.args.request_timeout)
            except asyncio.TimeoutError:
                res = {"status": "timeout"}
            except httpx.HTTPError as exc:
                res = {"status": "transport error", "error": f"{type(exc).__name__}: {exc}"}
            after = time.perf_counter() - sent
            if res["status"] == "stream error" and after >= DRAIN_S - 1:
                cut.append(round(after, 1))
                soak.status[job.kind, f"cut by the {DRAIN_S:g} s drain bound"] += 1
            else:
                soak.record(job, {**res, "seconds_after_sigterm": round(after, 1)}, time.perf_counter() - t)
            done.append(res["status"] == 200)

    tasks = [asyncio.ensure_future(one(j)) for j in jobs]
    await asyncio.sleep(0.5)
    sent = time.perf_counter()
    s["proc"].send_signal(signal.SIGTERM)
    await asyncio.gather(*tasks)
    try:
        code = await asyncio.get_running_loop().run_in_executor(None, s["proc"].wait, 120)
    except subprocess.TimeoutExpired:
        s["proc"].kill()
        code = "killed after 120 s"
    return {"in_flight": len(jobs), "drained": sum(done), "cut_by_drain_bound": len(cut), "exit_code": code,
            "exit_s_after_sigterm": round(time.perf_counter() - sent, 1)}


async def soak_main(soak: Soak, traffic: Traffic) -> None:
    a = soak.args
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def interrupt() -> None:
        if not stop.is_set():
            soak.interrupted = True
            print("interrupted: ending the soak as if its time were up (again to leave at once)", flush=True)
            stop.set()
        else:
            raise SystemExit(130)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupt)
    deadline = time.monotonic() + a.minutes * 60
    rss_stop = asyncio.Event()
    sampler = asyncio.ensure_future(sample_rss(soak, rss_stop))
    clients = [asyncio.ensure_future(client(soak, traffic, "main", i, stop, deadline)) for i in range(a.clients)]
    if "hybrid" in soak.servers:
        clients += [asyncio.ensure_future(client(soak, traffic, "hybrid", i, stop, deadline))
                    for i in range(a.hybrid_clients)]
    next_line = time.monotonic() + a.progress_every
    while not all(c.done() for c in clients):
        await asyncio.sleep(2.0)
        soak.check_ready()
        if time.monotonic() >= next_line:
            next_line += a.progress_every
            print(soak.progress(soak.write(a.output)), flush=True)
    for c in clients:
        c.result()  # (a client's own bug surfaces here)
    print(soak.progress(soak.write(a.output)) + " | clients done", flush=True)
    for name, s in soak.servers.items():
        try:
            async with httpx.AsyncClient(base_url=s["base"], timeout=30) as http:
                soak.metrics[name] = {"health": (await http.get("/health")).json(),
                                      "metrics": (await http.get("/metrics")).text}
        except httpx.HTTPError as exc:
            soak.metrics[name] = {"error": str(exc)}
    rss_stop.set()
    await sampler
    for name in soak.servers:
        soak.sigterm[name] = await sigterm_round(soak, traffic, name)
        print(f"SIGTERM to the {name} server: {soak.sigterm[name]}", flush=True)
    # the references still to compute (the servers are gone: the worker has the machine)
    while soak.waiting:
        await asyncio.sleep(2.0)
        before = len(soak.waiting)
        soak.check_ready()
        if len(soak.waiting) != before:
            print(f"checking: {len(soak.waiting)} answers still await a reference", flush=True)


def report(soak: Soak, s: dict) -> str:
    a = soak.args
    m = soak.machine
    c = s["checks"]
    failed = soak.failed(s)
    la = [v for _, v in soak.loadavg]
    load = f"{min(la):.1f}–{max(la):.1f}, median {percentile(la, 50):.1f}" if la else "not sampled"
    lines = [f"# specframe serve soak: {s['elapsed_s'] / 60:.1f} minutes of mixed traffic"
             + (" (interrupted)" if soak.interrupted else ""), "",
             f"Command: `{command()}`  ", f"Commit: `{commit()}`  ",
             f"Machine: {m['cpu']}, {m['cores']} cores, ISA {' '.join(m['isa'])}; 1-minute load average during the "
             f"soak (every process on the machine, this soak's included) {load}.", "",
             f"Servers: the default model `{a.model}` ({a.dtype}, batch {a.batch_size}, {a.clients} clients)"
             + (f"; a tiny random `{soak.hybrid.get('model_type')}` ({soak.hybrid.get('family')}, "
                f"{soak.hybrid.get('parameters', 0) / 1e6:.1f} M parameters, the default model's tokenizer; float32, "
                f"batch {a.batch_size}, {a.hybrid_clients} clients)" if soak.hybrid else "")
             + f". Greedy, {a.max_new_tokens} tokens ({a.structured_tokens} for json_schema and tools), each request "
             f"bounded by {a.request_timeout:g} s; edge cases {'on' if a.edge_cases else 'off'}; seed {a.seed}.", "",
             f"**{'FAILED' if failed else 'PASSED'}**" + (": " + "; ".join(failed) if failed else
                                                         ": no 5xx, no mismatch, no lost or repeated token, "
                                                         "every bad request a 4xx error object, SIGTERM exit 0."), "",
             "## Greedy answers against the same request alone", "",
             "| check | count |", "|---|---:|"]
    lines += [f"| {k} | {c.get(k, 0)} |" for k in FIGURES] + [f"| {k} | {v} |" for k, v in sorted(c.items())
                                                              if k not in FIGURES]
    lines += [f"| distinct requests decoded alone (references) | {s['references']} |", "",
              "## Requests by kind and outcome", "",
              "Outcome: the HTTP status, or `cancelled` (the client left on purpose), `timeout` (past its bound), "
              "`stream error` (an error object inside a 200 stream, or no `[DONE]`).", "",
              "| kind | outcomes | p50 s | p99 s | max s |", "|---|---|---:|---:|---:|"]
    for k, outcomes in s["by_kind_status"].items():
        lat = s["latency"].get(k, {})
        lines.append(f"| {k} | {', '.join(f'{st}: {n}' for st, n in outcomes.items())} | {lat.get('p50_s', '–')} | "
                     f"{lat.get('p99_s', '–')} | {lat.get('max_s', '–')} |")
    lines += ["", f"HTTP 5xx: {s['http_5xx']}. Bad requests, by name and status: "
              + "; ".join(f"{k} {dict(v)}" for k, v in s["bad_requests"].items()) + "."]
    if s["unexpected_4xx"]:
        lines += ["", "Refused with another 4xx than expected (not a failure): " + "; ".join(s["unexpected_4xx"])]
    lines += ["", "## Memory (RSS of each server process)", "",
              f"Sampled every {a.rss_every:g} s; warm-up {a.warmup_minutes:.2g} min; flat = slope of a least-squares "
              f"line over the second half after warm-up at most {a.rss_slope_limit:g} MiB/min.", "",
              "| server | at start | after warm-up | at the end | peak | growth after warm-up | slope, 2nd half | "
              "verdict |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, f in s["rss"].items():
        lines.append(f"| {name} | {f['first_mib']} MiB | {f.get('at_warmup_mib', '–')} MiB | {f['last_mib']} MiB | "
                     f"{f.get('peak_mib', '–')} MiB | {f.get('growth_after_warmup_mib', '–')} MiB | "
                     f"{f.get('slope_second_half_mib_per_min', '–')} MiB/min | {f['verdict']} |")
    lines += ["", "## SIGTERM", ""]
    lines += [f"- {n}: {st['drained']}/{st['in_flight']} streams in flight ({a.sigterm_tokens} tokens) finished"
              + (f", {st['cut_by_drain_bound']} cut by the server's {DRAIN_S:g} s drain bound (a slow machine)"
                 if st.get("cut_by_drain_bound") else "")
              + f"; exit code {st['exit_code']}, {st['exit_s_after_sigterm']} s after SIGTERM"
              for n, st in soak.sigterm.items()]
    if soak.failures:
        lines += ["", "## Failures (the first ones; all in results.json)", ""]
        for f in soak.failures[:20]:
            lines += [f"- **{f['what']}** ({f['server']}, {f['kind']}, at {f['at_s']} s): `{f['method']} {f['path']}` "
                      f"body `{json.dumps(f['body'], ensure_ascii=False)[:600]}` → "
                      f"`{json.dumps(f['detail'], ensure_ascii=False)[:900]}`"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    ap.add_argument("--structured-questions", type=Path, default=STRUCTURED_QUESTIONS,
                    help="questions with a constraint.json_schema (json_schema and tools requests)")
    ap.add_argument("--limit-per-category", type=int, default=1)
    ap.add_argument("--limit", type=int, default=8, help="plain questions in the pool")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients of the default model's server")
    ap.add_argument("--hybrid-clients", type=int, default=1, help="concurrent clients of the hybrid server (0: none)")
    ap.add_argument("--hybrid-type", default="qwen3_next")
    ap.add_argument("--hybrid-interval", type=float, default=2.0,
                    help="seconds between the starts of a hybrid client's requests, at least")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--structured-tokens", type=int, default=64)
    ap.add_argument("--sigterm-tokens", type=int, default=8, help="max_tokens of the streams in flight at SIGTERM")
    ap.add_argument("--request-timeout", type=float, default=300.0, help="seconds any one request may take")
    ap.add_argument("--rss-every", type=float, default=10.0)
    ap.add_argument("--warmup-minutes", type=float, default=None, help="default: a sixth of --minutes, 5 at most")
    ap.add_argument("--rss-slope-limit", type=float, default=1.0, help="MiB/min over the second half after warm-up")
    ap.add_argument("--progress-every", type=float, default=60.0)
    ap.add_argument("--tolerance", type=float, default=1e-4, help="log-probabilities: batched vs alone")
    ap.add_argument("--edge-cases", action="store_true", help="add requests for bugs known and being fixed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args()
    if args.warmup_minutes is None:
        args.warmup_minutes = min(5.0, args.minutes / 6)
    if not 1 <= args.clients <= 32 or not 0 <= args.hybrid_clients <= 16:
        ap.error("--clients must be in [1, 32] and --hybrid-clients in [0, 16]")

    questions = [p.text for p in select_questions(read_prompts(args.questions), None, args.limit_per_category)]
    questions = questions[: args.limit]
    structured = [(p.text, p.constraint["json_schema"]) for p in
                  select_questions(read_prompts(args.structured_questions), None, 1)]

    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_ref_init,
                               initargs=(args.model, args.dtype))
    soak = Soak(args, pool)
    traffic = Traffic(args, questions, structured)
    folder = Path(tempfile.mkdtemp(prefix="soak-hybrid-"))
    try:
        port = free_port()
        t = time.perf_counter()
        allow = sorted({n for s in STRATEGIES + STRUCTURED_STRATEGIES for n in s.split("+")})
        proc = start_server(args.model, args.dtype, args.batch_size, port, allow)
        soak.servers["main"] = {"proc": proc, "pid": proc.pid, "base": f"http://127.0.0.1:{port}",
                                "model": args.model, "log": str(proc.log)}
        print(f"default model's server up in {time.perf_counter() - t:.0f} s (pid {proc.pid}, port {port})",
              flush=True)
        if args.hybrid_clients:
            t = time.perf_counter()
            soak.hybrid = pool.submit(_build_hybrid, args.hybrid_type, str(folder)).result()
            port = free_port()
            proc = start_server(str(folder), "float32", args.batch_size, port, ["grammar", "ngram", "none"])
            soak.servers["hybrid"] = {"proc": proc, "pid": proc.pid, "base": f"http://127.0.0.1:{port}",
                                      "model": str(folder), "log": str(proc.log), **soak.hybrid}
            print(f"hybrid server ({soak.hybrid}) up in {time.perf_counter() - t:.0f} s (pid {proc.pid}, port "
                  f"{port})", flush=True)
        soak.t0 = time.monotonic()
        asyncio.run(soak_main(soak, traffic))
        soak.finished = not soak.interrupted
    finally:
        for s in soak.servers.values():
            if s["proc"].poll() is None:
                s["proc"].kill()
            s["log_tail"] = Path(s["log"]).read_text(errors="replace")[-3000:] if Path(s["log"]).exists() else ""
        s = soak.write(args.output)
        pool.shutdown(cancel_futures=True)
        shutil.rmtree(folder, ignore_errors=True)
    text = report(soak, s)
    print(text)
    if args.output:
        (args.output / "report.md").write_text(text)
    return 1 if soak.failed(s) else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
