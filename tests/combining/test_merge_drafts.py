"""The merge primitive of docs/combining.md: dedup, provenance, node budget and the exactness rules, and the
sampling distribution of merged trees (with a deliberately wrong merge that the same check catches)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from specframe import DraftTree
from specframe.acceptance import SpeculativeSamplingVerifier
from specframe.decode.merged_tree import MergedDraft, check_plan, merge_drafts
from specframe.sampling import SamplingParams

from tests.fakes import VOCAB, chain, tree


def whole(drafts):
    """The priority plan: every draft whole, in order."""
    return [(j, d.num_nodes) for j, d in enumerate(drafts)]


def paths(t: DraftTree) -> list[tuple[int, ...]]:
    """Token path from the root to each node."""
    out: list[tuple[int, ...]] = []
    for tok, p in zip(t.token_ids[0].tolist(), t.parent[0].tolist()):
        out.append((out[p] if p >= 0 else ()) + (tok,))
    return out


# --- the merge primitive ---------------------------------------------------------------------------------------------


def test_merge_worked_example_greedy():
    m = merge_drafts([chain([1, 2, 3]), chain([1, 4])], [(0, 3), (1, 2)], 8, greedy=True)
    assert m.tree.token_ids.tolist() == [[1, 2, 3, 4]] and m.tree.parent.tolist() == [[-1, 0, 1, 0]]
    assert m.sources == (0b11, 0b01, 0b01, 0b10)
    assert m.node_of == ((0, 1, 2), (0, 3))
    assert m.tree.draft_probs is None


def test_sampling_merges_deterministic_duplicates_only():
    q = torch.softmax(torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(0)), -1)
    a = chain([3, 5], q)  # stochastic: its own q rows
    b, c = chain([3, 1]), chain([3, 4])  # deterministic, the same first token as each other and as a
    m = merge_drafts([a, b, c], whole([a, b, c]), 16, greedy=False)
    #            a3  a5  b3=c3  b1  c4
    assert m.tree.token_ids.tolist() == [[3, 5, 3, 1, 4]]
    assert m.tree.parent.tolist() == [[-1, 0, -1, 2, 2]]
    assert m.sources == (0b001, 0b001, 0b110, 0b010, 0b100)
    probs = m.tree.draft_probs[0]
    torch.testing.assert_close(probs[:2], q)  # the stochastic nodes keep their own q
    for node, tok in ((2, 3), (3, 1), (4, 4)):  # deterministic nodes: one-hot q
        assert probs[node, tok] == 1 and probs[node].sum() == 1
    # under greedy everything may merge, and no probabilities are carried
    g = merge_drafts([a, b, c], whole([a, b, c]), 16, greedy=True)
    assert g.tree.token_ids.tolist() == [[3, 5, 1, 4]] and g.tree.parent.tolist() == [[-1, 0, 0, 0]]
    assert g.sources == (0b111, 0b001, 0b010, 0b100) and g.tree.draft_probs is None


def test_two_stochastic_drafts_with_the_same_tokens_stay_apart():
    q = torch.full((2, VOCAB), 1.0 / VOCAB)
    m = merge_drafts([chain([7, 8], q), chain([7, 8], q)], [(0, 2), (1, 2)], 8, greedy=False)
    assert m.tree.parent.tolist() == [[-1, 0, -1, 2]] and m.sources == (1, 1, 2, 2)


def test_node_budget_takes_prefixes_and_duplicates_are_free():
    a, b = chain([1, 2, 3]), chain([1, 2, 9, 8])
    m = merge_drafts([a, b], whole([a, b]), 4, greedy=True)
    assert m.tree.token_ids.tolist() == [[1, 2, 3, 9]]  # b's 1 and 2 cost nothing, 9 takes the last node
    assert m.node_of == ((0, 1, 2), (0, 1, 3)) and m.kept(1) == 3  # 8 did not fit: b contributed a prefix
    m = merge_drafts([a, b], [(1, 2), (0, 3)], 2, greedy=True)  # plan order and quotas: b's first two, then a
    assert m.tree.token_ids.tolist() == [[1, 2]] and m.node_of == ((0, 1), (0, 1))
    assert merge_drafts([a, b], [], 4, greedy=True).tree.num_nodes == 0


@pytest.mark.parametrize("greedy", [True, False])
def test_every_node_keeps_its_own_path(greedy):
    """Random drafts (chains and trees, deterministic and stochastic): each own node maps to a merged node whose
    root path is the own node's root path, provenance bits match, and the merged tree is topological."""
    rng = random.Random(0)
    for _ in range(200):
        drafts = []
        for _ in range(rng.randint(1, 4)):
            n = rng.randint(0, 7)
            parents = [rng.randint(-1, i - 1) for i in range(n)]
            ids = [rng.randint(1, 4) for _ in range(n)]
            probs = torch.full((n, 5), 0.2) if rng.random() < 0.4 else None
            drafts.append(tree(ids, parents, probs))
        plan = [(j, rng.randint(0, d.num_nodes)) for j, d in enumerate(drafts)]
        rng.shuffle(plan)
        m = merge_drafts(drafts, plan, rng.randint(1, 20), greedy=greedy)
        merged_paths = paths(m.tree)
        par = m.tree.parent[0].tolist()
        assert all(p < i for i, p in enumerate(par))
        if greedy:  # every duplicate merged: no two nodes share a path
            assert len(set(merged_paths)) == m.tree.num_nodes
        for j, d in enumerate(drafts):
            own_paths = paths(d)
            for i, node in enumerate(m.node_of[j]):
                assert merged_paths[node] == own_paths[i]
                assert m.sources[node] >> j & 1
        for node, src in enumerate(m.sources):
            assert src and all(node in m.node_of[j] for j in range(len(drafts)) if src >> j & 1)
        if not greedy:  # a stochastic node is never shared
            for src in m.sources:
                stochastic = [j for j in range(len(drafts)) if src >> j & 1 and drafts[j].draft_probs is not None]
                assert not stochastic or src == 1 << stochastic[0]


def test_own_accepted_credit_and_alone():
    a, b = chain([1, 2, 3]), tree([1, 5, 2], [-1, -1, 0])
    m = merge_drafts([a, b], whole([a, b]), 8, greedy=True)  # 1(ab) 2(ab) 3(a) 5(b)
    path = (0, 1, 2)
    assert m.own_accepted(0, path, a.parent[0].tolist()) == (0, 1, 2)
    assert m.own_accepted(1, path, b.parent[0].tolist()) == (0, 2)  # b's own node indices
    credited = [sum(1 for node in path if m.sources[node] >> j & 1) for j in (0, 1)]  # produced, alone or not
    assert (*credited, m.alone(0, path), m.alone(1, path)) == (3, 2, 1, 0)
    single = MergedDraft.single(a)
    assert single.own_accepted(0, (0, 1), a.parent[0].tolist()) == (0, 1) and single.sources == (1, 1, 1)


def test_check_plan():
    assert check_plan([(1, 3), (0, 0)], 2) == [(1, 3), (0, 0)]
    for bad in ([(2, 1)], [(0, 1), (0, 2)], [(0, -1)]):
        with pytest.raises(ValueError):
            check_plan(bad, 2)


# --- exactness of merged trees under sampling (statistical) ---------------------------------------------------------

V = 6
P = torch.tensor([0.45, 0.05, 0.2, 0.02, 0.1, 0.18])  # the target at every position (context-free)
Q = torch.tensor([0.5, 0.3, 0.02, 0.14, 0.02, 0.02])  # the stochastic proposer's q: often 1 and 3, which p rarely takes
TRIALS = 8_000


def merge_dedup_stochastic(drafts, plan, max_nodes, greedy=False):
    """BUG: merges a stochastic node into an existing node with the same token at the same path (keeping the
    existing node and its q), as one would under greedy. Recursive rejection would have subtracted the dropped
    node's q from the residual, so the emitted distribution shifts."""
    tokens, parents, rows, index, node_of = [], [], [], {}, []
    for j, quota in plan:
        d, own = drafts[j], []
        for i, (tok, p) in enumerate(zip(d.token_ids[0, :quota].tolist(), d.parent[0, :quota].tolist())):
            at = -1 if p < 0 else own[p]
            node = index.get((at, tok))
            if node is None:
                node = len(tokens)
                tokens.append(tok)
                parents.append(at)
                rows.append(torch.nn.functional.one_hot(torch.tensor(tok), V).float() if d.draft_probs is None
                            else d.draft_probs[0, i])
                index[(at, tok)] = node
            own.append(node)
        node_of.append(tuple(own))
    probs = torch.stack(rows)[None] if rows else None
    return MergedDraft(DraftTree(torch.tensor([tokens]).reshape(1, -1), torch.tensor([parents]).reshape(1, -1), probs),
                       (0,) * len(tokens), tuple(node_of))


def emitted_pairs(merge, order: str, trials: int, seed: int) -> torch.Tensor:
    """First two emitted tokens (as ``a * V + b``) of ``trials`` verifications of merged trees of a stochastic
    chain (two tokens drawn from Q, its q given) and three deterministic chains — two of them share their first
    token, 3, and the third starts with 1: the stochastic chain draws 1 or 3 at the same path 44 % of the time —
    through the real verifier. (A merge that drops the stochastic duplicates is off by TV 0.2 in the first token.)"""
    g = torch.Generator().manual_seed(seed)
    verifier, params = SpeculativeSamplingVerifier(), SamplingParams(temperature=1.0)
    logits = {}
    out = []
    for _ in range(trials):
        stochastic = chain(torch.multinomial(Q, 2, replacement=True, generator=g), Q.expand(2, -1).clone())
        deterministic = [chain([3, 1]), chain([3, 4]), chain([1, 2])]
        drafts = deterministic + [stochastic] if order == "deterministic-first" else [stochastic] + deterministic
        m = merge(drafts, whole(drafts), 16, greedy=False)
        n = m.tree.num_nodes
        if n not in logits:
            logits[n] = P.log().expand(1, n + 1, V).contiguous()
        res = verifier.verify(m.tree, logits[n], params, g)
        toks = [int(m.tree.token_ids[0, i]) for i in res.accepted_nodes[0]] + [res.next_token[0]]
        if len(toks) == 1:  # nothing accepted: the second token comes from a fresh step, drawn from the target
            toks.append(int(torch.multinomial(P, 1, generator=g)))
        out.append(toks[0] * V + toks[1])
    return torch.tensor(out)


def tv(samples: torch.Tensor, probs: torch.Tensor) -> float:
    freq = torch.bincount(samples, minlength=probs.numel()).double() / samples.numel()
    return 0.5 * float((freq - probs.double().flatten()).abs().sum())


@pytest.mark.parametrize("order", ["deterministic-first", "stochastic-first"])
def test_merged_trees_emit_the_target_distribution(order):
    pairs = emitted_pairs(merge_drafts, order, TRIALS, seed=1)
    assert tv(pairs // V, P) <= math.sqrt(V / TRIALS)  # first token ~ p
    assert tv(pairs, P[:, None] * P[None, :]) <= math.sqrt(V * V / TRIALS)  # first two tokens ~ p x p


def test_the_check_catches_a_merge_that_deduplicates_stochastic_nodes():
    pairs = emitted_pairs(merge_dedup_stochastic, "deterministic-first", TRIALS, seed=1)
    assert tv(pairs // V, P) > 4 * math.sqrt(V / TRIALS)
