"""Token trees: mask and positions, greedy and SpecInfer-style sampling over trees, KV compaction, and the
engine verifying branching drafts in one forward (exact against plain greedy)."""

from __future__ import annotations

import math

import pytest
import torch

from specframe import DraftTree, ProposerBase, ProposerConfig
from specframe.engine import Engine
from specframe.kv_cache import cache_length, compact, new_cache
from specframe.sampling import SamplingParams
from specframe.tree import (
    children_of,
    greedy_tree,
    node_depths,
    sampling_tree,
    tree_attention_mask,
    tree_position_ids,
)
from specframe.verifiers import GreedyVerifier, SpeculativeSamplingVerifier

from .support import PROMPT, build_model, build_tokenizer, check_metrics, hf_greedy
from specframe.target import Target

#          root
#         /    \
#        0      2
#        |       \
#        1        3
#        |
#        4
PARENT = [-1, 0, -1, 2, 1]


def test_children_depths_positions():
    assert children_of(PARENT) == [[0, 2], [1], [4], [3], [], []]
    assert node_depths(PARENT) == [1, 2, 1, 2, 3]
    assert tree_position_ids(PARENT, 7).tolist() == [[7, 8, 9, 8, 9, 10]]


def test_tree_mask_rows_see_past_newest_and_ancestors_only():
    mask = tree_attention_mask(PARENT, past_len=2, dtype=torch.float32)
    assert mask.shape == (1, 1, 6, 2 + 6)
    seen = (mask[0, 0] == 0).int().tolist()
    #            past  newest  n0 n1 n2 n3 n4
    assert seen == [
        [1, 1, 1, 0, 0, 0, 0, 0],  # newest token: the past and itself
        [1, 1, 1, 1, 0, 0, 0, 0],  # node 0: + itself
        [1, 1, 1, 1, 1, 0, 0, 0],  # node 1: + node 0
        [1, 1, 1, 0, 0, 1, 0, 0],  # node 2: its own branch only
        [1, 1, 1, 0, 0, 1, 1, 0],  # node 3: + node 2
        [1, 1, 1, 1, 1, 0, 0, 1],  # node 4: nodes 0, 1
    ]
    assert (mask[0, 0][mask[0, 0] != 0] == torch.finfo(torch.float32).min).all()


@pytest.mark.parametrize(
    "argmax, path, nxt",
    [
        ([10, 11, 12, 0, 0, 14], [0, 1, 4], 14),  # first branch all the way: bonus after node 4
        ([20, 0, 0, 21, 99, 0], [2, 3], 99),  # second sibling matches, then its child; bonus after node 3
        ([20, 0, 0, 5, 0, 0], [2], 5),  # second sibling, child rejected: recovered = argmax after node 2
        ([7, 0, 0, 0, 0, 0], [], 7),  # no child matches the root's argmax
    ],
)
def test_greedy_tree(argmax, path, nxt):
    tokens = [10, 11, 20, 21, 12]
    assert greedy_tree(argmax, tokens, PARENT) == (path, nxt)


def _tv(samples: torch.Tensor, probs: torch.Tensor) -> float:
    emp = torch.bincount(samples, minlength=probs.numel()).double() / samples.numel()
    return 0.5 * float((emp - probs.double()).abs().sum())


def _first_tokens(sampler, p, q, tree_parent, n, seed, one_hot_tokens=None):
    """First emitted token of n verifications; every row of the target distribution is p (context-free)."""
    g = torch.Generator().manual_seed(seed)
    num = len(tree_parent)
    target = p.expand(num + 1, -1).contiguous()
    firsts = []
    for _ in range(n):
        if one_hot_tokens is not None:
            tokens, dprobs = one_hot_tokens, None
        else:
            tokens = torch.multinomial(q, num, replacement=True, generator=g).tolist()
            dprobs = q.expand(num, -1)
        path, nxt = sampler(target, dprobs, tokens, tree_parent, g)
        firsts.append(tokens[path[0]] if path else nxt)
    return torch.tensor(firsts)


def _no_residual_update(target_probs, draft_probs, tokens, parent, generator):
    """A buggy sampler: siblings are tested against the *original* p instead of the updated residual."""
    kids = children_of(parent)
    p = target_probs[0]
    for c in kids[0]:
        q = draft_probs[c]
        x = tokens[c]
        if float(torch.rand((), generator=generator)) * float(q[x]) < float(p[x]):
            return [c], 0
    residual = (p - draft_probs[kids[0][-1]]).clamp_min(0)
    return [], int(torch.multinomial(residual / residual.sum(), 1, generator=generator))


V, N = 6, 30000
THRESHOLD = math.sqrt(V / N)
P = torch.tensor([0.05, 0.4, 0.1, 0.25, 0.15, 0.05])
Q = torch.tensor([0.3, 0.1, 0.3, 0.1, 0.1, 0.1])
SIBLINGS = [-1, -1, -1, 0]  # three i.i.d. siblings at the root, one grandchild


def test_sampling_tree_first_token_is_target_distributed():
    assert _tv(_first_tokens(sampling_tree, P, Q, SIBLINGS, N, 0), P) < THRESHOLD


def test_sampling_tree_duplicate_one_hot_siblings_stay_exact():
    # deterministic siblings with the same token twice: the second must never be accepted after the first fails
    firsts = _first_tokens(sampling_tree, P, None, [-1, -1, -1], N, 1, one_hot_tokens=[3, 3, 1])
    assert _tv(firsts, P) < THRESHOLD


def test_the_tree_test_has_power_against_a_missing_residual_update():
    assert _tv(_first_tokens(_no_residual_update, P, Q, SIBLINGS, N, 2), P) > 3 * THRESHOLD


@pytest.mark.parametrize("path", [[0, 1, 4], [2, 3], [2], []])
def test_compaction_equals_fresh_prefill_of_the_accepted_path(path):
    model = build_model("llama")
    tokens = [10, 11, 20, 21, 12]
    prompt = PROMPT
    with torch.inference_mode():
        cache = new_cache(model.config)
        model(input_ids=torch.tensor([prompt[:-1]]), cache=cache, use_cache=True)
        past = cache_length(cache)
        ids = torch.tensor([[prompt[-1], *tokens]])
        mask = tree_attention_mask(PARENT, past, torch.float32)
        pos = tree_position_ids(PARENT, past)
        model(input_ids=ids, cache=cache, use_cache=True, attention_mask=mask, position_ids=pos)
        compact(cache, past + 1, path)
        fresh = new_cache(model.config)
        model(input_ids=torch.tensor([prompt + [tokens[i] for i in path]]), cache=fresh, use_cache=True)
    assert cache_length(cache) == cache_length(fresh) == len(prompt) + len(path)
    for a, b in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-5)


class TreeConfig(ProposerConfig):
    name: str = "scripted-tree"


class ScriptedTree(ProposerBase):
    """Drafts a 2-branch tree: a wrong branch first, the reference continuation second (then wrong again)."""

    name = "scripted-tree"
    Config = TreeConfig
    produces_trees = True

    def __init__(self, reference: list[int], target) -> None:
        super().__init__(TreeConfig(), target)
        self.reference = reference

    def propose(self, state, budget):
        done = state.num_generated
        good = self.reference[done : done + 3]
        if len(good) < 3:
            return DraftTree.empty()
        bad = [(t + 1) % 64 for t in good]
        # nodes: bad0, bad1 (child of bad0), good0, good1, good2 (chain under good0), bad2 (child of good1)
        ids = torch.tensor([[bad[0], bad[1], good[0], good[1], good[2], bad[2]]])
        parent = torch.tensor([[-1, 0, -1, 2, 3, 3]])
        return DraftTree(ids, parent, None)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_engine_tree_greedy_equals_plain_greedy(arch):
    model = build_model(arch)
    target = Target(model, build_tokenizer())
    ref = hf_greedy(model, PROMPT, 24)
    engine = Engine(target, [ScriptedTree(ref, target.info)], GreedyVerifier())
    res = engine.generate(PROMPT, max_new_tokens=24)
    assert res.token_ids == ref
    assert res.metrics.proposer_faults == 0
    assert res.metrics.mean_accepted_length > 2.5  # the second branch is accepted 3 deep each step
    check_metrics(res)
    assert len(res.metrics.drafted_by_position) == 3  # counted by depth: the tree is 3 deep, 6 nodes wide


def test_engine_tree_sampling_is_seeded_and_fault_free():
    model = build_model("llama")
    target = Target(model, build_tokenizer())
    ref = hf_greedy(model, PROMPT, 16)
    engine = Engine(target, [ScriptedTree(ref, target.info)], SpeculativeSamplingVerifier())
    runs = [engine.generate(PROMPT, max_new_tokens=16, sampling=SamplingParams(temperature=1.0), seed=s)
            for s in (3, 3, 4)]
    assert runs[0].token_ids == runs[1].token_ids
    assert runs[0].token_ids != runs[2].token_ids
    assert all(r.metrics.proposer_faults == 0 for r in runs)


def test_sliding_window_target_turns_tree_drafts_into_target_only_steps():
    model = build_model("qwen2-sliding")
    target = Target(model, build_tokenizer())
    assert not target.supports_trees
    ref = hf_greedy(model, PROMPT, 12)
    res = Engine(target, [ScriptedTree(ref, target.info)], GreedyVerifier()).generate(PROMPT, max_new_tokens=12)
    assert res.token_ids == ref
    assert res.metrics.proposer_faults >= 1 and res.metrics.drafted_tokens == 0
