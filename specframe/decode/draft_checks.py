"""Checks that a draft honours the :class:`~specframe.contracts.DraftTree` contract before the target sees it.

The engine calls :func:`check_draft` on every draft (a failure turns the step into a target-only step, see
:mod:`specframe.decode.isolation`); the conformance kit (:mod:`specframe.testing`) calls it too, so a plugin author sees
the same message in their tests.
"""

from __future__ import annotations

import torch

from ..contracts import DraftTree
from ..errors import DraftError


def _prob_tolerance(dtype: torch.dtype) -> float:
    """How far a row of ``draft_probs`` may sum from 1: 1e-3, wider for low-precision dtypes (bfloat16)."""
    return max(1e-3, 2 * torch.finfo(dtype).eps)


def check_draft(draft: DraftTree, vocab_size: int, trees_ok: bool, batch: int | None = None) -> None:
    """Raise :class:`DraftError` naming the first broken rule.

    Rules: ``draft`` is a :class:`DraftTree`; ``token_ids`` and ``parent`` are ``[B, N]`` int64 with equal
    shapes (``B == batch`` when given); ids in ``[0, V)``; parents in ``[-1, i)`` for node ``i``; a chain unless
    ``trees_ok``; ``draft_probs`` (if any) is ``[B, N, V]`` floating, finite, non-negative, rows summing to 1
    (±1e-3, or 2 eps of a lower-precision dtype), and gives each drafted token a positive probability.
    """
    if not isinstance(draft, DraftTree):
        raise DraftError(f"propose must return a specframe.DraftTree, got {type(draft).__name__}")
    ids, parent = draft.token_ids, draft.parent
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or ids.dim() != 2:
        got = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise DraftError(f"token_ids must be a [B, N] int64 tensor, got {got}")
    if batch is not None and ids.shape[0] != batch:
        raise DraftError(f"token_ids must have batch size {batch} (the DecodeState's), got {ids.shape[0]}")
    if not isinstance(parent, torch.Tensor) or parent.dtype != torch.int64 or parent.shape != ids.shape:
        raise DraftError(f"parent must be int64 with the shape of token_ids {tuple(ids.shape)}")
    n = ids.shape[1]
    if n == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab_size:
        raise DraftError(f"token ids must be in [0, {vocab_size}), got {lo if lo < 0 else hi}")
    idx = torch.arange(n, dtype=torch.int64, device=parent.device)
    if bool((parent < -1).any()) or bool((parent >= idx).any()):
        raise DraftError("parents must come before their children (-1 <= parent[i] < i)")
    if not trees_ok and not draft.is_chain():
        raise DraftError(
            "branching draft where only chains are allowed (parent[i] == i - 1): the proposer must declare "
            "produces_trees, and the verifier and target must support trees (sliding-window targets do not)"
        )
    probs = draft.draft_probs
    if probs is not None:
        if not isinstance(probs, torch.Tensor) or not probs.is_floating_point():
            raise DraftError("draft_probs must be a floating [B, N, V] tensor")
        if tuple(probs.shape) != (ids.shape[0], n, vocab_size):
            raise DraftError(f"draft_probs must have shape {(ids.shape[0], n, vocab_size)}, got {tuple(probs.shape)}")
        tol = _prob_tolerance(probs.dtype)
        # every rule in one reading (one host sync where draft_probs live on an accelerator)
        off = (probs.float().sum(-1) - 1).abs().max()
        finite = torch.isfinite(probs).all() & ~(probs < 0).any()
        zero = (probs.gather(2, ids[..., None].to(probs.device)) <= 0).any()
        finite_ok, worst, has_zero = torch.stack([finite.float(), off.float(), zero.float()]).tolist()
        if not finite_ok:
            raise DraftError("draft_probs must be finite and >= 0")
        if not worst <= tol:
            raise DraftError(f"each draft_probs row must sum to 1 (±{tol:g}); one is off by {worst:.3g}")
        if has_zero:
            raise DraftError("a drafted token has draft probability 0: it cannot have been sampled from draft_probs")
