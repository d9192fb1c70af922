"""``hermes``: one JSON object per call between ``<tool_call>`` and ``</tool_call>`` (NousResearch Hermes 2 Pro and 3,
Qwen2.5 and Qwen3 instruct models; vLLM's ``hermes`` parser, SGLang's ``qwen25`` detector).

Worked example::

    I'll check.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Tokyo"}}
    </tool_call>
    -> content "I'll check.", calls [get_weather({"city": "Tokyo"})]

Parallel calls are consecutive blocks. A block left open at the end of the output is read to the end; a block whose
text is not one ``{"name", "arguments"}`` object stays in the content. Format: the Hermes function-calling
prompt format, https://github.com/NousResearch/Hermes-Function-Calling .
"""

from __future__ import annotations

from typing import Any, Sequence

from specframe.services import ToolCall, ToolParser, call_from_json, decode_json_prefix, lark_json, tool_call_schema

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def block_json(segment: str, open_: str = OPEN, close: str = CLOSE) -> Any:
    """The one JSON value between ``open_`` and ``close`` (``close`` may be missing); None when the block holds
    anything else."""
    inner = segment[len(open_):]
    inner = inner[:-len(close)] if inner.endswith(close) else inner
    got = decode_json_prefix(inner)
    if got is None or inner[got[1]:].strip():
        return None
    return got[0]


class HermesToolParser(ToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call."""

    name = "hermes"
    trigger = OPEN
    end = CLOSE
    priority = 10

    @classmethod
    def detect(cls, chat_template: str) -> bool:
        """Templates that teach ``<tool_call>`` blocks (Qwen2.5/Qwen3, Hermes), unless they are qwen3_xml's."""
        return OPEN in chat_template and "<function=" not in chat_template

    def parse_call(self, segment: str) -> list[ToolCall] | None:
        call = call_from_json(block_json(segment))
        return None if call is None else [call]

    def call_grammar(self, tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """After ``<tool_call>``: ``\\n{"name": <a tool>, "arguments": <its parameters>}\\n</tool_call>`` (newlines
        optional)."""
        call = lark_json(tool_call_schema(tools))
        return {"grammar": f'start: "\\n"? call "\\n"? "{CLOSE}"\ncall: {call}\n'}
