"""The tool-call parsing contract: a model's own tool-call text -> OpenAI ``tool_calls``, whole or streamed.

A *tool parser* (a plugin registered with ``specframe_register_tool_parsers``; the built-in ones are in
``specframe_plugins.tool_parsers``) reads one model family's tool-call format at the text level. It knows nothing of
tokens, the engine or HTTP; a server uses it in three places:

1. **choosing** — :meth:`ToolParser.detect` reads a model's chat template and says whether the template teaches this
   format (``Registry.tool_parser_for_template`` asks every parser, highest :attr:`ToolParser.priority` first; the
   ``generic`` envelope answers for a template with no tool format);
2. **constraining** (``tool_choice: auto``) — the output is free text until :attr:`ToolParser.trigger`; from the
   trigger on, :meth:`ToolParser.call_grammar` describes the call text that follows (a :class:`ConstraintSpec`-shaped
   mapping), so a lazy grammar armed by the trigger can force and draft it;
3. **answering** — :meth:`ToolParser.parse` splits a whole completion into ``(content, calls)``;
   :meth:`ToolParser.streaming` gives a :class:`StreamingToolParser` whose ``feed(delta)`` returns content deltas and
   OpenAI-shaped tool-call deltas (index, id and name first, then argument text).

The helpers a format is written with (JSON calls, grammar pieces) are in :mod:`.tool_formats`.

A malformed call is never an error: it stays in ``content`` as the text the model wrote (vLLM and SGLang do the same;
a server answers it with ``finish_reason: stop``).

Parser names follow vLLM's ``--tool-call-parser`` names where vLLM has the format (``hermes``, ``xlam``,
``llama3_json``, ``mistral``, ``pythonic``, ``qwen3_xml``, ``openai``).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Sequence


def new_call_id() -> str:
    """A fresh OpenAI-style tool call id, ``call_`` + 24 hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed call: ``arguments`` is a JSON text (OpenAI's ``function.arguments``), usually of an object."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """The call as one entry of an OpenAI ``message.tool_calls`` list."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """Streamed answer text (``delta.content``)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """One streamed piece of call ``index``: the first piece of a call carries ``id`` and ``name`` (``arguments``
    empty), the next ones argument text only; joined, a call's ``arguments`` pieces are its JSON arguments."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """The piece as one entry of an OpenAI chunk's ``delta.tool_calls`` list."""
        out: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.id is not None:
            out.update(id=self.id, type="function")
        if self.name is not None:
            function["name"] = self.name
        out["function"] = function
        return out


StreamEvent = ContentDelta | ToolCallDelta


class ToolParser:
    """The base of a tool-call format: subclass, set the class attributes, write :meth:`parse` (and, where the format
    has one, :meth:`call_grammar`). Instances hold no state; :meth:`streaming` makes the per-request state.

    Class attributes:
        name: the name in config and ``--tool-call-parser`` (vLLM's name where vLLM has the format).
        trigger: the text that opens a call (``"<tool_call>"``), arming the lazy grammar; None when the format has
            no opening text and the grammar applies from the first token (the ``generic`` envelope).
        end: the text that closes one call (``"</tool_call>"``), or None (the call ends where its JSON ends, or at
            the end of the output).
        openers: other texts that start a call region when parsing (not grammar triggers): xlam's bare
            ``[{`` list, a fenced ```` ```json ```` block.
        separators: characters that may stand between two calls and are not content (``";"`` for llama3_json).
        priority: detection order, highest first; the fallback ``generic`` is lowest.
        ban_on_none: ``tool_choice: "none"`` bans :attr:`trigger` from the output (:meth:`none_grammar`); False
            where the trigger is common text (pythonic's ``[``).
        system_hint: for a format no chat template teaches (``generic``): the system line a server adds, before
            the tools' list, to tell the model the format.

    A whole completion is cut into *regions*: each starts at the earliest :attr:`trigger` or opener and ends where
    :meth:`call_end` says (or at the end of the output); :meth:`parse_region` reads one region, by default as
    :meth:`parse_call`'s calls or, when those do not parse, as content. Streaming cuts the same regions, so a
    format only writes :meth:`call_end` and :meth:`parse_call`.

    ``tools`` (the request's OpenAI tool entries) is optional: a format whose arguments are not JSON (qwen3_xml's
    ``<parameter=...>`` values) reads the parameter types from it.
    """

    name: ClassVar[str] = ""
    trigger: ClassVar[str | None] = None
    end: ClassVar[str | None] = None
    openers: ClassVar[tuple[str, ...]] = ()
    separators: ClassVar[str] = ""
    priority: ClassVar[int] = 0
    ban_on_none: ClassVar[bool] = True  # tool_choice "none" bans the trigger (pythonic's "[" is common text: no)
    system_hint: ClassVar[str | None] = None  # a system line a server adds where the template does not teach tools

    def __init__(self, tools: Sequence[dict[str, Any]] | None = None) -> None:
        self.tools = list(tools or [])

    @property
    def markers(self) -> tuple[str, ...]:
        """Every text that starts a call region: the trigger, then the openers."""
        return tuple(m for m in (self.trigger, *self.openers) if m)

    def find_region(self, text: str, pos: int = 0) -> int:
        """Where the next call region starts in ``text`` from ``pos`` (-1: none)."""
        found = [at for at in (text.find(m, pos) for m in self.markers) if at >= 0]
        return min(found) if found else -1

    def parameter_types(self, function: str) -> dict[str, Any]:
        """``{parameter: its JSON schema}`` of ``function`` in :attr:`tools` (empty when unknown)."""
        for tool in self.tools:
            fn = tool.get("function", tool)
            if fn.get("name") == function:
                return dict((fn.get("parameters") or {}).get("properties") or {})
        return {}

    @classmethod
    def detect(cls, chat_template: str) -> bool:
        """Whether ``chat_template`` (the Jinja text) teaches this format. Default: never."""
        return False

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """Split a whole completion into its answer text and its calls, in order. A call that does not parse stays
        in the content as written; never raises on model output. Content is stripped when a call was found."""
        if self.trigger is None:
            content, calls = self.parse_region(text)
            return join_content([content], bool(calls)), calls
        pieces: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        while (at := self.find_region(text, pos)) >= 0:
            pieces.append(text[pos:at])
            size = self.call_end(text[at:])
            stop = len(text) if size is None else at + size
            content, found = self.parse_region(text[at:stop])
            pieces.append(content)
            calls += found
            pos = stop
        pieces.append(text[pos:])
        return join_content(pieces, bool(calls), self.separators), calls

    def parse_region(self, segment: str) -> tuple[str, list[ToolCall]]:
        """``(content, calls)`` of one region; default: :meth:`parse_call`'s calls, or the region as content."""
        calls = self.parse_call(segment)
        return (segment, []) if calls is None else ("", calls)

    def parse_call(self, segment: str) -> list[ToolCall] | None:
        """The calls in one region (it starts with a marker); None when it does not parse (it is then content)."""
        raise NotImplementedError

    def call_end(self, text: str) -> int | None:
        """``text`` starts with a marker: the length of the region at its start once it has ended, else None (it
        runs to the end of the output, or streaming waits for more). Default: through :attr:`end`."""
        if self.end is None:
            return None
        at = text.find(self.end, 1)
        return None if at < 0 else at + len(self.end)

    def call_grammar(self, tools: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
        """The text of a call to one of ``tools`` (OpenAI tool entries) right *after* :attr:`trigger` (the whole
        output when the trigger is None) through the end of the call, as
        :class:`specframe.contracts.constraint.ConstraintSpec` fields (``{"grammar": <Lark>}`` whose ``start`` rule
        is that text, or ``{"json_schema": ...}``); None when the format is parsed but not constrained. The trigger
        is not part of it: :meth:`auto_grammar` ends a lazy lexeme at the trigger (a grammar engine's lexer cannot
        end free text just before a literal that the free text may also begin)."""
        return None

    def auto_grammar(self, tools: Sequence[dict[str, Any]], trigger_token: int | None = None) -> dict[str, Any] | None:
        """The constraint of ``tool_choice: "auto"`` over ``tools``, as ConstraintSpec fields: free text with any
        number of calls, each from :attr:`trigger` (the end of a lazy lexeme: llguidance docs/syntax.md, "Tool
        calling") through :meth:`call_grammar`; the call grammar itself when the trigger is None (it applies from
        the first token); None without a call grammar (the calls are parsed, not constrained).

        ``trigger_token``: the trigger's token id where the vocabulary holds it as one added token (Qwen's
        ``<tool_call>``): llguidance reads every added token as a special token, which no text regex spells, so the
        call starts at that token (``<[id]>``) after free text that cannot contain it."""
        spec = self.call_grammar(tools)
        if spec is None or self.trigger is None:
            return spec
        if trigger_token is not None:
            return {"grammar": "\n".join([
                "start: sf_call* SF_TEXT?",
                r"SF_TEXT: /(.|\n)+/",
                f"sf_call: SF_TEXT? <[{int(trigger_token)}]> sf_body",
                grammar_rules(spec, "sf_body"),
            ])}
        return {"grammar": "\n".join([
            "start: sf_call* sf_tail",
            "sf_tail: SF_TEXT",
            r"SF_TEXT: /(.|\n)*/",
            f"sf_head[lazy]: SF_TEXT {json.dumps(self.trigger)}",
            "sf_call: sf_head sf_body",
            grammar_rules(spec, "sf_body"),
        ])}

    def none_grammar(self, trigger_token: int | None = None) -> dict[str, Any] | None:
        """The constraint of ``tool_choice: "none"``: any text without :attr:`trigger` (None for a format without
        one, or whose trigger is common text, :attr:`ban_on_none` False: nothing to ban). ``trigger_token`` as in
        :meth:`auto_grammar`: an added token, which free text cannot hold anyway (the engine reads it as special)."""
        if self.trigger is None or not self.ban_on_none:
            return None
        if trigger_token is not None:
            return {"grammar": "start: SF_TEXT?\n" + r"SF_TEXT: /(.|\n)+/"}
        banned = re.escape(self.trigger).replace("/", "\\/")
        return {"grammar": "start: SF_TEXT?\n" + rf"SF_TEXT: /(.|\n)+/ & ~/(.|\n)*{banned}(.|\n)*/"}

    def streaming(self) -> "StreamingToolParser":
        """A fresh per-request streaming parser."""
        return StreamingToolParser(self)


#: JSON as the built-in constraint engine writes it (``specframe.grammar.llguidance_engine.JSON_LAYOUT``, kept equal
#: by a test; the contracts do not import an engine): no free whitespace, ``", "`` and ``": "`` separators; put under
#: ``"x-guidance"`` in a schema embedded in a Lark grammar.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def lark_json(schema: dict[str, Any]) -> str:
    """A Lark (llguidance dialect) ``%json`` item for ``schema``, in the engine's JSON layout."""
    return "%json " + json.dumps({**schema, "x-guidance": JSON_LAYOUT})


def grammar_rules(spec: dict[str, Any], name: str) -> str:
    """``spec`` (``{"grammar": Lark}`` or ``{"json_schema": ...}``) as Lark rules whose entry rule is ``name`` (a
    grammar's ``start`` renamed; a schema as a ``%json`` item in the engine's JSON layout)."""
    if spec.get("grammar") is not None:
        return re.sub(r"(?m)^start(\s*):", rf"{name}\1:", spec["grammar"])
    if spec.get("json_schema") is not None:
        return f"{name}: {lark_json(spec['json_schema'])}"
    raise ValueError(f"a grammar is {{'grammar': ...}} or {{'json_schema': ...}}, got {sorted(spec)}")


def join_content(pieces: list[str], found_calls: bool, separators: str = "") -> str:
    """The answer text from the pieces around calls: pieces holding only whitespace and ``separators`` between
    calls are dropped, and the text is stripped when a call was found."""
    if not found_calls:
        return "".join(pieces)
    junk = re.compile(rf"[\s{re.escape(separators)}]*") if separators else re.compile(r"\s*")
    return "".join(p for p in pieces if not junk.fullmatch(p)).strip()


def held_prefix(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` could begin ``marker`` (hold them back: the marker may follow)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class StreamingToolParser:
    """One request's streaming state over a :class:`ToolParser`: ``feed(delta)`` returns the events the text so far
    settles, ``finish()`` the rest. Content streams as it comes, except a tail that could begin the trigger; a call
    is held from its trigger until :meth:`ToolParser.call_end` (or the end of the output) and then read with
    :meth:`ToolParser.parse_region`, the regions ``parse`` cuts, so the streamed calls equal ``parse``'s for any
    chunking. A call is sent as two
    pieces: id + name, then its whole arguments (OpenAI's chunk shape; clients join the pieces)."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self._buf = ""  # text not yet settled
        self._in_call = parser.trigger is None  # a format without a trigger is one call region from the start
        self._after_call = False  # the text right after a call: separators there are not content
        self._index = 0
        self.calls: list[ToolCall] = []  # the calls sent so far

    def feed(self, delta: str) -> list[StreamEvent]:
        """The events ``delta`` settles (possibly none: text that may begin a call is held)."""
        self._buf += delta
        events: list[StreamEvent] = []
        while self._step(events, final=False):
            pass
        return events

    def finish(self) -> list[StreamEvent]:
        """The events for the held text at the end of the output (a call cut off is parsed as it stands)."""
        events: list[StreamEvent] = []
        while self._step(events, final=True):
            pass
        return events

    def _step(self, events: list[StreamEvent], final: bool) -> bool:
        """Settle one piece of the buffer; True when something was settled and another step may settle more."""
        trigger = self.parser.trigger
        if not self._buf:
            return False
        if self._in_call:
            size = None if trigger is None else self.parser.call_end(self._buf)
            if size is None and not final:
                return False
            self._emit_call(self._buf[:size] if size is not None else self._buf, events)
            self._buf = self._buf[size:] if size is not None else ""
            self._in_call, self._after_call = False, True
            return True
        at = self.parser.find_region(self._buf)
        if self._after_call:
            junk = re.match(rf"[\s{re.escape(self.parser.separators)}]*", self._buf)
            n = junk.end() if junk else 0
            rest = self._buf[n:]
            if not final and at < 0 and any(m.startswith(rest) for m in self.parser.markers):
                return False  # only separators so far (and maybe a marker's beginning): wait
            if at == n or n == len(self._buf):
                self._buf = self._buf[n:]
                self._after_call = False
                return bool(self._buf)
            self._after_call = False
        if at >= 0:
            if at:
                events.append(ContentDelta(self._buf[:at]))
            self._buf, self._in_call = self._buf[at:], True
            return True
        keep = 0 if final else max(held_prefix(self._buf, m) for m in self.parser.markers)
        if len(self._buf) > keep:
            events.append(ContentDelta(self._buf[:len(self._buf) - keep]))
            self._buf = self._buf[len(self._buf) - keep:]
        return False

    def _emit_call(self, segment: str, events: list[StreamEvent]) -> None:
        content, calls = self.parser.parse_region(segment)
        if content:
            events.append(ContentDelta(content))
        for call in calls:
            events.append(ToolCallDelta(self._index, "", call.id, call.name))
            events.append(ToolCallDelta(self._index, call.arguments))
            self.calls.append(call)
            self._index += 1


def collect(events: Iterable[StreamEvent]) -> tuple[str, list[tuple[str, str]]]:
    """Join streamed events as a client does: ``(content, [(name, arguments)])`` (tests and clients)."""
    content: list[str] = []
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    for e in events:
        if isinstance(e, ContentDelta):
            content.append(e.text)
        else:
            if e.name is not None:
                names[e.index] = e.name
            args[e.index] = args.get(e.index, "") + e.arguments
    return "".join(content), [(names[i], args.get(i, "")) for i in sorted(names)]
