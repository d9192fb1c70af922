"""``openai_gptoss``: gpt-oss's reasoning is its ``analysis`` channel (harmony format; vLLM's ``openai_gptoss``
reasoning parser). Each ``<|channel|>analysis<|message|>...<|end|>`` message is reasoning; every other message is
left in the content as written, for the ``openai`` tool parser to read (its ``final`` channel is the answer)::

    <|channel|>analysis<|message|>Need the tool.<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>
    -> reasoning "Need the tool.", content "<|start|>assistant<|channel|>final<|message|>Hi<|return|>"

Format: https://github.com/openai/harmony .
"""

from __future__ import annotations

import re

from specframe.services import ContentDelta, ReasoningDelta, ReasoningParser

ANALYSIS = re.compile(r"(?:<\|start\|>assistant)?<\|channel\|>analysis<\|message\|>(.*?)(?:<\|end\|>|$)", re.DOTALL)
START = "<|channel|>analysis<|message|>"


class HarmonyReasoningParser(ReasoningParser):
    """Analysis-channel messages out of a harmony answer; several are joined with a newline."""

    name = "openai_gptoss"
    start = START
    end = "<|end|>"
    priority = 30

    @classmethod
    def detect(cls, chat_template: str) -> bool:
        """gpt-oss templates (harmony's ``<|channel|>`` and its ``analysis`` channel)."""
        return "<|channel|>" in chat_template and "analysis" in chat_template

    def split(self, text: str) -> tuple[str, str]:
        reasoning = [m.group(1) for m in ANALYSIS.finditer(text)]
        return "\n".join(reasoning), ANALYSIS.sub("", text)

    def streaming(self) -> "StreamingHarmonyReasoning":
        return StreamingHarmonyReasoning(self)


class StreamingHarmonyReasoning:
    """Whole messages settle as they close (``<|end|>``, ``<|call|>``, ``<|return|>``); the rest at the end. The
    joined events equal :meth:`HarmonyReasoningParser.split`."""

    CLOSERS = ("<|end|>", "<|call|>", "<|return|>")

    def __init__(self, parser: HarmonyReasoningParser) -> None:
        self.parser, self._buf, self._said, self._done = parser, "", False, False

    @property
    def reasoning_done(self) -> bool:
        """True once a message that is not analysis has begun (the answer or a call)."""
        head = self._buf.removeprefix("<|start|>assistant")
        return self._done or (head.startswith("<|channel|>") and not START.startswith(head[:len(START)]))

    def feed(self, delta: str) -> list[ReasoningDelta | ContentDelta]:
        self._buf += delta
        out: list[ReasoningDelta | ContentDelta] = []
        while True:
            ends = [at + len(c) for c in self.CLOSERS if (at := self._buf.find(c)) >= 0]
            if not ends:
                return out
            cut = min(ends)
            out += self._settle(self._buf[:cut])
            self._buf = self._buf[cut:]

    def finish(self) -> list[ReasoningDelta | ContentDelta]:
        out, self._buf = self._settle(self._buf), ""
        return out

    def _settle(self, piece: str) -> list[ReasoningDelta | ContentDelta]:
        reasoning, content = self.parser.split(piece)
        out: list[ReasoningDelta | ContentDelta] = []
        if ANALYSIS.search(piece):
            out.append(ReasoningDelta(("\n" if self._said else "") + reasoning))
            self._said = True
        if content:
            out.append(ContentDelta(content))
            self._done = self._done or "<|channel|>" in content
        return out
