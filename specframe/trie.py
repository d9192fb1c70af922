"""A token trie: token sequences merged by shared prefix, nodes numbered in insertion order (pure; no model).

The one place a draft tree is grown node by node from tokens: prompt lookup's branches (``ngram``), retrieved
continuations (``retrieval``) and several proposers' drafts (:func:`specframe.decode.merge.merge_drafts`) all insert into a
:class:`TokenTrie` and read back ``token`` / ``parent`` lists, which are a :class:`~specframe.contracts.DraftTree`
in topological order as they stand.
"""

from __future__ import annotations

from typing import Iterable

from torch import Tensor

from .contracts import DraftTree


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
