"""Targets that keep their recurrent state themselves: rollback by replay.

Some transformers models carry their state in an argument of their own instead of a ``Cache`` — RWKV (v4) takes and
returns ``state``, five ``[B, hidden, layers]`` tensors that its forward updates in place. Such a state cannot be
cut back to a position, so :class:`StateTarget` rolls back the other way (the field's "replay" choice, issue 52 2b):
before each forward it copies the state into buffers the request reuses (one state, whatever the draft length), and
when a verification accepts fewer tokens than it scored, it restores that copy and runs the accepted tokens through
the model again. A step whose draft is accepted whole costs one copy of the state; a rejection costs one more forward
over the accepted tokens. Trees are not verified (one state cannot hold several branches): such targets verify
chains.

Exactness is the engine's usual contract: a multi-token forward over the state must give the logits of decoding the
tokens one at a time, checked at load by :func:`specframe.target.probes.cached_forward_obstacle` through this
target's own forward and rollback.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch
from torch import Tensor

from ..decode.target_scorer import TargetScorer
from .hf import Target


def make_target(model: Any, tokenizer: Any = None, name: str = "") -> Target:
    """The target adapter for ``model``: :class:`~specframe.target.hf.Target` over specframe's KV cache, or for a
    model that keeps its recurrent state itself (RWKV's ``state=``) :class:`StateTarget`, which rolls back by replay.

    Raises:
        ConfigError: the model cannot be a target (the message says why, in one line).
    """
    return (StateTarget if keeps_own_state(model) else Target)(model, tokenizer, name)


def keeps_own_state(model: Any) -> bool:
    """The model's forward takes its recurrent state as ``state=`` and no KV ``cache`` (RWKV)."""
    params = inspect.signature(model.forward).parameters
    return "state" in params and "cache" not in params


class ModelState:
    """One request's state of a :class:`StateTarget`: the model's ``state`` after :attr:`length` positions, and what
    the last forward needs to be undone (the state before it, copied into reused buffers, and its tokens)."""

    def __init__(self) -> None:
        self.state: list[Tensor] | None = None  # the model's own state tensors (updated in place by its forward)
        self.length = 0  # positions the state has consumed
        self.saved: list[Tensor] = []  # the state before the last forward (buffers reused from step to step)
        self.saved_length = 0  # positions consumed before the last forward
        self.tokens: Tensor | None = None  # [B, n] int64: the last forward's tokens (None: nothing to undo)

    def get_seq_length(self) -> int:  # (the name the engine's cache helpers read)
        return self.length

    def save(self, tokens: Tensor) -> None:
        """Remember the state before a forward over ``tokens``."""
        if self.state is not None:
            if len(self.saved) != len(self.state):
                self.saved = [torch.empty_like(s) for s in self.state]
            for kept, live in zip(self.saved, self.state):
                kept.copy_(live)
        self.saved_length, self.tokens = self.length, tokens

    def restore(self) -> None:
        """Back to the state before the last forward."""
        if self.saved_length == 0:
            self.state = None  # (the last forward was the first: it made the state)
        elif self.state is not None:
            for live, kept in zip(self.state, self.saved):
                live.copy_(kept)
        self.length = self.saved_length


class StateTarget(Target):
    """A transformers causal LM whose forward keeps its state itself (``state=``, see the module docstring).

    Args: as :class:`~specframe.target.hf.Target`.

    Raises:
        ConfigError: the model's multi-token forward over its state does not reproduce its one-token decoding.
    """

    @staticmethod
    def load_obstacle(model: Any) -> str | None:
        from .probes import cached_forward_obstacle

        return cached_forward_obstacle(model, _StateRunner(model))

    @staticmethod
    def branching_obstacle(model: Any) -> str | None:
        return "its recurrent state is kept by the model, one state per request"

    def new_cache(self) -> ModelState:
        """An empty state for one request."""
        return ModelState()

    def new_scorer(self, layers: tuple[int, ...], want_hidden: bool) -> "StateScorer":
        """The scorer of one request (:class:`specframe.contracts.Scorer`): chains, rollback by replay."""
        return StateScorer(self, layers, want_hidden)

    def forward_features(
        self,
        input_ids: Tensor,
        cache: ModelState,
        layers: Sequence[int],
        want_hidden: bool = False,
        logits_to_keep: int = 0,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """As :meth:`Target.forward_features` (chains only), over a :class:`ModelState`.

        Raises:
            ValueError: a tree mask was given.
        """
        if attention_mask is not None:
            raise ValueError(f"{self.name} keeps its own recurrent state: it verifies chains, not token trees")
        out = state_forward(self.model, cache, input_ids, bool(want_hidden or layers), logits_to_keep)
        hidden = out.hidden_states[-1] if want_hidden else None
        feats = torch.stack([out.hidden_states[i] for i in layers], 2) if layers else None
        return out.logits, hidden, feats

    def rollback(self, cache: ModelState, length: int) -> None:
        """Keep the first ``length`` positions: restore the state before the last forward and replay its tokens up to
        ``length``.

        Raises:
            ValueError: ``length`` is beyond what the state holds, or before the last forward (only it can be undone).
        """
        state_rollback(self.model, cache, length)

    def restore(self, cache: ModelState) -> None:
        """Undo a forward that raised partway (the model may have updated its state in place before raising)."""
        if cache.tokens is not None:
            cache.restore()
            cache.tokens = None


class StateScorer(TargetScorer):
    """:class:`~specframe.decode.target_scorer.TargetScorer` over a :class:`StateTarget`: keep = rollback by replay."""

    target: StateTarget

    def keep(self, accepted: list[int]) -> None:
        self.target.rollback(self.cache, self.base + len(accepted))

    def undo(self) -> None:
        self.target.restore(self.cache)


def state_forward(model: Any, cache: ModelState, input_ids: Tensor, hidden_states: bool = False,
                  logits_to_keep: int = 0) -> Any:
    """The model's output over ``input_ids [B, n]`` int64 after ``cache``, which then holds them (undoable)."""
    cache.save(input_ids)
    out = model(input_ids=input_ids, state=cache.state, use_cache=True, output_hidden_states=hidden_states,
                logits_to_keep=logits_to_keep)
    cache.state, cache.length = list(out.state), cache.length + input_ids.shape[1]
    return out


def state_rollback(model: Any, cache: ModelState, length: int) -> None:
    """:meth:`StateTarget.rollback` (see there)."""
    if length > cache.length:
        raise ValueError(f"cannot roll the state forward: holds {cache.length} positions, asked for {length}")
    if length == cache.length:
        return
    if cache.tokens is None or length < cache.saved_length:
        raise ValueError(f"cannot roll the state back to {length} positions: only its last forward (from "
                         f"{cache.saved_length}) can be undone")
    tokens = cache.tokens[:, : length - cache.saved_length]
    cache.restore()
    cache.tokens = None
    if tokens.shape[1]:
        with torch.inference_mode():
            out = model(input_ids=tokens, state=cache.state, use_cache=True, logits_to_keep=1)
        cache.state, cache.length = list(out.state), cache.length + tokens.shape[1]


class _StateRunner:
    """How the load probes run a model that keeps its own state (:class:`StateTarget` before it exists)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def new_cache(self) -> ModelState:
        return ModelState()

    def forward(self, cache: ModelState, ids: Tensor, **kw: Any) -> Tensor:
        return state_forward(self.model, cache, ids).logits

    def rollback(self, cache: ModelState, length: int) -> None:
        state_rollback(self.model, cache, length)
