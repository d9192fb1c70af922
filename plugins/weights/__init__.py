"""Weights shipped with the built-in learned proposers: ``<target name>/<proposer>/`` (see each model card)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parent


def shipped(target_name: str, proposer: str) -> Path | None:
    """The shipped weights folder of ``proposer`` for the target named ``target_name``, or None."""
    path = ROOT / target_name / proposer
    return path if path.is_dir() else None


def available(proposer: str) -> list[str]:
    """Target names with shipped weights for ``proposer``."""
    return sorted(p.parent.name for p in ROOT.glob(f"*/{proposer}") if p.is_dir())
