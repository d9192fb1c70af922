"""The bench's journal: ``records.jsonl`` in the output folder, one line per finished run, so a long bench keeps
what it has done and ``specframe bench ... --resume`` continues where an interrupted run stopped.

The first line names the run: ``{"journal": 1, "key": ...}``, a hash of the bench config (after the command line's
overrides) and of the chosen questions (position, id, category, text). ``--resume`` takes the records of a journal
with the same key and runs only what is missing; records already there are used as they are (nothing is run or
counted twice). A journal of another config or other questions is refused with one line; a torn last line (the
process killed while writing it) is dropped and run again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

from ..decode.metrics import current_names
from ..errors import ConfigError
from ..io.jsonl import jsonl_lines

NAME = "records.jsonl"
VERSION = 1


def record_key(r: dict[str, Any]) -> tuple:
    """What identifies one run in a bench: (question position, seed, repeat, strategy)."""
    return r["question"], r["seed"], r["repeat"], r["strategy"]


def run_key(config: dict[str, Any], questions: Sequence[Any]) -> str:
    """A hash of the bench config (as dumped) and the chosen questions."""
    doc = {"config": config, "questions": [[i, q.question_id, q.category, q.text] for i, q in enumerate(questions)]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:32]


class Journal:
    """Appends finished records to ``<output>/records.jsonl`` (flushed per record).

    Args:
        output: the bench's output folder (exists).
        key: :func:`run_key` of this run.
        resume: keep the records of an earlier run with the same key (else the journal starts over).

    Raises:
        ConfigError: ``resume`` and the journal there was written for another config or other questions.
    """

    def __init__(self, output: Path, key: str, resume: bool) -> None:
        self.path = Path(output) / NAME
        self.done: dict[tuple, dict[str, Any]] = self._read(key) if resume else {}
        with open(self.path, "w", encoding="utf-8") as f:  # rewritten whole: the header and what is kept
            f.write(json.dumps({"journal": VERSION, "key": key}) + "\n")
            for r in self.done.values():
                f.write(json.dumps(r) + "\n")
        self._f = open(self.path, "a", encoding="utf-8")

    def _read(self, key: str) -> dict[tuple, dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--resume: cannot read {self.path} ({type(exc).__name__}): drop --resume to start "
                              "over") from None
        lines = list(jsonl_lines(text))
        try:
            head = json.loads(lines[0][1]) if lines else {}
        except ValueError:
            head = {}
        if not isinstance(head, dict) or head.get("journal") != VERSION or head.get("key") != key:
            raise ConfigError(f"--resume: {self.path} was written by a bench of another config or other questions: "
                              "run the same command as before, or drop --resume to start over")
        done: dict[tuple, dict[str, Any]] = {}
        for n, (_, line) in enumerate(lines[1:], 2):
            try:
                r = json.loads(line)
                r["metrics"] = current_names(r["metrics"])  # (a journal written before the glossary's names)
                done[record_key(r)] = r
            except (ValueError, KeyError, TypeError):
                if n == len(lines):  # a torn last line: that run is done again
                    break
                raise ConfigError(f"--resume: {self.path} line {n} is damaged: drop --resume to start over") from None
        return done

    def add(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()
