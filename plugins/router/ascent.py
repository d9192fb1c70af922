"""The router's choice: how deep each proposer drafts (or how much of its draft is kept), by a greedy ascent of the
expected committed tokens per unit of step cost. Pure functions over plain lists and floats; the cost curve comes in
as a function.

Choice (greedy ascent, deterministic): with depths ``L_j`` (0 = skip), the expected committed tokens are
``E = 1 + sum_d [1 - prod_j (1 - reach[j][d] * [d <= L_j])]`` (the bonus token, plus depth ``d`` reached by any
proposer, treating proposers as independent — optimistic for correlated ones) and the cost in one-token forwards
is ``C = v(1 + sum_j nodes_j(L_j)) + sum_{j: L_j > 0} cost[j]`` with ``nodes_j(L) = ceil(sum_{d<=L}
width[j][d])``. Starting from nobody, it repeatedly deepens the one proposer (to any deeper level) that most
raises ``E / C``, while that ratio rises and the node budgets hold (each proposer's nodes <= the step's budget,
all together <= the merged tree's ``max_nodes``). A proposer's node budget is ``nodes_j(L_j)``. With a steep curve
(no native bf16) drafts are trimmed hard, and where no prefix of any draft raises ``E / C`` above plain decoding's
``1 / v(1)`` nothing is verified: speculation switches itself off (and the probes switch it back on when drafts
start to pay again, :mod:`.probes`).

Once a proposer has drafted (the cascade, :meth:`AdaptiveRouter.revise`), its options are the prefixes of its actual
draft (``nodes(L)`` = shortest prefix holding its nodes of depth <= L, :func:`prefix_levels`) valued with
``hit[j][d]``, the probability its nodes reach depth ``d`` on the accepted path given its kept draft reaches depth
``d`` — the product of per-depth continuation rates ``cont[j][d]`` (:func:`hit`) — and its draft cost counts as
spent (``fixed``). Every draft is trimmed to its chosen prefix, unless keeping it whole costs at most
``keep_tolerance`` (3 %) of the best E / C (:func:`keep_whole`): on a flat cost curve extra nodes are nearly free and
a trim must clearly pay.

The order of every sum and product here is part of the router's behaviour: the ascent compares ratios, and a
reordered sum can flip a decision.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Sequence

Cost = Callable[[float], float]  # v-like: the step's cost, in one-token forwards, of verifying n tokens


class Option(NamedTuple):
    """One proposer's options in the ascent."""

    levels: list[int]  # nodes(L) for L = 1..: node budget (or nodes kept) when it goes L deep; [] = not an option
    reach: Sequence[float]  # reach[d]: probability its nodes reach depth d + 1 on the accepted path (>= len(levels))
    cost: float  # its draft cost if chosen, one-token forwards (0 when already spent: a drafted proposer)


def levels_of(width: Sequence[float], dmax: int) -> list[int]:
    """``nodes(L)`` for L = 1..``dmax`` from per-depth widths: ``ceil(width[0] + ... + width[L - 1])`` (less 1e-9,
    so a sum that rounding left a hair above an integer stays there).

    Example: ``levels_of([1.0, 2.0, 0.5], 3) == [1, 3, 4]``."""
    levels, cum = [], 0.0
    for d in range(dmax):
        cum += width[d]
        levels.append(math.ceil(cum - 1e-9))
    return levels


def prefix_levels(depths: Sequence[int], dmax: int) -> list[int]:
    """For a drafted tree whose nodes (topological order) have ``depths`` (root's children: 1), ``nodes(L)`` for
    L = 1..its depth (at most ``dmax``): the shortest prefix (what :meth:`DraftTree.truncate` keeps) holding every
    node of depth <= L. ``[]`` for an empty draft.

    Example: depths ``[1, 2, 1, 3]`` give ``[3, 3, 4]`` (depth 1 needs the root at index 2)."""
    if not depths:
        return []
    deepest = min(max(depths), dmax)
    last = [0] * deepest  # last index of a node at each depth
    for i, d in enumerate(depths):
        if d <= deepest:
            last[d - 1] = i
    levels, need = [], 0
    for d in range(deepest):
        need = max(need, last[d] + 1)
        levels.append(need)
    return levels


def hit(cont: Sequence[float]) -> list[float]:
    """``hit[d]``: probability that a proposer's nodes on the accepted path reach depth ``d + 1`` given its kept
    draft reaches that depth: the running product ``cont[0] * ... * cont[d]`` of its continuation rates. Learning
    each depth's rate only when the path got there keeps what a long match is worth even after a run of misses
    (lookup drafts are all-or-nothing: bursts of long accepted copies between short misses).

    Example: ``hit([0.5, 0.5, 1.0]) == [0.5, 0.25, 0.25]``."""
    acc, prods = 1.0, []
    for c in cont:
        acc *= c
        prods.append(acc)
    return prods


def allocate(options: Sequence[Option], drafted: Sequence[bool], budget: int, max_nodes: int, dmax: int,
             fixed: float, cost: Cost, keep_tolerance: float = 0.0) -> tuple[list[int], list[int]]:
    """``(depth per proposer, nodes per proposer)`` by greedy ascent of E / C (module docstring).

    Args:
        options: per proposer (engine order), its levels, reach and draft cost.
        drafted: per proposer, True when it has drafted: its levels are prefixes of its draft, not capped by
            ``budget``, and its number is the nodes to keep.
        budget: the step's node budget per proposer (caps a proposer that has not drafted).
        max_nodes: the most nodes of all proposers together (the merged tree's).
        dmax: the deepest level planned (every ``levels`` is at most this long).
        fixed: draft cost already spent this step, one-token forwards.
        cost: the step's cost of verifying ``n`` tokens (the newest + drafts), one-token forwards.
        keep_tolerance: > 0: afterwards keep drafted proposers' drafts whole where that costs at most this
            fraction of the best E / C (:func:`keep_whole`).

    Example: one proposer, ``levels [1, 2, 3]``, ``reach [0.9, 0.5, 0.1]``, cost 0 on ``v(n) = 1 + 0.5 (n - 1)``:
    depth 1 gives (1 + 0.9) / 1.5 = 1.267 > 1; depth 2 (1 + 1.4) / 2 = 1.2 does not beat it: ``([1], [1])``.
    """
    p = len(options)
    depth, nodes = [0] * p, [0] * p
    total_nodes, extra_cost = 0, 0.0
    best_ratio = 1.0 / (cost(1) + fixed)
    while True:
        best = None
        for j, (levels, reach, cost_j) in enumerate(options):
            if len(levels) <= depth[j]:
                continue
            others = [1.0] * dmax  # chance no other chosen proposer reaches depth d + 1
            for i in range(p):
                if i != j and depth[i]:
                    r_i = options[i].reach
                    for d in range(depth[i]):
                        others[d] *= 1.0 - r_i[d]
            e_rest = 1.0 + sum(1.0 - o for o in others)  # E without j
            add = extra_cost + (0.0 if depth[j] else cost_j)
            gain = 0.0
            for d in range(len(levels)):
                gain += others[d] * reach[d]
                if d + 1 <= depth[j]:
                    continue
                n_j = levels[d]
                n_all = total_nodes - nodes[j] + n_j
                if (not drafted[j] and n_j > budget) or n_all > max_nodes:
                    break
                ratio = (e_rest + gain) / (cost(1 + n_all) + fixed + add)
                if ratio > best_ratio * (1 + 1e-9) and (best is None or ratio > best[0]):
                    best = (ratio, j, d + 1, n_j, add)
        if best is None:
            if keep_tolerance > 0:
                keep_whole(options, drafted, depth, nodes, fixed, max_nodes, best_ratio, keep_tolerance, cost)
            return depth, nodes
        best_ratio, j, d, n_j, extra_cost = best
        total_nodes += n_j - nodes[j]
        depth[j], nodes[j] = d, n_j


def keep_whole(options: Sequence[Option], drafted: Sequence[bool], depth: list[int], nodes: list[int], fixed: float,
               max_nodes: int, best: float, keep_tolerance: float, cost: Cost) -> None:
    """Keep each trimmed draft whole when that costs at most ``keep_tolerance`` of the best E / C (``best``): the
    statistics are noisy moving averages, and the tokens a trim throws away come in bursts (a long lookup match)
    that a short memory undervalues, while on a flat cost curve the nodes cost almost nothing. Updates ``depth``
    and ``nodes`` in place (arguments as :func:`allocate`'s)."""
    dmax = max((len(o.levels) for o in options), default=0)

    def ratio(dep: list[int], nod: list[int]) -> float:
        e = 1.0
        for d in range(dmax):
            miss = 1.0
            for i, (_, reach, _) in enumerate(options):
                if d < dep[i]:
                    miss *= 1.0 - reach[d]
            e += 1.0 - miss
        extra = sum(options[i].cost for i in range(len(options)) if dep[i] and not drafted[i])
        return e / (cost(1 + sum(nod)) + fixed + extra)

    for j, was_drafted in enumerate(drafted):
        levels = options[j].levels
        if not was_drafted or not levels or nodes[j] >= levels[-1]:
            continue
        dep, nod = list(depth), list(nodes)
        dep[j], nod[j] = len(levels), levels[-1]
        if sum(nod) <= max_nodes and ratio(dep, nod) >= (1 - keep_tolerance) * best:
            depth[j], nodes[j] = dep[j], nod[j]
