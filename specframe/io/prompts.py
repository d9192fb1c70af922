"""Reading prompts files in Spec-Bench's format: one JSON object per line with ``question_id``, ``category``
and ``turns`` (a list of user turns; the first is used), and optionally ``constraint``: the structured output the
answer must follow (``{"json_schema": {...}}``, ``{"regex": "..."}``, ... as ``generate(constraint=...)`` takes it;
``specframe bench`` decodes under it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import PromptsFileError
from .jsonl import jsonl_lines


@dataclass(frozen=True)
class Prompt:
    text: str
    question_id: Any = None
    category: str | None = None
    constraint: dict[str, Any] | None = None


def read_prompts(path: str | Path) -> list[Prompt]:
    """Parse a Spec-Bench-style JSONL file (JSON Lines: records end at ``"\\n"`` only, see :mod:`specframe.io.jsonl`).

    Raises:
        PromptsFileError: missing file, empty file, bad JSON or a line without a non-empty ``turns`` list of
            strings (the message names file and line).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")  # (a byte-order mark, as Windows editors write, is dropped)
    except OSError as exc:
        raise PromptsFileError(f"cannot read prompts file {p}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise PromptsFileError(f"{p}: not UTF-8 text") from None
    prompts = []
    for no, line in jsonl_lines(text):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptsFileError(f"{p}:{no}: invalid JSON ({exc.msg})") from None
        turns = obj.get("turns") if isinstance(obj, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns) or not turns[0]:
            raise PromptsFileError(f"{p}:{no}: expected an object with `turns`, a non-empty list of strings")
        constraint = obj.get("constraint")
        if constraint is not None and not isinstance(constraint, dict):
            raise PromptsFileError(f"{p}:{no}: `constraint` must be an object such as {{\"json_schema\": {{...}}}}")
        prompts.append(Prompt(turns[0], obj.get("question_id"), obj.get("category"), constraint))
    if not prompts:
        raise PromptsFileError(f"{p}: no prompts in file")
    return prompts
