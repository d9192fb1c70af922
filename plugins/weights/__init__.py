"""Weights shipped with the built-in learned proposers: ``<target name>/<proposer>/`` (see each model card).

A folder holds the weights, their configs, ``recipe.json`` and the model card (``README.md``) only: the corpora they
were trained on and their loss logs and plots stay in the repository's ``lab/data/<target name>/`` (lab/data/README.md), out
of the wheel."""

from __future__ import annotations

from pathlib import Path

from specframe import ConfigError

ROOT = Path(__file__).parent


def shipped(target_name: str, proposer: str) -> Path | None:
    """The shipped weights folder of ``proposer`` for the target named ``target_name``, or None."""
    path = ROOT / target_name / proposer
    return path if path.is_dir() else None


def available(proposer: str) -> list[str]:
    """Target names with shipped weights for ``proposer``."""
    return sorted(p.parent.name for p in ROOT.glob(f"*/{proposer}") if p.is_dir())


def weights_folder(configured: str | None, target_name: str, proposer: str, what: str, fix: str) -> Path:
    """The folder a learned proposer loads: ``configured`` when set, else the one shipped for the target.

    Raises:
        ConfigError: nothing configured and nothing shipped for ``target_name`` (names ``what`` and the ``fix``).
    """
    if configured:
        return Path(configured).expanduser()
    folder = shipped(target_name, proposer)
    if folder is None:
        have = ", ".join(available(proposer)) or "none"
        raise ConfigError(f"no {what} shipped for target {target_name!r} (shipped for: {have}): {fix}")
    return folder
