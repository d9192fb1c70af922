"""The contracts between the engine and its plugins, one module a concern:

- :mod:`.proposer`: drafts (:class:`DraftTree`), decode state, proposers, verifiers and what they are told;
- :mod:`.combining`: attribution (:class:`StepReport`), merge policies and routers, for proposers combined under one
  verification pass;
- :mod:`.scoring`: the verification forward of one request (:class:`Scorer`), which the live target, llama.cpp and
  a recorded trace implement.

Every name is importable from here (and the ones plugins use from :mod:`specframe` itself).
"""

from .combining import (
    MergePolicy,
    MergePolicyBase,
    MergePolicyConfig,
    ProposerStep,
    Router,
    RouterBase,
    RouterConfig,
    StepReport,
    merge_key,
)
from .proposer import (
    Capabilities,
    DecodeState,
    DraftTree,
    Proposer,
    ProposerBase,
    ProposerConfig,
    TargetInfo,
    TargetModel,
    Verifier,
    VerifyOutcome,
    VerifyResult,
)
from .scoring import Scored, Scorer, ScorerFactory

__all__ = [
    "Capabilities", "DecodeState", "DraftTree", "MergePolicy", "MergePolicyBase", "MergePolicyConfig", "Proposer",
    "ProposerBase", "ProposerConfig", "ProposerStep", "Router", "RouterBase", "RouterConfig", "Scored", "Scorer",
    "ScorerFactory", "StepReport", "TargetInfo", "TargetModel", "Verifier", "VerifyOutcome", "VerifyResult",
    "merge_key",
]
