"""JSON Lines as JSON Lines: records are separated by ``"\\n"`` only (https://jsonlines.org).

``str.splitlines()`` also breaks at U+2028, U+2029, U+0085, ``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e``; JSON allows all
but the control characters raw inside strings, and any writer with ``ensure_ascii=False`` emits U+2028 as is, so a
reader that splits with ``splitlines()`` cuts a valid record in two. Every JSONL file specframe reads goes through
:func:`jsonl_lines`.
"""

from __future__ import annotations

from typing import Iterator


def jsonl_lines(text: str) -> Iterator[tuple[int, str]]:
    """Each non-blank line of JSON Lines ``text`` with its 1-based line number, split on ``"\\n"`` only (a
    trailing ``"\\r"`` of Windows line ends is dropped).

    Example: ``list(jsonl_lines('{"a": "x\\u2028y"}\\n\\n{"b": 1}\\r\\n'))`` -> ``[(1, '{"a": "x\\u2028y"}'),
    (3, '{"b": 1}')]`` (the first record keeps its raw U+2028).
    """
    for no, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if line.strip(" \t"):
            yield no, line
