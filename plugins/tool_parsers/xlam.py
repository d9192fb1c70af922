"""``xlam``: a JSON list of ``{"name", "arguments"}`` objects, bare or wrapped (Salesforce xLAM-2 function-calling
models; SmolLM2-1.7B-Instruct's ``<tool_call>[{...}]</tool_call>``; vLLM's ``xlam`` parser).

The list may stand alone, after ``[TOOL_CALLS]``, inside ``<tool_call>`` ... ``</tool_call>`` or in a fenced
```` ```json ```` block; text before it (a ``<think>`` span included) is content. Worked example::

    I'll help you check the weather.<tool_call>[{"name": "get_weather", "arguments": {"city": "Dallas"}}]</tool_call>
    -> content "I'll help you check the weather.", calls [get_weather({"city": "Dallas"})]

Sources: xLAM, https://huggingface.co/Salesforce/Llama-xLAM-2-8b-fc-r ; SmolLM2,
https://huggingface.co/HuggingFaceTB/SmolLM2-1.7B-Instruct .
"""

from __future__ import annotations

from typing import Any, Sequence

from specframe.services import ToolCall, ToolParser, calls_from_json, decode_json_prefix, lark_json, tool_call_schema

FENCE = "```"
WRAPS = {"<tool_call>": "</tool_call>", "```json": FENCE, "[TOOL_CALLS]": ""}


class XlamToolParser(ToolParser):
    """A JSON list of calls (or one call object), bare, fenced or wrapped in ``<tool_call>``/``[TOOL_CALLS]``."""

    name = "xlam"
    trigger = "<tool_call>"
    end = "</tool_call>"
    openers = ("```json", "[TOOL_CALLS]", '[{"name"')
    priority = 15

    @classmethod
    def detect(cls, chat_template: str) -> bool:
        """Templates that teach xLAM's JSON list (or write ``<tool_call>[``). SmolLM2-1.7B's own template does not
        mention tools (its model card gives the format in a system prompt): name ``xlam`` explicitly there."""
        return "<tool_call>[" in chat_template or ('[{"name"' in chat_template and '"arguments"' in chat_template)

    def _wrap(self, text: str) -> tuple[str, str]:
        return next(((o, c) for o, c in WRAPS.items() if text.startswith(o)), ("", ""))

    def call_end(self, text: str) -> int | None:
        opener, closer = self._wrap(text)
        if closer:
            at = text.find(closer, len(opener))
            return None if at < 0 else at + len(closer)
        got = decode_json_prefix(text[len(opener):])
        return None if got is None else len(opener) + got[1]

    def parse_call(self, segment: str) -> list[ToolCall] | None:
        opener, closer = self._wrap(segment)
        inner = segment[len(opener):]
        inner = inner[:-len(closer)] if closer and inner.endswith(closer) else inner
        got = decode_json_prefix(inner)
        if got is None or inner[got[1]:].strip():
            return None
        return calls_from_json(got[0])

    def call_grammar(self, tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """After ``<tool_call>``: ``[<call>, ...]</tool_call>``, a non-empty JSON list of calls to ``tools``."""
        schema = {"type": "array", "items": tool_call_schema(tools), "minItems": 1}
        return {"grammar": f'start: list "</tool_call>"\nlist: {lark_json(schema)}\n'}
