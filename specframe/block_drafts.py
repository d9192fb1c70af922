"""A block drafter's per-slot candidates as one token tree, best paths first (pure; no model).

A block proposer (DFlash, DFlash2, PARD: one drafter forward fills a block of ``K`` slots) has, at each slot ``i``, a
score for every token. Its chain (the best token of each slot, or a selector's best chain) is what it drafts when
it drafts a chain; its other good tokens at a slot are *candidates* the target can verify in the same forward as
siblings of the chain's node at that slot. Two things keep such a tree exact and worth its nodes:

- **Which paths exist.** Slot ``i + 1``'s scores were computed for the chain's token at slot ``i`` (DFlash2's
  selector is causal in the block: its score of slot ``i + 1`` reads the token chosen at slot ``i``) or for no token
  at all (DFlash's and PARD's rows read mask tokens: per-slot marginals). Either way they say nothing about what
  follows a *candidate*, so a candidate is a leaf: every path of the tree is the chain's prefix followed by at most
  one candidate. No path continues with a slot score that was not computed for that path's tokens.
- **Which nodes are kept.** A node's score is its *path score*, the product of the chain's slot scores down to its
  parent times its own: ``s(chain_i) = prod_{j <= i} c_j`` and ``s(alt_{i,m}) = prod_{j < i} c_j * a_{i,m}``, each
  factor a probability in [0, 1], so a score never grows along a path (consistent along a path, as EAGLE-2's
  dynamic tree, Li et al. 2024, eq. 2, and SpecInfer's expansion, Miao et al. 2024, score theirs). The tree keeps
  the ``max_nodes`` best nodes, ordered by score (ties: shallower first), which is a topological order; so every
  prefix of it (what a node budget or a router keeps) is again the best tree of its size.

Greedy verification follows the target's argmax down the tree; a candidate is a deterministic node (one-hot q),
so this tree is exact under greedy decoding. Under sampling a block proposer drafts its chain alone (a candidate
chosen as "the best token but the drawn one" would depend on the drawn token, which SpecInfer's multi-draft rule
forbids).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .contracts import DraftTree


def block_tree(chain: Tensor, chain_scores: Tensor, candidates: Tensor, candidate_scores: Tensor,
               max_nodes: int) -> DraftTree:
    """The best ``max_nodes`` nodes of a block's chain and its per-slot candidates, as one draft tree.

    Args:
        chain: ``[K]`` int64, the chain's token at each slot (slot 0 follows the newest committed token).
        chain_scores: ``[K]`` float, the probability the drafter gives the chain's token at each slot, given the
            chain before it (a causal score) or given nothing (a per-slot marginal); each in [0, 1].
        candidates: ``[K, M]`` int64, other tokens at each slot, best first (a slot's entry equal to its chain
            token, or ``-1``, is left out).
        candidate_scores: ``[K, M]`` float, their probabilities at that slot, in [0, 1].
        max_nodes: most nodes in the tree (>= 0).

    Returns:
        A single-row :class:`DraftTree` (deterministic: no ``draft_probs``): chain node ``i`` is a child of chain node
        ``i - 1``, a candidate at slot ``i`` a leaf child of chain node ``i - 1``; nodes ordered by path score,
        highest first, ties shallower first (see the module docstring). With ``M = 0`` it is the chain's first
        ``max_nodes`` tokens.

    Raises:
        ValueError: the shapes disagree, or a score is outside [0, 1].

    Example: chain ``[5, 6, 7]`` with scores ``[0.9, 0.5, 0.9]`` and one candidate per slot, ``[[8], [9], [4]]``
    scored ``[[0.05], [0.4], [0.05]]``, ``max_nodes=4``: the path scores are 0.9, 0.45, 0.405 for the chain and
    0.05, 0.36, 0.0225 for the candidates, so the tree is ``5 -> 6 -> 7`` with ``9`` a sibling of ``6``: tokens
    ``[5, 6, 7, 9]``, parents ``[-1, 0, 1, 0]``.
    """
    chain = torch.as_tensor(chain, dtype=torch.int64).reshape(-1).cpu()
    k = int(chain.shape[0])
    cs = torch.as_tensor(chain_scores, dtype=torch.float64).reshape(-1).cpu()
    cand = torch.as_tensor(candidates, dtype=torch.int64).cpu().reshape(k, -1)
    ascore = torch.as_tensor(candidate_scores, dtype=torch.float64).cpu().reshape(k, -1)
    if cs.shape[0] != k or cand.shape != ascore.shape:
        raise ValueError(f"block_tree: chain [{k}], chain_scores {list(cs.shape)}, candidates {list(cand.shape)} and "
                         f"candidate_scores {list(ascore.shape)} must agree ([K], [K], [K, M], [K, M])")
    for name, s in (("chain_scores", cs), ("candidate_scores", ascore)):
        if s.numel() and not bool(((s >= 0) & (s <= 1)).all()):
            raise ValueError(f"block_tree: {name} must be probabilities in [0, 1]")
    if k == 0 or max_nodes <= 0:
        return DraftTree.empty()
    through = torch.cumprod(cs, 0)  # [K] the chain's path score through slot i (x * c <= x for c <= 1: never grows)
    before = torch.cat([torch.ones(1, dtype=torch.float64), through[:-1]])  # [K] its path score before slot i
    # (score, depth, order, token, slot, is_chain): the chain's slot i at depth i + 1, a candidate at slot i too
    nodes: list[tuple[float, int, int, int, int, bool]] = []
    for i in range(k):
        nodes.append((float(through[i]), i + 1, 0, int(chain[i]), i, True))
        for m in range(cand.shape[1]):
            tok = int(cand[i, m])
            if tok < 0 or tok == int(chain[i]):
                continue
            nodes.append((float(before[i] * ascore[i, m]), i + 1, 1 + m, tok, i, False))
    nodes.sort(key=lambda n: (-n[0], n[1], n[2]))
    kept = nodes[:max_nodes]
    # a chain node's ancestors outrank it (score never grows, ties go shallower first), so kept is ancestor-closed
    index_of_chain: dict[int, int] = {}
    tokens: list[int] = []
    parent: list[int] = []
    for idx, (_, _, _, tok, slot, is_chain) in enumerate(kept):
        tokens.append(tok)
        parent.append(-1 if slot == 0 else index_of_chain[slot - 1])
        if is_chain:
            index_of_chain[slot] = idx
    return DraftTree.from_lists(tokens, parent)
