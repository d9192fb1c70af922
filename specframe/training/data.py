"""Where the repository keeps training data: ``data/<target>/`` at its top level, beside the code, never in a wheel.

- ``data/<target>/corpus/`` (and ``corpus-long/``, ...): the committed corpora; ``specframe train`` without
  ``--corpus`` uses ``corpus/`` (:func:`shipped_corpus`).
- ``data/<target>/training/<proposer>/``: the loss log (``train-log.jsonl``) and plot (``loss.png``) of the weights
  shipped in ``specframe_plugins/weights/<target>/<proposer>/`` (:func:`log_folder`).

Both exist in a checkout of the repository only: an installed wheel has no ``data/``, so there the default corpus is
built in the output folder and every run keeps its log beside its weights.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data"  # <repository>/data (specframe/training/data.py is 2 levels down)


def shipped_corpus(target_name: str) -> Path | None:
    """The corpus committed for the target named ``target_name`` (``data/<target>/corpus/``), or None."""
    path = DATA / target_name / "corpus"
    return path if (path / "corpus.json").is_file() else None


def log_folder(out: Path) -> Path:
    """Where a training run into ``out`` writes ``train-log.jsonl`` and ``loss.png``: ``out`` itself, except for a
    shipped weights folder of this checkout (``plugins/weights/<target>/<proposer>``), whose log and plot go to
    ``data/<target>/training/<proposer>/`` so that the package holds weights, configs and model cards only."""
    from specframe_plugins.weights import ROOT

    try:
        parts = Path(out).resolve().relative_to(ROOT.resolve()).parts
    except ValueError:
        return out
    if len(parts) != 2 or not DATA.is_dir():
        return out
    target, proposer = parts
    return DATA / target / "training" / proposer


def repo_path(path: Path) -> str:
    """``path`` relative to the repository (``data/...``), else as given: for model cards and messages."""
    try:
        return Path(path).resolve().relative_to(DATA.parent).as_posix()
    except ValueError:
        return Path(path).as_posix()
