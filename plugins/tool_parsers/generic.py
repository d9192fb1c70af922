"""``generic``: a JSON envelope for models with no tool-call format of their own (SmolLM2-135M/360M, base models),
after llama.cpp's "Generic" chat handler (common/chat.cpp): the whole answer is one JSON object, forced by a grammar
from the first token (so :attr:`trigger` is None) and explained to the model by a system line::

    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}   -> calls
    {"content": "It is sunny."}                                                -> content "It is sunny."

``"tool_call": {...}`` (one call) and ``"response"`` (llama.cpp's name for the text) are read too. Anything else
is content as written. Detection accepts every template, at the lowest priority: it is the fallback.
"""

from __future__ import annotations

from typing import Any, Sequence

from specframe.services import ToolCall, ToolParser, calls_from_json, decode_json_prefix, tool_call_schema

#: The system line a server adds for a model that has never seen tools (the schema is forced anyway).
SYSTEM_HINT = ('Answer with one JSON object: {"tool_calls": [{"name": <tool name>, "arguments": {...}}]} to call '
               'tools, or {"content": <your answer>} to answer directly.')


class GenericToolParser(ToolParser):
    """``{"tool_calls": [...]}`` or ``{"content": "..."}``, the whole answer."""

    name = "generic"
    trigger = None
    system_hint = SYSTEM_HINT
    priority = -100

    @classmethod
    def detect(cls, chat_template: str) -> bool:
        """Any template: the fallback when no other parser recognises it."""
        return True

    def parse_region(self, segment: str) -> tuple[str, list[ToolCall]]:
        got = decode_json_prefix(segment)
        if got is None or segment[got[1]:].strip() or not isinstance(got[0], dict):
            return segment, []
        value = got[0]
        calls_value = value.get("tool_calls", [value["tool_call"]] if "tool_call" in value else None)
        if calls_value is not None:
            calls = calls_from_json(calls_value)
            return (segment, []) if calls is None else ("", calls)
        for key in ("content", "response"):
            if isinstance(value.get(key), str):
                return value[key], []
        return segment, []

    def call_grammar(self, tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The envelope's JSON schema: calls to ``tools`` or a ``content`` string (applies from the first token)."""
        calls = {"type": "array", "items": tool_call_schema(tools), "minItems": 1}
        return {"json_schema": {"anyOf": [
            {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"],
             "additionalProperties": False},
            {"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"],
             "additionalProperties": False},
        ]}}
