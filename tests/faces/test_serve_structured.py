"""specframe serve with structured output (issue 54 c): the official openai client sends ``response_format``
(json_object, json_schema strict), ``tools`` / ``tool_choice`` and ``logprobs`` (top 5), streamed and not, to a live
server over a tiny byte-level model: answers parse and validate, tool calls come back as OpenAI ``tool_calls``, and
log-probabilities equal those of the same request decoded without speculation (float32, 1e-4)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

import specframe  # noqa: E402
from specframe.target.hf import Target  # noqa: E402

from tests.fakes import build_bpe_model, build_bpe_tokenizer, join_chat_stream, live_server  # noqa: E402

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if tools %}tools: {{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}\n"
            "{% endif %}{% if add_generation_prompt %}assistant: {% endif %}")
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string", "maxLength": 8}},
                                                           "required": ["city"], "additionalProperties": False}}}
ZIP = {"type": "function", "function": {"name": "find_zip", "parameters": {
    "type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["zip"],
    "additionalProperties": False}}}
MESSAGES = [{"role": "user", "content": '{"name": "Ada", "age": 36} {"city": "Paris"}'}]


@pytest.fixture(scope="module")
def sf():
    tok = build_bpe_tokenizer()
    tok.chat_template = TEMPLATE
    sf = specframe.load(target=Target(build_bpe_model(tok), tok, name="tiny-bpe"), batch_size=4, max_new_tokens=40)
    yield sf
    sf.close()


@pytest.fixture(scope="module")
def server(sf):
    from specframe.serve.app import create_app

    app = create_app(sf, model_name="tiny-bpe", max_tokens_limit=64, max_pending=32)
    with live_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)


def _spec(name):
    return {"speculative": {"proposers": [name]}}


def _streamed(client, **kwargs):
    return join_chat_stream(client.chat.completions.create(stream=True, **kwargs))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("proposer", ["ngram", "grammar"])
def test_json_schema_strict(client, stream, proposer):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    kwargs = dict(model="tiny-bpe", messages=MESSAGES, response_format=fmt, max_tokens=40, extra_body=_spec(proposer))
    if stream:
        content, _, _, finish = _streamed(client, **kwargs)
    else:
        r = client.chat.completions.create(**kwargs)
        content, finish = r.choices[0].message.content, r.choices[0].finish_reason
    assert finish == "stop", content
    jsonschema.validate(json.loads(content), PERSON)
    plain = client.chat.completions.create(**{**kwargs, "extra_body": _spec("none")})
    assert plain.choices[0].message.content == content  # speculation changes nothing


def test_json_object(client):
    r = client.chat.completions.create(model="tiny-bpe", messages=MESSAGES, max_tokens=40,
                                       response_format={"type": "json_object"}, extra_body=_spec("ngram"))
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: a valid prefix
        assert r.choices[0].message.content.lstrip().startswith("{")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", "named"])
def test_tool_calls(client, stream, choice):
    tool_choice = "required" if choice == "required" else {"type": "function", "function": {"name": "find_zip"}}
    kwargs = dict(model="tiny-bpe", messages=MESSAGES, tools=[WEATHER, ZIP], tool_choice=tool_choice, max_tokens=40,
                  extra_body=_spec("ngram"))
    if stream:
        _, calls, _, finish = _streamed(client, **kwargs)
        (call,) = calls.values()
        name, arguments = call["name"], call["arguments"]
    else:
        r = client.chat.completions.create(**kwargs)
        finish = r.choices[0].finish_reason
        (call,) = r.choices[0].message.tool_calls
        assert r.choices[0].message.content is None and call.id.startswith("call_") and call.type == "function"
        name, arguments = call.function.name, call.function.arguments
    assert finish == "tool_calls"
    if choice == "named":
        assert name == "find_zip"
    tool = {"get_weather": WEATHER, "find_zip": ZIP}[name]
    jsonschema.validate(json.loads(arguments), tool["function"]["parameters"])


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_equal_without_speculation(client, server, stream):
    kwargs = dict(model="tiny-bpe", messages=MESSAGES, max_tokens=24, logprobs=True, top_logprobs=5,
                  response_format={"type": "json_object"})
    base = client.chat.completions.create(**kwargs, extra_body=_spec("none")).choices[0]
    if stream:
        content, _, got, _ = _streamed(client, **kwargs, extra_body=_spec("ngram"))
    else:
        r = client.chat.completions.create(**kwargs, extra_body=_spec("ngram")).choices[0]
        content, got = r.message.content, r.logprobs.content
    want = base.logprobs.content
    assert content == base.message.content and len(got) == len(want) > 0
    assert "".join(t.token for t in got) == content  # no entry for the EOS that ended the answer
    assert bytes(b for t in got for b in t.bytes).decode("utf-8") == content
    for a, b in zip(got, want):
        assert a.token == b.token and abs(a.logprob - b.logprob) < 1e-4
        assert [t.token for t in a.top_logprobs] == [t.token for t in b.top_logprobs] and len(a.top_logprobs) == 5
        assert max(abs(x.logprob - y.logprob) for x, y in zip(a.top_logprobs, b.top_logprobs)) < 1e-4
    # the completions API's legacy shape
    r = httpx.post(server + "/v1/completions", json={"prompt": "abc", "max_tokens": 6, "logprobs": 2}).json()
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert "".join(lp["tokens"]) == r["choices"][0]["text"] and all(len(t) == 2 for t in lp["top_logprobs"])


@pytest.mark.parametrize("body, needle, param", [
    ({"tools": [WEATHER, WEATHER], "tool_choice": "required"}, "tool names must differ", None),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among the tools",
     None),
    ({"tool_choice": "required"}, "tool_choice needs tools", None),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "give one of them", "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string",
                                                                                         "format": "weird"}}}},
     "Unknown format", None),
    ({"response_format": {"type": "xml"}}, "response_format", None),
    ({"top_logprobs": 3}, "top_logprobs needs logprobs", None),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", None),
])
def test_bad_structured_requests_are_400s(server, body, needle, param):
    r = httpx.post(server + "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"] and "\n" not in err["message"], err
    if param is not None:
        assert err["param"] == param


def test_logprob_entries_follow_the_content():
    """One entry per token of the content: none for an EOS that ended the answer, and a token holding part of a
    character carries its own bytes (joined, the bytes are the content), its text those bytes escaped."""
    from types import SimpleNamespace

    from specframe.decode.engine import TokenLogprob
    from specframe.serve.structured import chat_logprobs, completion_logprobs

    tok = build_bpe_tokenizer()
    text = 'é🎉"'
    ids = tok.encode(text, add_special_tokens=False)
    assert any(tok.decode([i]) == "\ufffd" for i in ids)  # the emoji is split across byte tokens
    result = SimpleNamespace(finish_reason="stop", logprobs=[TokenLogprob(i, -0.5, ((i, -0.5),))
                                                             for i in [*ids, tok.eos_token_id]])
    content = chat_logprobs(result, tok)["content"]
    assert len(content) == len(ids) and bytes(b for t in content for b in t["bytes"]).decode("utf-8") == text
    assert len(completion_logprobs(result, tok)["tokens"]) == len(ids)
    cut = SimpleNamespace(finish_reason="length", logprobs=result.logprobs[:-1])
    assert len(chat_logprobs(cut, tok)["content"]) == len(ids)
