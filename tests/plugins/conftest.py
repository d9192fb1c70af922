"""Fixtures of the plugin tests: installed-looking plugin distributions."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pytest

FakeDist = Callable[..., Path]


@pytest.fixture
def fake_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeDist:
    """``fake_dist(dist, version, entry_points={ep: module}, modules={module: source})`` -> its folder: a
    ``<name>.dist-info`` folder (METADATA + entry_points.txt) and the plugin's modules, written to a temporary folder
    put on ``sys.path`` — exactly what ``importlib.metadata`` finds for a ``pip install``-ed package. Everything is
    removed after the test (the source of a trivial plugin module: :func:`tests.fakes.proposer_module`)."""
    added: list[str] = []

    def make(dist: str, version: str, entry_points: dict[str, str], modules: dict[str, str]) -> Path:
        root = tmp_path / f"{dist}-site"
        info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        eps = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
        (info / "entry_points.txt").write_text(f"[specframe]\n{eps}")
        for module, source in modules.items():
            (root / f"{module}.py").write_text(textwrap.dedent(source))
            added.append(module)
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        return root

    yield make
    for module in added:
        sys.modules.pop(module, None)
