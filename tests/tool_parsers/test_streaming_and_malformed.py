"""Streaming in OpenAI's chunk shape, content that streams before a call ends, and malformed or cut-off calls
returned as content (never raised)."""

from __future__ import annotations

import json

import pytest

from specframe.services import ContentDelta, ToolCallDelta

from .conftest import CASES


def test_content_streams_at_once_and_the_trigger_is_held_until_it_resolves(registry):
    stream = registry.tool_parser("hermes")().streaming()
    assert stream.feed("Sure, let me") == [ContentDelta("Sure, let me")]
    assert stream.feed(" check.<tool") == [ContentDelta(" check.")]  # "<tool" may begin "<tool_call>": held
    assert stream.feed('_call>{"name": "get_weather", "arguments": {"city": "NYC"}}') == []
    events = stream.feed("</tool_call>")
    assert [type(e) for e in events] == [ToolCallDelta, ToolCallDelta]
    first, second = (e.to_openai() for e in events)
    assert first == {"index": 0, "id": events[0].id, "type": "function",
                     "function": {"name": "get_weather", "arguments": ""}}
    assert second == {"index": 0, "function": {"arguments": '{"city": "NYC"}'}}
    assert stream.finish() == [] and [c.name for c in stream.calls] == ["get_weather"]


def test_a_held_prefix_that_is_not_the_trigger_is_released(registry):
    stream = registry.tool_parser("hermes")().streaming()
    assert stream.feed("a <tool") == [ContentDelta("a ")]
    assert stream.feed("box> b") == [ContentDelta("<toolbox> b")]
    assert stream.finish() == []


def test_parallel_calls_get_consecutive_indexes(registry):
    stream = registry.tool_parser("qwen3_xml")().streaming()
    text = ("<tool_call>\n<function=a>\n</function>\n</tool_call>\n<tool_call>\n<function=b>\n<parameter=x>1"
            "</parameter>\n</function>\n</tool_call>")
    events = stream.feed(text) + stream.finish()
    assert [(e.index, e.name) for e in events if isinstance(e, ToolCallDelta) and e.name] == [(0, "a"), (1, "b")]
    assert not [e for e in events if isinstance(e, ContentDelta)]


@pytest.mark.parametrize("case", CASES, ids=[f"{c['parser']}-{c['id']}" for c in CASES])
def test_every_cut_of_a_recorded_output_parses_without_raising(registry, case):
    """An output cut by max_tokens anywhere: parse and stream return content and whole calls only."""
    parser = registry.tool_parser(case["parser"])()
    text = case["output"]
    for cut in range(0, len(text), 5):
        content, calls = parser.parse(text[:cut])
        assert isinstance(content, str)
        for call in calls:
            assert call.name and isinstance(call.arguments, str)
        stream = parser.streaming()
        stream.feed(text[:cut])
        stream.finish()


@pytest.mark.parametrize("name, text", [
    ("hermes", '<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>'),  # arguments not an object
    ("hermes", "<tool_call>not json</tool_call> after"),
    ("xlam", '[{"name": "f"}]'),  # no arguments
    ("llama3_json", '{"name": 3, "parameters": {}}'),
    ("mistral", "[TOOL_CALLS]"),
    ("pythonic", "[f(1, 2)]"),  # positional arguments
    ("pythonic", "[os.system(cmd=__import__('os').getcwd())]"),  # not a literal: never evaluated
    ("pythonic", "[f(x=1e999)]"),  # not finite: not JSON
    ("qwen3_xml", "<tool_call><function=f>stray text</function></tool_call>"),
    ("openai", "<|channel|>commentary to=functions.f <|constrain|>json"),  # no message yet
    ("generic", '{"tool_calls": [{"name": "f", "arguments": "x"}]}'),
    ("generic", '{"tool_calls": [] '),
])
def test_a_malformed_call_is_returned_as_content(registry, name, text):
    content, calls = registry.tool_parser(name)().parse(text)
    assert calls == [] and content == text


@pytest.mark.parametrize("text, content, calls", [
    ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}', "",
     [("get_weather", {"city": "Paris"})]),
    ('{"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": [1]}}]}', "",
     [("a", {}), ("b", {"x": [1]})]),
    ('{"tool_call": {"name": "a", "arguments": {}}}', "", [("a", {})]),
    ('{"content": "It is sunny."}', "It is sunny.", []),
    ('{"response": "Hi"}', "Hi", []),
    ("plain text", "plain text", []),
])
def test_the_generic_envelope(registry, text, content, calls):
    parser = registry.tool_parser("generic")()
    got_content, got = parser.parse(text)
    assert got_content == content and [(c.name, json.loads(c.arguments)) for c in got] == calls
    stream = parser.streaming()
    events = [e for ch in text for e in stream.feed(ch)] + stream.finish()
    assert [(e.name, e.index) for e in events if isinstance(e, ToolCallDelta) and e.name] == [
        (n, i) for i, (n, _) in enumerate(calls)]
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == content


def test_qwen3_xml_reads_parameter_types_from_the_tools(registry):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "zip": {"type": "string"}, "n": {"type": "integer"}}}}}]
    text = ("<tool_call>\n<function=f>\n<parameter=zip>\n12345\n</parameter>\n<parameter=n>\n7\n</parameter>\n"
            "</function>\n</tool_call>")
    _, calls = registry.tool_parser("qwen3_xml")(tools).parse(text)
    assert json.loads(calls[0].arguments) == {"zip": "12345", "n": 7}  # declared a string: stays text
    _, calls = registry.tool_parser("qwen3_xml")().parse(text)
    assert json.loads(calls[0].arguments) == {"zip": 12345, "n": 7}  # no schema: JSON-looking text is read as JSON


def test_pythonic_streams_bracketed_prose_at_once(registry):
    stream = registry.tool_parser("pythonic")().streaming()
    assert "".join(e.text for e in stream.feed("See [1] and [2].")) == "See [1] and [2]."
    events = stream.feed(" [get_weather(city='Paris')]") + stream.finish()
    assert [(e.name, e.arguments) for e in events if isinstance(e, ToolCallDelta) and e.name] == [("get_weather", "")]
    assert [e.arguments for e in events if isinstance(e, ToolCallDelta) and not e.name] == ['{"city": "Paris"}']
