"""The public stepping API as docs/how-it-works.md shows it (issue 56, 2.): the snippet runs as written on the
default model, and its loop gives what ``generate_result`` gives; hosts import no private name."""

from __future__ import annotations

import ast
import re

import pytest

from tests.fakes import ROOT


def _snippet() -> str:
    doc = (ROOT / "docs" / "how-it-works.md").read_text(encoding="utf-8")
    section = doc[doc.index("### Driving requests yourself"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_the_documented_host_loop_runs_and_equals_generate_result(capsys):
    code = _snippet()
    scope: dict = {}
    exec(compile(code, "docs/how-it-works.md", "exec"), scope)
    sf, result = scope["sf"], scope["result"]
    assert capsys.readouterr().out.strip()  # it printed the text and τ
    want = sf.generate_result(scope["ids"], proposers=["ngram"], max_new_tokens=32)
    assert result.token_ids == want.token_ids and result.finish_reason == want.finish_reason
    assert len(result.token_ids) == 32  # (draft lengths may differ: the pooled router instance learns across requests)


def test_no_module_imports_a_private_name_of_another():
    """specframe, plugins and contrib import only public names across modules (the stepping API is public)."""
    found = []
    for root in ("specframe", "plugins", "contrib"):
        for path in (ROOT / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom):
                    found += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, found
