"""The constraint contract: structured output (JSON schema, JSON mode, regex, Lark grammar) under speculation.

A *constraint engine* (a plugin registered with ``specframe_register_constraint_engines``; the built-in one is
``llguidance``, :mod:`specframe.grammar`) compiles a :class:`ConstraintSpec` into one request's :class:`Constraint`:
the grammar state after the committed tokens. The decode loop (:mod:`specframe.decode.engine`) uses it at three
points of each step, and never names an engine:

1. **drafts** — each proposer's draft keeps its longest prefix the grammar allows along each node's path
   (:meth:`Constraint.allowed_prefix`), so no target row is spent on a node the grammar forbids. Under sampling
   only deterministic drafts are cut: cutting a sampled node because of its own token would change which tokens
   are emitted (its rejection subtracts its ``q`` from the target distribution, Leviathan et al. 2022 §2.3);
   a forbidden sampled node is verified and rejected with certainty instead.
2. **verification** — each row of the target's logits is masked by the grammar state reached along that row's path
   (:meth:`Constraint.mask`: forbidden tokens to ``-inf``), and the request's acceptance rule (greedy, speculative
   sampling, SpecInfer's tree rule) runs on the masked logits, i.e. on the constrained distribution. Output is
   exactly that of constrained decoding without speculation: token-identical under greedy, the same distribution
   under sampling (the mask is applied before temperature / top-k / top-p, as transformers applies a logits
   processor before its warpers).
3. **commit** — the committed tokens advance the grammar state (:meth:`Constraint.commit`).

A proposer reads the constraint from ``DecodeState.constraint``, a :class:`ConstraintView` that can ask but not
advance (e.g. the ``grammar`` proposer drafts the tokens the grammar forces, :meth:`Constraint.forced`).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Protocol, Sequence, runtime_checkable

from pydantic import BaseModel, ConfigDict, field_validator, model_validator
from torch import Tensor

from .proposer import DraftTree

#: The deepest a JSON schema may nest, in levels of JSON objects and arrays (the schema itself is level 1; an object
#: property's schema is two levels under its object's, ``properties`` then the property; an array's ``items`` one).
#: Deeper schemas are refused with one ConstraintError / HTTP 400 before anything reads them. The engines' own limits
#: are above it: llguidance 1.9 reads a schema up to 124 levels (its grammar's JSON parser stops at 128, three of them
#: its own wrapper), pydantic's JSON serializer up to 255; a tool call's schema in ``specframe serve`` wraps the tool's
#: ``parameters`` up to 4 levels deeper (:data:`TOOL_WRAP_DEPTH`).
MAX_SCHEMA_DEPTH = 100
#: The levels a tool call's answer schema (``tool_choice: required`` over several tools) adds above a tool's
#: ``parameters``: ``{"anyOf": [{"properties": {"arguments": <parameters>}}]}``. A tool's ``parameters`` may nest
#: ``MAX_SCHEMA_DEPTH - TOOL_WRAP_DEPTH`` levels.
TOOL_WRAP_DEPTH = 4


def schema_depth(value: Any) -> int:
    """How many levels of JSON objects and arrays ``value`` nests (0 for a scalar). Iterative: any depth is measured
    without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def check_schema_depth(schema: Any, what: str = "the schema", limit: int = MAX_SCHEMA_DEPTH,
                       why: str = "specframe.contracts.constraint.MAX_SCHEMA_DEPTH") -> None:
    """Refuse a schema that nests more than ``limit`` levels of objects and arrays (``why``: where the limit comes
    from, for the message).

    Raises:
        ValueError: one line naming the depth and the limit.
    """
    depth = schema_depth(schema)
    if depth > limit:
        raise ValueError(f"{what} nests {depth} levels of JSON objects and arrays; the limit is {limit} ({why}): "
                         "flatten it, or use $defs and $ref")


class ConstraintSpec(BaseModel):
    """What the output must match: exactly one of ``json_schema``, ``json_object``, ``regex``, ``grammar``.

    ``json_schema``: a JSON Schema (a mapping, or its JSON text; at most :data:`MAX_SCHEMA_DEPTH` levels deep);
    ``json_object``: any JSON object (OpenAI's JSON
    mode); ``regex``: a regular expression the whole output matches; ``grammar``: a Lark grammar (llguidance's
    dialect, start rule ``start``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None

    @field_validator("json_schema", mode="before")
    @classmethod
    def _schema_text(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except json.JSONDecodeError as exc:
                raise ValueError(f"json_schema is not valid JSON: {exc}") from None
            except RecursionError:  # (Python's JSON reader stops near 1000 levels)
                raise ValueError(f"the schema nests deeper than Python's JSON reader goes; the limit is "
                                 f"{MAX_SCHEMA_DEPTH} levels (specframe.contracts.constraint.MAX_SCHEMA_DEPTH)") from None
        if v is not None and not isinstance(v, dict):
            raise ValueError(f"json_schema must be a JSON object (a mapping), got {type(v).__name__}")
        if v is not None:
            check_schema_depth(v, "the schema")  # before anything serialises or compiles it
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> "ConstraintSpec":
        given = [k for k in ("json_schema", "json_object", "regex", "grammar") if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("give exactly one of json_schema, json_object, regex, grammar"
                             + (f" (got {', '.join(given)})" if given else ""))
        for k in ("regex", "grammar"):
            if getattr(self, k) == "":
                raise ValueError(f"{k} is empty")
        return self

    @property
    def kind(self) -> str:
        """``json_schema`` | ``json_object`` | ``regex`` | ``grammar``."""
        return next(k for k in ("json_schema", "json_object", "regex", "grammar") if getattr(self, k) not in (None, False))


@runtime_checkable
class Constraint(Protocol):
    """One request's grammar state (see the module docstring). Shapes: N draft nodes, V vocabulary."""

    def allowed_prefix(self, draft: DraftTree) -> int:
        """How many of ``draft``'s first nodes (in its topological order) the grammar allows, each along its own
        path from the committed tokens: the draft may be cut to that many. ``draft``: ``[1, N]``."""

    def mask(self, draft: DraftTree, logits: Tensor) -> Tensor:
        """``logits [1, N + 1, V]`` (row 0 after the committed tokens, row ``i + 1`` after node ``i``) with each row's
        forbidden tokens set to ``-inf``; a new tensor, same dtype and device. Rows after a node the grammar forbids
        are left as they are (no accepted path reaches them).

        Raises:
            ConstraintError: the grammar admits no token after the committed tokens.
        """

    def commit(self, tokens: Sequence[int]) -> None:
        """Advance past the committed ``tokens`` (each one allowed by the masked distribution it was taken from)."""

    def forced(self, limit: int, after: Sequence[int] = ()) -> list[int]:
        """Up to ``limit`` tokens the grammar forces next, whatever the model says (may be empty): after the committed
        tokens, then ``after`` (a path the grammar allows; the state is left as it was)."""

    def choices(self, limit: int, after: Sequence[int] = ()) -> list[int] | None:
        """The tokens the grammar allows after the committed tokens and then ``after`` (a path it allows), in id
        order; None when there are more than ``limit`` (the state is left as it was)."""


class ConstraintView:
    """What a proposer sees of its request's constraint (``DecodeState.constraint``): it may ask what the grammar
    forces or allows, never advance or mask it — a proposer that did would change the request's output (the engine
    alone commits, after verification).

    Args:
        constraint: the request's :class:`Constraint`.
    """

    __slots__ = ("_constraint",)

    def __init__(self, constraint: Constraint) -> None:
        self._constraint = constraint

    def forced(self, limit: int, after: Sequence[int] = ()) -> list[int]:
        """:meth:`Constraint.forced`."""
        return self._constraint.forced(limit, after)

    def choices(self, limit: int, after: Sequence[int] = ()) -> list[int] | None:
        """:meth:`Constraint.choices`."""
        return self._constraint.choices(limit, after)

    def allowed_prefix(self, draft: DraftTree) -> int:
        """:meth:`Constraint.allowed_prefix` (leaves the grammar state as it was)."""
        return self._constraint.allowed_prefix(draft)


@runtime_checkable
class ConstraintEngine(Protocol):
    """Compiles constraints for one target's tokenizer (a plugin class; ``name`` selects it, ``constraint_engine:``
    in the config).

    ``__init__(tokenizer, vocab_size, eos_token_ids)``: the target's transformers tokenizer, its logits width ``V``
    and the token ids that end generation (a finished constraint allows only these).
    """

    name: ClassVar[str]

    def compile(self, spec: ConstraintSpec) -> Constraint:
        """A fresh :class:`Constraint` for one request.

        Raises:
            ConstraintError: the schema, regex or grammar is invalid, uses what the engine does not support, or admits
                no output the engine can produce (the message names it): refused here, before any decoding.
        """

    # Optional: a classmethod ``check(spec)`` that refuses (ConstraintError), with no model's tokenizer, a spec no
    # tokenizer could satisfy. :func:`specframe.config.load_config` calls it on a config file's ``constraint:``, so
    # such a constraint fails when the config loads rather than at the first request.
