"""The public face: ``specframe`` exports what plugins use, and the built-in plugins and contrib import nothing else."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import specframe

ROOT = Path(__file__).resolve().parents[1]


def test_every_public_name_resolves():
    missing = [name for name in specframe.__all__ if not hasattr(specframe, name)]
    assert missing == []
    assert len(set(specframe.__all__)) == len(specframe.__all__)
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        specframe.not_a_name  # noqa: B018


def _specframe_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "specframe":
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "specframe")
    return found


def test_plugins_and_contrib_import_only_the_public_face():
    files = sorted(ROOT.glob("plugins/**/*.py")) + sorted(ROOT.glob("contrib/*/*.py"))
    assert len(files) > 8
    beyond = {str(p.relative_to(ROOT)): sorted(m for m in _specframe_imports(p) if m != "specframe") for p in files}
    assert {k: v for k, v in beyond.items() if v} == {}


def test_lazy_names_are_the_modules_own_objects():
    from specframe.decode.engine import Engine
    from specframe.registry import build_registry
    from specframe.target.kv_cache import rollback

    assert specframe.Engine is Engine and specframe.build_registry is build_registry and specframe.rollback is rollback
