"""Token-tree primitives: children, depths, attention mask and position ids. Pure functions; no model. The
accepted path through a tree (greedy and SpecInfer-style multi-draft rejection sampling) is in
:mod:`specframe.verify`, beside the chain rules.

Layout of one tree verification forward: input row 0 is the newest committed token (its KV is not cached
yet), rows ``1..N`` are draft nodes in topological order. Node ``i`` sits at depth ``depth[i]`` (children of the
newest token have depth 1) and attends to the cached past, the newest token, its ancestors and itself.

"""

from __future__ import annotations

import torch
from torch import Tensor


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
