"""``tool_choice: "auto"`` in ``specframe serve``: the model's own tool-call format, read by a tool-call parser, with a
lazy grammar from the format's trigger on; and reasoning returned apart (``reasoning_content``).

The formats are plugins (``specframe_register_tool_parsers`` / ``specframe_register_reasoning_parsers``): the
server takes ``--tool-call-parser NAME`` / ``--reasoning-parser NAME``, else the one whose ``detect`` accepts the
model's chat template (the ``generic`` envelope when no other does: SmolLM2-135M's template has no tool format).

Per request (:func:`plan`):

- ``auto`` (OpenAI's default when ``tools`` are given): for a format with a trigger (``<tool_call>``), the output is
  free text until the trigger, then the format's call grammar (the tool's parameters as JSON schema) to the end of
  the call, then free again (any number of calls): one llguidance Lark grammar whose head is a lazy lexeme ending at
  the trigger (llguidance docs/syntax.md, "Tool calling"), so the grammar proposer drafts a call's forced tokens
  once the trigger is accepted. For the ``generic`` envelope (no trigger) the envelope's schema applies from the
  first token, and a system line (the parser's ``system_hint`` and the tools) tells the model the format. A
  ``response_format`` beside ``auto`` is the constraint instead (calls are still parsed out of the text).
- ``required`` / a named function: as before (:func:`specframe.serve.structured.request_constraint`); ``none``: the
  format's trigger is banned (``ToolParser.none_grammar``: free text that cannot hold it), unless a
  ``response_format`` constrains the answer.
- A reasoning model: the constraint starts after the reasoning's end marker (``</think>``): the reasoning is a lazy
  lexeme ending at it, so a draft that accepts the end marker moves the grammar on in the same step.

The answer (:func:`answer_parts`): reasoning split off first, then calls parsed out of the rest; a malformed call
stays in ``content`` (finish ``stop``), never a 500. Streaming (:class:`AutoStream`): reasoning deltas, content
deltas and ``tool_calls`` deltas in OpenAI's chunk shape, equal to the whole answer's once joined.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from ..contracts.reasoning import ReasoningDelta
from ..contracts.tool_formats import lark_literal
from ..contracts.tool_parsing import ContentDelta, ToolCallDelta, grammar_rules
from .structured import StructuredRequestError, ToolCalls, request_constraint


@dataclass
class Formats:
    """A server's tool-call and reasoning formats: parser classes (None: the model has none) and how each was
    chosen (``--tool-call-parser`` or detected from the chat template)."""

    tool: Optional[type] = None
    reasoning: Optional[type] = None
    why: dict[str, str] = field(default_factory=dict)

    @classmethod
    def choose(cls, registry: Any, chat_template: Optional[str], tool_parser: Optional[str] = None,
               reasoning_parser: Optional[str] = None) -> "Formats":
        """The formats for a model with ``chat_template`` (None: none).

        Raises:
            UnknownToolParserError, UnknownReasoningParserError: a name no installed plugin registers (the message
                lists the installed ones).
        """
        out = cls()
        if tool_parser:
            out.tool, out.why["tool"] = registry.tool_parser(tool_parser), "--tool-call-parser"
        else:
            out.tool, out.why["tool"] = registry.tool_parser_for_template(chat_template), "chat template"
        if reasoning_parser:
            out.reasoning, out.why["reasoning"] = registry.reasoning_parser(reasoning_parser), "--reasoning-parser"
        else:
            out.reasoning, out.why["reasoning"] = registry.reasoning_parser_for_template(chat_template), \
                "chat template"
        return out


@dataclass
class Plan:
    """What one chat request decodes under and how its answer is read: the constraint (as
    :meth:`specframe.api.Specframe.submit` takes it), a forced call (``required`` / named: :class:`ToolCalls`), the
    ``auto`` parser (an instance holding the request's tools), the reasoning parser, and a system line to add."""

    constraint: Optional[dict[str, Any]] = None
    calls: Optional[ToolCalls] = None
    auto: Any = None
    reasoning: Any = None
    system: Optional[str] = None
    added: dict[str, int] = field(default_factory=dict)  # the tokenizer's added tokens the grammars were built with


def plan(body: Any, formats: Formats, prompt_text: Optional[str] = None, added: Optional[dict[str, int]] = None) -> Plan:
    """The plan of a chat ``body`` (see the module docstring). ``prompt_text``: the rendered prompt, which tells a
    reasoning parser whether the template opened the reasoning already. ``added``: the tokenizer's added tokens
    (text -> id, ``get_added_vocab()``): a trigger or reasoning marker among them is one token that the grammar
    engine reads as special, so the grammars name it by id.

    Raises:
        StructuredRequestError: ``auto`` on a model with no tool-call parser; a tool call and a ``response_format``
            with ``required`` / a named function.
    """
    tools = getattr(body, "tools", None)
    choice = getattr(body, "tool_choice", None)
    reasoning = None
    if formats.reasoning is not None:
        reasoning = formats.reasoning.for_prompt(prompt_text) if prompt_text is not None else formats.reasoning()
    if tools and (choice is None or choice == "auto"):
        if formats.tool is None:
            raise StructuredRequestError(
                "tool_choice auto needs a tool-call parser for this model and none is installed: start the server "
                "with --tool-call-parser NAME, or set tool_choice to \"required\", a named function or \"none\"",
                "tool_choice")
        entries = [t.model_dump(exclude_none=True) for t in tools]
        parser = formats.tool(entries)
        constraint, _ = request_constraint(_ResponseFormat(body))
        if constraint is None:
            constraint = parser.auto_grammar(entries, (added or {}).get(parser.trigger or ""))
        system = None
        if parser.trigger is None:  # a format the template does not teach: say it, and list the tools
            system = (parser.system_hint or "") + "\nTools: " + json.dumps([t["function"] for t in entries], ensure_ascii=False)
        return Plan(_after_reasoning(constraint, reasoning, added), None, parser, reasoning, system, dict(added or {}))
    constraint, calls = request_constraint(body)
    if tools and choice == "none" and constraint is None and formats.tool is not None:
        parser = formats.tool([t.model_dump(exclude_none=True) for t in tools])
        constraint = parser.none_grammar((added or {}).get(parser.trigger or ""))  # (the trigger banned)
    return Plan(_after_reasoning(constraint, reasoning, added), calls, None, reasoning, added=dict(added or {}))


class _ResponseFormat:
    """A body's ``response_format`` alone (no tools), as :func:`request_constraint` reads a body."""

    def __init__(self, body: Any) -> None:
        self.response_format, self.tools, self.tool_choice = body.response_format, None, None


def _after_reasoning(constraint: Optional[dict[str, Any]], reasoning: Any,
                     added: Optional[dict[str, int]] = None) -> Optional[dict[str, Any]]:
    """``constraint`` applied after the reasoning ends (its end marker ends a lazy lexeme; text before the marker
    is free, the marker included), or as it is without reasoning. A format whose output starts inside the
    reasoning (the template opened it) must close it first; another (``starts_inside`` False: Qwen3, which may not
    think at all) may open one with its start marker, or answer at once. Markers that are added tokens (``added``:
    Qwen3's ``<think>``, ``</think>``) are named by id (llguidance reads added tokens as special: no text regex
    spells them); the reasoning text between them then cannot hold them, so it ends at the end marker unaided."""
    if constraint is None or reasoning is None:
        return constraint
    if constraint.get("json_object"):
        answer = {"json_schema": {"type": "object"}}
    elif constraint.get("json_schema") is not None:
        answer = {"json_schema": constraint["json_schema"]}
    elif constraint.get("grammar") is not None:
        answer = {"grammar": constraint["grammar"]}
    else:
        answer = {"grammar": "start: SF_RE\nSF_RE: /" + constraint["regex"].replace("/", "\\/") + "/"}
    inside = bool(getattr(reasoning, "starts_inside", False))
    ids = added or {}
    if reasoning.end in ids:
        open_ = "" if inside or reasoning.start not in ids else f"<[{ids[reasoning.start]}]> "
        return {"grammar": "\n".join([
            "start: sf_reasoning SF_GAP? sf_answer" if inside else "start: (sf_reasoning SF_GAP?)? sf_answer",
            f"sf_reasoning: {open_}SF_THOUGHT? <[{ids[reasoning.end]}]>",
            r"SF_THOUGHT: /(.|\n)+/",
            r"SF_GAP: /[ \n]+/",
            grammar_rules(answer, "sf_answer"),
        ])}
    head = "" if inside else lark_literal(reasoning.start) + " "
    return {"grammar": "\n".join([
        "start: sf_reasoning SF_GAP? sf_answer" if inside else "start: (sf_reasoning SF_GAP?)? sf_answer",
        f"sf_reasoning[lazy]: {head}" + r"/(.|\n)*/ " + lark_literal(reasoning.end),
        r"SF_GAP: /[ \n]+/",
        grammar_rules(answer, "sf_answer"),
    ])}


def template_messages(messages: list[dict[str, Any]], parser: Any) -> list[dict[str, Any]]:
    """Messages as the chat template takes them: an assistant message's ``tool_calls`` with ``arguments`` as a
    mapping (chat templates write them with ``tojson``; OpenAI sends a JSON string). For a format the template does
    not know (no trigger: the ``generic`` envelope) an assistant's calls become its content in that envelope, and a
    tool message's content says which call it answers, so the model reads its own format back."""
    out = []
    for m in messages:
        m = dict(m)
        calls = m.get("tool_calls")
        if calls:
            fixed = []
            for c in calls:
                fn = dict(c.get("function", {}))
                try:
                    fn["arguments"] = json.loads(fn.get("arguments") or "{}")
                except (TypeError, json.JSONDecodeError):
                    pass
                fixed.append({**c, "function": fn})
            if parser is not None and parser.trigger is None:
                envelope = {"tool_calls": [{"name": c["function"].get("name"), "arguments": c["function"]["arguments"]}
                                           for c in fixed]}
                m = {"role": "assistant", "content": json.dumps(envelope, ensure_ascii=False)}
            else:
                m["tool_calls"] = fixed
        if m.get("role") == "tool" and parser is not None and parser.trigger is None:
            m = {"role": "user", "content": json.dumps({"tool_response": m.get("content", "")}, ensure_ascii=False)}
        out.append(m)
    return out


def with_system(messages: list[dict[str, Any]], line: Optional[str]) -> list[dict[str, Any]]:
    """``line`` added to the first system message, or as a system message of its own before the others."""
    if not line:
        return messages
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": (messages[0].get("content") or "") + "\n\n" + line}, *messages[1:]]
    return [{"role": "system", "content": line}, *messages]


def answer_parts(text: str, p: Plan) -> tuple[Optional[str], str, list[dict[str, Any]]]:
    """``(reasoning, content, tool_calls)`` of a whole answer under plan ``p`` (``tool_calls`` OpenAI entries; only
    ``auto`` parses them here)."""
    reasoning = None
    if p.reasoning is not None:
        reasoning, text = p.reasoning.split(text)
        reasoning = reasoning or None
    if p.auto is None:
        return reasoning, text, []
    content, calls = p.auto.parse(text)
    return reasoning, content, [c.to_openai() for c in calls]


class AutoStream:
    """One streamed request's reading of its text pieces (plan ``p``): reasoning first (when the model reasons),
    then content and, under ``auto``, calls. :meth:`feed` / :meth:`finish` return OpenAI ``delta`` objects."""

    def __init__(self, p: Plan) -> None:
        self.reasoning = p.reasoning.streaming() if p.reasoning is not None else None
        self.tools = p.auto.streaming() if p.auto is not None else None
        self.called = False

    def feed(self, piece: str) -> list[dict[str, Any]]:
        return self._deltas(self.reasoning.feed(piece) if self.reasoning is not None else [ContentDelta(piece)],
                            final=False)

    def finish(self) -> list[dict[str, Any]]:
        return self._deltas(self.reasoning.finish() if self.reasoning is not None else [], final=True)

    def _deltas(self, events: list[Any], final: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for e in events:
            if isinstance(e, ReasoningDelta):
                if e.text:
                    out.append({"reasoning_content": e.text})
            elif self.tools is None:
                if e.text:
                    out.append({"content": e.text})
            else:
                out += self._tool_deltas(self.tools.feed(e.text))
        if final and self.tools is not None:
            out += self._tool_deltas(self.tools.finish())
        return out

    def _tool_deltas(self, events: list[Any]) -> list[dict[str, Any]]:
        out = []
        for e in events:
            if isinstance(e, ToolCallDelta):
                self.called = True
                out.append({"tool_calls": [e.to_openai()]})
            elif e.text:
                out.append({"content": e.text})
        return out
