"""The contracts for combining several proposers under one verification pass: attribution (what each proposer
drafted and had accepted in a step), merge policies (how their drafts share the merged tree's node budget) and
routers (which proposers run each step, with what node budget). See docs/combining.md.

The single-proposer contracts (drafts, decode state, proposers, verifiers) are in :mod:`specframe.contracts`.
Shapes: N merged-tree nodes, P proposers, L depth of a node (1 = child of the newest committed token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Sequence, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .proposer import DraftTree, TargetInfo, numbers_as_numbers, own_config


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
    drafted_by_depth: tuple[int, ...]  # [L] drafted nodes at depth l + 1 (L: its deepest drafted node)
    accepted: int  # credited: its nodes on the accepted path (a prefix of the path)
    accepted_alone: int  # accepted nodes only it produced
    draft_s: float  # seconds in its propose call
    fault: bool  # it faulted in this step (see specframe.decode.isolation)
    feedback_s: float = 0.0  # seconds in its on_verified call this step (its feedback work)

    @property
    def wasted(self) -> int:
        """Drafted nodes of this proposer that were not accepted."""
        return self.drafted - self.accepted


@dataclass(frozen=True, slots=True)
class StepReport:
    """What merge policies, routers and observers learn after each step."""

    proposers: tuple[ProposerStep, ...]  # one per proposer, in the engine's order
    verified: int  # N, the step's drafted nodes: the merged tree's, scored with the newest token (N + 1 positions)
    accepted: int  # accepted path length
    forward_s: float  # seconds of the target's verification forward


def merge_key(data: Any) -> Any:
    """``merge:`` settings with ``name`` as the selecting key: the old spelling ``policy: NAME`` is read as
    ``name: NAME`` (both given: they must agree)."""
    if isinstance(data, dict) and "policy" in data:
        data = dict(data)
        old = data.pop("policy")
        if data.setdefault("name", old) != old:
            raise ValueError(f"merge: `name` ({data['name']!r}) and its old spelling `policy` ({old!r}) disagree")
    return data


class MergePolicyConfig(BaseModel):
    """Base of every merge policy's config (``merge:`` in the top-level config); ``name`` selects it, as it selects
    proposers and routers (``policy`` is read as ``name``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    max_nodes: int = Field(24, ge=1, le=256, description="Most nodes of the merged tree (the verification width).")

    _numbers = model_validator(mode="before")(classmethod(numbers_as_numbers))

    @model_validator(mode="before")
    @classmethod
    def _old_key(cls, data: Any) -> Any:
        return merge_key(data)


@runtime_checkable
class MergePolicy(Protocol):
    """Decides how several proposers' drafts share the merged tree's node budget.

    Construction: ``cls(config, target_info)``; ``max_nodes`` is the merged tree's node budget. The merge itself
    (dedup, provenance, exactness rules) is :func:`specframe.decode.merged_tree.merge_drafts`; a policy only plans it.
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

    def __init_subclass__(cls, **kwargs: Any) -> None:  # a Config it inherits: with `name: Literal[cls.name]`
        super().__init_subclass__(**kwargs)
        own_config(cls)

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

    _numbers = model_validator(mode="before")(classmethod(numbers_as_numbers))


@runtime_checkable
class Router(Protocol):
    """Decides, each step, which proposers run and with what node budget: several combined ones, or a lone one
    whose draft it trims to what pays (when the router is set explicitly, or the target carries a measured cost curve).

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
        """Node budget per proposer for this step (``0`` = skip it); ``budget`` is the step's node budget,
        ``max_nodes`` the merged tree's, ``available[j]`` False for a proposer disabled by faults."""

    def on_step(self, report: StepReport) -> None:
        """Feedback after each step (who drafted what, what was accepted, the forward's time)."""

    def on_batch(self, rows: int, width: int) -> None:
        """Called before ``route`` when the step's forward is shared with other requests (batched decoding): ``rows``
        requests, this one included, the others' rows ``width`` tokens wide at the last step (the forward pads every
        row to the widest). A router that plans with costs should charge a draft what it adds to the whole forward
        (see the adaptive router's ``cost.StepCost``). :class:`RouterBase`'s ignores it."""

    def revise(self, budget: int, max_nodes: int, available: Sequence[bool],
               drafts: Sequence[DraftTree | None], budgets: Sequence[int]) -> Sequence[int]:
        """Called after each proposer that ran this step, in the engine's order, with the drafts so far
        (``drafts[j]`` None for a proposer still to run, empty for one skipped or faulty) and the current
        per-proposer numbers. Returns new ones: for a proposer still to run its node budget (0 = skip it), for
        one that drafted how many of its nodes to keep (a prefix; more than it drafted keeps all). A cascade:
        cheap proposers first, the costly ones only when the cheap ones' drafts look short.
        :class:`RouterBase`'s keeps every number as it is."""


class RouterBase:
    """Convenience base: stores the config; runs every proposer with the full budget."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[RouterConfig]] = RouterConfig

    def __init_subclass__(cls, **kwargs: Any) -> None:  # a Config it inherits: with `name: Literal[cls.name]`
        super().__init_subclass__(**kwargs)
        own_config(cls)

    def __init__(self, config: RouterConfig, target: TargetInfo | None = None) -> None:
        self.config = config
        self.target = target

    def start(self, proposers: Sequence[str], seed: int, greedy: bool) -> None:
        self.proposers = tuple(proposers)

    def route(self, budget: int, max_nodes: int, available: Sequence[bool]) -> Sequence[int]:
        return [budget if ok else 0 for ok in available]

    def on_step(self, report: StepReport) -> None:
        return None

    def on_batch(self, rows: int, width: int) -> None:
        return None

    def revise(self, budget: int, max_nodes: int, available: Sequence[bool],
               drafts: Sequence[DraftTree | None], budgets: Sequence[int]) -> Sequence[int]:
        """Keeps the step's numbers as they are (see :meth:`Router.revise`)."""
        return list(budgets)
