"""The wheel built from the repository: every package ships (found, not listed by hand), ``plugins/`` ships as
``specframe_plugins`` with the shipped weights, and nothing else lands at the top level (no ``plugins``,
``contrib`` or ``tests`` package, no ``lab/``: no training corpus, loss log or plot). Built offline from a copy of
the tree, with this venv's setuptools (``--no-build-isolation``), so nothing is downloaded and the source tree is not
written to."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import specframe

from tests.fakes import ROOT

SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                              "runs", "out", "bench-*", ".benchmarks")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, set[str]]:
    src = tmp_path_factory.mktemp("src") / "specframe"
    shutil.copytree(ROOT, src, ignore=SKIP)
    for folder in (src / "plugins" / "weights").glob("*/*/"):  # a run's log and plot copied in beside the weights
        (folder / "train-log.jsonl").write_text("{}\n")
        (folder / "loss.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(out),
         str(src)], capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = out.glob("specframe-*.whl")
    BUILD_OUTPUT.append(proc.stdout + proc.stderr)
    return path, set(zipfile.ZipFile(path).namelist())


BUILD_OUTPUT: list[str] = []  # what the wheel build printed (the fixture's build)


def _packages(folder: Path, installed_as: str) -> set[str]:
    return {f"{installed_as}/{p.parent.relative_to(folder).as_posix()}/__init__.py".replace("/./", "/")
            for p in folder.rglob("__init__.py") if "__pycache__" not in p.parts}


def test_every_package_ships(wheel):
    _, names = wheel
    expected = _packages(ROOT / "specframe", "specframe") | _packages(ROOT / "plugins", "specframe_plugins")
    assert "specframe/bench/__init__.py" in expected
    assert not expected - names, f"packages missing from the wheel: {sorted(expected - names)}"
    modules = {f"specframe/{p.relative_to(ROOT / 'specframe').as_posix()}" for p in (ROOT / "specframe").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert not modules - names, f"modules missing from the wheel: {sorted(modules - names)}"


def test_only_specframe_packages_at_the_top_level(wheel):
    _, names = wheel
    top = {n.split("/")[0] for n in names}
    assert top == {"specframe", "specframe_plugins", f"specframe-{specframe.__version__}.dist-info"}, top


def test_shipped_weights_ship_and_training_data_does_not(wheel):
    _, names = wheel
    shipped = {f"specframe_plugins/{p.relative_to(ROOT / 'plugins').as_posix()}"
               for p in (ROOT / "plugins" / "weights").glob("*/*/*") if p.is_file()}
    assert shipped and not shipped - names, sorted(shipped - names)
    assert {n.rsplit(".", 1)[-1] for n in shipped} <= {"json", "safetensors", "md"}, shipped  # weights, configs, cards
    weights = [n for n in names if n.startswith("specframe_plugins/weights/")]
    assert not [n for n in weights if n.endswith((".jsonl", ".png", ".gz")) or "/corpus" in n]  # no log, plot, corpus
    assert not [n for n in names if n.startswith(("data/", "lab/")) or n.endswith(".jsonl.gz")]  # nothing of lab/ anywhere


def test_training_data_lives_in_lab_data_and_the_model_cards_link_it():
    """``lab/data/<target>/``: the corpora (``corpus/``, ``corpus-long/``) and each shipped proposer's loss log and plot
    (``training/<proposer>/``); the model card beside the weights links the plot there (lab/data/README.md)."""
    folders = [p for p in (ROOT / "plugins" / "weights").glob("*/*") if p.is_dir()]
    assert folders and not [p for p in folders if p.name.startswith("corpus")]
    for folder in folders:
        target, proposer = folder.parent.name, folder.name
        logs = ROOT / "lab" / "data" / target / "training" / proposer
        assert (logs / "train-log.jsonl").is_file() and (logs / "loss.png").is_file(), logs
        card = (folder / "README.md").read_text(encoding="utf-8")
        link = f"../../../../lab/data/{target}/training/{proposer}/loss.png"
        assert f"![loss curve]({link})" in card and (folder / link).resolve() == (logs / "loss.png").resolve()
    for target in {p.parent.name for p in folders}:
        assert (ROOT / "lab" / "data" / target / "corpus" / "corpus.json").is_file()
    assert (ROOT / "lab" / "data" / "README.md").is_file()


def test_entry_points_name_modules_that_ship(wheel):
    path, names = wheel
    with zipfile.ZipFile(path) as z:
        text = z.read(f"specframe-{specframe.__version__}.dist-info/entry_points.txt").decode()
    targets = [line.split("=", 1)[1].strip().split(":")[0] for line in text.splitlines() if "=" in line]
    assert "specframe.cli" in targets and "specframe_plugins.ngram" in targets
    for module in targets:
        as_path = module.replace(".", "/")
        assert f"{as_path}.py" in names or f"{as_path}/__init__.py" in names, module


def test_the_shipped_traces_ship(wheel):
    _, names = wheel
    shipped = {f"specframe/{p.relative_to(ROOT / 'specframe').as_posix()}"
               for p in (ROOT / "specframe" / "testing" / "traces").glob("*/*") if p.is_file()}
    assert {n.rsplit("/", 1)[1] for n in shipped} == {"manifest.json", "tokens.json.gz"}
    assert not shipped - names, sorted(shipped - names)


def test_the_build_is_quiet(wheel):
    """No setuptools BuildBackendWarning (a data folder missing from ``packages``, ...): what every ``pip install -e .``
    of scripts/setup.sh would print."""
    assert BUILD_OUTPUT and "BuildBackendWarning" not in BUILD_OUTPUT[-1], BUILD_OUTPUT[-1][:3000]
    assert "specframe.testing.traces" not in BUILD_OUTPUT[-1]
