"""Helpers for writing a tool-call format (:mod:`.tool_parsing` holds the contract): reading a call out of JSON as
models write it, and the JSON schema / Lark pieces of a format's call grammar (``ToolParser.call_grammar``)."""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

from .tool_parsing import JSON_LAYOUT, ToolCall, lark_json, new_call_id  # noqa: F401 (JSON_LAYOUT: re-exported)


def json_arguments(value: Any) -> str | None:
    """A call's arguments as OpenAI's JSON text: a mapping is serialised (``json.dumps``, non-ASCII kept); a string
    that holds a JSON object is passed through re-serialised (some models write arguments pre-encoded); None (the
    key is missing) -> ``"{}"``; anything else (a list, a number, a plain string) -> None, not a call."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return None


def call_from_json(obj: Any, args_keys: Sequence[str] = ("arguments", "parameters")) -> ToolCall | None:
    """``{"name": str, "arguments" | "parameters": {...}}`` -> a :class:`ToolCall`; None when ``obj`` is not that."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    key = next((k for k in args_keys if k in obj), None)
    if key is None:
        return None
    arguments = json_arguments(obj[key])
    return None if arguments is None else ToolCall(new_call_id(), obj["name"], arguments)


def calls_from_json(value: Any) -> list[ToolCall] | None:
    """One call object or a non-empty list of them -> the calls; None when any element is not a call."""
    items = value if isinstance(value, list) else [value]
    calls = [call_from_json(v) for v in items]
    return calls if items and all(c is not None for c in calls) else None  # type: ignore[return-value]


_DECODER = json.JSONDecoder()


def decode_json_prefix(text: str) -> tuple[Any, int] | None:
    """The JSON value at the start of ``text`` (leading whitespace skipped) and where it ends; None when no complete
    value starts there (cut off, or not JSON)."""
    start = len(text) - len(text.lstrip())
    try:
        return _DECODER.raw_decode(text, start)
    except json.JSONDecodeError:
        return None


def tool_call_schema(tools: Iterable[dict[str, Any]], args_key: str = "arguments") -> dict[str, Any]:
    """The JSON schema of one call object ``{"name": <a tool's name>, args_key: <its parameters>}`` over OpenAI
    ``tools`` entries (``{"type": "function", "function": {"name", "parameters"}}`` or the bare function)."""
    options = []
    for tool in tools:
        fn = tool.get("function", tool)
        options.append({"type": "object", "properties": {"name": {"const": fn["name"]},
                                                          args_key: fn.get("parameters") or {"type": "object"}},
                        "required": ["name", args_key], "additionalProperties": False})
    if not options:
        raise ValueError("tool_call_schema needs at least one tool")
    return options[0] if len(options) == 1 else {"anyOf": options}


def lark_literal(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text)
