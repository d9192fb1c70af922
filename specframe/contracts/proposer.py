"""The contracts between the engine and its plugins: drafts, decode state, verification results.

Glossary (shapes): B batch, T committed sequence length, N draft-tree nodes, K draft length of a chain,
V vocabulary, H hidden size, F feature layers (the terms and every letter: docs/how-it-works.md, "Vocabulary").

Terms: a *draft* is a token tree proposed by a *proposer*; the *target* scores every node in one forward; the
*verifier* walks the tree and keeps an *accepted* path; after the first rejection it draws a *recovered* token
from the residual distribution, and when every node on a path passes it draws a *bonus* token from the target
distribution after the last node. Either way, each step commits ``accepted + 1`` tokens.

Every structure carries a batch dimension B; the engine runs B = 1 for now.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Literal,
    Protocol,
    Sequence,
    Union,
    get_args,
    get_origin,
    runtime_checkable,
)

import torch
from pydantic import BaseModel, ConfigDict, create_model, model_validator
from torch import Tensor

from ..sampling import SamplingParams

if TYPE_CHECKING:
    from ..target.cost import CostCurve


@dataclass(frozen=True, slots=True)
class DraftTree:
    """A proposer's draft: a token tree in topological order (a chain is the one-child case).

    Node ``i`` continues the path to ``parent[b, i]``; ``-1`` means it continues the last committed token.
    Parents come before children (``parent[b, i] < i``).

    Where a draft lives: on any device. The engine reads a draft's structure (``token_ids``, ``parent``) on the
    host — :meth:`on_host`, one copy per draft when the proposer made it on an accelerator, the one host sync the
    draft costs — merges and checks it there, and copies the step's ids to the target's device once, for the
    verification forward; ``draft_probs`` stay where they were made and the verifier moves them to the target's
    logits (one copy when they differ). A drafter on the target's GPU therefore returns its tensors as they are.
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

    @staticmethod
    def from_lists(
        token_ids: Sequence[int], parent: Sequence[int], draft_probs: Tensor | None = None
    ) -> "DraftTree":
        """A single-row (B = 1) draft tree from Python lists.

        Args:
            token_ids: ``[N]`` token ids, in topological order.
            parent: ``[N]`` parent node indices (``parent[i] < i``; -1 = child of the last committed token).
            draft_probs: ``[N, V]`` or ``[1, N, V]`` float32 q rows, or None for a deterministic proposal.

        Returns:
            ``token_ids`` / ``parent`` as ``[1, N]`` int64 tensors, ``draft_probs`` as ``[1, N, V]`` (a view).

        Raises:
            ValueError: ``token_ids`` and ``parent`` differ in length, or ``draft_probs`` is not ``[N, V]`` /
                ``[1, N, V]``.

        Example: ``DraftTree.from_lists([5, 6, 7], [-1, 0, 0]).token_ids`` is ``tensor([[5, 6, 7]])``.
        """
        n = len(token_ids)
        if len(parent) != n:
            raise ValueError(f"from_lists: {n} token ids but {len(parent)} parents")
        ids = torch.tensor(list(token_ids), dtype=torch.int64).reshape(1, n)
        par = torch.tensor(list(parent), dtype=torch.int64).reshape(1, n)
        probs = None
        if draft_probs is not None:
            shape = tuple(draft_probs.shape)
            if not (len(shape) == 2 or (len(shape) == 3 and shape[0] == 1)) or shape[-2] != n:
                raise ValueError(f"from_lists: draft_probs must be [{n}, V] or [1, {n}, V], got {list(shape)}")
            probs = draft_probs.reshape(1, n, shape[-1])
        return DraftTree(ids, par, probs)

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

    def on_host(self) -> "DraftTree":
        """This draft with ``token_ids`` and ``parent`` on the CPU (one stacked copy, so one host sync, when they
        live elsewhere; ``self`` when they are already there); ``draft_probs`` stay on their device."""
        ids, parent = self.token_ids, self.parent
        if ids.device.type == "cpu" and parent.device.type == "cpu":
            return self
        if ids.shape == parent.shape and ids.dtype == parent.dtype and ids.device == parent.device:
            both = torch.stack([ids, parent]).cpu()
            return DraftTree(both[0], both[1], self.draft_probs)
        return DraftTree(ids.cpu(), parent.cpu(), self.draft_probs)

    def to(self, device: torch.device | str) -> "DraftTree":
        """This draft with every tensor on ``device`` (``self`` when they are all there already)."""
        dev = torch.device(device)
        tensors = [t for t in (self.token_ids, self.parent, self.draft_probs) if t is not None]
        if all(t.device == dev for t in tensors):
            return self
        probs = None if self.draft_probs is None else self.draft_probs.to(dev)
        return DraftTree(self.token_ids.to(dev), self.parent.to(dev), probs)

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
    hidden: Tensor | None = None  # [B, H] target's last hidden state at the last accepted position, the one
    # before the newest committed token (the newest is not processed yet; nodes rejected after it do not count);
    # filled only when a proposer declares needs_hidden_states
    features: Tensor | None = None  # [B, T_f, F, H] target dtype: hidden states of the layers ``feature_layers``
    # at positions 0..T_f-1, every position the target has processed (T_f = T - 1 between steps: all committed
    # tokens but the newest); filled only when a proposer declares ``feature_layers`` and the target supports it
    feature_layers: tuple[int, ...] = ()  # transformers hidden_states indices of ``features``' F axis, ascending
    constraint: Any = None  # the request's structured-output constraint, read-only (contracts.constraint.ConstraintView)
    # past the committed tokens, or None; proposers may read it (e.g. ``forced``) and must not commit to it

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

    draft: DraftTree  # what this proposer drafted and the target verified (after truncation to its node budget and,
    # when combined, to the merged tree's node budget: a prefix of what propose returned)
    accepted_nodes: tuple[tuple[int, ...], ...]  # [B][A_b] accepted node indices of that draft
    committed: tuple[tuple[int, ...], ...]  # [B][C_b] tokens committed this step, after stop checks
    finished: bool  # a stop condition ended the request in this step
    target_tokens: tuple[tuple[int, ...], ...] | None = None  # [B][1 + N_b] the target's most likely token (argmax
    # of its logits) after the newest committed token (index 0) and after each node ``i`` of ``draft`` (index
    # ``i + 1``), given the path to that node; filled only for a proposer that declares ``reads_target_tokens``
    # (Jacobi / lookahead decoding reads its next guesses from them), else None

    @property
    def num_accepted(self) -> int:
        """Accepted nodes of row 0."""
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
    cost: CostCurve | None = field(default=None, compare=False)  # the target's measured cost curve v(n) =
    # T(n tokens) / T(1 token) on this machine (it follows thread changes), or None when nothing was measured
    engine: str = "transformers"  # what runs the target: "transformers" (``model`` is its torch module) or
    # "llama.cpp" (``model`` is None: no torch weights or hidden states to reuse)


@runtime_checkable
class TargetModel(Protocol):
    """The target as the engine uses it (:class:`specframe.target.hf.Target` is the transformers adapter; a test or
    replay target may be any object with these members).

    Optional: ``forward_features(input_ids, cache, layers, want_hidden, ...)`` -> ``(logits, hidden, features
    [B, n, F, H])`` for proposers that read hidden-state features; ``new_scorer(layers, want_hidden)`` -> the
    :class:`specframe.contracts.Scorer` of one request, for an engine with its own KV state (llama.cpp; default: the
    transformers KV-cache scorer); ``last_logits(ids)`` -> ``[V]`` float32 logits after ``ids``; ``governor`` and
    ``settings`` (the machine profile's thread governor and chosen settings).
    """

    info: TargetInfo
    vocab_size: int  # V
    eos_token_ids: frozenset[int]
    max_context: int  # positions the target supports
    device: torch.device
    dtype: torch.dtype  # of its activations (the default scorer builds a token tree's attention mask in it)
    tokenizer: Any  # a transformers tokenizer, or None (then generated text is "")
    supports_trees: bool  # one tree mask serves every layer

    def decode(self, token_ids: list[int]) -> str:
        """Text of ``token_ids`` (special tokens skipped)."""

    def new_cache(self) -> Any:
        """An empty KV cache for one request."""

    def forward(self, input_ids: Tensor, cache: Any, want_hidden: bool = False, logits_to_keep: int = 0,
                attention_mask: Tensor | None = None, position_ids: Tensor | None = None
                ) -> tuple[Tensor, Tensor | None]:
        """One forward over ``input_ids [B, n]`` int64 appended after ``cache``: ``(logits [B, n, V], hidden
        [B, n, H] or None)``; ``attention_mask [B, 1, n, cached + n]`` additive and ``position_ids [B, n]`` for a
        token tree."""


class _NotANumber:
    """What :func:`numbers_as_numbers` puts in place of a bool or string given for a number field: no number, so the
    field's own check refuses it (its repr is the value given, for messages that show it)."""

    def __init__(self, given: Any) -> None:
        self.given = given

    def __repr__(self) -> str:
        return repr(self.given)


def numbers_as_numbers(cls: Any, data: Any) -> Any:
    """A config model's ``model_validator(mode="before")``: a bool or a string given for a number field (one typed
    ``int`` or ``float``, or None) is refused by the field's own check, naming the field, where pydantic's lax mode
    would read ``true`` as 1 and ``"5"`` as 5 (YAML's ``k: yes`` is true: the run would use k = 1, which nobody
    wrote)."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for name, f in cls.model_fields.items():
        key = name if name in out else f.alias
        kinds = get_args(f.annotation) if get_origin(f.annotation) in (Union, types.UnionType) else (f.annotation,)
        kinds = tuple(k for k in kinds if k is not type(None))
        if key in out and isinstance(out[key], (bool, str)) and kinds and all(k in (int, float) for k in kinds):
            out[key] = _NotANumber(out[key])
    return out


def names_itself(config: Any, name: str) -> bool:
    """Whether the config model ``config`` types its ``name`` as ``Literal[name]`` (what registration requires of a
    plugin's ``Config``, so a typed config holds the plugin's own config objects)."""
    field = config.model_fields.get("name") if isinstance(config, type) and issubclass(config, BaseModel) else None
    return field is not None and field.annotation == Literal[name]


def own_config(cls: type) -> None:
    """The plugin base classes' ``__init_subclass__``: a class that inherits its ``Config`` (the base's, whose
    ``name`` is a plain ``str``, or a parent plugin's) gets a subclass of it with ``name: Literal[cls.name]``; a
    ``Config`` the class declares itself is left as it is (registration checks it: :func:`names_itself`)."""
    name, config = getattr(cls, "name", None), getattr(cls, "Config", None)
    if "Config" in vars(cls) or not (isinstance(name, str) and name) or not (
            isinstance(config, type) and issubclass(config, BaseModel)) or names_itself(config, name):
        return
    cls.Config = create_model(f"{cls.__name__}Config", __base__=config, __module__=cls.__module__,
                              name=(Literal[name], name))
    cls.Config.__qualname__ = f"{cls.__qualname__}.Config"  # where pickle finds it


class ProposerConfig(BaseModel):
    """Base of every proposer's config. Subclasses add fields; ``name`` selects the proposer. A number option is
    given as a number (:func:`numbers_as_numbers`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str

    _numbers = model_validator(mode="before")(classmethod(numbers_as_numbers))


@runtime_checkable
class Proposer(Protocol):
    """Drafts tokens for the target to verify.

    Capability flags (class attributes, the same for every instance) tell the engine what a proposer needs and
    produces, so the engine never checks for a particular proposer; it reads them once per engine
    (:meth:`Capabilities.of`):

    - ``needs_hidden_states``: the engine fills ``DecodeState.hidden``.
    - ``produces_trees``: drafts may branch (branching drafts need a tree-capable verifier and target; where
      either takes chains only, the engine keeps each draft's leading chain).
    - ``provides_draft_probs``: drafts carry ``draft_probs``; otherwise they are deterministic (one-hot q).
    - ``reads_features`` (optional, default False): the proposer reads target hidden-state features; which layers
      it reads is the *instance* attribute ``feature_layers`` (they may depend on its weights), set in
      ``__init__``: transformers ``hidden_states`` indices (0 = the embeddings, ``i`` = after decoder layer
      ``i``) whose states at every processed position it reads from ``DecodeState.features`` (EAGLE-style
      drafters); the engine takes them from the verification forward it runs anyway. Hosts that cannot give
      features (e.g. vLLM) refuse such a proposer up front.
    - ``block_size`` (optional, default 0): a *block proposer* (DFlash, DFlash2, PARD) fills a block of
      ``block_size`` rows, the newest token and ``block_size - 1`` drafts, in one drafter forward, so drafting the
      whole block costs what drafting part of it does. The *instance* attribute (it may depend on its weights),
      set in ``__init__``. The engine then asks it for its whole block whenever it runs and verifies the prefix
      that pays: the router's choice from the measured cost curve (the block's *verify budget*), a block larger
      than the step can verify clipped (said once). Its drafts go at most ``block_size - 1`` deep; a tree of
      per-slot candidates is built by :func:`specframe.services.block_tree` (path scores consistent along a path).

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


@dataclass(frozen=True, slots=True)
class Capabilities:
    """A proposer's capability flags, read once (see :class:`Proposer`)."""

    needs_hidden_states: bool = False
    produces_trees: bool = False
    provides_draft_probs: bool = False
    feature_layers: tuple[int, ...] = ()  # [F] hidden_states indices it reads, ascending; () = none
    reads_target_tokens: bool = False  # its VerifyOutcome carries the target's argmax at each of its nodes
    block_size: int = 0  # a block proposer's rows per drafter forward (newest token + drafts); 0 = not one

    @staticmethod
    def of(proposer: Any) -> "Capabilities":
        """The flags of ``proposer`` (an instance: ``feature_layers`` and ``block_size`` may depend on its weights): the
        three the contract requires read directly, the optional three through :func:`~specframe.contracts.optional.optional`.

        Raises:
            AttributeError: a required flag is missing (registration refuses such a class first).
        """
        from .optional import optional

        return Capabilities(
            bool(proposer.needs_hidden_states),
            bool(proposer.produces_trees),
            bool(proposer.provides_draft_probs),
            tuple(sorted({int(i) for i in (optional(proposer, "feature_layers") or ())})),
            bool(optional(proposer, "reads_target_tokens")),
            max(int(optional(proposer, "block_size") or 0), 0),
        )


class ProposerBase:
    """Convenience base class with no-op ``start``/``on_verified`` and default capability flags."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[ProposerConfig]] = ProposerConfig
    needs_hidden_states: ClassVar[bool] = False
    produces_trees: ClassVar[bool] = False
    provides_draft_probs: ClassVar[bool] = False
    reads_features: ClassVar[bool] = False
    reads_target_tokens: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:  # a Config it inherits: with `name: Literal[cls.name]`
        super().__init_subclass__(**kwargs)
        own_config(cls)

    def __init__(self, config: ProposerConfig, target: TargetInfo) -> None:
        self.config = config
        self.target = target
        self.feature_layers: tuple[int, ...] = ()  # set by a proposer whose class reads_features
        self.block_size = 0  # set by a block proposer: rows its one drafter forward fills

    def start(self, state: DecodeState) -> None:
        return None

    def propose(self, state: DecodeState, budget: int) -> DraftTree:  # pragma: no cover - abstract
        raise NotImplementedError

    def on_verified(self, outcome: VerifyOutcome) -> None:
        return None


@runtime_checkable
class Verifier(Protocol):
    """Decides which draft nodes the target accepts and draws the recovered or bonus token.

    ``supports_trees``: can verify branching drafts. Which verifier a request uses is configured by name
    (``verifier: auto`` = ``greedy`` at temperature 0, else ``speculative-sampling``).
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
