"""Token-tree primitives: attention mask, position ids, and the accepted path (greedy and SpecInfer-style
multi-draft rejection sampling). Pure functions; no model.

Layout of one tree verification forward: input row 0 is the newest committed token (its KV is not cached
yet), rows ``1..N`` are draft nodes in topological order. Node ``i`` sits at depth ``depth[i]`` (children of the
newest token have depth 1) and attends to the cached past, the newest token, its ancestors and itself.

Sampling over a tree follows SpecInfer (Miao et al. 2024, "SpecInfer", Algorithm 2, multi-step speculative
sampling): at a node, children are tried in order; child ``c`` with token ``x`` drawn from ``q_c`` is accepted
with probability ``min(1, p(x) / q_c(x))``; after a rejection the target distribution is replaced by the
residual ``norm(max(0, p − q_c))`` before the next sibling is tried; if every child is rejected the recovered
token is drawn from the current residual. When a path reaches a leaf, the bonus token is drawn from the target
distribution after it. Deterministic nodes use one-hot ``q``, so a second sibling with the token of an already
rejected one is rejected with certainty (its residual mass is zero).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .verify import RESIDUAL_EPS


def children_of(parent: list[int]) -> list[list[int]]:
    """``children[0]`` = children of the root (newest committed token), ``children[i + 1]`` = of node ``i``."""
    kids: list[list[int]] = [[] for _ in range(len(parent) + 1)]
    for i, p in enumerate(parent):
        kids[p + 1].append(i)
    return kids


def node_depths(parent: list[int]) -> list[int]:
    """Depth of each node (root's children: 1). Parents must precede children."""
    depth: list[int] = []
    for p in parent:
        depth.append(1 if p < 0 else depth[p] + 1)
    return depth


def tree_position_ids(parent: list[int], past_len: int, device: torch.device | str = "cpu") -> Tensor:
    """``[1, N + 1]`` int64 positions: the newest token at ``past_len``, node ``i`` at ``past_len + depth[i]``."""
    return torch.tensor([[past_len] + [past_len + d for d in node_depths(parent)]], dtype=torch.int64, device=device)


def tree_attention_mask(parent: list[int], past_len: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> Tensor:
    """``[1, 1, N + 1, past_len + N + 1]`` additive mask (0 = attend, dtype's min = masked).

    Row 0 (newest token) sees the past and itself; row ``i + 1`` sees the past, the newest token, the ancestors
    of node ``i`` and node ``i`` itself.
    """
    n = len(parent)
    allowed = torch.zeros((n + 1, past_len + n + 1), dtype=torch.bool)
    allowed[:, : past_len + 1] = True
    for i, p in enumerate(parent):
        if p >= 0:
            allowed[i + 1, past_len + 1 :] = allowed[p + 1, past_len + 1 :]
        allowed[i + 1, past_len + 1 + i] = True
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def greedy_tree(target_argmax: list[int], tokens: list[int], parent: list[int]) -> tuple[list[int], int]:
    """Longest path whose every node equals the target's argmax at its parent.

    Args:
        target_argmax: ``N + 1`` ids; entry 0 after the newest token, entry ``i + 1`` after node ``i``.
        tokens: ``N`` node tokens; parent: ``N`` parent indices.

    Returns:
        ``(path, next_token)``: accepted node indices root-first and the target's argmax after the path.
    """
    kids = children_of(parent)
    path: list[int] = []
    row = 0
    while True:
        want = target_argmax[row]
        nxt = next((c for c in kids[row] if tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        row = nxt + 1


def sampling_tree(
    target_probs: Tensor, draft_probs: Tensor | None, tokens: list[int], parent: list[int], generator: torch.Generator
) -> tuple[list[int], int]:
    """Multi-draft recursive rejection sampling over a token tree (see the module docstring).

    Args:
        target_probs: ``[N + 1, V]`` float32 warped target distributions (row 0: after the newest token).
        draft_probs: ``[N, V]`` float32, ``q`` each node's token was drawn from; None = one-hot for all.
        tokens, parent: ``N`` node tokens and parent indices.
        generator: randomness.

    Returns:
        ``(path, next_token)``; the emitted tokens are distributed as sampling the target one token at a time.
    """
    kids = children_of(parent)
    path: list[int] = []
    row = 0
    while True:
        p = target_probs[row]
        accepted = None
        for c in kids[row]:
            x = tokens[c]
            if draft_probs is None:
                q = torch.zeros_like(p)
                q[x] = 1.0
            else:
                q = draft_probs[c]
            u = float(torch.rand((), generator=generator, device=p.device))
            if u * float(q[x]) < float(p[x]):
                accepted = c
                break
            residual = (p - q).clamp_min(0.0)
            mass = float(residual.sum())
            p = p if mass <= RESIDUAL_EPS else residual / mass
        if accepted is None:
            return path, int(torch.multinomial(p, 1, generator=generator))
        path.append(accepted)
        row = accepted + 1
