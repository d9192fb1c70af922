"""``qwen3_xml``: Qwen3-Coder's XML calls (Qwen3-Coder-30B-A3B / 480B-A35B, Qwen3.5; vLLM's ``qwen3_xml`` and
``qwen3_coder`` parsers, SGLang's ``qwen3_coder`` detector)::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Tokyo
    </parameter>
    </function>
    </tool_call>
    -> calls [get_weather({"city": "Tokyo"})]

Parameter values are raw text (one newline at each end is trimmed). A parameter the request's tool declares as
``string`` stays text; any other value is read as JSON when it parses (``42``, ``true``, ``["a"]``) and kept as text
otherwise. Format: https://huggingface.co/Qwen/Qwen3-Coder-30B-A3B-Instruct (its chat template).

:meth:`Qwen3XmlToolParser.call_grammar` writes the template's layout (a newline around each value), the parameters in
the schema's order (required ones present), a ``string`` value as text without ``</`` and any other value as JSON
under its schema.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from specframe.services import ToolCall, ToolParser, lark_json, lark_literal, new_call_id

OPEN, CLOSE = "<tool_call>", "</tool_call>"
NL = "\n"
# a string value with its closing tag, one lexeme (llguidance lexes greedily: a value ending before a separate "</"
# literal could not give the "<" back): any text without "</"
TEXT = r"TEXT: /([^<]|<[^\/])*\n<\/parameter>\n/"
FUNCTION = re.compile(r"\s*<function=([^>\s]+)>(.*?)</function>\s*", re.DOTALL)
PARAMETER = re.compile(r"<parameter=([^>]+)>(.*?)</parameter>", re.DOTALL)


def _trim(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _value(raw: str, schema: dict) -> object:
    if schema.get("type") == "string":
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


class Qwen3XmlToolParser(ToolParser):
    """``<tool_call><function=NAME><parameter=P>value</parameter>...</function></tool_call>``."""

    name = "qwen3_xml"
    trigger = OPEN
    end = CLOSE
    priority = 20

    @classmethod
    def detect(cls, chat_template: str) -> bool:
        """Templates that teach ``<function=...>`` with ``<parameter=...>`` (Qwen3-Coder's)."""
        return "<function=" in chat_template and "<parameter=" in chat_template

    def parse_call(self, segment: str) -> list[ToolCall] | None:
        inner = segment[len(OPEN):]
        inner = inner[:-len(CLOSE)] if inner.endswith(CLOSE) else inner
        m = FUNCTION.fullmatch(inner)
        if m is None:
            return None
        name, body = m.group(1), m.group(2)
        types = self.parameter_types(name)
        args = {p: _value(_trim(v), types.get(p) or {}) for p, v in PARAMETER.findall(body)}
        if PARAMETER.sub("", body).strip():
            return None  # text outside the parameters: not this format
        return [ToolCall(new_call_id(), name, json.dumps(args, ensure_ascii=False))]

    def call_grammar(self, tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """After ``<tool_call>``: newline, ``<function=NAME>``, newline, then each parameter as
        ``<parameter=P>``/newline/value/newline/``</parameter>``/newline, then ``</function>``, newline,
        ``</tool_call>``, for one of ``tools``."""
        rules, names = [], []
        for i, tool in enumerate(tools):
            fn = tool.get("function", tool)
            parameters = fn.get("parameters") or {}
            required = set(parameters.get("required") or [])
            items = []
            for j, (param, schema) in enumerate((parameters.get("properties") or {}).items()):
                text = (schema or {}).get("type") == "string"
                value = "TEXT" if text else lark_json(schema or {})
                opening = lark_literal(f"<parameter={param}>{NL}")
                closing = "" if text else " " + lark_literal(f"{NL}</parameter>{NL}")
                rules.append(f"p{i}_{j}: {opening} {value}{closing}")
                items.append(f"p{i}_{j}" + ("" if param in required else "?"))
            function = lark_literal(f"<function={fn['name']}>{NL}")
            rules.append(f"f{i}: {function} {' '.join(items)} {lark_literal('</function>' + NL)}")
            names.append(f"f{i}")
        head = f"start: {lark_literal(NL)} ({' | '.join(names)}) {lark_literal(CLOSE)}"
        return {"grammar": NL.join([head, *rules, TEXT]) + NL}
