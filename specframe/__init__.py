"""specframe: model-agnostic speculative decoding with pluggable proposers.

Public API::

    import specframe
    sf = specframe.load(model="smollm2-135m-instruct", proposers=[{"name": "ngram"}])
    record = sf.generate("Summarize: ...", max_new_tokens=128)   # same dict as `specframe generate --json`

Plugin authors import the contracts from here: ``DraftTree``, ``DecodeState``, ``ProposerBase``,
``ProposerConfig``, ``TargetInfo``, ``VerifyOutcome``, ``hookimpl``.
"""

from __future__ import annotations

from typing import Any

from .contracts import (
    DecodeState,
    DraftTree,
    Proposer,
    ProposerBase,
    ProposerConfig,
    TargetInfo,
    Verifier,
    VerifyOutcome,
    VerifyResult,
)
from .errors import SpecframeError
from .hookspecs import hookimpl
from .sampling import SamplingParams

__version__ = "0.1.0"

__all__ = [
    "DecodeState",
    "DraftTree",
    "Proposer",
    "ProposerBase",
    "ProposerConfig",
    "SamplingParams",
    "SpecframeError",
    "TargetInfo",
    "Verifier",
    "VerifyOutcome",
    "VerifyResult",
    "hookimpl",
    "load",
    "Engine",
    "Specframe",
]


def __getattr__(name: str) -> Any:  # heavy imports (transformers) only when used
    if name in ("load", "Specframe"):
        from . import api

        return getattr(api, name)
    if name == "Engine":
        from .decode.engine import Engine

        return Engine
    raise AttributeError(name)
