"""Merging several proposers' drafts into one token tree, verified in a single target forward (pure; no model).

A *merge plan* says in which order the proposers' drafts are inserted and how many nodes of each (a prefix of
its draft, which in topological order is still a tree) may be taken; :func:`merge_drafts` inserts them into one
trie under a node budget and records the *provenance* of every merged node as a bitmask (bit ``j`` set: proposer
``j``, in the engine's order, produced this node).

Deduplication and exactness. Two nodes are the same node when they continue the same merged parent with the
same token. Under greedy verification any two such nodes may be merged (verification follows the target's
argmax down the tree, so a duplicate sibling could never be chosen instead). Under sampling, SpecInfer's
multi-draft rejection (:func:`specframe.acceptance.sampling_tree`) tries siblings in turn, subtracting each rejected
sibling's ``q`` from the target distribution:

- two *deterministic* nodes (one-hot ``q``, a draft without ``draft_probs``) with the same token may be merged:
  after the first is rejected the residual has no mass on that token, so the duplicate would be rejected with
  certainty — it only adds its children, which the merged node keeps;
- a *stochastic* node (its own ``draft_probs`` row) is never merged with anything: recursive rejection would have
  subtracted its ``q`` from the residual, so dropping it (or swapping its ``q`` for another node's) changes the
  distribution of what is emitted. It stays a sibling of its own, with its own ``q`` row.

The merged tree's ``draft_probs`` (sampling only, and only when a stochastic node is present) holds each
stochastic node's own ``q`` and a one-hot row for each deterministic node; under greedy it is None.
A node's presence never depends on its own sampled token (stochastic nodes are never deduplicated, and the
budget is spent in plan order), which the multi-draft exactness argument needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import Tensor

from ..contracts import DraftTree
from ..token_tree import TokenTrie, node_depths


@dataclass(frozen=True, slots=True)
class MergedDraft:
    """One verification tree built from several drafts, with provenance.

    ``node_of[j][i]`` is the merged index of proposer ``j``'s own node ``i``; proposer ``j`` contributed the
    first ``len(node_of[j])`` nodes of its draft (a prefix), the rest were left out by the node budget.
    """

    tree: DraftTree  # [1, N] the merged tree verified by the target
    sources: tuple[int, ...]  # [N] provenance bitmask: bit j set = proposer j produced the node
    node_of: tuple[tuple[int, ...], ...]  # [P][kept_j] own node index -> merged node index
    _depths: list[int] | None = field(default=None, compare=False, repr=False)  # [N], filled by depths()

    @staticmethod
    def single(draft: DraftTree, proposers: int = 1, index: int = 0) -> "MergedDraft":
        """The identity merge: ``draft`` (proposer ``index`` of ``proposers``) verified as it is."""
        n = draft.num_nodes
        node_of = tuple(tuple(range(n)) if j == index else () for j in range(proposers))
        return MergedDraft(draft, (1 << index,) * n, node_of)

    def depths(self) -> list[int]:
        """``[N]`` each merged node's depth (1 = a child of the newest committed token), computed once."""
        depths = self._depths
        if depths is None:  # (once: attribution and the metrics writer both read it)
            depths = node_depths(self.tree.parent.tolist()[0]) if self.tree.num_nodes else []
            object.__setattr__(self, "_depths", depths)
        return depths

    def kept(self, j: int) -> int:
        """How many of proposer ``j``'s nodes (a prefix of its draft) are in the merged tree."""
        return len(self.node_of[j])

    def own_accepted(self, j: int, path: Sequence[int], own_parent: Sequence[int]) -> tuple[int, ...]:
        """Proposer ``j``'s own node indices on the accepted ``path`` (merged indices), root first.

        ``own_parent`` is the parent list of proposer ``j``'s draft. Its accepted nodes are a prefix of the path
        (an own node's parent is an own node, and both map onto the path); when its draft holds duplicate
        deterministic nodes, the one whose own parent continues the own path is chosen.
        """
        out: list[int] = []
        prev = -1
        own = self.node_of[j]
        for m in path:
            nxt = next((i for i, mm in enumerate(own) if mm == m and own_parent[i] == prev), None)
            if nxt is None:
                break
            out.append(nxt)
            prev = nxt
        return tuple(out)

    def alone(self, j: int, path: Sequence[int]) -> int:
        """Accepted nodes only proposer ``j`` produced."""
        bit = 1 << j
        return sum(1 for m in path if self.sources[m] == bit)


def merge_drafts(
    drafts: Sequence[DraftTree],
    plan: Sequence[tuple[int, int]],
    max_nodes: int,
    *,
    greedy: bool,
) -> MergedDraft:
    """Insert the drafts into one deduplicated token tree.

    Args:
        drafts: one draft per proposer (``[1, N_j]``; an empty draft for a proposer that did not draft).
        plan: ``(proposer index, quota)`` in insertion order: the first ``quota`` nodes of that proposer's draft
            are inserted, in its own topological order. Proposers missing from the plan contribute nothing.
        max_nodes: most merged nodes. A node that would need a new merged node when the tree is full ends that
            proposer's contribution (so each proposer contributes a prefix of its draft); a duplicate of an
            existing node costs nothing.
        greedy: True under greedy verification: every duplicate is merged and the merged tree carries no
            ``draft_probs`` (greedy verification ignores them). False under sampling: only deterministic nodes
            are merged (see the module docstring).

    Returns:
        The merged tree (topological order: insertion order) with provenance.

    Example (greedy): ``[[1, 2, 3]]`` chain and ``[[1, 4]]`` chain, plan ``[(0, 3), (1, 2)]``, ``max_nodes`` 8 ->
    tokens ``[1, 2, 3, 4]``, parents ``[-1, 0, 1, 0]``, sources ``[0b11, 0b01, 0b01, 0b10]``.
    """
    trie = TokenTrie(max_nodes)
    sources: list[int] = []  # [N] provenance bitmask of each merged node
    rows: list[tuple[int, int] | None] = []  # [N] (proposer, own node) whose q row a stochastic merged node uses
    node_of: list[list[int]] = [[] for _ in drafts]
    for j, quota in plan:
        _insert_draft(trie, drafts[j], j, quota, greedy, sources, rows, node_of[j])
    tree = trie.to_draft(_q_rows(drafts, trie.token, rows))
    return MergedDraft(tree, tuple(sources), tuple(tuple(o) for o in node_of), trie.depth)


def _insert_draft(
    trie: TokenTrie,
    draft: DraftTree,
    j: int,
    quota: int,
    greedy: bool,
    sources: list[int],
    rows: list[tuple[int, int] | None],
    own: list[int],
) -> None:
    """Insert the first ``quota`` nodes of proposer ``j``'s ``draft`` into ``trie`` in its own order, stopping
    where a new merged node would exceed the budget.

    For each inserted own node: its merged index is appended to ``own`` and bit ``j`` is set in its ``sources``
    entry; a new merged node first gets its ``sources`` (0) and ``rows`` entries. Under sampling
    (``greedy=False``) a draft with ``draft_probs`` inserts non-mergeable (stochastic) nodes, each with its own
    q row ``(j, own node)``."""
    assert draft.token_ids.shape[0] == 1, "merging is for batch size 1"
    if quota <= 0 or not draft.num_nodes:
        return
    stochastic = draft.draft_probs is not None and not greedy
    ids = draft.token_ids[0, :quota].tolist()
    par = draft.parent[0, : len(ids)].tolist()
    for i, (tok, p) in enumerate(zip(ids, par)):
        m = trie.insert(-1 if p < 0 else own[p], tok, mergeable=not stochastic)
        if m is None:
            break
        if m == len(sources):  # a new merged node
            sources.append(0)
            rows.append((j, i) if stochastic else None)
        sources[m] |= 1 << j
        own.append(m)


def _q_rows(drafts: Sequence[DraftTree], tokens: Sequence[int], rows: Sequence[tuple[int, int] | None]
            ) -> Tensor | None:
    """The merged tree's ``draft_probs``: ``[1, N, V]`` float32, each stochastic node's own q row (``rows[m]`` =
    (proposer, own node)) and a one-hot row for each deterministic node; None when no node is stochastic."""
    if all(src is None for src in rows):
        return None
    first = next(d.draft_probs for d in drafts if d.draft_probs is not None)
    probs = torch.zeros((1, len(tokens), int(first.shape[-1])), dtype=torch.float32, device=first.device)
    for m, (tok, src) in enumerate(zip(tokens, rows)):
        if src is None:
            probs[0, m, tok] = 1.0  # deterministic node: one-hot q
        else:
            j, i = src
            probs[0, m] = drafts[j].draft_probs[0, i].to(torch.float32)
    return probs


def check_plan(plan: Sequence[tuple[int, int]], proposers: int) -> list[tuple[int, int]]:
    """Validate a merge policy's plan: ``(index, quota)`` pairs with distinct indices in ``[0, proposers)`` and
    ``quota >= 0``.

    Raises:
        ValueError: naming the broken rule.
    """
    out, seen = [], set()
    for entry in plan:
        j, quota = (int(x) for x in entry)
        if not 0 <= j < proposers or j in seen:
            raise ValueError(f"a merge plan must name each proposer index in [0, {proposers}) at most once, got {j}")
        if quota < 0:
            raise ValueError(f"a merge plan quota must be >= 0, got {quota} for proposer {j}")
        seen.add(j)
        out.append((j, quota))
    return out
