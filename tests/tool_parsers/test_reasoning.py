"""Reasoning parsers: the thinking returned apart from the answer, whole and streamed in any chunking, and the answer
then read by the family's tool parser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specframe.services import ContentDelta, ReasoningDelta

from .conftest import chunkings

HARMONY = ("<|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant<|channel|>commentary "
           'to=functions.get_weather <|constrain|>json<|message|>{"city": "Tokyo"}<|call|>')
CASES = [  # parser, starts_inside override, output, reasoning, content
    ("qwen3", None, "<think>The user greets.</think>\n\nHello!", "The user greets.", "Hello!"),
    ("qwen3", None, "Hello!", "", "Hello!"),  # enable_thinking=False: no span in the output
    ("qwen3", None, "<think>\nStill thinking", "\nStill thinking", ""),  # cut off while thinking
    ("qwen3", True, "The prompt opened it.</think>Answer", "The prompt opened it.", "Answer"),  # Qwen3-Thinking-2507
    ("qwen3", None, "<think></think>\n\nNo thoughts.", "", "No thoughts."),
    ("deepseek_r1", None, "Let me see. 2+2=4.</think>\n\nThe answer is 4.", "Let me see. 2+2=4.", "The answer is 4."),
    ("deepseek_r1", None, "<think>Okay.</think>Done", "Okay.", "Done"),
    ("deepseek_r1", None, "Thinking without an end", "Thinking without an end", ""),
    ("openai_gptoss", None, HARMONY, "Need the weather tool.",
     '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Tokyo"}'
     "<|call|>"),
    ("openai_gptoss", None, "<|channel|>final<|message|>Hi<|return|>", "", "<|channel|>final<|message|>Hi<|return|>"),
]


RECORDED = json.loads(Path(__file__).with_name("vllm_reasoning_cases.json").read_text(encoding="utf-8"))["cases"]
CASES += [(c["parser"], c["starts_inside"], c["output"], c["reasoning"], c["content"]) for c in RECORDED]


@pytest.mark.parametrize("name, inside, text, reasoning, content", CASES)
def test_split_and_streaming_agree(registry, name, inside, text, reasoning, content):
    parser = registry.reasoning_parser(name)(starts_inside=inside)
    assert parser.split(text) == (reasoning, content)
    for pieces in chunkings(text, seed=len(text)):
        stream = parser.streaming()
        events = [e for p in pieces for e in stream.feed(p)] + stream.finish()
        assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == reasoning, pieces
        assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == content, pieces
        kinds = [type(e) for e in events if e.text]
        assert kinds == sorted(kinds, key=lambda k: k is ContentDelta) or name == "openai_gptoss"  # reasoning first


def test_reasoning_done_marks_where_constraints_may_start(registry):
    stream = registry.reasoning_parser("qwen3")().streaming()
    assert stream.feed("<think>a") == [ReasoningDelta("a")] and not stream.reasoning_done
    assert stream.feed("b</thi") == [ReasoningDelta("b")] and not stream.reasoning_done
    assert stream.feed('nk>\n{"x": 1}') == [ContentDelta('{"x": 1}')] and stream.reasoning_done


def test_the_prompt_decides_whether_the_output_starts_inside(registry):
    cls = registry.reasoning_parser("qwen3")
    assert cls.for_prompt("<|im_start|>assistant\n<think>\n").starts_inside is True
    assert cls.for_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n").starts_inside is False
    assert cls.for_prompt("<|im_start|>assistant\n").starts_inside is False


def test_gpt_oss_reasoning_then_tool_call(registry):
    reasoning, content = registry.reasoning_parser("openai_gptoss")().split(HARMONY)
    answer, calls = registry.tool_parser("openai")().parse(content)
    assert reasoning == "Need the weather tool." and answer == ""
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Tokyo"}')]


def test_qwen3_reasoning_then_hermes_call(registry):
    text = '<think>Use the tool.</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    reasoning, content = registry.reasoning_parser("qwen3")().split(text)
    assert reasoning == "Use the tool."
    assert [c.name for c in registry.tool_parser("hermes")().parse(content)[1]] == ["f"]
