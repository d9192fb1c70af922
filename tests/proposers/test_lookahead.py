"""lookahead (plugins/lookahead.py) and the feedback it reads: the target's argmax at each draft node
(``reads_target_tokens`` -> ``VerifyOutcome.target_tokens``)."""

from __future__ import annotations

from typing import Literal

import pytest
import torch

import specframe
from specframe import DecodeState, DraftTree, ProposerBase, ProposerConfig, SamplingParams, VerifyOutcome, hookimpl
from specframe.registry import build_registry
from specframe.target.hf import Target
from specframe.testing import conformance_suite
from specframe_plugins.lookahead import LookaheadConfig, LookaheadProposer

from tests.fakes import PROMPT, build_model, build_tokenizer, hf_greedy

# (its drafts follow its Jacobi trajectory, which the feedback of rejected drafts legitimately moves: no rollback check)
TestLookaheadConformance = conformance_suite(LookaheadProposer, config={"window": 3, "ngram": 2, "guesses": 3},
                                             samples=400, skip=("rollback",))


@pytest.fixture(scope="module")
def target():
    return Target(build_model("llama"), build_tokenizer())


class _RecorderConfig(ProposerConfig):
    name: Literal["recorder"] = "recorder"


class _Recorder(ProposerBase):
    """Drafts a fixed tree and records the target tokens it is given."""

    name = "recorder"
    Config = _RecorderConfig
    produces_trees = True
    reads_target_tokens = True
    seen: list = []

    def propose(self, state, budget):
        return DraftTree.from_lists([7, 9, 11, 5], [-1, 0, -1, 2]).truncate(budget)

    def on_verified(self, outcome):
        type(self).seen.append((outcome.draft, outcome.target_tokens, outcome.committed[0]))


def _registry():
    plugin = type("P", (), {"specframe_register_proposers": staticmethod(
        hookimpl(lambda register: register(_Recorder)))})()
    return build_registry(extra_plugins=(plugin,))


@torch.inference_mode()
def test_a_proposer_that_reads_target_tokens_gets_the_targets_argmax_after_the_root_and_each_node(target):
    _Recorder.seen = []
    sf = specframe.load(target=target, registry=_registry(), proposers=["recorder"], router="none",
                        max_new_tokens=8)
    sf.generate_result(PROMPT, chat=False)
    draft, tokens, committed = _Recorder.seen[0]
    assert draft.num_nodes == 4 and len(tokens[0]) == 5
    model = target.model
    paths = [[], [7], [7, 9], [11], [11, 5]]  # root, then each node's path
    want = [int(model(input_ids=torch.tensor([PROMPT + p])).logits[0, -1].argmax()) for p in paths]
    assert list(tokens[0]) == want
    assert committed[0] == want[0]  # greedy: the first committed token is the argmax after the root


def test_without_the_flag_no_target_tokens_are_computed(target):
    from specframe_plugins.ngram import NgramProposer

    assert not NgramProposer.reads_target_tokens
    outcome = VerifyOutcome(DraftTree.empty(), ((),), ((1,),), False)
    assert outcome.target_tokens is None


def _state(tokens, prompt_len):
    return DecodeState(torch.tensor([tokens]), prompt_len, SamplingParams(), torch.Generator())


def test_jacobi_guesses_come_from_the_targets_argmax_and_the_diagonal_fills_the_pool(target):
    p = LookaheadProposer(LookaheadConfig(window=3, ngram=2, guesses=2), target.info)
    tokens = [4, 5, 6, 7]
    p.start(_state(tokens, 4))
    d1 = p.propose(_state(tokens, 4), 8)
    assert d1.num_nodes == 3 and d1.is_chain()  # the window only: the pool is empty
    # the target says: after the root 20, after the window's nodes 21, 22, 23; nothing accepted, 20 committed
    p.on_verified(VerifyOutcome(d1, ((),), ((20,),), False, ((20, 21, 22, 23),)))
    assert p.window == [21, 22, 23]  # positions 5, 6, 7: the argmax after each guessed prefix
    tokens = tokens + [20]
    d2 = p.propose(_state(tokens, 4), 8)
    assert d2.token_ids[0].tolist()[:3] == [21, 22, 23]
    p.on_verified(VerifyOutcome(d2, ((),), ((30,),), False, ((30, 31, 32, 33),)))
    # two iterations kept: the diagonal (iteration 1 at q, iteration 2 at q + 1) gives 2-grams
    assert p.pool[20] == [(30,)] and p.pool[21] == [(31,)] and p.pool[22] == [(32,)]
    tokens = tokens + [30]  # (the pool is keyed by the newest committed token)
    p.levels.clear()
    p.pool[30] = [(8,), (10,)]
    d3 = p.propose(_state(tokens, 4), 8)
    assert d3.token_ids[0].tolist() == [31, 32, 33, 8, 10] and d3.parent[0].tolist() == [-1, 0, 1, -1, -1]
    assert p.propose(_state(tokens, 4), 2).num_nodes == 2  # the budget keeps the window first


def test_lookahead_alone_and_with_ngram_decode_exactly_the_targets_greedy_tokens(target):
    want = hf_greedy(target.model, PROMPT, 24)
    sf = specframe.load(target=target, max_new_tokens=24)
    for proposers in (["lookahead"], ["ngram", "lookahead"]):
        got = sf.generate_result(PROMPT, proposers=proposers, chat=False)
        assert got.token_ids == want, proposers
        assert got.metrics.drafted_nodes > 0


def test_a_shared_pool_is_shared_only_by_requests_that_ask(target):
    a = LookaheadProposer(LookaheadConfig(shared_pool=True), target.info)
    b = LookaheadProposer(LookaheadConfig(shared_pool=True), target.info)
    c = LookaheadProposer(LookaheadConfig(), target.info)
    for p in (a, b, c):
        p.start(_state([1, 2, 3], 3))
    assert a.pool is b.pool and c.pool is not a.pool
