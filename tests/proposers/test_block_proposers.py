"""Block proposers in the contract (issue 66, 1): ``block_size`` as a capability, a block's per-slot candidates as
one tree with path scores (:func:`specframe.services.block_tree`), the engine asking for the whole block and the
router keeping the prefix its cost curve pays for (the verify budget) or turning a block drafter off, a block larger
than a step verifies clipped and said once, and the kit holding a block proposer to its block."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from specframe import Capabilities, DraftTree, ProposerBase, ProposerConfig
from specframe.acceptance import GreedyVerifier
from specframe.decode.drafting import _CLIPPED
from specframe.decode.engine import Engine
from specframe.services import block_tree, node_depths
from specframe.target.hf import Target
from specframe.testing.calls import draft_problem
from specframe_plugins.ngram import NgramConfig, NgramProposer
from specframe_plugins.router import AdaptiveConfig, AdaptiveRouter

from tests.fakes import NAME, PROMPT, VOCAB, build_model, build_tokenizer, hf_greedy, policy_of


# --- block_tree: pure ----------------------------------------------------------------------------------------------
def test_the_docstring_example():
    t = block_tree(torch.tensor([5, 6, 7]), torch.tensor([0.9, 0.5, 0.9]), torch.tensor([[8], [9], [4]]),
                   torch.tensor([[0.05], [0.4], [0.05]]), 4)
    assert t.token_ids[0].tolist() == [5, 6, 7, 9] and t.parent[0].tolist() == [-1, 0, 1, 0]
    assert t.draft_probs is None


def _path_scores(t: DraftTree, score_of: dict) -> list[float]:
    ids, par = t.token_ids[0].tolist(), t.parent[0].tolist()
    out: list[float] = []
    for i, (tok, p) in enumerate(zip(ids, par)):
        depth = node_depths(par)[i]
        out.append((1.0 if p < 0 else out[p]) * score_of[(depth - 1, tok)])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_every_prefix_is_the_best_tree_of_its_size_and_scores_never_grow_along_a_path(seed):
    g = torch.Generator().manual_seed(seed)
    k, m = 6, 3
    probs = torch.softmax(torch.randn(k, 20, generator=g) * 2, -1)  # [K, V] per-slot distributions
    top = probs.topk(m + 1, -1)
    chain, chain_s = top.indices[:, 0], top.values[:, 0]
    cands, cand_s = top.indices[:, 1:], top.values[:, 1:]
    score_of = {(i, int(t)): float(probs[i, t]) for i in range(k) for t in range(20)}
    whole = block_tree(chain, chain_s, cands, cand_s, 1000)
    assert whole.num_nodes == k * (m + 1)
    par = whole.parent[0].tolist()
    ids = whole.token_ids[0].tolist()
    assert all(p < i for i, p in enumerate(par))  # topological
    scores = _path_scores(whole, score_of)
    assert all(scores[i] <= scores[p] + 1e-12 for i, p in enumerate(par) if p >= 0)  # consistent along a path
    assert scores == sorted(scores, reverse=True)  # best first
    chain_nodes = [i for i, p in enumerate(par) if p == -1 and ids[i] == int(chain[0])]
    assert len(chain_nodes) == 1
    # a candidate is a leaf under the chain: only chain nodes have children
    has_children = {p for p in par if p >= 0}
    depth = node_depths(par)
    assert all(ids[i] == int(chain[depth[i] - 1]) for i in has_children)
    for n in range(whole.num_nodes + 1):  # what a node budget or a router keeps
        cut = block_tree(chain, chain_s, cands, cand_s, n)
        assert cut.token_ids[0].tolist() == ids[:n] and cut.parent[0].tolist() == par[:n]


def test_no_candidates_is_the_chain_and_a_candidate_equal_to_the_chain_or_minus_one_is_left_out():
    t = block_tree(torch.tensor([3, 4, 5]), torch.tensor([0.5, 0.5, 0.5]), torch.empty(3, 0, dtype=torch.int64),
                   torch.empty(3, 0), 2)
    assert t.token_ids[0].tolist() == [3, 4] and t.parent[0].tolist() == [-1, 0]
    t = block_tree(torch.tensor([3, 4]), torch.tensor([0.9, 0.9]), torch.tensor([[3, -1], [7, 4]]),
                   torch.tensor([[0.05, 0.05], [0.05, 0.05]]), 10)
    assert t.token_ids[0].tolist() == [3, 4, 7] and t.parent[0].tolist() == [-1, 0, 0]
    assert block_tree(torch.tensor([3]), torch.tensor([1.0]), torch.tensor([[4]]), torch.tensor([[0.0]]), 0).num_nodes == 0


def test_equal_scores_put_the_parent_first():
    t = block_tree(torch.tensor([3, 4, 5]), torch.tensor([1.0, 1.0, 1.0]), torch.tensor([[9], [8], [7]]),
                   torch.tensor([[1.0], [1.0], [1.0]]), 6)
    par = t.parent[0].tolist()
    assert all(p < i for i, p in enumerate(par)) and t.token_ids[0].tolist()[:2] == [3, 9]


@pytest.mark.parametrize(("args", "needle"), [
    ((torch.tensor([3, 4]), torch.tensor([0.5]), torch.zeros(2, 1, dtype=torch.int64), torch.zeros(2, 1)), "agree"),
    ((torch.tensor([3]), torch.tensor([1.5]), torch.zeros(1, 1, dtype=torch.int64), torch.zeros(1, 1)),
     "chain_scores must be probabilities"),
    ((torch.tensor([3]), torch.tensor([0.5]), torch.zeros(1, 1, dtype=torch.int64), torch.tensor([[-0.1]])),
     "candidate_scores must be probabilities"),
])
def test_bad_inputs_are_one_error_naming_them(args, needle):
    with pytest.raises(ValueError, match=needle):
        block_tree(*args, 4)


# --- the engine and the router ---------------------------------------------------------------------------------------
class ScriptedBlock(ProposerBase):
    """A block proposer (``block_size`` rows): drafts the reference's next ``block_size - 1`` tokens (the first
    ``correct`` right, the rest wrong), whatever budget it is asked with beyond that; records each budget asked."""

    name = "scripted-block"

    def __init__(self, target, reference: list[int], block_size: int = 8, correct: int | None = None) -> None:
        super().__init__(ProposerConfig(name=self.name), target)
        self.reference, self.correct = reference, correct
        self.block_size = block_size
        self.asked: list[int] = []
        self.verified: list[tuple[int, int]] = []  # (nodes verified, accepted)

    def propose(self, state, budget):
        self.asked.append(budget)
        done = state.num_generated
        block = self.reference[done : done + min(self.block_size - 1, budget)]
        c = len(block) if self.correct is None else self.correct
        block = block[:c] + [(t + 1) % VOCAB for t in block[c:]]
        return DraftTree.chain(block) if block else DraftTree.empty()

    def on_verified(self, outcome):
        self.verified.append((outcome.draft.num_nodes, outcome.num_accepted))


@pytest.fixture(scope="module")
def target() -> Target:
    return Target(build_model("llama", num_hidden_layers=2), build_tokenizer(), name=NAME)


N = 40


def router(**cfg) -> AdaptiveRouter:
    return AdaptiveRouter(AdaptiveConfig(measure="never", explore=0.0, **cfg))


def test_block_size_is_a_capability_read_from_the_instance(target):
    p = ScriptedBlock(target.info, [], block_size=5)
    assert Capabilities.of(p).block_size == 5
    assert Capabilities.of(NgramProposer(NgramConfig(), target.info)).block_size == 0


def test_a_block_proposer_is_asked_for_its_whole_block_and_the_cost_curve_sizes_what_is_verified(target):
    """On a cost curve v(n) = 1 + 0.15 (n - 1), a block right in its first 3 tokens only: the router plans budgets
    of a few nodes, yet the block proposer is asked with the step's whole budget every step (its forward costs the
    same) and the router keeps the prefix that pays, 3 or 4 of its 7 drafts; output exact."""
    ref = hf_greedy(target.model, PROMPT, N)
    p = ScriptedBlock(target.info, ref, block_size=8, correct=3)
    e = Engine(target, [p], GreedyVerifier(), router=router(cost_curve=[1.0 + 0.15 * i for i in range(16)],
                                                            draft_cost={"scripted-block": 0.1}))
    out = e.generate(PROMPT, max_new_tokens=N)
    assert out.token_ids == ref
    assert p.asked[0] == N - 1 and len(p.asked) == out.metrics.target_forwards  # asked every step
    done = 0
    for asked, (verified, accepted) in zip(p.asked, p.verified):
        assert asked == N - 1 - done  # the whole budget: tokens left - 1
        assert verified in (3, 4) and accepted == 3  # the prefix that pays, not the block's 7
        done += accepted + 1


def test_a_flat_cost_curve_verifies_the_whole_block(target):
    ref = hf_greedy(target.model, PROMPT, N)
    p = ScriptedBlock(target.info, ref, block_size=8)
    out = Engine(target, [p], GreedyVerifier(), router=router(cost_curve=[1.0] * 16)).generate(PROMPT, max_new_tokens=N)
    assert out.token_ids == ref
    assert [n for n, _ in p.verified][:4] == [7, 7, 7, 7] and out.metrics.target_forwards <= 6


def test_the_router_turns_off_a_block_drafter_that_does_not_pay(target):
    ref = hf_greedy(target.model, PROMPT, 64)
    p = ScriptedBlock(target.info, ref, block_size=8, correct=0)  # never right
    out = Engine(target, [p], GreedyVerifier(), router=router(cost_curve=[1.0 + 0.2 * i for i in range(16)],
                                                              draft_cost={"scripted-block": 0.5}, ledger_steps=4)
                 ).generate(PROMPT, max_new_tokens=64)
    assert out.token_ids == ref
    assert len(p.asked) < out.metrics.target_forwards / 3  # asked in its first steps and in rare probes only


def test_a_block_larger_than_a_step_verifies_is_clipped_and_said_once(target, caplog):
    ref = hf_greedy(target.model, PROMPT, 24)
    _CLIPPED.clear()
    with caplog.at_level(logging.WARNING, logger="specframe"):
        for _ in range(2):
            p = ScriptedBlock(target.info, ref, block_size=12)
            ngram = NgramProposer(NgramConfig(k=3), target.info)
            e = Engine(target, [p, ngram], GreedyVerifier(), merge=policy_of("priority", max_nodes=4))
            out = e.generate(PROMPT, max_new_tokens=24)
            assert out.token_ids == ref
            assert max(n for n, _ in p.verified) == 4
    said = [r.getMessage() for r in caplog.records if "clipped" in r.getMessage()]
    assert len(said) == 1 and "blocks of 11 tokens" in said[0] and "at most 4" in said[0]


def test_the_kit_holds_a_block_proposer_to_its_block(target):
    p = ScriptedBlock(target.info, [], block_size=3)
    deep = DraftTree.chain([1, 2, 3])
    assert "block_size = 3" in draft_problem(deep, p, VOCAB)
    assert draft_problem(DraftTree.chain([1, 2]), p, VOCAB) is None
    branch = DraftTree.from_lists([1, 2, 3], [-1, 0, 0])  # two deep, three nodes: a block's tree
    p.produces_trees = True
    assert draft_problem(branch, p, VOCAB) is None


def test_random_budgets_never_change_the_output(target):
    """However the router or policy budgets a block, the output is the target's (a property check of the trims)."""
    ref = hf_greedy(target.model, PROMPT, 30)
    rng = random.Random(0)
    for _ in range(4):
        slope = rng.choice([0.0, 0.1, 0.5, 1.5])
        p = ScriptedBlock(target.info, ref, block_size=rng.randint(2, 12), correct=rng.randint(0, 6))
        out = Engine(target, [p], GreedyVerifier(), router=router(cost_curve=[1.0 + slope * i for i in range(16)])
                     ).generate(PROMPT, max_new_tokens=30)
        assert out.token_ids == ref, slope
