"""``call_grammar`` / ``auto_grammar``: what ``tool_choice: "auto"`` forces. Each format's auto grammar (free text,
then from the trigger on the call grammar, then free text again) compiles with the built-in engine (llguidance),
admits a call to a declared tool in the form the parser reads back, with text around it and two calls in a row, and
refuses an undeclared tool or an argument of the wrong type once the trigger is written."""

from __future__ import annotations

import json

import pytest

from specframe.contracts.constraint import ConstraintSpec
from specframe.grammar.llguidance_engine import LLGuidanceEngine

from tests.fakes import build_bpe_tokenizer

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
ARGS = '{"city": "Paris"}'
# parser -> (a call as the grammar writes it, the same call to a tool nobody declared)
CALLS = {
    "hermes": ('<tool_call>\n{"name": "get_weather", "arguments": %s}\n</tool_call>', "get_weather"),
    "xlam": ('<tool_call>[{"name": "get_weather", "arguments": %s}]</tool_call>', "get_weather"),
    "llama3_json": ('{"name": "get_weather", "parameters": %s}', "get_weather"),
    "mistral": ('[TOOL_CALLS][{"name": "get_weather", "arguments": %s}]', "get_weather"),
    "generic": ('{"tool_calls": [{"name": "get_weather", "arguments": %s}]}', "get_weather"),
}


@pytest.fixture(scope="module")
def engine():
    tok = build_bpe_tokenizer()
    return tok, LLGuidanceEngine(tok, len(tok), {0})


def _accepts(engine, spec: dict, text: str) -> bool:
    tok, eng = engine
    matcher = eng.compile(ConstraintSpec(**spec)).matcher
    return matcher.consume_tokens(tok.encode(text)) and matcher.is_accepting()


@pytest.mark.parametrize("name", sorted(CALLS))
def test_the_grammar_admits_a_declared_call_that_parses_back(registry, engine, name):
    parser = registry.tool_parser(name)(TOOLS)
    spec = parser.auto_grammar(TOOLS)
    template, tool = CALLS[name]
    text = template % ARGS
    assert _accepts(engine, spec, text), spec
    assert not _accepts(engine, spec, text.replace(tool, "rm_rf")), "an undeclared tool name must be refused"
    assert not _accepts(engine, spec, text.replace('"Paris"', "3")), "the parameters' schema must hold"
    _, calls = parser.parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    if parser.trigger is not None:
        assert text.startswith(parser.trigger)  # the grammar covers the call from its trigger on
        assert _accepts(engine, spec, "Let me check.\n" + text + "\n" + text + " Done.")  # text, two calls, text
        assert _accepts(engine, spec, "No call needed: 2 + 2 = 4.")  # no call at all
        assert not _accepts(engine, spec, "Sure. " + text.replace(tool, "rm_rf"))  # after the trigger: forced


def test_the_generic_envelope_also_admits_plain_content(engine, registry):
    spec = registry.tool_parser("generic")().call_grammar(TOOLS)
    assert _accepts(engine, spec, '{"content": "It is sunny."}')


def test_the_qwen3_xml_grammar_writes_the_template_layout_with_typed_values(registry, engine):
    tools = TOOLS + [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "note": {"type": "string"}}, "required": ["a"]}}}]
    parser = registry.tool_parser("qwen3_xml")(tools)
    spec = parser.auto_grammar(tools)
    call = "<tool_call>\n<function=add>\n<parameter=a>\n12\n</parameter>\n</function>\n</tool_call>"
    assert _accepts(engine, spec, call)
    assert _accepts(engine, spec, call.replace("</function>", "<parameter=note>\nx < y\n</parameter>\n</function>"))
    assert not _accepts(engine, spec, call.replace("12", "twelve"))  # an integer parameter takes JSON
    assert not _accepts(engine, spec, call.replace("add", "sub"))
    weather = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    assert _accepts(engine, spec, weather)
    assert not _accepts(engine, spec, weather.replace("<parameter=city>\nParis\n</parameter>\n", ""))  # required
    assert [(c.name, json.loads(c.arguments)) for c in parser.parse(call)[1]] == [("add", {"a": 12})]


@pytest.mark.parametrize("name", sorted(CALLS))
def test_none_bans_the_trigger_as_text(registry, engine, name):
    parser = registry.tool_parser(name)(TOOLS)
    spec = parser.none_grammar()
    if parser.trigger is None:
        assert spec is None  # (generic: nothing to ban)
        return
    assert _accepts(engine, spec, "Plain words, no call.") and _accepts(engine, spec, "")
    assert not _accepts(engine, spec, "Sure: " + CALLS[name][0] % ARGS)


@pytest.mark.parametrize("name", ["pythonic", "openai"])
def test_formats_without_a_grammar_say_so(registry, name):
    assert registry.tool_parser(name)().call_grammar(TOOLS) is None
    if name == "pythonic":
        assert registry.tool_parser(name)().none_grammar() is None  # its "[" is everyday text
    assert registry.tool_parser(name)().auto_grammar(TOOLS) is None


def test_the_grammar_pieces_write_json_as_the_engine_does():
    from specframe.contracts.tool_formats import JSON_LAYOUT as FORMATS_LAYOUT
    from specframe.grammar.llguidance_engine import JSON_LAYOUT

    assert FORMATS_LAYOUT == JSON_LAYOUT
