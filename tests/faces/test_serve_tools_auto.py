"""``tool_choice: "auto"`` in specframe serve (issue 68): the model's own tool-call format read by a tool-call parser
(detected from the chat template), with a lazy grammar from the format's trigger on, through the official openai
client over a live server, streamed and not; every answer equal to the same request decoded without speculation
(float32). Two tiny byte-level models: one whose template teaches no tool format (the ``generic`` envelope, as
SmolLM2-135M), and one whose template teaches Hermes ``<tool_call>`` blocks, with a logit bias towards the trigger
token so that it calls tools (a model trained for it would)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

import specframe  # noqa: E402
from specframe.contracts.constraint import ConstraintSpec  # noqa: E402
from specframe.errors import UnknownToolParserError  # noqa: E402
from specframe.target.hf import Target  # noqa: E402

from tests.fakes import build_bpe_model, build_bpe_tokenizer, join_chat_stream, live_server  # noqa: E402

PLAIN_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant: {% endif %}")
HERMES_TEMPLATE = ("{% if tools %}{# calls are written <tool_call>{...}</tool_call> #}tools: "
                   "{{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}\n{% endif %}"
                   + PLAIN_TEMPLATE)
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string", "maxLength": 8}},
                                                           "required": ["city"], "additionalProperties": False}}}
ZIP = {"type": "function", "function": {"name": "find_zip", "parameters": {
    "type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["zip"],
    "additionalProperties": False}}}
TOOLS = [WEATHER, ZIP]
MESSAGES = [{"role": "user", "content": 'Weather? {"city": "Paris"} zip 75001'}]
SCHEMAS = {"get_weather": WEATHER["function"]["parameters"], "find_zip": ZIP["function"]["parameters"]}


def _server(tok, model, name):
    from specframe.serve.app import create_app

    sf = specframe.load(target=Target(model, tok, name=name), batch_size=4, max_new_tokens=48)
    return sf, create_app(sf, model_name=name, max_tokens_limit=96, max_pending=32)


@pytest.fixture(scope="module")
def generic():
    tok = build_bpe_tokenizer()
    tok.chat_template = PLAIN_TEMPLATE
    sf, app = _server(tok, build_bpe_model(tok, max_positions=2048), "tiny-plain")  # (the tools' system line)
    assert app.state.formats.tool.name == "generic" and app.state.formats.reasoning is None
    with live_server(app) as url:
        yield url
    sf.close()


@pytest.fixture(scope="module")
def hermes():
    tok = build_bpe_tokenizer()
    tok.add_tokens(["<tool_call>"])  # (as Qwen's vocabulary has it: one token)
    tok.chat_template = HERMES_TEMPLATE
    model = build_bpe_model(tok)
    trigger = tok.convert_tokens_to_ids("<tool_call>")
    bias = torch.zeros(len(tok))
    bias[trigger] = 30.0  # the trigger is every position's first choice; the call grammar decides the rest
    model.lm_head.register_forward_hook(lambda module, args, out: out + bias)
    sf, app = _server(tok, model, "tiny-hermes")
    assert app.state.formats.tool.name == "hermes"
    with live_server(app) as url:
        yield url
    sf.close()


def _client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def _ask(url, stream, proposers, **kw):
    """``(content, [(name, arguments dict)], finish)`` of one chat request (streamed deltas joined as a client does)."""
    client = _client(url)
    kwargs = dict(model=client.models.list().data[0].id, messages=MESSAGES, tools=TOOLS, max_tokens=48,
                  extra_body={"speculative": {"proposers": proposers}}, **kw)
    if not stream:
        r = client.chat.completions.create(**kwargs)
        c = r.choices[0]
        calls = [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls or []]
        assert all(t.id.startswith("call_") and t.type == "function" for t in c.message.tool_calls or [])
        return c.message.content, calls, c.finish_reason
    content, calls, _, finish = join_chat_stream(client.chat.completions.create(stream=True, **kwargs))
    return content or None, [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())], finish


@pytest.mark.parametrize("stream", [False, True])
def test_generic_envelope_under_auto_equals_plain_decoding(generic, stream):
    """No tool format in the template: the envelope is forced from the first token; the answer is calls or text, the
    same with the grammar proposer + ngram as without speculation, streamed or not."""
    base = _ask(generic, False, ["none"])
    content, calls, finish = base
    if calls:
        assert finish == "tool_calls" and all(jsonschema.validate(a, SCHEMAS[n]) is None for n, a in calls)
    else:
        assert finish in ("stop", "length") and content is not None
    assert _ask(generic, stream, ["grammar", "ngram"]) == base
    assert _ask(generic, stream, ["none"]) == base


def test_generic_envelope_reads_a_history_with_calls_and_results(generic):
    history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "14 C"}]
    r = httpx.post(generic + "/v1/chat/completions", json={"messages": history, "tools": TOOLS, "max_tokens": 24})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")


@pytest.mark.parametrize("stream", [False, True])
def test_hermes_calls_under_auto_parse_and_equal_plain_decoding(hermes, stream):
    """The trigger arms the call grammar: each call names a declared tool with arguments its schema admits; the
    grammar proposer drafts the forced part; output equal to plain decoding's; streamed deltas join to the same."""
    base = _ask(hermes, False, ["none"])
    content, calls, finish = base
    assert calls and all(jsonschema.validate(a, SCHEMAS[n]) is None for n, a in calls), base
    assert _ask(hermes, stream, ["grammar", "ngram"]) == base
    assert _ask(hermes, stream, ["none"]) == base
    r = httpx.post(hermes + "/v1/chat/completions", json={"messages": MESSAGES, "tools": TOOLS, "max_tokens": 48,
                                                          "speculative": {"proposers": ["grammar"]}}).json()
    spec = r["usage"]["speculation"]["proposers"]["grammar"]
    assert spec["accepted"] > 0  # a call's forced tokens came from the grammar proposer


def test_none_bans_the_trigger_and_required_still_works_beside_auto(hermes):
    """The biased model writes ``<tool_call>`` first whenever it may: under ``none`` it may not."""
    r = httpx.post(hermes + "/v1/chat/completions", json={"messages": MESSAGES, "tools": TOOLS, "max_tokens": 8,
                                                          "tool_choice": "none"}).json()
    assert r["choices"][0]["message"].get("tool_calls") is None and "<tool_call>" not in r["choices"][0]["message"][
        "content"]
    r = httpx.post(hermes + "/v1/chat/completions", json={"messages": MESSAGES, "tools": TOOLS, "max_tokens": 40,
                                                          "tool_choice": "required"}).json()
    assert r["choices"][0]["finish_reason"] in ("tool_calls", "length")


@pytest.mark.parametrize("tools, needle", [
    ([WEATHER, WEATHER], "tool names must differ: get_weather"),
    ([{"type": "function", "function": {"name": "rm -rf", "parameters": {}}}], "tools.0.function.name"),
])
def test_bad_tools_are_400s(generic, tools, needle):
    r = httpx.post(generic + "/v1/chat/completions", json={"messages": MESSAGES, "tools": tools, "max_tokens": 4})
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text


def test_an_unknown_parser_is_refused_naming_the_installed_ones():
    from specframe.serve.app import create_app

    tok = build_bpe_tokenizer()
    tok.chat_template = PLAIN_TEMPLATE
    sf = specframe.load(target=Target(build_bpe_model(tok), tok, name="t"), batch_size=1, max_new_tokens=4)
    try:
        with pytest.raises(UnknownToolParserError, match="hermes"):
            create_app(sf, tool_parser="hermez")
    finally:
        sf.close()


def test_the_reasoning_wrap_starts_a_constraint_after_the_end_marker():
    """A reasoning model's constraint applies after ``</think>``: free thinking, then the schema. DeepSeek-R1's
    template opens the reasoning (it must be closed); Qwen3 may answer without thinking."""
    from specframe.grammar.llguidance_engine import LLGuidanceEngine
    from specframe.registry import build_registry
    from specframe.serve.tool_calling import _after_reasoning

    tok = build_bpe_tokenizer()
    engine = LLGuidanceEngine(tok, len(tok), {0})
    registry = build_registry()

    def accepts(name, text):
        spec = _after_reasoning({"json_schema": SCHEMAS["get_weather"]}, registry.reasoning_parser(name)())
        m = engine.compile(ConstraintSpec(**spec)).matcher
        return m.consume_tokens(tok.encode(text)) and m.is_accepting()

    for name in ("deepseek_r1", "qwen3"):
        assert accepts(name, '<think>cold? {"x": 1}</think>\n\n{"city": "Paris"}')
        assert not accepts(name, '<think>hm</think>\n\nParis')  # after the reasoning: the schema
    assert accepts("deepseek_r1", 'no open tag</think>{"city": "Oslo"}')
    assert not accepts("deepseek_r1", '{"city": "Paris"}')  # no end marker: still reasoning, never accepting
    assert accepts("qwen3", '{"city": "Paris"}')  # no thinking at all
    assert not accepts("qwen3", 'no open tag</think>{"city": "Oslo"}')
