"""``openai``: gpt-oss's harmony format (vLLM's ``openai`` parser). An answer is a run of messages, each
``<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]<|message|>BODY`` closed by ``<|end|>``, ``<|call|>`` or
``<|return|>`` (later ones opened by ``<|start|>assistant``)::

    <|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"location": "Tokyo"}<|call|>
    -> calls [get_weather({"location": "Tokyo"})]

A message to ``functions.NAME`` is a call (its body the arguments, re-serialised when it is JSON, as written when
not); the ``final`` channel, and a ``commentary`` message with no recipient (a preamble), are content; the
``analysis`` channel is reasoning, left out here (the ``openai_gptoss`` reasoning parser returns it). The text must
be decoded with its special tokens kept. Format: https://github.com/openai/harmony ,
https://cookbook.openai.com/articles/openai-harmony .
"""

from __future__ import annotations

import json
import re

from specframe.services import ToolCall, ToolParser, new_call_id

TERMINATORS = ("<|end|>", "<|call|>", "<|return|>")
MESSAGE = "<|message|>"
RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")
CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")


def message_end(text: str) -> int | None:
    """The length of the harmony message at the start of ``text``, through its terminator (None: not closed)."""
    ends = [at + len(t) for t in TERMINATORS if (at := text.find(t, 1)) >= 0]
    return min(ends) if ends else None


def strip_terminator(body: str) -> str:
    return next((body[:-len(t)] for t in TERMINATORS if body.endswith(t)), body)


def header_and_body(segment: str) -> tuple[str, str] | None:
    at = segment.find(MESSAGE)
    return None if at < 0 else (segment[:at], strip_terminator(segment[at + len(MESSAGE):]))


class HarmonyToolParser(ToolParser):
    """Harmony messages; those addressed ``to=functions.NAME`` are calls."""

    name = "openai"
    trigger = "to=functions."
    openers = ("<|channel|>", "<|start|>")
    priority = 30

    @classmethod
    def detect(cls, chat_template: str) -> bool:
        """gpt-oss templates (harmony channels and ``functions.`` recipients)."""
        return "<|channel|>" in chat_template and "functions." in chat_template

    def call_end(self, text: str) -> int | None:
        return message_end(text)

    def parse_region(self, segment: str) -> tuple[str, list[ToolCall]]:
        parts = header_and_body(segment)
        if parts is None:
            return segment, []
        header, body = parts
        to = RECIPIENT.search(header)
        if to is not None:
            try:
                arguments = json.dumps(json.loads(body), ensure_ascii=False)
            except json.JSONDecodeError:
                arguments = body
            return "", [ToolCall(new_call_id(), to.group(1), arguments)]
        channel = CHANNEL.search(header)
        return ("", []) if channel is not None and channel.group(1) == "analysis" else (body, [])
