"""The contracts between the engine and its plugins, one module a concern:

- :mod:`.proposer`: drafts (:class:`DraftTree`), decode state, proposers, verifiers and what they are told;
- :mod:`.combining`: attribution (:class:`StepReport`), merge policies and routers, for proposers combined under one
  verification pass;
- :mod:`.scoring`: the verification forward of one request (:class:`Scorer`), which the live target, llama.cpp and
  a recorded trace implement;
- :mod:`.tool_parsing` (with its helpers, :mod:`.tool_formats`) and :mod:`.reasoning`: a model's tool-call text and
  its reasoning span, parsed at the text level (:class:`ToolParser`, :class:`ReasoningParser`) for an
  OpenAI-compatible server.

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
from .reasoning import ReasoningDelta, ReasoningParser, StreamingReasoningParser
from .scoring import Scored, Scorer, ScorerFactory
from .tool_parsing import ContentDelta, StreamingToolParser, ToolCall, ToolCallDelta, ToolParser

__all__ = [
    "Capabilities", "ContentDelta", "DecodeState", "DraftTree", "MergePolicy", "MergePolicyBase", "MergePolicyConfig",
    "Proposer", "ProposerBase", "ProposerConfig", "ProposerStep", "ReasoningDelta", "ReasoningParser", "Router",
    "RouterBase", "RouterConfig", "Scored", "Scorer", "ScorerFactory", "StepReport", "StreamingReasoningParser",
    "StreamingToolParser", "TargetInfo", "TargetModel", "ToolCall", "ToolCallDelta", "ToolParser", "Verifier",
    "VerifyOutcome", "VerifyResult", "merge_key",
]
