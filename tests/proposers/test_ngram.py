"""The ``ngram`` proposer (prompt lookup): the reference lookup, the incremental index, config validation."""

from __future__ import annotations

import random

import pytest
import torch
from pydantic import ValidationError

from specframe.config import load_config, resolve_plugins
from specframe.contracts import DecodeState, TargetInfo
from specframe.errors import ConfigError
from specframe.registry import build_registry
from specframe.sampling import SamplingParams
from specframe_plugins.ngram import NgramConfig, NgramIndex, NgramProposer, find_continuation

INFO = TargetInfo(
    vocab_size=64, eos_token_ids=frozenset(), max_context=256, device=torch.device("cpu"), dtype=torch.float32
)


def test_docstring_worked_example():
    assert find_continuation([5, 6, 7, 8, 9, 5, 6, 7], 1, 3, 3) == [8, 9, 5]
    assert find_continuation([5, 9, 5, 9, 5, 9], 1, 3, 5) == [5, 9, 5, 9, 5]  # through the repeat
    # "first" copies after the earliest occurrence, "recent" after the latest
    assert find_continuation([1, 2, 3, 1, 2, 4, 1, 2], 2, 2, 2, "first") == [3, 1]
    assert find_continuation([1, 2, 3, 1, 2, 4, 1, 2], 2, 2, 2, "recent") == [4, 1]


@pytest.mark.parametrize(
    "tokens, min_n, max_n, k, expected",
    [
        # the continuation runs into the end of the tokens: it goes on through the repeat (period 5)
        ([5, 6, 7, 8, 9, 5, 6, 7], 1, 3, 10, [8, 9, 5, 6, 7, 8, 9, 5, 6, 7]),
        ([5, 6, 7, 8, 9, 5, 6, 7], 1, 3, 1, [8]),  # k caps the draft
        ([1, 2, 3, 1, 2, 4, 1, 2], 1, 2, 3, [4, 1, 2]),  # most recent occurrence of [1, 2] wins
        ([1, 2, 3, 9, 2, 4, 1, 2], 1, 2, 3, [3, 9, 2]),  # longest suffix [1, 2] beats the later [2]
        ([1, 2, 3, 9, 2, 4, 1, 2], 1, 1, 3, [4, 1, 2]),  # max_n = 1: only [2], most recent
        ([1, 2, 3, 4], 1, 4, 3, []),  # no earlier occurrence of any suffix
        ([1, 2, 3, 9, 2, 4, 7, 2], 2, 3, 3, []),  # [2] recurs but min_n = 2 and [7, 2] does not
        ([7, 7, 7, 7], 1, 3, 5, [7] * 5),  # overlapping occurrence [7, 7, 7] ending at 2: period 1
        ([5, 9] * 3, 1, 4, 8, [5, 9] * 4),  # the case: k = 8 drafts 8, not one period (2)
        ([1, 2, 3, 1, 2, 3, 1, 2], 1, 4, 5, [3, 1, 2, 3, 1]),  # mid-period: continues from the match
        ([4], 1, 3, 3, []),  # a single token has nothing before it
        ([], 1, 3, 3, []),
    ],
)
def test_find_continuation_cases(tokens, min_n, max_n, k, expected):
    assert find_continuation(tokens, min_n, max_n, k) == expected


@pytest.mark.parametrize("match", ["recent", "first"])
def test_index_equals_reference_on_random_sequences(match):
    rng = random.Random(1234)
    checks = 0
    for _ in range(300):
        min_n = rng.randint(1, 3)
        max_n = rng.randint(min_n, 5)
        alphabet = rng.randint(2, 6)  # small alphabets so that matches of every length occur
        index = NgramIndex(min_n, max_n, match)
        tokens: list[int] = []
        for _ in range(rng.randint(1, 12)):  # extend in chunks of random size, as the engine commits them
            chunk = [rng.randrange(alphabet) for _ in range(rng.randint(0 if tokens else 1, 6))]
            tokens += chunk
            index.extend(chunk)
            for k in (1, 3, 8):
                want = find_continuation(tokens, min_n, max_n, k, match)
                assert index.lookup(k) == want, (tokens, min_n, max_n, k, match)
                checks += 1
    assert checks > 2000


def test_index_finds_matches():
    index = NgramIndex(1, 3)
    index.extend([5, 6, 7, 8, 9])
    assert index.lookup(3) == []
    index.extend([5, 6])
    assert index.lookup(3) == [7, 8, 9]
    index.extend([7])
    assert index.lookup(3) == [8, 9, 5]


@pytest.mark.parametrize("min_n, max_n", [(3, 2), (5, 1)])
def test_min_n_greater_than_max_n_is_rejected(min_n, max_n):
    with pytest.raises(ValidationError, match=rf"min_n \({min_n}\) must be <= max_n \({max_n}\)"):
        NgramConfig(min_n=min_n, max_n=max_n)


@pytest.mark.parametrize("field, value", [("k", 0), ("k", 65), ("min_n", 0), ("max_n", 17), ("bogus", 1)])
def test_config_bounds(field, value):
    with pytest.raises(ValidationError, match=rf"(?m)^{field}$"):
        NgramConfig(**{field: value})


def test_bad_options_through_the_registry_name_the_proposer():
    bad = [{"name": "ngram", "min_n": 4, "max_n": 2}]
    with pytest.raises(ConfigError, match=r"proposer 'ngram'.*min_n \(4\) must be <= max_n \(2\)"):
        load_config(None, proposers=bad)
    with pytest.raises(ConfigError, match=r"proposer 'ngram'.*min_n \(4\) must be <= max_n \(2\)"):
        resolve_plugins(load_config(None), build_registry(), proposers=bad)  # a request's override
    ((cls, pcfg),) = resolve_plugins(load_config(None, proposers=[{"name": "ngram", "k": 3}]), build_registry()).proposers
    assert cls is NgramProposer and pcfg == NgramConfig(k=3)


def _state(tokens: list[int], prompt_len: int) -> DecodeState:
    return DecodeState(torch.tensor([tokens]), prompt_len, SamplingParams(), torch.Generator())


def test_proposer_follows_the_growing_sequence():
    proposer = NgramProposer(NgramConfig(k=3, min_n=1, max_n=3), INFO)
    tokens = [5, 6, 7, 8, 9, 5]
    proposer.start(_state(tokens, len(tokens)))
    assert proposer.propose(_state(tokens, 6), budget=8).token_ids.tolist() == [[6, 7, 8]]
    tokens += [6, 7]
    draft = proposer.propose(_state(tokens, 6), budget=8)
    assert draft.token_ids.tolist() == [[8, 9, 5]]
    assert draft.is_chain() and draft.draft_probs is None  # deterministic proposal
    assert proposer.propose(_state(tokens, 6), budget=2).token_ids.tolist() == [[8, 9]]  # budget caps k
    tokens += [1]
    assert proposer.propose(_state(tokens, 6), budget=8).num_nodes == 0  # no match: an empty draft


@pytest.mark.parametrize("branches", [1, 3])
def test_drafts_continue_through_a_repeat_up_to_k(branches):
    """On periodic text the most recent occurrence is one period back; the draft used to stop after one period
    (2 tokens for [5, 9] repeated, with k = 8), now it is k long — index, tree and reference agree."""
    from specframe_plugins.ngram import continuation

    assert continuation([5, 9, 5, 9], 1, 5) == [5, 9, 5, 9, 5]
    proposer = NgramProposer(NgramConfig(k=8, branches=branches), INFO)
    tokens = [3, 4] + [5, 9] * 3
    proposer.start(_state(tokens, 2))
    draft = proposer.propose(_state(tokens, 2), budget=16)
    assert draft.token_ids[0, :8].tolist() == [5, 9] * 4
    assert proposer.propose(_state(tokens, 2), budget=5).token_ids.tolist()[0][:5] == [5, 9, 5, 9, 5]
    index = NgramIndex(1, 4).track_all()
    index.extend(tokens)
    assert index.lookup_many(8, 3)[0] == index.lookup(8) == [5, 9] * 4


def test_start_resets_the_index():
    proposer = NgramProposer(NgramConfig(k=2), INFO)
    proposer.start(_state([1, 2, 3, 1], 4))
    assert proposer.propose(_state([1, 2, 3, 1], 4), 4).token_ids.tolist() == [[2, 3]]
    proposer.start(_state([4, 5, 6, 1], 4))  # a new request: nothing from the previous one is remembered
    assert proposer.propose(_state([4, 5, 6, 1], 4), 4).num_nodes == 0


def test_registered_under_its_name():
    registry = build_registry()
    assert registry.proposer("ngram") is NgramProposer
    assert {"ngram", "none"} <= set(registry.proposers)


def test_merge_into_tree_shares_prefixes_and_respects_the_node_budget():
    from specframe_plugins.ngram import merge_into_tree

    assert merge_into_tree([[1, 2, 3], [1, 4]], 8) == ([1, 2, 3, 4], [-1, 0, 1, 0])
    assert merge_into_tree([[1, 2, 3], [5, 6]], 4) == ([1, 2, 3, 5], [-1, 0, 1, -1])
    assert merge_into_tree([], 4) == ([], [])


@pytest.mark.parametrize("match", ["recent", "first"])
def test_lookup_many_starts_with_lookup_and_has_distinct_continuations(match):
    rng = random.Random(7)
    for _ in range(200):
        tokens = [rng.randrange(3) for _ in range(rng.randint(2, 30))]
        index = NgramIndex(1, 3, match).track_all()
        index.extend(tokens)
        many = index.lookup_many(4, 3)
        assert (many[0] if many else []) == index.lookup(4)
        assert len(many) == len({tuple(c) for c in many}) <= 3


def test_branching_ngram_is_exact_and_drafts_trees(llama_target):
    from specframe.acceptance import GreedyVerifier
    from specframe.decode.engine import Engine

    from tests.fakes import hf_greedy

    cfg = NgramConfig(branches=3, max_nodes=12, k=4)
    proposer = NgramProposer(cfg, llama_target.info)
    assert proposer.produces_trees
    branched = []
    propose = proposer.propose

    def spy(state, budget):
        draft = propose(state, budget)
        branched.append(not draft.is_chain())
        return draft

    proposer.propose = spy
    prompt = [11, 12, 13, 11, 12, 14, 11, 12, 15, 11, 12]  # "11 12" continues three different ways
    res = Engine(llama_target, [proposer], GreedyVerifier()).generate(prompt, max_new_tokens=24)
    assert branched[0]  # the first draft is a 3-branch tree
    assert res.token_ids == hf_greedy(llama_target.model, prompt, 24)
    assert res.metrics.proposer_faults == 0 and res.metrics.drafted_nodes > 0
