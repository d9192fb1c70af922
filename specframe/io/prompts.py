"""Reading prompts files: JSON Lines in Spec-Bench's format — one object per line with ``question_id``, ``category``
and ``turns`` (a list of user turns; the first is what ``generate`` and ``bench`` decode) and optionally
``constraint``: the structured output the answer must follow (``{"json_schema": {...}}``, ``{"regex": "..."}``, ...
as ``generate(constraint=...)`` takes it; ``specframe bench`` decodes under it).

SPEED-Bench's files (NVIDIA Model-Optimizer ``examples/specdec_bench``) read the same way, as JSON Lines or as the
Parquet file its ``prepare_data.py`` writes (with ``pyarrow`` installed): their other fields — ``sub_category``,
``source``, ``src_id``, ``difficulty``, ``multiturn``, and ``entropy_tier`` / ``split`` / ``context_tokens`` of
specframe's SPEED-Bench-shaped workload (:mod:`specframe.bench.workload`) — are kept in :attr:`Prompt.extra`. The
public SPEED-Bench files hold a placeholder instead of each prompt; such a file is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PromptsFileError, first_line
from .jsonl import jsonl_lines

SPEED_BENCH_PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH"
_READ = ("question_id", "category", "turns", "constraint")  # the fields Prompt holds itself


@dataclass(frozen=True)
class Prompt:
    """One question. ``text`` is its first turn; ``turns`` all its user turns (empty for a prompt given alone);
    ``extra`` the record's other fields. Prompts compare by text, id, category and constraint."""

    text: str
    question_id: Any = None
    category: str | None = None
    constraint: dict[str, Any] | None = None
    turns: tuple[str, ...] = field(default=(), compare=False)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def sub_category(self) -> str | None:
        return self.extra.get("sub_category")

    @property
    def difficulty(self) -> str | None:
        return self.extra.get("difficulty")

    @property
    def context_tokens(self) -> int | None:
        """The first turn's length in tokens as the file gives it (``context_tokens``), or None."""
        n = self.extra.get("context_tokens")
        return n if isinstance(n, int) and not isinstance(n, bool) else None

    @property
    def speed_bench(self) -> bool:
        """Whether the record has SPEED-Bench's schema (a ``sub_category`` field): its category is a report column of
        its own, not grouped as Spec-Bench groups the MT-bench categories."""
        return "sub_category" in self.extra


def read_prompts(path: str | Path) -> list[Prompt]:
    """Parse a prompts file: JSON Lines (records end at ``"\\n"`` only, see :mod:`specframe.io.jsonl`), or a Parquet
    file (SPEED-Bench's ``test.parquet``; needs ``pyarrow``).

    Raises:
        PromptsFileError: missing file, empty file, bad JSON, a record without a non-empty ``turns`` list of strings,
            a record holding SPEED-Bench's placeholder instead of its prompt, or a Parquet file without ``pyarrow``
            installed (the message names the file and the line or row, and the fix).
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise PromptsFileError(f"cannot read prompts file {p}: {exc.strerror}") from None
    if data[:4] == b"PAR1" or p.suffix.lower() == ".parquet":
        rows = [(f"row {i}", obj) for i, obj in enumerate(_parquet_rows(p), 1)]
    else:
        try:
            text = data.decode("utf-8-sig")  # (a byte-order mark, as Windows editors write, is dropped)
        except UnicodeDecodeError:
            raise PromptsFileError(f"{p}: not UTF-8 text") from None
        rows = []
        for no, line in jsonl_lines(text):
            try:
                rows.append((str(no), json.loads(line)))
            except json.JSONDecodeError as exc:
                raise PromptsFileError(f"{p}:{no}: invalid JSON ({exc.msg})") from None
    prompts = [_prompt(p, where, obj) for where, obj in rows]
    if not prompts:
        raise PromptsFileError(f"{p}: no prompts in file")
    return prompts


def _prompt(p: Path, where: str, obj: Any) -> Prompt:
    turns = obj.get("turns") if isinstance(obj, dict) else None
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns) or not turns[0]:
        raise PromptsFileError(f"{p}:{where}: expected an object with `turns`, a non-empty list of strings")
    if any(SPEED_BENCH_PLACEHOLDER in t for t in turns):
        raise PromptsFileError(
            f"{p}:{where}: question {obj.get('question_id')!r} holds SPEED-Bench's placeholder, not its prompt (the "
            "public SPEED-Bench files carry no prompt text): fetch the data with specdec_bench's prepare_data.py "
            "(NVIDIA Model-Optimizer examples/specdec_bench: python prepare_data.py --config qualitative) and pass "
            "the test.parquet it writes")
    constraint = obj.get("constraint")
    if constraint is not None and not isinstance(constraint, dict):
        raise PromptsFileError(f"{p}:{where}: `constraint` must be an object such as {{\"json_schema\": {{...}}}}")
    extra = {k: v for k, v in obj.items() if k not in _READ}
    return Prompt(turns[0], obj.get("question_id"), obj.get("category"), constraint, tuple(turns), extra)


def _parquet_rows(p: Path) -> list[Any]:
    """The rows of a Parquet file as plain Python objects (pyarrow, else pandas with a Parquet engine)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        pq = None
    try:
        if pq is not None:
            return pq.read_table(p).to_pylist()
        import pandas

        return json.loads(pandas.read_parquet(p).to_json(orient="records"))
    except ImportError:
        jsonl = p.with_suffix(".jsonl").name
        raise PromptsFileError(
            f"{p}: reading a Parquet file needs pyarrow (pip install pyarrow), or convert it to JSON Lines where "
            f"specdec_bench runs: python -c \"import pandas; pandas.read_parquet('{p.name}').to_json('{jsonl}', "
            "orient='records', lines=True, force_ascii=False)\"") from None
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise PromptsFileError(f"{p}: not a readable Parquet file ({first_line(exc)})") from None
