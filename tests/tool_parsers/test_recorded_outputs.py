"""Each built-in tool parser on recorded outputs of its model family (vLLM's public parser tests, as data:
vllm_cases.json names the files and commits): the same calls (name and parsed arguments) and content, whole and
streamed in any chunking."""

from __future__ import annotations

import json

import pytest

from specframe.contracts.tool_parsing import collect
from specframe.services import ContentDelta, ToolCallDelta

from .conftest import CASES, chunkings


def _expected(call: dict) -> tuple:
    return (call["name"], ("raw", call["raw_arguments"]) if "raw_arguments" in call else ("json", call["arguments"]))


def _got(name: str, arguments: str, raw: bool) -> tuple:
    return (name, ("raw", arguments) if raw else ("json", json.loads(arguments)))


@pytest.mark.parametrize("case", CASES, ids=[f"{c['parser']}-{c['id']}" for c in CASES])
def test_parse_gives_the_recorded_calls_and_content(registry, case):
    parser = registry.tool_parser(case["parser"])()
    content, calls = parser.parse(case["output"])
    want = [_expected(c) for c in case["calls"]]
    assert [_got(c.name, c.arguments, "raw_arguments" in w) for c, w in zip(calls, case["calls"])] == want
    assert len(calls) == len(want)
    assert content == case["content"]
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in calls)
    assert len({c.id for c in calls}) == len(calls)


@pytest.mark.parametrize("case", CASES, ids=[f"{c['parser']}-{c['id']}" for c in CASES])
def test_streaming_in_any_chunking_gives_what_parse_gives(registry, case):
    parser = registry.tool_parser(case["parser"])()
    _, whole = parser.parse(case["output"])
    for n, pieces in enumerate(chunkings(case["output"], seed=len(case["output"]))):
        stream = parser.streaming()
        events = [e for piece in pieces for e in stream.feed(piece)] + stream.finish()
        content, calls = collect(events)
        assert calls == [(c.name, c.arguments) for c in whole], f"chunking {n}: {pieces}"
        assert content.strip() == case["content"].strip(), f"chunking {n}: {pieces}"
        for e in events:
            assert isinstance(e, (ContentDelta, ToolCallDelta)) and (not isinstance(e, ContentDelta) or e.text)


def test_every_built_in_tool_parser_has_recorded_cases(registry):
    assert set(registry.tool_parsers) - {c["parser"] for c in CASES} == {"generic"}  # generic: no upstream model
