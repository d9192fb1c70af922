"""``mistral``: calls after the ``[TOOL_CALLS]`` token, in either of Mistral's two forms (vLLM's ``mistral`` parser,
SGLang's ``mistral`` detector):

- up to tokenizer v7 (Mistral-7B-Instruct-v0.3, Mistral-Nemo): one JSON list,
  ``[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}, ...]``;
- from v11 (Mistral-Small-3.1 and later, Magistral, Devstral): one marker per call, ``[TOOL_CALLS]add{"a": 1}``,
  or with v13's ``[ARGS]``: ``[TOOL_CALLS]add[ARGS]{"a": 1}``.

Worked example: ``Hello[TOOL_CALLS]add{"a": 1, "b": 2}`` -> content "Hello", calls [add({"a": 1, "b": 2})]. Text
after the calls is content. Format: mistral-common's tokenizer versions,
https://github.com/mistralai/mistral-common .
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from specframe.services import (
    ToolCall,
    ToolParser,
    call_from_json,
    calls_from_json,
    decode_json_prefix,
    lark_json,
    tool_call_schema,
)

MARK, ARGS = "[TOOL_CALLS]", "[ARGS]"
NAME = re.compile(r"[A-Za-z_][\w.\-]*")


def _named(text: str) -> tuple[str, int, Any] | None:
    """``name[ARGS]?{json}`` at the start of ``text``: (name, end, arguments value)."""
    m = NAME.match(text)
    if m is None:
        return None
    at = m.end() + (len(ARGS) if text.startswith(ARGS, m.end()) else 0)
    if not text.startswith("{", at):
        return None
    got = decode_json_prefix(text[at:])
    return None if got is None else (m.group(), at + got[1], got[0])


class MistralToolParser(ToolParser):
    """``[TOOL_CALLS]`` then a JSON list of calls, or ``name{args}`` / ``name[ARGS]{args}``."""

    name = "mistral"
    trigger = MARK
    priority = 10

    @classmethod
    def detect(cls, chat_template: str) -> bool:
        """Templates that write ``[TOOL_CALLS]`` (Mistral's)."""
        return MARK in chat_template

    def call_end(self, text: str) -> int | None:
        body = text[len(MARK):]
        lead = len(body) - len(body.lstrip())
        if body.lstrip().startswith("["):
            got = decode_json_prefix(body)
            return None if got is None else len(MARK) + got[1]
        named = _named(body[lead:])
        return None if named is None else len(MARK) + lead + named[1]

    def parse_call(self, segment: str) -> list[ToolCall] | None:
        body = segment[len(MARK):].lstrip()
        if body.startswith("["):
            got = decode_json_prefix(body)
            return None if got is None or body[got[1]:].strip() else calls_from_json(got[0])
        named = _named(body)
        if named is None or body[named[1]:].strip():
            return None
        call = call_from_json({"name": named[0], "arguments": named[2]})
        return None if call is None else [call]

    def call_grammar(self, tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The pre-v11 form, after ``[TOOL_CALLS]``: a non-empty JSON list of calls to ``tools``."""
        schema = {"type": "array", "items": tool_call_schema(tools), "minItems": 1}
        return {"grammar": f"start: list\nlist: {lark_json(schema)}\n"}
