"""How the kit reports: :class:`ConformanceError` carries a message written for the plugin author (what the
proposer did, what the contract expects, the likely cause), without kit internals."""

from __future__ import annotations

import traceback


class ConformanceError(AssertionError):
    """A proposer failed a conformance check; the message says what is wrong in the author's terms."""


class NotApplicable(Exception):
    """A check does not apply to this proposer (e.g. draft-probability checks for deterministic drafts)."""


def where(exc: BaseException) -> str:
    """``file.py:12 in propose`` for the innermost frame of an exception (the author's code, usually)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    return f" at {f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name}"


def describe_exc(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}{where(exc)}"


def ids(tokens) -> str:
    """A short rendering of a token-id list."""
    tokens = list(tokens)
    return str(tokens) if len(tokens) <= 12 else f"{tokens[:12]}... ({len(tokens)} tokens)"
