"""The contracts between the engine and its plugins: drafts, decode state, verification results.

Glossary (shapes): B batch, T committed sequence length, N draft-tree nodes, K draft length of a chain,
V vocabulary, H hidden size.

Terms: a *draft* is a token tree proposed by a *proposer*; the *target* scores every node in one forward; the
*verifier* walks the tree and keeps an *accepted* path; after the first rejection it draws a *recovered* token
from the residual distribution, and when every node on a path passes it draws a *bonus* token from the target
distribution after the last node. Either way, each step commits ``accepted + 1`` tokens.

Every structure carries a batch dimension B; the engine runs B = 1 for now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, Sequence, runtime_checkable

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from .sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class DraftTree:
    """A proposer's draft: a token tree in topological order (a chain is the one-child case).

    Node ``i`` continues the path to ``parent[b, i]``; ``-1`` means it continues the last committed token.
    Parents come before children (``parent[b, i] < i``).
    """

    token_ids: Tensor  # [B, N] int64, node tokens
    parent: Tensor  # [B, N] int64, parent node index, -1 = child of the last committed token
    draft_probs: Tensor | None = None  # [B, N, V] float32, q at each node (the distribution the node's
    # token was drawn from, given the path to its parent); None = deterministic proposal (one-hot q)

    @property
    def num_nodes(self) -> int:
        return int(self.token_ids.shape[-1])

    @staticmethod
    def empty(batch: int = 1) -> "DraftTree":
        """A draft with no nodes: the step decodes one token from the target alone."""
        z = torch.empty((batch, 0), dtype=torch.int64)
        return DraftTree(z, z.clone(), None)

    @staticmethod
    def chain(token_ids: list[int] | Tensor, draft_probs: Tensor | None = None) -> "DraftTree":
        """A single-row chain draft.

        Args:
            token_ids: ``K`` token ids (list or ``[K]`` int64 tensor).
            draft_probs: ``[K, V]`` float32 or None for a deterministic proposal.
        """
        ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(1, -1)
        k = ids.shape[1]
        parent = torch.arange(-1, k - 1, dtype=torch.int64).reshape(1, -1)
        probs = None if draft_probs is None else draft_probs.reshape(1, k, -1)
        return DraftTree(ids, parent, probs)

    def is_chain(self) -> bool:
        n = self.num_nodes
        if n == 0:
            return True
        expected = torch.arange(-1, n - 1, dtype=self.parent.dtype, device=self.parent.device)
        return bool((self.parent == expected).all())

    def leading_chain(self) -> "DraftTree":
        """The longest prefix that is a chain (``parent[i] == i - 1``): what a tree draft keeps where only chains
        can be verified. For a trie of continuations inserted in order, the first continuation."""
        n = self.num_nodes
        expected = torch.arange(-1, n - 1, dtype=self.parent.dtype, device=self.parent.device)
        same = (self.parent == expected).all(0)
        return self.truncate(n if bool(same.all()) else int(same.to(torch.int64).argmin()))

    def truncate(self, max_nodes: int) -> "DraftTree":
        """The first ``max_nodes`` nodes; in topological order that prefix is still a valid tree."""
        if self.num_nodes <= max_nodes:
            return self
        probs = None if self.draft_probs is None else self.draft_probs[:, :max_nodes]
        return DraftTree(self.token_ids[:, :max_nodes], self.parent[:, :max_nodes], probs)


@dataclass(slots=True)
class DecodeState:
    """What a proposer sees at each step. Owned by the engine; proposers must not mutate it."""

    tokens: Tensor  # [B, T] int64 on CPU: prompt + committed tokens
    prompt_len: int  # tokens[:, :prompt_len] is the prompt
    sampling: SamplingParams  # the warp to apply to any draft distribution sampled from
    generator: torch.Generator  # per-request randomness; draw from it, never from the global RNG
    hidden: Tensor | None = None  # [B, H] target's last hidden state at the last position it processed
    # (filled only when a proposer declares needs_hidden_states)
    features: Tensor | None = None  # [B, T_f, F, H] target dtype: hidden states of the layers ``feature_layers``
    # at positions 0..T_f-1, every position the target has processed (T_f = T - 1 between steps: all committed
    # tokens but the newest); filled only when a proposer declares ``feature_layers`` and the target supports it
    feature_layers: tuple[int, ...] = ()  # transformers hidden_states indices of ``features``' F axis, ascending

    @property
    def num_generated(self) -> int:
        return int(self.tokens.shape[1]) - self.prompt_len


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """A verifier's decision for one step.

    ``accepted_nodes[b]`` lists the draft node indices on the accepted path, root first; ``next_token[b]`` is
    the recovered token (after a rejection) or the bonus token (when the whole path passed).
    """

    accepted_nodes: tuple[tuple[int, ...], ...]  # [B][A_b]
    next_token: tuple[int, ...]  # [B]


@dataclass(frozen=True, slots=True)
class VerifyOutcome:
    """Feedback to a proposer after a step (``Proposer.on_verified``).

    When several proposers are combined, each gets an outcome about its own draft: ``draft`` is the part of it
    the target verified and ``accepted_nodes`` its own node indices on the accepted path of the merged tree.
    """

    draft: DraftTree  # what this proposer drafted and the target verified (after truncation to its budget and,
    # when combined, to the merged tree's node budget: a prefix of what propose returned)
    accepted_nodes: tuple[tuple[int, ...], ...]  # [B][A_b] accepted node indices of that draft
    committed: tuple[tuple[int, ...], ...]  # [B][C_b] tokens committed this step, after stop checks
    finished: bool  # a stop condition ended the request in this step

    @property
    def num_accepted(self) -> int:
        """Accepted draft tokens of row 0."""
        return len(self.accepted_nodes[0])


@dataclass(frozen=True, slots=True)
class TargetInfo:
    """What a proposer may know about the target. Built by the target adapter."""

    vocab_size: int  # V, rows of the target's logits
    eos_token_ids: frozenset[int]
    max_context: int  # positions the target supports
    device: torch.device
    dtype: torch.dtype
    name: str = ""
    tokenizer: Any = field(default=None, compare=False)  # transformers tokenizer, for proposers that need text
    model: Any = field(default=None, compare=False)  # the target model, for heads that reuse its LM head
    supports_trees: bool = True  # one tree mask serves every layer (False for sliding-window targets): a
    # tree-drafting proposer should draft chains when False
    cost: Any = field(default=None, compare=False)  # the target's measured cost curve on this machine, or None:
    # an object with ``v(n) -> float`` = T(n tokens) / T(1 token) (specframe.tune.CostCurve; it follows thread changes)


class ProposerConfig(BaseModel):
    """Base of every proposer's config. Subclasses add fields; ``name`` selects the proposer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str


@runtime_checkable
class Proposer(Protocol):
    """Drafts tokens for the target to verify.

    Capability flags (class attributes) tell the engine what a proposer needs and produces, so the engine never
    checks for a particular proposer:

    - ``needs_hidden_states``: the engine fills ``DecodeState.hidden``.
    - ``produces_trees``: drafts may branch (needs a tree-capable verifier).
    - ``provides_draft_probs``: drafts carry ``draft_probs``; otherwise they are deterministic (one-hot q).
    - ``feature_layers`` (optional, may be set per instance): transformers ``hidden_states`` indices (0 = the
      embeddings, ``i`` = after decoder layer ``i``) whose states at every processed position the proposer reads
      from ``DecodeState.features`` (EAGLE-style drafters); the engine takes them from the verification forward it
      runs anyway.
    - ``reads_features`` (optional, class-level): the proposer sets ``feature_layers`` per instance, so the class
      itself says it reads hidden-state features (hosts that cannot give them, e.g. vLLM, refuse it up front).

    Construction: ``cls(config, target_info)``. One instance serves one request at a time; ``start`` resets it.
    """

    name: ClassVar[str]
    Config: ClassVar[type[ProposerConfig]]
    needs_hidden_states: ClassVar[bool]
    produces_trees: ClassVar[bool]
    provides_draft_probs: ClassVar[bool]

    def start(self, state: DecodeState) -> None:
        """Called once per request after the prompt is known, before the first ``propose``."""

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        """Draft at most ``budget`` nodes (``budget >= 1``). Nodes beyond the budget are dropped."""

    def on_verified(self, outcome: VerifyOutcome) -> None:
        """Feedback after the target verified this proposer's draft (adapt k, update caches)."""


class ProposerBase:
    """Convenience base class with no-op ``start``/``on_verified`` and default capability flags."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[ProposerConfig]] = ProposerConfig
    needs_hidden_states: ClassVar[bool] = False
    produces_trees: ClassVar[bool] = False
    provides_draft_probs: ClassVar[bool] = False

    def __init__(self, config: ProposerConfig, target: TargetInfo) -> None:
        self.config = config
        self.target = target

    def start(self, state: DecodeState) -> None:
        return None

    def propose(self, state: DecodeState, budget: int) -> DraftTree:  # pragma: no cover - abstract
        raise NotImplementedError

    def on_verified(self, outcome: VerifyOutcome) -> None:
        return None


@runtime_checkable
class Verifier(Protocol):
    """Decides which draft nodes the target accepts and draws the recovered or bonus token.

    ``supports_trees``: can verify branching drafts; ``greedy``: used when temperature is 0.
    """

    name: ClassVar[str]
    supports_trees: ClassVar[bool]

    def verify(
        self,
        draft: DraftTree,
        target_logits: Tensor,
        sampling: SamplingParams,
        generator: torch.Generator,
    ) -> VerifyResult:
        """Args:
        draft: the draft tree, ``N`` nodes.
        target_logits: ``[B, N + 1, V]`` any float dtype; row 0 is the target's distribution after the last
            committed token, row ``i + 1`` the distribution after node ``i``.
        sampling: the warp to apply to the target logits.
        generator: per-request randomness.
        """


# --- combining proposers: attribution, merge policies, routers ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProposerStep:
    """One proposer's part in one verification step (attribution; see docs/combining.md).

    Crediting rule: an accepted node credits every proposer that produced it, so with overlapping drafts the
    proposers' ``accepted`` add up to more than the step's accepted tokens; ``accepted_alone`` counts the
    accepted nodes no other proposer produced.
    """

    name: str  # the proposer's label (its name; ``name#2`` for a second instance of the same name)
    asked: bool  # propose was called (False: the router left it out, it is disabled, or no budget was left)
    budget: int  # node budget it was given (0 when not asked)
    proposed: int  # nodes it returned (after truncation to its budget; 0 on a fault)
    drafted: int  # of those, nodes in the verified tree (a node shared with another proposer counts for each)
    drafted_by_depth: tuple[int, ...]  # [D] drafted nodes at depth d + 1
    accepted: int  # credited: its nodes on the accepted path (a prefix of the path)
    accepted_alone: int  # accepted nodes only it produced
    draft_s: float  # seconds in its propose call
    fault: bool  # it faulted in this step (see specframe.isolation)

    @property
    def wasted(self) -> int:
        """Verified nodes of this proposer that were not accepted."""
        return self.drafted - self.accepted


@dataclass(frozen=True, slots=True)
class StepReport:
    """What merge policies, routers and observers learn after each step."""

    proposers: tuple[ProposerStep, ...]  # one per proposer, in the engine's order
    verified: int  # N, nodes of the merged tree the target scored (plus the newest token: N + 1 positions)
    accepted: int  # accepted path length
    forward_s: float  # seconds of the target's verification forward


class MergePolicyConfig(BaseModel):
    """Base of every merge policy's config (``merge:`` in the top-level config); ``policy`` selects it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str
    max_nodes: int = Field(24, ge=1, le=256, description="Most nodes of the merged tree (the verification width).")


@runtime_checkable
class MergePolicy(Protocol):
    """Decides how several proposers' drafts share the merged tree's node budget.

    Construction: ``cls(config, target_info)``; ``max_nodes`` is the merged tree's node budget. The merge itself
    (dedup, provenance, exactness rules) is :func:`specframe.merge.merge_drafts`; a policy only plans it.
    """

    name: ClassVar[str]
    Config: ClassVar[type[MergePolicyConfig]]
    max_nodes: int

    def start(self, proposers: Sequence[str]) -> None:
        """A new request with these proposer labels (engine order)."""

    def plan(self, drafts: Sequence[DraftTree], max_nodes: int) -> Sequence[tuple[int, int]]:
        """``(proposer index, quota)`` in insertion order: the first ``quota`` nodes of that proposer's draft go
        in, earlier entries first; ``drafts[j]`` is empty for a proposer that did not draft this step."""

    def on_step(self, report: StepReport) -> None:
        """Feedback after each step (live acceptance per proposer)."""


class MergePolicyBase:
    """Convenience base: stores the config and ``max_nodes``; no-op ``start``/``on_step``."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[MergePolicyConfig]] = MergePolicyConfig

    def __init__(self, config: MergePolicyConfig, target: TargetInfo | None = None) -> None:
        self.config = config
        self.target = target
        self.max_nodes = config.max_nodes

    def start(self, proposers: Sequence[str]) -> None:
        self.proposers = tuple(proposers)

    def plan(self, drafts: Sequence[DraftTree], max_nodes: int) -> Sequence[tuple[int, int]]:  # pragma: no cover
        raise NotImplementedError

    def on_step(self, report: StepReport) -> None:
        return None


class RouterConfig(BaseModel):
    """Base of every router's config (``router:`` in the top-level config); ``name`` selects it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str


@runtime_checkable
class Router(Protocol):
    """Decides, each step, which of several combined proposers run and with what node budget.

    Construction: ``cls(config, target_info)``. Routing never changes what greedy decoding emits, nor the
    distribution of what sampling emits; but under sampling it decides which proposers draw from the request's
    generator, so to keep a seed reproducing the same tokens a router must decide deterministically from the seed
    and the feedback's counts (no global RNG, no draws from the request's generator, and no wall-clock timings
    unless ``greedy``).
    """

    name: ClassVar[str]
    Config: ClassVar[type[RouterConfig]]

    def start(self, proposers: Sequence[str], seed: int, greedy: bool) -> None:
        """A new request with these proposer labels (engine order), its seed, and whether it decodes greedily."""

    def route(self, budget: int, max_nodes: int, available: Sequence[bool]) -> Sequence[int]:
        """Node budget per proposer for this step (``0`` = skip it); ``budget`` is the step's draft budget,
        ``max_nodes`` the merged tree's, ``available[j]`` False for a proposer disabled by faults."""

    def on_step(self, report: StepReport) -> None:
        """Feedback after each step (who drafted what, what was accepted, the forward's time)."""

    # Optional (the engine calls it when present; RouterBase's keeps every plan as it is):
    # def revise(self, budget, max_nodes, available, drafts, budgets) -> Sequence[int]
    #     Called after each proposer that ran this step, in the engine's order, with the drafts so far
    #     (``drafts[j]`` None for a proposer still to run, empty for one skipped or faulty) and the current
    #     per-proposer numbers. Returns new ones: for a proposer still to run its node budget (0 = skip it), for
    #     one that drafted how many of its nodes to keep (a prefix; more than it drafted keeps all). A cascade:
    #     cheap proposers first, the costly ones only when the cheap ones' drafts look short.


class RouterBase:
    """Convenience base: stores the config; runs every proposer with the full budget."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[RouterConfig]] = RouterConfig

    def __init__(self, config: RouterConfig, target: TargetInfo | None = None) -> None:
        self.config = config
        self.target = target

    def start(self, proposers: Sequence[str], seed: int, greedy: bool) -> None:
        self.proposers = tuple(proposers)

    def route(self, budget: int, max_nodes: int, available: Sequence[bool]) -> Sequence[int]:
        return [budget if ok else 0 for ok in available]

    def on_step(self, report: StepReport) -> None:
        return None

    def revise(self, budget: int, max_nodes: int, available: Sequence[bool],
               drafts: Sequence["DraftTree | None"], budgets: Sequence[int]) -> Sequence[int]:
        """Keeps the step's plan as it is (see :class:`Router`)."""
        return list(budgets)
