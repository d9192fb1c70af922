"""Token-tree primitives: children, depths, attention mask and position ids. Pure functions; no model. The
accepted path through a tree (greedy and SpecInfer-style multi-draft rejection sampling) is in
:mod:`specframe.acceptance`, beside the chain rules.

Layout of one tree verification forward: input row 0 is the newest committed token (its KV is not cached
yet), rows ``1..N`` are draft nodes in topological order. Node ``i`` sits at depth ``depth[i]`` (children of the
newest token have depth 1) and attends to the cached past, the newest token, its ancestors and itself.

A token trie (:class:`TokenTrie`) merges token sequences by shared prefix, nodes numbered in insertion order. It is
the one place a draft tree is grown node by node from tokens: prompt lookup's branches (``ngram``), retrieved
continuations (``retrieval``) and several proposers' drafts (:func:`specframe.decode.merged_tree.merge_drafts`) all
insert into one and read back ``token`` / ``parent`` lists, which are a :class:`~specframe.contracts.DraftTree` in
topological order as they stand.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor

from .contracts.proposer import DraftTree


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
    """``[1, 1, N + 1, past_len + N + 1]`` additive mask (0 = attend, dtype's min = masked), on ``device``.

    Row 0 (newest token) sees the past and itself; row ``i + 1`` sees the past, the newest token, the ancestors
    of node ``i`` and node ``i`` itself.

    Only the ``[N + 1, N + 1]`` block over the newest token and the nodes is built on the host and copied (one
    small copy); the past columns (all 0) are filled on ``device``, so the copy does not grow with ``past_len``.
    """
    n = len(parent)
    block = [[False] * (n + 1) for _ in range(n + 1)]  # [N + 1, N + 1]: row sees column (newest token, nodes)
    block[0][0] = True
    for i, p in enumerate(parent):
        row = block[i + 1]
        if p >= 0:
            row[:] = block[p + 1]
        else:
            row[0] = True
        row[i + 1] = True
    sees = torch.tensor(block, dtype=torch.bool, device=device)
    tail = torch.zeros((n + 1, n + 1), dtype=dtype, device=device).masked_fill_(~sees, torch.finfo(dtype).min)
    past = torch.zeros((n + 1, past_len), dtype=dtype, device=device)
    return torch.cat([past, tail], 1)[None, None]


class TokenTrie:
    """Token sequences merged by shared prefix, under an optional node budget.

    Node ``i`` (numbered in insertion order, so ``parent[i] < i``) has ``token[i]``, ``parent[i]`` (``-1``: a
    child of the root, i.e. of the last committed token), ``depth[i]`` (1 for the root's children) and
    ``count[i]`` (how many insertions passed through it). ``children[p]`` lists the children of node ``p``
    (``p = -1``: the root) in insertion order. All five are plain Python lists / a dict, ``N`` entries each;
    read them, do not modify them.

    A *mergeable* node is the same node as any later mergeable insertion of the same token under the same parent
    (that insertion returns it and bumps its count). A node inserted with ``mergeable=False`` is never looked up:
    every such insertion makes a new node (a stochastic draft node under sampling must keep its own ``q``).

    Args:
        max_nodes: most nodes; an insertion that would need a new node beyond it returns None. None = no limit.

    Example::

        trie = TokenTrie(max_nodes=4)
        trie.add([1, 2, 3])            # -> [0, 1, 2]
        trie.add([1, 4, 5])            # -> [0, 3]: node 0 is shared, then the budget is spent
        trie.token, trie.parent        # ([1, 2, 3, 4], [-1, 0, 1, 0])
        trie.count, trie.depth         # ([2, 1, 1, 1], [1, 2, 3, 2])
    """

    def __init__(self, max_nodes: int | None = None) -> None:
        self.max_nodes = max_nodes
        self.token: list[int] = []  # [N] token id of each node
        self.parent: list[int] = []  # [N] parent node index, -1 = child of the root
        self.depth: list[int] = []  # [N] tokens from the root, 1 for the root's children
        self.count: list[int] = []  # [N] insertions that passed through the node
        self._index: dict[tuple[int, int], int] = {}  # (parent node, token) -> node, mergeable nodes only

    def __len__(self) -> int:
        return len(self.token)

    @property
    def children(self) -> dict[int, list[int]]:
        """Node (-1 = the root) -> its children, in insertion order (built when asked: the hot paths never ask)."""
        out: dict[int, list[int]] = {-1: []}
        for node, parent in enumerate(self.parent):
            out[node] = []
            out[parent].append(node)
        return out

    @property
    def full(self) -> bool:
        """True when a new node would exceed ``max_nodes``."""
        return self.max_nodes is not None and len(self.token) >= self.max_nodes

    def child(self, parent: int, token: int) -> int | None:
        """The mergeable child of ``parent`` (-1 = root) with ``token``, or None."""
        return self._index.get((parent, int(token)))

    def insert(self, parent: int, token: int, *, mergeable: bool = True) -> int | None:
        """Add one occurrence of ``token`` under node ``parent`` (-1 = root) and return its node index.

        A mergeable insertion reuses the existing mergeable child with that token (no budget spent); otherwise a
        new node is appended, or, when the trie is :attr:`full`, nothing changes and None is returned. The
        returned node's ``count`` goes up by one.

        Raises:
            IndexError: ``parent`` is not -1 or an existing node.
        """
        token = int(token)
        if not -1 <= parent < len(self.token):
            raise IndexError(f"parent node {parent} is not -1 or one of the {len(self.token)} nodes")
        node = self._index.get((parent, token)) if mergeable else None
        if node is None:
            node = len(self.token)
            if self.max_nodes is not None and node >= self.max_nodes:
                return None
            self.token.append(token)
            self.parent.append(parent)
            self.depth.append(self.depth[parent] + 1 if parent >= 0 else 1)
            self.count.append(0)
            if mergeable:
                self._index[(parent, token)] = node
        self.count[node] += 1
        return node

    def add(self, sequence: Iterable[int], parent: int = -1, *, mergeable: bool = True) -> list[int]:
        """Insert ``sequence`` as a path below ``parent`` (-1 = root), token by token (see :meth:`insert`).

        Returns:
            The node index of each inserted token: all of them, or a prefix when the budget ran out.
        """
        nodes: list[int] = []
        for token in sequence:
            node = self.insert(parent, token, mergeable=mergeable)
            if node is None:
                break
            nodes.append(node)
            parent = node
        return nodes

    def to_draft(self, draft_probs: Tensor | None = None) -> DraftTree:
        """The trie as a single-row draft: ``token_ids`` / ``parent`` ``[1, N]`` int64 in insertion order.

        Args:
            draft_probs: ``[N, V]`` or ``[1, N, V]`` float32 q rows, one per node, or None (deterministic).
        """
        return DraftTree.from_lists(self.token, self.parent, draft_probs)
