"""What every ``specframe`` command shares: the stderr console, the one-line error exit, loading with a spinner.

Every user error prints one line ``error: ...`` on stderr and exits with code 2, before anything is written to
stdout or to an output folder.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import sys
from typing import Any, Iterator, NoReturn

import typer
from rich.console import Console

from ..errors import ConfigError, SpecframeError

err = Console(stderr=True, highlight=False)


def _utf(stream: Any) -> bool:
    try:
        return codecs.lookup(getattr(stream, "encoding", None) or "ascii").name.startswith("utf")
    except LookupError:
        return False


def tolerant_stdio() -> None:
    """On a stdout / stderr that cannot encode every character (``PYTHONIOENCODING=ascii``, a C locale), write
    what it cannot encode as backslash escapes (``\\xe9``) instead of raising UnicodeEncodeError after the work is
    done. Streams that cannot be reconfigured (test capture) are left as they are."""
    for stream in (sys.stdout, sys.stderr):
        if not _utf(stream) and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def json_line(obj: Any) -> str:
    """``obj`` as one JSON line for stdout: characters as they are on a UTF-8 stdout, ``\\uXXXX`` escapes on any
    other, so the line is valid JSON whatever stdout can encode."""
    return json.dumps(obj, ensure_ascii=not _utf(sys.stdout)) + "\n"


def fail(message: str | BaseException) -> NoReturn:
    """Print ``error: <message>`` on stderr and exit with code 2."""
    err.print(f"error: {message}", markup=False, soft_wrap=True)
    raise typer.Exit(2)


@contextlib.contextmanager
def one_error_line() -> Iterator[None]:
    """A :class:`~specframe.errors.SpecframeError` raised inside ends the command through :func:`fail`."""
    try:
        yield
    except SpecframeError as exc:
        fail(exc)


def machine_flags(threads: str | None, prepack: str | None) -> dict:
    """``--threads`` / ``--prepack`` as config values (None = not given).

    Raises:
        ConfigError: a value that is not a whole number in [1, 1024] or auto (threads), or on / off / auto (prepack).
    """
    from ..config import MAX_THREADS

    out: dict = {}
    if threads is not None:
        if threads != "auto" and not (threads.isdigit() and 1 <= int(threads) <= MAX_THREADS):
            raise ConfigError(f"--threads must be a whole number in [1, {MAX_THREADS}] or auto, got {threads!r}")
        out["threads"] = threads if threads == "auto" else int(threads)
    if prepack is not None:
        values = {"on": True, "off": False, "auto": "auto", "true": True, "false": False}
        if prepack.lower() not in values:
            raise ConfigError(f"--prepack must be on, off or auto, got {prepack!r}")
        out["prepack"] = values[prepack.lower()]
    return out


def load_with_progress(cfg: Any, registry: Any, what: str = "") -> Any:
    """``specframe.load`` with a spinner, and a bar while a first machine profile is measured."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    import specframe

    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=err, transient=True) as progress:
        progress.add_task(f"loading {what or cfg.model} ...", total=None)
        return specframe.load(cfg, registry=registry, log=lambda s: err.print(s, markup=False), progress=progress)


def progress_bar(label: str = "{task.description}", info: bool = False) -> Any:
    """A ``rich.progress.Progress`` on stderr for long work: ``label``, the bar, done/total, elapsed, remaining
    (``info``: a column for each task's ``info`` field, e.g. a loss)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [TextColumn(label), BarColumn(), MofNCompleteColumn(), *([TextColumn("{task.fields[info]}")] * info),
               TimeElapsedColumn(), TimeRemainingColumn()]
    return Progress(*columns, console=err)


class ProgressLines:
    """Long work's progress as plain lines on a stderr that is not a terminal (a log file, CI), where a rich bar is
    drawn only once, at the end: one line per phase each time it has advanced by ``step`` of its total or
    ``every_s`` seconds have passed, and one when it completes. On a terminal it prints nothing (the bar shows it).
    """

    def __init__(self, step: float = 0.05, every_s: float = 60.0) -> None:
        import time

        self.step, self.every_s, self.clock = step, every_s, time.monotonic
        self.on = not err.is_terminal
        self.last: dict[str, tuple[int, float]] = {}  # phase -> (done at the last line, its time)

    def __call__(self, phase: str, done: int, total: int | None, info: str = "") -> None:
        if not self.on:
            return
        now = self.clock()
        last_done, last_t = self.last.get(phase, (-1, now))
        finished = total is not None and done >= total
        due = total and done - last_done >= self.step * total or now - last_t >= self.every_s
        if done != last_done and (last_done < 0 or finished or due):
            self.last[phase] = (done, now)
            of = f"/{total}" if total else ""
            err.print(f"{phase} {done}{of}{' ' + info if info else ''}", markup=False)
