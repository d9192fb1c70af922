"""Fixtures of the bench and replay tests (the builders are in :mod:`tests.fakes`)."""

from __future__ import annotations

import pytest

from tests.fakes import write_cli_trace


@pytest.fixture(scope="module")
def trace_files(tmp_path_factory):
    """Model folders (the target and another model), questions, and a trace recorded by the CLI
    (:func:`tests.fakes.write_cli_trace`); one per test module."""
    root = tmp_path_factory.mktemp("replay-cli")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECFRAME_CACHE", str(root / "cache"))
        write_cli_trace(root)
        yield root
