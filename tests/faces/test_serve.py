"""specframe serve: the official openai client against a live server (uvicorn on a free localhost port) over a tiny
model — completions and chat, streamed and not, token-identical to offline generation per strategy; refusals as 4xx
OpenAI error objects; a client that leaves mid-stream frees its row and changes no other output; /metrics; and the
command itself draining and exiting 0 on SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import specframe  # noqa: E402

from tests.fakes import build_model, build_tokenizer, chat_target, live_server, wait_healthy  # noqa: E402

WORDS = ["ba bb bc ba bb bd", "ca cb cc cd ca cb", "da db dc da db dc dd", "ea eb", "fa fb fc fa fb fc fa"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sf():
    sf = specframe.load(target=chat_target(initializer_range=0.2), batch_size=4, max_new_tokens=24)
    yield sf
    sf.close()


@pytest.fixture(scope="module")
def server(sf):
    from specframe.serve.app import create_app

    app = create_app(sf, model_name="tiny", allowed={"none", "ngram", "draft-model"}, max_tokens_limit=64,
                     max_pending=32)
    with live_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)


STRATEGIES = {"none": ["none"], "ngram": ["ngram"], "ngram+draft-model": ["ngram", "draft-model"]}


@pytest.fixture(scope="module")
def draft_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve-draft")
    build_model("llama", seed=1).save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    return str(folder)


def _proposers(name, draft_folder):
    return [{"name": p, "model": draft_folder} if p == "draft-model" else {"name": p} for p in STRATEGIES[name]]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_completions_equal_offline_generation_streamed_or_not(sf, client, strategy, draft_folder):
    props = _proposers(strategy, draft_folder)
    # an untimed router: a timed one routes by this machine's measured times (the one-token time, the re-priced
    # cost curve), so the forward counts compared below would follow the machine's noise, not the server
    router = {"name": "adaptive", "measure": "never"}
    for text in WORDS:
        want = sf.generate_result(text, proposers=props, router=router, max_new_tokens=20, chat=False)
        got = client.completions.create(model="tiny", prompt=text, max_tokens=20, temperature=0,
                                        extra_body={"speculative": {"proposers": props, "router": router}})
        assert got.choices[0].text == want.text
        assert got.choices[0].finish_reason == want.finish_reason
        assert got.usage.completion_tokens == len(want.token_ids)
        spec = got.usage.model_extra["speculation"]
        assert spec["target_forwards"] == want.metrics.target_forwards
        assert set(spec["proposers"]) == set(want.metrics.proposers)
        chunks = list(client.completions.create(model="tiny", prompt=text, max_tokens=20, temperature=0, stream=True,
                                                extra_body={"speculative": {"proposers": props, "router": router}}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
        assert chunks[-1].usage.completion_tokens == len(want.token_ids)  # the final usage chunk
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == want.finish_reason


def test_chat_uses_the_chat_template_streamed_or_not(sf, client):
    messages = [{"role": "user", "content": "ba bb bc ba bb"}]
    ids = sf.target.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"]
    want = sf.generate_result(list(ids), proposers=["ngram"], max_new_tokens=16)
    got = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0,
                                         extra_body={"speculative": {"proposers": ["ngram"]}})
    assert got.choices[0].message.content == want.text and got.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0,
                                                 stream=True, extra_body={"speculative": {"proposers": ["ngram"]}}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text


def test_chat_content_as_text_parts_and_the_developer_role_read_as_openai_reads_them(sf, client, server):
    """The official client's list form of content (``[{"type": "text", ...}]``) and the ``developer`` role (what
    newer clients send for the system message) give the same answer as plain text and ``system``; an image part is
    a 400 saying the model reads text only."""
    plain = [{"role": "system", "content": "ca cb"}, {"role": "user", "content": "ba bb bc ba bb"}]
    parts = [{"role": "developer", "content": [{"type": "text", "text": "ca cb"}]},
             {"role": "user", "content": [{"type": "text", "text": "ba bb "}, {"type": "text", "text": "bc ba bb"}]}]
    want = client.chat.completions.create(model="tiny", messages=plain, max_tokens=12, temperature=0)
    got = client.chat.completions.create(model="tiny", messages=parts, max_tokens=12, temperature=0)
    assert got.choices[0].message.content == want.choices[0].message.content
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    r = httpx.post(server + "/v1/chat/completions", json={"messages": image, "max_tokens": 4})
    assert r.status_code == 400 and "reads text only" in r.json()["error"]["message"], r.text


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(server + "/health").json()["status"] == "ok"
    client.completions.create(model="tiny", prompt="ba bb ba bb", max_tokens=8, temperature=0)
    text = httpx.get(server + "/metrics").text
    for name in ("specframe_requests_total", "specframe_generation_tokens_total",
                 "specframe_time_to_first_token_seconds_bucket", "specframe_accepted_nodes_total",
                 "specframe_drafted_nodes_by_position_total"):
        assert name in text, name


@pytest.mark.parametrize("body, status, needle", [
    ("{not json", 400, "not valid JSON"),
    ({"prompt": "aa", "max_tokens": 4, "frobnicate": 1}, 400, "unknown field 'frobnicate'"),
    ({"prompt": "aa", "max_tokens": 400}, 400, "over this server's limit of 64"),
    ({"prompt": "aa", "max_tokens": 4, "speculative": {"proposers": ["eagle"]}}, 400, "'eagle' is not allowed"),
    ({"prompt": "aa", "max_tokens": 4, "speculative": {"proposers": [{"name": "ngram", "k": -3}]}}, 400, "k"),
    ({"prompt": "aa", "max_tokens": 4, "temperature": 7}, 400, "temperature"),
    ({"prompt": "aa", "max_tokens": 4, "n": 2}, 400, "n"),
    ({"prompt": "aa " * 300, "max_tokens": 4}, 400, "context"),
    ({"prompt": "aa " * 250, "max_tokens": 20}, 400, "maximum context length is 256 tokens; the request asks for 270"),
    ({"prompt": "aa", "max_tokens": 4, "model": "gpt-9"}, 404, "not served here"),
    ({"prompt": [], "max_tokens": 4}, 400, "empty"),
    # issue 55 (1, 2): a lone surrogate was a plain-text 500; logprobs 0 was dropped with a 200 and logprobs null
    ({"prompt": "hi \ud800", "max_tokens": 4}, 400, "lone UTF-16 surrogate"),
    ({"prompt": "hi", "max_tokens": 4, "stop": ["\udfff"]}, 400, "lone UTF-16 surrogate"),
    ({"prompt": "hi", "max_tokens": 4, "logprobs": 21}, 400, "logprobs"),
    ({"prompt": "hi", "max_tokens": 4, "logprobs": True}, 400, "logprobs"),
    # issue 54: structured output on a model without an EOS token (nothing could end a finished answer)
    ({"prompt": "hi", "max_tokens": 4, "response_format": {"type": "json_object"}}, 400, "no EOS token"),
    ({"prompt": "hi", "max_tokens": 4, "response_format": {"type": "json_schema"}}, 400, "json_schema"),
])
def test_bad_requests_get_the_openai_error_object(server, body, status, needle):
    data = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(server + "/v1/completions", content=data, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and set(err) == {"message", "type", "param", "code"}


def test_a_lone_surrogate_in_chat_content_is_a_400(server):
    for content in ("a \ud800", [{"type": "text", "text": "\udc00"}]):
        body = json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": 4})
        r = httpx.post(server + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "lone UTF-16 surrogate" in r.json()["error"]["message"], r.text


def test_openai_and_vllm_spellings_new_users_send(server, client):
    """Report kinds of round five (issue 55 c): vLLM's ``top_k: -1`` (off) is read as off; a one-string prompt list is
    that prompt and a batch of several is one clear 400; ``stream_options`` without ``stream`` is a 400 (as OpenAI and
    vLLM answer); ``client.models.retrieve`` finds the served model and 404s another."""
    def post(body):
        return httpx.post(server + "/v1/completions", json={"max_tokens": 6, **body})

    base = post({"prompt": "ba bb bc", "temperature": 1.0, "seed": 3}).json()["choices"][0]["text"]
    r = post({"prompt": "ba bb bc", "temperature": 1.0, "seed": 3, "top_k": -1})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == base
    r = post({"prompt": ["ba bb bc"], "temperature": 1.0, "seed": 3})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == base
    r = post({"prompt": ["ba", "bb"]})
    assert r.status_code == 400 and "a batch of 2 prompts" in r.json()["error"]["message"]
    r = post({"prompt": "ba", "stream_options": {"include_usage": True}})
    assert r.status_code == 400 and "only allowed when stream is true" in r.json()["error"]["message"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


def test_max_pending_holds_under_a_burst(sf):
    """Issue 55 (4): with ``max_pending`` 6, 16 requests sent at once all got 200 (each passed the check before any
    was submitted); now admission counts them: 6 run, 10 get a 429, and the server admits again once they finish."""
    import asyncio

    from specframe.serve.app import create_app

    gate = threading.Event()
    real_submit = sf.submit

    def held_submit(prompt, **kwargs):  # every admitted request stays in flight until the gate opens
        gate.wait(30)
        return real_submit(prompt, **kwargs)

    app = create_app(sf, model_name="tiny", max_tokens_limit=64, max_pending=6)

    async def burst():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            sends = [asyncio.ensure_future(c.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 4}))
                     for _ in range(16)]
            await asyncio.sleep(1.0)  # every request reached admission while the first six wait at submit
            gate.set()
            codes = sorted(r.status_code for r in await asyncio.gather(*sends))
            again = await c.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 4})
            return codes, again.status_code

    sf.submit = held_submit
    try:
        codes, again = asyncio.run(burst())
    finally:
        del sf.submit
    assert codes == [200] * 6 + [429] * 10 and again == 200


def test_a_full_server_answers_429(sf, server, monkeypatch):
    monkeypatch.setattr(type(sf), "pending", property(lambda self: 32))
    r = httpx.post(server + "/v1/completions", json={"prompt": "aa", "max_tokens": 4})
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"


def test_a_client_leaving_mid_stream_frees_its_row_and_changes_no_other_output(sf, server, client):
    want = [sf.generate_result(t, proposers=["ngram"], max_new_tokens=40, chat=False).text for t in WORDS[:3]]
    got: list = [None] * 3

    def worker(i):
        got[i] = client.completions.create(model="tiny", prompt=WORDS[i], max_tokens=40, temperature=0,
                                           extra_body={"speculative": {"proposers": ["ngram"]}}).choices[0].text

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    with httpx.stream("POST", server + "/v1/completions", json={"prompt": WORDS[4], "max_tokens": 64,
                                                                "stream": True}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 3:
                break  # leave after a few events
    for t in threads:
        t.join()
    assert got == want
    for _ in range(100):  # the left request's row is freed (before its 64 tokens were done)
        if sf.pending == 0:
            break
        time.sleep(0.05)
    assert sf.pending == 0


def test_serve_command_drains_and_exits_0_on_sigterm(tmp_path):
    model_dir = tmp_path / "tiny-model"
    # wide enough that a long answer takes seconds: the stream is still going when SIGTERM comes
    build_model("llama", hidden_size=512, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=8,
                max_position_embeddings=2048).save_pretrained(model_dir)
    build_tokenizer().save_pretrained(model_dir)
    port = _free_port()
    env = {"SPECFRAME_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    import os

    env = {**os.environ, **env}
    proc = subprocess.Popen([sys.executable, "-m", "specframe", "serve", "--model", str(model_dir), "--port", str(port),
                             "--batch-size", "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, tries=600, pause=0.1)
        result = {}

        def slow():
            result["r"] = httpx.post(url + "/v1/completions", json={"prompt": "ba bb", "max_tokens": 300}, timeout=120)

        started = threading.Event()

        def streamed():
            with httpx.stream("POST", url + "/v1/completions", timeout=120,
                              json={"prompt": "ca cb", "max_tokens": 300, "stream": True}) as r:
                lines = []
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        lines.append(line)
                        started.set()
                result["lines"] = lines

        threads = [threading.Thread(target=slow), threading.Thread(target=streamed)]
        for t in threads:
            t.start()
        assert started.wait(60)
        proc.send_signal(signal.SIGTERM)  # mid-stream
        for t in threads:
            t.join()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        assert result["r"].status_code == 200  # the requests in flight were answered before the exit
        lines = result["lines"]
        assert lines[-1] == "data: [DONE]" and '"usage"' in lines[-2]  # the stream too, whole
        assert json.loads(lines[-2][5:])["usage"]["completion_tokens"] == 300
    finally:
        if proc.poll() is None:
            proc.kill()


def test_requests_past_the_drain_bound_end_with_an_error_object(tmp_path):
    """Issue 65 (soak): a stream still going when the shutdown's drain bound came was cut after 18 pieces with no finish
    chunk, no error and no [DONE]; now it ends with an error object (code server_shutting_down) and [DONE]. A request
    that does not stream got a 500 (text/plain) and was decoded on past the bound; now it is a 503 with that error
    object and its row is freed. The process exits 0 within the bound and uvicorn's 5 s."""
    model_dir = tmp_path / "tiny-model"
    build_model("llama", hidden_size=512, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=8,
                max_position_embeddings=4096).save_pretrained(model_dir)
    build_tokenizer().save_pretrained(model_dir)
    port = _free_port()
    import os

    env = {**os.environ, "SPECFRAME_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "specframe", "serve", "--model", str(model_dir), "--port", str(port),
                             "--drain-seconds", "3"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, tries=600, pause=0.1)
        started, lines = threading.Event(), []

        def streamed():
            with httpx.stream("POST", url + "/v1/completions", timeout=120,
                              json={"prompt": "ca cb", "max_tokens": 3500, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        lines.append(line)
                        started.set()

        whole = {}

        def not_streamed():  # (a newcomer's report: a 500 with a traceback, and the server decoding on past the bound)
            whole["r"] = httpx.post(url + "/v1/completions", json={"prompt": "ba bb", "max_tokens": 3500}, timeout=120)

        threads = [threading.Thread(target=streamed), threading.Thread(target=not_streamed)]
        for t in threads:
            t.start()
        assert started.wait(60)
        time.sleep(0.5)  # (the request that does not stream is in by now)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
            assert not t.is_alive()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        assert time.monotonic() - signalled < 3 + 5 + 10  # the bound, uvicorn's 5 s, and room for a loaded machine
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2][5:])["error"]
        assert error["code"] == "server_shutting_down" and error["type"] == "server_error"
        assert "drain period (3 s)" in error["message"]
        pieces = [json.loads(line[5:])["choices"][0] for line in lines[:-2]]
        assert pieces and all(p["finish_reason"] is None for p in pieces)  # cut, not finished: 3500 tokens take longer
        assert whole["r"].status_code == 503, whole["r"].text
        assert whole["r"].json()["error"]["code"] == "server_shutting_down"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_port_in_use_is_one_error_line_before_the_model_loads(no_model_load):
    """Issue 55 (3): the server loaded the model, printed "serving …", then died with uvicorn's [Errno 98] and exit 3;
    now the port is bound first: one error line, exit 2, no model loaded."""
    from typer.testing import CliRunner

    from specframe.cli import app

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        res = CliRunner().invoke(app, ["serve", "--port", str(port)])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert lines[0].startswith("error: --port") and "cannot listen on" in lines[0] and "serving" not in res.output


def test_serve_bad_flags_one_error_line(no_model_load):
    from typer.testing import CliRunner

    from specframe.cli import app

    res = CliRunner().invoke(app, ["serve", "--batch-size", "0"])
    assert res.exit_code != 0 and "error:" in res.output and "--batch-size" in res.output
    res = CliRunner().invoke(app, ["serve", "--allow-proposer", "nosuch"])
    assert res.exit_code != 0 and "error:" in res.output and "nosuch" in res.output


def test_serving_bench_against_the_live_server(server, tmp_path):
    """``specframe bench --serve``: every question answered at each concurrency, tokens and τ from the usage object,
    greedy answers identical across strategies and concurrencies, and the report, results and plot written."""
    from typer.testing import CliRunner

    from specframe.cli import app

    qfile = tmp_path / "q.jsonl"
    qfile.write_text("".join(json.dumps({"question_id": i, "category": "c", "turns": [w]}) + "\n"
                             for i, w in enumerate(WORDS)))
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(f"max_new_tokens: 12\nconcurrency: [1, 3]\nservers:\n"
                   f"  - {{name: none, url: {server}/v1, speculative: {{proposers: [none]}}}}\n"
                   f"  - {{name: ngram, url: {server}/v1, speculative: {{proposers: [ngram]}}, api: completions}}\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["bench", "--config", str(cfg), "--questions", str(qfile), "--output", str(out),
                                   "--serve", f"plain={server}"])
    assert res.exit_code == 0, res.output
    load = json.loads((out / "results.json").read_text())["serving"]
    assert [(r["endpoint"], r["concurrency"]) for r in load] == [
        ("none", 1), ("ngram", 1), ("plain", 1), ("none", 3), ("ngram", 3), ("plain", 3)]
    for r in load:
        assert r["failed"] == 0 and r["empty"] == 0 and len(r["requests"]) == len(WORDS)
        assert all(0 < q["new_tokens"] <= 12 and q["ttft_s"] > 0 for q in r["requests"])
        assert r["tau"] is not None and r["tau"] >= 1.0
    chat = [r for r in load if r["endpoint"] != "ngram"]  # chat requests: the same prompts, so the same answers
    assert all(r["same_text"] == len(WORDS) for r in chat)
    assert (out / "serving.png").stat().st_size > 0 and "| none | 1 |" in (out / "report.md").read_text()
    # the ngram rows asked /v1/completions (the raw question): each equals offline generation without the template
    texts = [q["text"] for q in next(r for r in load if r["endpoint"] == "ngram")["requests"]]
    assert texts == [q["text"] for q in next(r for r in load if r["endpoint"] == "ngram" and r["concurrency"] == 3)
                     ["requests"]]


def test_serving_bench_refuses_an_endpoint_that_does_not_answer(tmp_path):
    from typer.testing import CliRunner

    from specframe.cli import app

    qfile = tmp_path / "q.jsonl"
    qfile.write_text(json.dumps({"question_id": 1, "category": "c", "turns": ["ba"]}) + "\n")
    res = CliRunner().invoke(app, ["bench", "--serve", f"http://127.0.0.1:{_free_port()}", "--questions", str(qfile),
                                   "--output", str(tmp_path / "o")])
    assert res.exit_code != 0 and "error:" in res.output and "start the server first" in res.output
    assert not (tmp_path / "o").exists()  # nothing written
    res = CliRunner().invoke(app, ["bench", "--serve", "localhost:8000", "--questions", str(qfile)])
    assert res.exit_code != 0 and "http://" in res.output
