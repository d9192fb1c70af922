"""Checks that a draft honours the :class:`~specframe.contracts.DraftTree` contract before the target sees it."""

from __future__ import annotations

import torch

from .contracts import DraftTree
from .errors import DraftError


def check_draft(draft: DraftTree, vocab_size: int, trees_ok: bool) -> None:
    """Raise :class:`DraftError` naming the first broken rule.

    Rules: ``token_ids`` and ``parent`` are ``[B, N]`` int64 with equal shapes; ids in ``[0, V)``; parents in
    ``[-1, i)`` for node ``i``; a chain unless ``trees_ok``; ``draft_probs`` (if any) is ``[B, N, V]`` floating,
    non-negative, rows summing to 1 (±1e-3), and gives each drafted token a positive probability.
    """
    ids, parent = draft.token_ids, draft.parent
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or ids.dim() != 2:
        raise DraftError("token_ids must be a [B, N] int64 tensor")
    if not isinstance(parent, torch.Tensor) or parent.dtype != torch.int64 or parent.shape != ids.shape:
        raise DraftError(f"parent must be int64 with the shape of token_ids {tuple(ids.shape)}")
    n = ids.shape[1]
    if n == 0:
        return
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise DraftError(f"token ids must be in [0, {vocab_size})")
    idx = torch.arange(n, dtype=torch.int64, device=parent.device)
    if bool((parent < -1).any()) or bool((parent >= idx).any()):
        raise DraftError("parents must come before their children (-1 <= parent[i] < i)")
    if not trees_ok and not draft.is_chain():
        raise DraftError("this verifier accepts chains only (parent[i] == i - 1)")
    probs = draft.draft_probs
    if probs is not None:
        if not isinstance(probs, torch.Tensor) or not probs.is_floating_point():
            raise DraftError("draft_probs must be a floating [B, N, V] tensor")
        if tuple(probs.shape) != (ids.shape[0], n, vocab_size):
            raise DraftError(f"draft_probs must have shape {(ids.shape[0], n, vocab_size)}, got {tuple(probs.shape)}")
        sums = probs.float().sum(-1)
        if bool((probs < 0).any()) or not bool(torch.allclose(sums, torch.ones_like(sums), atol=1e-3)):
            raise DraftError("each draft_probs row must be a probability distribution (>= 0, summing to 1)")
        if bool((probs.gather(2, ids[..., None].to(probs.device)) <= 0).any()):
            raise DraftError("a drafted token has draft probability 0: it cannot have been sampled from q")
