"""Where the repository keeps training data: ``lab/data/<target>/`` at its top level, beside the code, never in a wheel.

- ``lab/data/<target>/corpus/`` (and ``corpus-long/``, ...): the committed corpora; ``specframe train`` without
  ``--corpus`` uses ``corpus/`` (:func:`shipped_corpus`).
- ``lab/data/<target>/training/<proposer>/``: the loss log (``train-log.jsonl``) and plot (``loss.png``) of the weights
  shipped in ``specframe_plugins/weights/<target>/<proposer>/`` (:func:`log_folder`).

Both exist in a checkout of the repository only: an installed wheel has no ``lab/data/``, so there the default corpus is
built in the output folder and every run keeps its log beside its weights.
"""

from __future__ import annotations

from pathlib import Path

# <repository>/lab/data (specframe/training/data.py is 2 levels down): the lab notebook's room, not the product's
DATA = Path(__file__).resolve().parents[2] / "lab" / "data"


def shipped_corpus(target_name: str) -> Path | None:
    """The corpus committed for the target named ``target_name`` (``lab/data/<target>/corpus/``), or None."""
    path = DATA / target_name / "corpus"
    return path if (path / "corpus.json").is_file() else None


def log_folder(out: Path) -> Path:
    """Where a training run into ``out`` writes ``train-log.jsonl`` and ``loss.png``: ``out`` itself, except for a
    shipped weights folder of this checkout (``plugins/weights/<target>/<proposer>``), whose log and plot go to
    ``lab/data/<target>/training/<proposer>/`` so that the package holds weights, configs and model cards only."""
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
    """``path`` relative to the repository (``lab/data/...``; the repository is ``DATA``'s grandparent), else as
    given: for model cards and messages."""
    try:
        return Path(path).resolve().relative_to(DATA.parents[1]).as_posix()
    except ValueError:
        return Path(path).as_posix()
