"""``pythonic``: a Python list of calls with keyword arguments, ``[get_weather(city="SF", days=3), now()]``
(Llama 3.2 1B/3B and Llama 4's zero-shot function calling, ToolACE; vLLM's ``pythonic`` parser, SGLang's
``pythonic`` detector).

Read with :func:`ast.parse` and :func:`ast.literal_eval`, never evaluated: an argument must be a literal (string,
number, bool, None, list, dict, tuple); a positional argument, a non-literal or a non-finite number leaves the whole
list as content. Worked example::

    [get_weather(city='San Francisco', metric='celsius')]
    -> calls [get_weather({"city": "San Francisco", "metric": "celsius"})]

Format: Meta's Llama 3.2 prompt format,
https://github.com/meta-llama/llama-models/blob/main/models/llama3_2/text_prompt_format.md .
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

from specframe.services import ToolCall, ToolParser, new_call_id

CALL_HEAD = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
PARTIAL_HEAD = re.compile(r"\[\s*(?:[A-Za-z_][\w.]*\s*)?")


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def read_calls(text: str) -> list[ToolCall] | None:
    """The calls of a Python list of calls with keyword literal arguments; None for anything else."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) and not node.args):
            return None
        try:
            kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
        if None in kwargs or not _finite(kwargs):
            return None
        try:
            arguments = json.dumps(kwargs, ensure_ascii=False)
        except TypeError:  # bytes, sets, complex numbers: not JSON
            return None
        calls.append(ToolCall(new_call_id(), ast.unparse(node.func), arguments))
    return calls


class PythonicToolParser(ToolParser):
    """``[f(a=1), g(b="x")]``: the list ends at the first ``]`` after which it parses."""

    name = "pythonic"
    trigger = "["
    ban_on_none = False  # ("[" is everyday text: tool_choice none bans nothing)
    priority = 6

    @classmethod
    def detect(cls, chat_template: str) -> bool:
        """Templates that teach ``[func_name1(params_name1=params_value1, ...)]`` (Llama 3.2 / Llama 4)."""
        return "[func_name1(" in chat_template

    def call_end(self, text: str) -> int | None:
        if CALL_HEAD.match(text) is None:  # "[" not followed by "name(": one character of content
            return None if PARTIAL_HEAD.fullmatch(text) else 1  # (or wait: it may still become one)
        at = text.find("]")
        while at >= 0:
            if read_calls(text[:at + 1]) is not None:
                return at + 1
            at = text.find("]", at + 1)
        return None

    def parse_call(self, segment: str) -> list[ToolCall] | None:
        return read_calls(segment)
