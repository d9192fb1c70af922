"""The optional members of the contracts, in one place.

A plugin or target that implements a Protocol structurally (without the convenience base classes) may leave out the
members listed here; :func:`optional` reads one, or its default when it is absent. Every other contract member is
required and read directly (``router.route(...)``, ``target.supports_trees``, ``info.cost``).
"""

from __future__ import annotations

from typing import Any

#: member -> (who may declare it, default when absent, what it is)
OPTIONAL: dict[str, tuple[str, Any, str]] = {
    "reads_features": ("Proposer class", False, "reads target hidden-state features (which: feature_layers)"),
    "feature_layers": ("Proposer instance", (), "[F] hidden_states indices it reads as features"),
    "reads_target_tokens": ("Proposer", False, "its VerifyOutcome carries the target's argmax at its nodes"),
    "block_size": ("Proposer instance", 0, "rows of the block one drafter forward fills (0: not a block proposer); "
                   "its drafts reach at most block_size - 1 deep and cost the same at any budget"),
    "forward_features": ("TargetModel", None, "forward_features(...) -> (logits, hidden, features [B, n, F, H])"),
    "new_scorer": ("TargetModel", None, "new_scorer(layers, want_hidden) -> one request's Scorer (own KV state)"),
    "new_batch": ("TargetModel", None, "new_batch(rows) -> a batch for batched decoding, or None"),
    "rollback": ("TargetModel", None, "rollback(cache, length): its own KV rollback (llama.cpp)"),
    "last_logits": ("TargetModel", None, "last_logits(ids) -> [V] float32 logits after ids"),
    "governor": ("TargetModel", None, "the machine profile's thread governor"),
    "settings": ("TargetModel", None, "the machine profile's chosen settings"),
    "close": ("Scorer, a target's batch", None, "close(): give the request's or batch's resources back"),
    "describe": ("TargetModel", None, "describe() -> the engine and its build, for records (llama.cpp)"),
    "engine": ("TargetModel", "transformers", "the name of the engine that runs it"),
}


def optional(obj: Any, member: str) -> Any:
    """``obj.<member>`` for a member the contracts declare optional (:data:`OPTIONAL`), else its default.

    Raises:
        KeyError: ``member`` is not optional in any contract (read a required member directly).
    """
    try:
        default = OPTIONAL[member][1]
    except KeyError:
        raise KeyError(f"{member!r} is not an optional contract member: read it directly") from None
    return getattr(obj, member, default)
