"""The reasoning-parsing contract: a reasoning model's thinking, returned apart from its answer.

A *reasoning parser* (registered with ``specframe_register_reasoning_parsers``; the built-in ones are in
``specframe_plugins.reasoning_parsers``) splits a completion into ``reasoning`` (OpenAI-compatible servers return it
as ``message.reasoning_content``) and ``content`` (the answer, which a tool parser then reads), whole
(:meth:`ReasoningParser.split`) or streamed (:meth:`ReasoningParser.streaming`). Pure text: it knows nothing of tokens.

The span is ``start`` ... ``end`` (``<think>`` ... ``</think>`` for DeepSeek-R1 and Qwen3). A template that writes
``start`` into the prompt (Qwen3's and DeepSeek-R1's newer templates open ``<think>`` themselves) makes the output
begin inside the reasoning: :attr:`ReasoningParser.starts_inside` says whether the parser assumes so when the output
does not open with ``start``. A server arms constraints (a JSON schema, a tool grammar) only after ``end``
(:meth:`StreamingReasoningParser.reasoning_done`).

Names follow vLLM's ``--reasoning-parser`` names (``deepseek_r1``, ``qwen3``, ``openai_gptoss``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .tool_parsing import ContentDelta, held_prefix


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Streamed reasoning text (``delta.reasoning_content``)."""

    text: str


class ReasoningParser:
    """The base of a reasoning format: set ``name``, ``start``, ``end`` (and ``starts_inside``); override
    :meth:`split` for a format that is not one leading span.

    Class attributes:
        name: the name in config and ``--reasoning-parser``.
        start, end: the markers around the reasoning.
        starts_inside: an output that does not begin with ``start`` is reasoning until ``end`` (the template opened
            the span in the prompt); an output with no ``end`` at all is then all reasoning (cut off while thinking).
            An instance may override it for one request (:meth:`for_prompt`).
        implicit_ends: texts that end the reasoning without ``end`` and begin the content (Qwen3 models may open
            ``<tool_call>`` straight from their thinking).
        priority: detection order, highest first.
    """

    name: ClassVar[str] = ""
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    starts_inside: ClassVar[bool] = False
    implicit_ends: ClassVar[tuple[str, ...]] = ()
    priority: ClassVar[int] = 0

    def __init__(self, starts_inside: bool | None = None) -> None:
        if starts_inside is not None:
            self.starts_inside = starts_inside  # this request's prompt decides (see for_prompt)

    @classmethod
    def for_prompt(cls, prompt: str) -> "ReasoningParser":
        """A parser for one request: the output starts inside the reasoning when the rendered ``prompt`` ends with
        an open ``start`` (DeepSeek-R1's and Qwen3-Thinking's templates end with ``<think>\n``)."""
        tail = prompt.rstrip()
        return cls(starts_inside=tail.endswith(cls.start) or None) if cls.start else cls()

    @classmethod
    def detect(cls, chat_template: str) -> bool:
        """Whether ``chat_template`` belongs to this reasoning format. Default: it mentions both markers."""
        return cls.start in chat_template and cls.end in chat_template

    def split(self, text: str) -> tuple[str, str]:
        """``(reasoning, content)`` of a whole completion. Leading whitespace of the content is dropped; an output
        without a reasoning span is all content (unless :attr:`starts_inside`, see the class docstring)."""
        body = text.lstrip()
        opened = body.startswith(self.start)
        if opened:
            body = body[len(self.start):]
        elif not self.starts_inside:
            return "", text
        at, size = self.reasoning_end(body)
        if at < 0:
            return body, ""  # cut off while thinking
        return body[:at], body[at + size:].lstrip()

    def reasoning_end(self, text: str) -> tuple[int, int]:
        """Where the reasoning in ``text`` ends and how many characters the marker there takes out (``end``'s
        length; 0 for an implicit end, which stays in the content); ``(-1, 0)`` when it has not ended."""
        found = [(at, len(self.end)) for at in [text.find(self.end)] if at >= 0]
        found += [(at, 0) for at in (text.find(m) for m in self.implicit_ends) if at >= 0]
        return min(found) if found else (-1, 0)

    def streaming(self) -> "StreamingReasoningParser":
        """A fresh per-request streaming splitter."""
        return StreamingReasoningParser(self)


class StreamingReasoningParser:
    """One request's split of streamed text into :class:`ReasoningDelta` then :class:`ContentDelta` events; the
    joined events equal :meth:`ReasoningParser.split` for any chunking (markers are held until they are whole)."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self._buf = ""
        self._state = "begin"  # begin -> reasoning -> content (or begin -> content)
        self._strip = False  # drop whitespace at the start of the content

    @property
    def reasoning_done(self) -> bool:
        """True once the reasoning has ended (or there is none): constraints on the answer start here."""
        return self._state == "content"

    def feed(self, delta: str) -> list[ReasoningDelta | ContentDelta]:
        """The events ``delta`` settles."""
        self._buf += delta
        return self._drain(final=False)

    def finish(self) -> list[ReasoningDelta | ContentDelta]:
        """The events for the held text at the end of the output."""
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[ReasoningDelta | ContentDelta]:
        p, out = self.parser, []
        if self._state == "begin":
            head = self._buf.lstrip()
            if head.startswith(p.start):
                self._buf, self._state = head[len(p.start):], "reasoning"
            elif p.start.startswith(head) and not final:
                return out  # may still become the start marker
            elif p.starts_inside:
                self._buf, self._state = head, "reasoning"
            else:
                self._state = "content"
        if self._state == "reasoning":
            at, size = p.reasoning_end(self._buf)
            if at >= 0:
                if at:
                    out.append(ReasoningDelta(self._buf[:at]))
                self._buf, self._state, self._strip = self._buf[at + size:], "content", True
            else:
                keep = 0 if final else max(held_prefix(self._buf, m) for m in (p.end, *p.implicit_ends))
                if len(self._buf) > keep:
                    out.append(ReasoningDelta(self._buf[:len(self._buf) - keep]))
                    self._buf = self._buf[len(self._buf) - keep:]
                return out
        if self._strip:
            self._buf = self._buf.lstrip()
            self._strip = not self._buf
        if self._buf:
            out.append(ContentDelta(self._buf))
            self._buf = ""
        return out
