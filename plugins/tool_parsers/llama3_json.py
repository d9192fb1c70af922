"""``llama3_json``: Llama 3.1/3.2/3.3's JSON tool calls, ``{"name": ..., "parameters": {...}}`` (``arguments`` also
read), optionally after ``<|python_tag|>``, several separated by ``;`` (vLLM's ``llama3_json`` parser, SGLang's
``llama3`` detector). Text around the calls is content. Worked example::

    {"name": "searchTool", "parameters": {"query": "test1"}}; {"name": "getOpenIncidentsTool", "parameters": {}}
    -> calls [searchTool({"query": "test1"}), getOpenIncidentsTool({})]

Format: Meta's Llama 3.1 model card, "JSON based tool calling",
https://www.llama.com/docs/model-cards-and-prompt-formats/llama3_1/ .
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from specframe.services import ToolCall, ToolParser, call_from_json, decode_json_prefix, lark_json, lark_literal

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    """One JSON object per call; a call ends where its JSON ends."""

    name = "llama3_json"
    trigger = '{"name"'
    openers = (PYTHON_TAG,)
    separators = ";"
    priority = 5

    @classmethod
    def detect(cls, chat_template: str) -> bool:
        """Llama 3.x templates with JSON tool calls (they name ``"parameters"`` and the ``<|eom_id|>``/header
        tokens)."""
        return "<|start_header_id|>" in chat_template and '"parameters"' in chat_template

    def call_end(self, text: str) -> int | None:
        skip = len(PYTHON_TAG) if text.startswith(PYTHON_TAG) else 0
        got = decode_json_prefix(text[skip:])
        return None if got is None else skip + got[1]

    def parse_call(self, segment: str) -> list[ToolCall] | None:
        body = segment.removeprefix(PYTHON_TAG)
        got = decode_json_prefix(body)
        if got is None or body[got[1]:].strip():
            return None
        call = call_from_json(got[0], ("parameters", "arguments"))
        return None if call is None else [call]

    def call_grammar(self, tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """After the trigger ``{"name"``: the rest of one ``{"name": <a tool>, "parameters": <its parameters>}``
        object, in the engine's JSON layout (``": "`` and ``", "``)."""
        rules, names = [], []
        for i, tool in enumerate(tools):
            fn = tool.get("function", tool)
            head = lark_literal(f': {json.dumps(fn["name"])}, "parameters": ')
            rules.append(f"t{i}: {head} {lark_json(fn.get('parameters') or {'type': 'object'})} \"}}\"")
            names.append(f"t{i}")
        return {"grammar": "\n".join([f"start: {' | '.join(names)}", *rules]) + "\n"}
