"""End-to-end invariants of the decode loop on tiny random HF models (llama, qwen2, qwen2 with a sliding window).

The central one: speculative greedy decoding equals plain greedy decoding token for token, whatever the proposer
drafts (nothing, n-gram lookups, the right answer, half right, garbage, or more than the budget allows), and
stops (EOS, stop strings, max_new_tokens) cut the output exactly where plain decoding would.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from specframe.contracts import DecodeState, DraftTree, ProposerBase, ProposerConfig, VerifyOutcome
from specframe.decode.engine import Engine
from specframe.errors import ConfigError, PromptTooLongError
from specframe.sampling import SamplingParams
from specframe.target.hf import Target
from specframe.target.kv_cache import cache_length, rollback
from specframe_plugins.autoregressive import NoneConfig, NoProposer
from specframe_plugins.ngram import NgramConfig, NgramProposer

from tests.fakes import PROMPT, PROMPT_2, VOCAB, WORDS, build_model, check_metrics, hf_greedy, plain_generate

pytestmark = pytest.mark.device_subset

N_NEW = 40


class ScriptedProposer(ProposerBase):
    """Drafts from a known continuation of the prompt (``script[i]`` = generated token ``i``).

    Each draft is ``script[g : g + k]`` (g = tokens generated so far) with every token from index ``correct`` on
    replaced by a wrong one, so exactly ``min(correct, len(draft))`` nodes are accepted under greedy
    verification. ``ignore_budget`` drafts ``budget + extra`` tokens regardless of the budget.
    """

    name = "scripted"

    def __init__(self, target, script: list[int], k: int = 4, correct: int | None = None, ignore_budget: int = 0):
        super().__init__(ProposerConfig(name=self.name), target)
        self.script, self.k, self.correct, self.ignore_budget = script, k, correct, ignore_budget
        self.budgets: list[int] = []
        self.outcomes: list[VerifyOutcome] = []
        self.starts = 0

    def start(self, state: DecodeState) -> None:
        self.starts += 1
        self.budgets.clear()
        self.outcomes.clear()

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        assert budget >= 1
        self.budgets.append(budget)
        g = state.num_generated
        n = budget + self.ignore_budget if self.ignore_budget else min(self.k, budget)
        draft = list(self.script[g : g + n])
        assert len(draft) == n, "script too short for this test"
        correct = len(draft) if self.correct is None else self.correct
        draft = draft[:correct] + [(t + 1) % VOCAB for t in draft[correct:]]
        return DraftTree.chain(draft)

    def on_verified(self, outcome: VerifyOutcome) -> None:
        self.outcomes.append(outcome)


def text_of(ids: list[int]) -> str:
    """What the word-level tokenizer decodes ``ids`` to (the special pad token 0 is skipped)."""
    return " ".join(WORDS[t] for t in ids if t != 0)


def greedy_engine(target: Target, proposer: Any) -> Engine:
    return Engine(target, [proposer], GreedyVerifier())


@pytest.fixture
def reference(target):
    """Plain greedy continuation of PROMPT (N_NEW + 24 tokens, so scripts can run past the end)."""
    ref = hf_greedy(target.model, PROMPT, N_NEW + 24)
    assert len(ref) == N_NEW + 24
    return ref


# --- speculative greedy == plain greedy ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt", [PROMPT, PROMPT_2, [7, 8, 9, 10, 11, 12, 13]], ids=["prompt1", "prompt2", "norepeat"]
)
def test_none_proposer_equals_transformers_generate(target, prompt):
    result = plain_generate(target, prompt, N_NEW)
    assert result.token_ids == hf_greedy(target.model, prompt, N_NEW)
    assert result.finish_reason == "length"
    assert result.metrics.target_forwards == N_NEW  # one forward per token, tau = 1
    assert result.metrics.drafted_nodes == 0
    check_metrics(result)


@pytest.mark.parametrize("prompt", [PROMPT, PROMPT_2], ids=["prompt1", "prompt2"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_ngram_equals_plain_greedy(target, prompt, k):
    expected = hf_greedy(target.model, prompt, N_NEW)
    proposer = NgramProposer(NgramConfig(k=k), target.info)
    result = greedy_engine(target, proposer).generate(prompt, max_new_tokens=N_NEW)
    assert result.token_ids == expected
    assert result.finish_reason == "length"
    m = result.metrics
    assert m.drafted_nodes > 0 and m.accepted_nodes > 0  # speculation actually happened
    assert m.target_forwards < N_NEW  # and saved forwards
    assert max(len(m.drafted_by_depth), 1) <= k
    check_metrics(result)


def test_all_accepted(target, reference):
    proposer = ScriptedProposer(target.info, reference, k=4)
    result = greedy_engine(target, proposer).generate(PROMPT, max_new_tokens=N_NEW)
    assert result.token_ids == reference[:N_NEW]
    m = result.metrics
    assert m.accepted_nodes == m.drafted_nodes > 0
    assert all(o.num_accepted == o.draft.num_nodes for o in proposer.outcomes)
    # 40 tokens = 8 steps of 4 drafts + 1 bonus: tau = 5
    assert m.target_forwards == N_NEW // 5
    assert m.tau == 5.0
    check_metrics(result)


@pytest.mark.parametrize("correct", [1, 2, 3])
def test_partially_accepted(target, reference, correct):
    proposer = ScriptedProposer(target.info, reference, k=4, correct=correct)
    result = greedy_engine(target, proposer).generate(PROMPT, max_new_tokens=N_NEW)
    assert result.token_ids == reference[:N_NEW]
    assert [o.num_accepted for o in proposer.outcomes] == [min(correct, o.draft.num_nodes) for o in proposer.outcomes]
    m = result.metrics
    assert 0 < m.accepted_nodes < m.drafted_nodes
    assert m.accepted_by_depth[:correct] == m.drafted_by_depth[:correct]
    assert sum(m.accepted_by_depth[correct:]) == 0
    check_metrics(result)


def test_garbage_drafts_change_nothing(target, reference):
    proposer = ScriptedProposer(target.info, reference, k=5, correct=0)
    result = greedy_engine(target, proposer).generate(PROMPT, max_new_tokens=N_NEW)
    assert result.token_ids == reference[:N_NEW]
    m = result.metrics
    assert m.accepted_nodes == 0 and m.drafted_nodes > 0
    assert m.target_forwards == N_NEW and m.tau == 1.0
    check_metrics(result)


class RandomProposer(ProposerBase):
    """Drafts random tokens of random length from its own seeded RNG (ignores the context)."""

    name = "random"

    def __init__(self, target, seed: int):
        super().__init__(ProposerConfig(name=self.name), target)
        self.g = torch.Generator().manual_seed(seed)

    def propose(self, state, budget):
        n = int(torch.randint(0, 7, (1,), generator=self.g))
        return DraftTree.chain(torch.randint(0, VOCAB, (n,), generator=self.g))


def test_random_garbage_of_random_length(target, reference):
    result = greedy_engine(target, RandomProposer(target.info, seed=0)).generate(PROMPT, max_new_tokens=N_NEW)
    assert result.token_ids == reference[:N_NEW]
    check_metrics(result)


def test_draft_longer_than_budget_is_truncated(target, reference):
    # the proposer ignores the budget and drafts budget + 5 correct tokens; the engine keeps `budget` of them
    proposer = ScriptedProposer(target.info, reference, ignore_budget=5)
    result = greedy_engine(target, proposer).generate(PROMPT, max_new_tokens=13)
    assert result.token_ids == reference[:13]
    assert result.finish_reason == "length"
    assert proposer.budgets == [12]  # one step: 12 drafts + 1 bonus
    assert [o.draft.num_nodes for o in proposer.outcomes] == proposer.budgets
    check_metrics(result)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 6, 9])
@pytest.mark.parametrize("correct", [None, 2])
def test_max_new_tokens_reached_mid_block(target, reference, max_new_tokens, correct):
    # k = 4: the proposer would draft past max_new_tokens at the last step; exactly max_new_tokens come out
    proposer = ScriptedProposer(target.info, reference, k=4, correct=correct)
    result = greedy_engine(target, proposer).generate(PROMPT, max_new_tokens=max_new_tokens)
    assert result.token_ids == reference[:max_new_tokens]
    assert result.finish_reason == "length"
    assert len(result.token_ids) == max_new_tokens
    assert all(1 <= b <= max_new_tokens - 1 for b in proposer.budgets)
    if max_new_tokens == 1:
        assert proposer.budgets == []  # no room for a draft: a target-only step, the proposer is not asked
    check_metrics(result)


def test_one_token_prompt(target):
    prompt = [PROMPT[0]]
    expected = hf_greedy(target.model, prompt, N_NEW)
    assert plain_generate(target, prompt, N_NEW).token_ids == expected
    result = greedy_engine(target, NgramProposer(NgramConfig(), target.info)).generate(prompt, max_new_tokens=N_NEW)
    assert result.token_ids == expected
    proposer = ScriptedProposer(target.info, expected + [1] * 8, k=3, correct=2)
    result = greedy_engine(target, proposer).generate(prompt, max_new_tokens=N_NEW)
    assert result.token_ids == expected
    check_metrics(result)


class Spy(ProposerBase):
    """Wraps a proposer and records each draft it made."""

    def __init__(self, inner):
        super().__init__(inner.config, inner.target)
        self.inner, self.name, self.drafts = inner, inner.name, []

    def start(self, state):
        self.inner.start(state)

    def propose(self, state, budget):
        draft = self.inner.propose(state, budget)
        self.drafts.append((state.num_generated, draft.token_ids[0].tolist()))
        return draft

    def on_verified(self, outcome):
        self.inner.on_verified(outcome)


def test_ngram_without_a_match_is_plain_decoding(target):
    prompt = [7, 8, 9, 10, 11, 12, 13]  # no repeated token: nothing to look up at the first step
    expected = hf_greedy(target.model, prompt, N_NEW)
    spy = Spy(NgramProposer(NgramConfig(), target.info))
    result = greedy_engine(target, spy).generate(prompt, max_new_tokens=N_NEW)
    assert result.token_ids == expected
    assert spy.drafts[0] == (0, [])  # first step: no match, an empty draft
    check_metrics(result)


def test_ngram_k_larger_than_any_match(target):
    # max_n = min_n = 1 and k = 64: drafts are whatever followed the last token; still exact
    proposer = NgramProposer(NgramConfig(k=64, min_n=1, max_n=1), target.info)
    result = greedy_engine(target, proposer).generate(PROMPT, max_new_tokens=N_NEW)
    assert result.token_ids == hf_greedy(target.model, PROMPT, N_NEW)
    check_metrics(result)


# --- stops --------------------------------------------------------------------------------------------------------


def first_new_token_index(tokens: list[int], start: int) -> int:
    """Smallest j >= start with tokens[j] not among tokens[:j]."""
    for j in range(start, len(tokens)):
        if tokens[j] not in tokens[:j]:
            return j
    raise AssertionError("no fresh token in the reference")


def test_eos_inside_a_draft_block(model, tokenizer, reference, monkeypatch):
    j = first_new_token_index(reference, 2)
    eos = reference[j]
    monkeypatch.setattr(model.generation_config, "eos_token_id", eos)
    target = Target(model, tokenizer)
    assert target.eos_token_ids == frozenset({eos})
    # the first draft block holds the EOS (position j) and 3 tokens after it (the reference ignores EOS)
    k = j + 4
    proposer = ScriptedProposer(target.info, reference, k=k)
    result = greedy_engine(target, proposer).generate(PROMPT, max_new_tokens=N_NEW)
    assert result.token_ids == reference[: j + 1]  # EOS kept in token_ids, nothing after it
    assert result.token_ids[-1] == eos
    assert result.finish_reason == "stop"
    assert len(proposer.outcomes) == 1
    outcome = proposer.outcomes[0]
    # all k nodes passed verification, but only those up to the EOS were committed: only they count as accepted
    assert outcome.draft.num_nodes == k and outcome.accepted_nodes == (tuple(range(j + 1)),)
    assert outcome.committed == (tuple(reference[: j + 1]),)
    assert outcome.finished
    assert result.text == text_of(reference[: j + 1])  # (the EOS here is an ordinary word of the tokenizer)
    check_metrics(result)
    # transformers agrees, and so do the other proposers
    assert hf_greedy(model, PROMPT, N_NEW, eos=eos) == result.token_ids
    for other in (NoProposer(NoneConfig(), target.info), NgramProposer(NgramConfig(), target.info)):
        r = greedy_engine(target, other).generate(PROMPT, max_new_tokens=N_NEW)
        assert (r.token_ids, r.finish_reason) == (result.token_ids, "stop")
        check_metrics(r)


def test_eos_as_the_first_token(model, tokenizer, reference, monkeypatch):
    monkeypatch.setattr(model.generation_config, "eos_token_id", [reference[0], 63])
    target = Target(model, tokenizer)
    proposer = ScriptedProposer(target.info, reference, k=4)
    result = greedy_engine(target, proposer).generate(PROMPT, max_new_tokens=N_NEW)
    assert result.token_ids == reference[:1]
    assert result.finish_reason == "stop"


@pytest.mark.parametrize("words", [1, 2], ids=["one-word", "two-words"])
def test_stop_string_inside_a_block(target, reference, words):
    j = first_new_token_index(reference, 3)
    stop = text_of(reference[j - words + 1 : j + 1])
    full_text = text_of(reference)
    assert full_text.index(stop) == len(text_of(reference[: j - words + 1])) + 1
    proposer = ScriptedProposer(target.info, reference, k=j + 4)  # the first block runs 3 tokens past the stop
    result = greedy_engine(target, proposer).generate(PROMPT, max_new_tokens=N_NEW, stop_strings=["zz", stop])
    # the token completing the stop string is committed; the text is cut before the stop string
    assert result.token_ids == reference[: j + 1]
    assert result.finish_reason == "stop"
    assert result.text == full_text[: full_text.index(stop)]
    assert stop not in result.text
    assert len(proposer.outcomes) == 1
    outcome = proposer.outcomes[0]
    assert outcome.finished and outcome.committed == (tuple(reference[: j + 1]),)
    assert outcome.draft.num_nodes == j + 4 and outcome.accepted_nodes == (tuple(range(j + 1)),)
    check_metrics(result)
    r = plain_generate(target, PROMPT, N_NEW, stop_strings=[stop])
    assert (r.token_ids, r.text, r.finish_reason) == (result.token_ids, result.text, "stop")


@pytest.mark.parametrize("stop_kind", ["eos", "stop-string"])
@pytest.mark.parametrize("combined", [False, True], ids=["alone", "combined"])
def test_nothing_after_a_stop_is_counted(model, tokenizer, reference, monkeypatch, stop_kind, combined):
    """A draft block accepted past the stop: only its nodes up to the stop count as accepted — in the request's
    metrics, acceptance by position, each proposer's credit, its on_verified feedback and observer events."""
    from specframe.decode.observe import Observers
    from specframe_plugins.merge_policies import PriorityConfig, PriorityPolicy

    j = first_new_token_index(reference, 2)
    stops: dict = {}
    if stop_kind == "eos":
        monkeypatch.setattr(model.generation_config, "eos_token_id", reference[j])
    else:
        stops["stop_strings"] = [text_of(reference[j : j + 1])]
    target = Target(model, tokenizer)
    k = j + 4  # the first block: all k nodes pass verification, 3 of them after the stop
    scripted = ScriptedProposer(target.info, reference, k=k)
    proposers = [scripted, ScriptedProposer(target.info, reference, k=k)] if combined else [scripted]
    merge = PriorityPolicy(PriorityConfig(max_nodes=64)) if combined else None
    events: list = []
    observer = Observers(0, [("recorder", lambda event: events.append(event))], [])
    result = Engine(target, proposers, GreedyVerifier(), merge=merge).generate(
        PROMPT, max_new_tokens=N_NEW, observer=observer, **stops)
    assert result.token_ids == reference[: j + 1] and result.finish_reason == "stop"
    m = result.metrics
    assert (m.target_forwards, m.drafted_nodes) == (1, k)
    assert m.accepted_nodes == j + 1 and m.accepted_by_depth == [1] * (j + 1) + [0] * (k - j - 1)
    assert m.acceptance_rate == pytest.approx((j + 1) / k)
    for label, pm in m.proposers.items():
        assert pm.accepted_nodes == j + 1, label
        assert pm.accepted_by_depth == [1] * (j + 1) + [0] * (k - j - 1), label
        assert pm.wasted_nodes == k - (j + 1), label
    assert scripted.outcomes[0].accepted_nodes == (tuple(range(j + 1)),)
    assert [(e.drafted, e.accepted, e.committed) for e in events] == [(k, j + 1, tuple(reference[: j + 1]))]
    assert all(step.accepted == j + 1 for step in events[0].attribution)
    check_metrics(result)


def test_stop_string_spanning_steps(target, reference):
    # plain decoding commits one token per step: the stop string is completed across steps
    j = first_new_token_index(reference, 4)
    stop = text_of(reference[j - 2 : j + 1])
    r = plain_generate(target, PROMPT, N_NEW, stop_strings=[stop])
    assert r.token_ids == reference[: j + 1]
    assert r.text == text_of(reference[: j - 2]) + " "


def test_stop_string_never_matching(target, reference):
    r = greedy_engine(target, NgramProposer(NgramConfig(), target.info)).generate(
        PROMPT, max_new_tokens=N_NEW, stop_strings=["zz"]
    )
    assert r.token_ids == reference[:N_NEW] and r.finish_reason == "length"
    assert r.text == text_of(reference[:N_NEW])


def test_context_limit_stops_with_length(target):
    prompt = (PROMPT * 30)[: target.max_context - 5]
    result = greedy_engine(target, NgramProposer(NgramConfig(), target.info)).generate(prompt, max_new_tokens=50)
    assert len(result.token_ids) == 5 and result.finish_reason == "length"
    assert result.token_ids == plain_generate(target, prompt, 50).token_ids
    check_metrics(result)


# --- KV cache rollback --------------------------------------------------------------------------------------------


def layer_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


@pytest.mark.parametrize("accepted", [0, 2, 5])
def test_kv_after_rollback_equals_fresh_prefill(target, accepted):
    prompt = torch.tensor([PROMPT], device=target.device)
    draft = torch.tensor([[3, 14, 15, 9, 26, 5]], device=target.device)
    with torch.inference_mode():
        cache = target.new_cache()
        target.forward(prompt[:, :-1], cache)
        target.forward(torch.cat([prompt[:, -1:], draft], 1), cache)  # the verification forward
        assert cache_length(cache) == prompt.shape[1] + draft.shape[1]
        rollback(cache, prompt.shape[1] + accepted)
        assert cache_length(cache) == prompt.shape[1] + accepted
        committed = torch.cat([prompt, draft[:, :accepted]], 1)
        fresh = target.new_cache()
        target.forward(committed, fresh)
        rollback(fresh, cache_length(fresh))  # removes nothing; trims sliding-window layers to their window
        for (k1, v1), (k2, v2) in zip(layer_kv(cache), layer_kv(fresh), strict=True):
            assert k1.shape == k2.shape and v1.shape == v2.shape
            torch.testing.assert_close(k1, k2, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(v1, v2, rtol=1e-5, atol=1e-5)
        # continuing after the rollback scores the next token exactly like a full forward of the sequence
        nxt = torch.tensor([[42, 17]], device=target.device)
        cont, _ = target.forward(nxt, cache)
        full, _ = target.forward(torch.cat([committed, nxt], 1), target.new_cache())
        torch.testing.assert_close(cont[0], full[0, -2:], rtol=1e-4, atol=1e-5)


def test_kv_rollback_on_sliding_window_layers_past_the_window(tokenizer):
    # 30 positions, window 8: a sliding layer keeps only the window unless past recording lets us crop
    target = Target(build_model("qwen2-sliding"), tokenizer)
    seq = torch.tensor([PROMPT + PROMPT_2 + [1, 2, 3, 4, 5, 6, 7, 8]], device=target.device)
    with torch.inference_mode():
        cache = target.new_cache()
        target.forward(seq[:, :20], cache)
        target.forward(seq[:, 20:], cache)  # 10 new positions, 6 rejected
        rollback(cache, 24)
        nxt, _ = target.forward(seq[:, 24:25], cache)
        full, _ = target.forward(seq[:, :25], target.new_cache())
    torch.testing.assert_close(nxt[0, -1], full[0, -1], rtol=1e-4, atol=1e-5)


def test_rollback_cannot_grow_the_cache(target):
    cache = target.new_cache()
    with torch.inference_mode():
        target.forward(torch.tensor([PROMPT], device=target.device), cache)
    with pytest.raises(ValueError, match="cannot roll the KV cache forward"):
        rollback(cache, len(PROMPT) + 1)
    rollback(cache, len(PROMPT))  # a no-op
    assert cache_length(cache) == len(PROMPT)


# --- sampling -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("proposer_name", ["none", "ngram"])
def test_sampling_same_seed_same_tokens(target, proposer_name):
    params = SamplingParams(temperature=1.0)

    def run(seed: int) -> list[int]:
        proposer = (NoProposer(NoneConfig(), target.info) if proposer_name == "none"
                    else NgramProposer(NgramConfig(), target.info))
        engine = Engine(target, [proposer], SpeculativeSamplingVerifier())
        result = engine.generate(PROMPT, max_new_tokens=24, sampling=params, seed=seed)
        check_metrics(result)
        return result.token_ids

    a, b = run(0), run(0)
    assert a == b
    assert len({tuple(run(s)) for s in (1, 2, 3)} | {tuple(a)}) == 4  # different seeds, different samples


def test_sampling_does_not_use_the_global_rng(target):
    engine = Engine(target, [NgramProposer(NgramConfig(), target.info)], SpeculativeSamplingVerifier())
    params = SamplingParams(temperature=0.8, top_k=20)
    torch.manual_seed(1)
    a = engine.generate(PROMPT, max_new_tokens=16, sampling=params, seed=5).token_ids
    torch.manual_seed(2)
    b = engine.generate(PROMPT, max_new_tokens=16, sampling=params, seed=5).token_ids
    assert a == b


def test_sampling_with_top_k_1_is_greedy(target, reference):
    # top_k = 1 leaves one token per position: sampling must reproduce greedy decoding, with any proposer
    params = SamplingParams(temperature=1.0, top_k=1)
    for proposer in (NgramProposer(NgramConfig(), target.info), ScriptedProposer(target.info, reference, correct=2)):
        r = Engine(target, [proposer], SpeculativeSamplingVerifier()).generate(
            PROMPT, max_new_tokens=N_NEW, sampling=params, seed=3
        )
        assert r.token_ids == reference[:N_NEW]
        check_metrics(r)


# --- streaming ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stop", [None, "two-words"])
def test_streamed_pieces_concatenate_to_the_text(target, reference, stop):
    stop_strings = ()
    if stop:
        j = first_new_token_index(reference, 6)
        stop_strings = (text_of(reference[j - 1 : j + 1]),)
    pieces: list[str] = []
    engine = greedy_engine(target, NgramProposer(NgramConfig(), target.info))
    result = engine.generate(PROMPT, max_new_tokens=N_NEW, stop_strings=stop_strings, on_text=pieces.append)
    assert "".join(pieces) == result.text
    assert len(pieces) > 1 and all(pieces)  # streamed as it went, no empty pieces
    if stop:
        assert result.finish_reason == "stop"
        assert stop_strings[0] not in result.text and result.text.endswith(" ")


def test_streaming_sampled_text(target):
    pieces: list[str] = []
    engine = Engine(target, [NgramProposer(NgramConfig(), target.info)], SpeculativeSamplingVerifier())
    result = engine.generate(
        PROMPT, max_new_tokens=30, sampling=SamplingParams(temperature=1.0), seed=4, on_text=pieces.append
    )
    assert "".join(pieces) == result.text == text_of(result.token_ids)


# --- faults and errors --------------------------------------------------------------------------------------------


class Faulty(ProposerBase):
    name = "faulty"

    def __init__(self, target, mode: str):
        super().__init__(ProposerConfig(name=self.name), target)
        self.mode = mode

    def propose(self, state, budget):
        if self.mode == "raise":
            raise RuntimeError("boom")
        if self.mode == "out-of-vocab":
            return DraftTree.chain([VOCAB + 3])
        if self.mode == "tree":
            return DraftTree(torch.tensor([[1, 2]]), torch.tensor([[-1, -1]]))
        if self.mode == "bad-probs":
            return DraftTree.chain([1], torch.full((1, VOCAB), 0.5))
        raise ValueError(self.mode)

    def on_verified(self, outcome):
        if self.mode == "raise":
            raise RuntimeError("boom again")


@pytest.mark.parametrize("mode", ["raise", "out-of-vocab", "tree", "bad-probs"])
def test_a_faulty_proposer_cannot_change_the_output(target, reference, mode, caplog):
    result = greedy_engine(target, Faulty(target.info, mode)).generate(PROMPT, max_new_tokens=12)
    assert result.token_ids == reference[:12]
    assert result.finish_reason == "length"
    assert result.metrics.proposer_faults >= 1
    assert result.metrics.drafted_nodes == 0  # no bad draft reached the target
    assert any("faulty" in r.getMessage() for r in caplog.records)  # the user is told which proposer


def test_generate_rejects_bad_requests(target):
    engine = greedy_engine(target, NoProposer(NoneConfig(), target.info))
    with pytest.raises(ConfigError, match="^max_new_tokens must be >= 1"):
        engine.generate(PROMPT, max_new_tokens=0)
    with pytest.raises(ConfigError, match="empty"):
        engine.generate([], max_new_tokens=4)
    with pytest.raises(PromptTooLongError):
        engine.generate([1] * target.max_context, max_new_tokens=4)
    with pytest.raises(ConfigError, match="at least one proposer"):
        Engine(target, [], GreedyVerifier())
    ngram = NgramProposer(NgramConfig(), target.info)
    with pytest.raises(ConfigError, match="needs a merge policy"):  # combining: see tests/combining/test_combined_engine.py
        Engine(target, [ngram, NoProposer(NoneConfig(), target.info)], GreedyVerifier())
    with pytest.raises(ConfigError, match="listed twice"):
        Engine(target, [ngram, ngram], GreedyVerifier(), merge=object())


def test_tree_proposer_with_a_chain_verifier_drafts_chains(target, reference):
    """A verifier that takes chains only: a tree-drafting proposer's drafts keep their leading chain (no fault), and
    the output is the target's."""
    seen = []

    class TreeProposer(NoProposer):
        name = "tree"
        produces_trees = True

        def propose(self, state, budget):  # the target's next token, plus a wrong sibling of it
            nxt = reference[state.num_generated]
            return DraftTree.from_lists([nxt, (nxt + 1) % target.vocab_size], [-1, -1])

    class ChainOnlyVerifier(GreedyVerifier):
        supports_trees = False

        def verify(self, draft, logits, sampling, generator):
            seen.append(draft.is_chain())
            return super().verify(draft, logits, sampling, generator)

    result = Engine(target, [TreeProposer(NoneConfig(), target.info)], ChainOnlyVerifier()).generate(
        PROMPT, max_new_tokens=6)
    assert result.token_ids == reference[:6]
    assert seen and all(seen)
    assert result.metrics.proposer_faults == 0 and result.metrics.accepted_nodes >= 1


def test_engine_is_reusable_and_restarts_the_proposer(target, reference):
    proposer = ScriptedProposer(target.info, reference, k=3, correct=1)
    engine = greedy_engine(target, proposer)
    first = engine.generate(PROMPT, max_new_tokens=10)
    second = engine.generate(PROMPT, max_new_tokens=10)
    assert first.token_ids == second.token_ids == reference[:10]
    assert proposer.starts == 2
    check_metrics(first)
    check_metrics(second)
    assert first.metrics.to_dict()["new_tokens"] == second.metrics.new_tokens == 10


def test_result_record(target, reference):
    result = greedy_engine(target, NgramProposer(NgramConfig(), target.info)).generate(PROMPT, max_new_tokens=8)
    record = result.to_dict()
    assert record["token_ids"] == reference[:8]
    assert record["finish_reason"] == "length"
    assert record["text"] == text_of(reference[:8])
    m = record["metrics"]
    assert m["new_tokens"] == 8 and m["prompt_tokens"] == len(PROMPT)
    assert m["tau"] == round(8 / m["target_forwards"], 4)
    assert result.prompt_token_ids == PROMPT


# --- hidden states for proposers that ask for them ------------------------------------------------------------------


class HiddenSpy(ScriptedProposer):
    """A scripted proposer that needs hidden states and records the one it sees at each step."""

    needs_hidden_states = True

    def start(self, state):
        super().start(state)
        self.seen = []

    def propose(self, state, budget):
        self.seen.append((state.tokens[0].tolist(), None if state.hidden is None else state.hidden.clone()))
        return super().propose(state, budget)


@pytest.mark.parametrize("prompt", [PROMPT, PROMPT[:1]], ids=["prompt", "one-token"])
def test_hidden_state_is_the_last_processed_position(target, prompt):
    reference = hf_greedy(target.model, prompt, N_NEW + 8)
    spy = HiddenSpy(target.info, reference, k=4, correct=2)
    result = greedy_engine(target, spy).generate(prompt, max_new_tokens=20)
    assert result.token_ids == reference[:20]
    check_metrics(result)
    with torch.inference_mode():
        full = target.model(input_ids=torch.tensor([prompt + result.token_ids], device=target.device),
                            output_hidden_states=True)
    last_layer = full.hidden_states[-1][0]
    assert len(spy.seen) > 3
    for tokens, hidden in spy.seen:
        if len(tokens) == 1:  # nothing processed yet
            assert hidden is None
            continue
        # the cache holds all but the newest token, so the last processed position is len(tokens) - 2
        torch.testing.assert_close(hidden[0], last_layer[len(tokens) - 2], rtol=1e-4, atol=1e-5)


def byte_tokenizer(eos: int | None = None):
    """A byte-level tokenizer with one token per byte (id = byte value): any non-ASCII character spans tokens.
    ``eos``: the byte whose token is the (special, not decoded) EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok,
                                   eos_token=None if eos is None else bytes_to_unicode()[eos])


@pytest.mark.parametrize("finish", ["length", "eos"])
def test_a_character_cut_by_the_budget_is_left_out_of_text_and_stream(finish, monkeypatch):
    """When generation ends inside a multi-byte character the text ended in U+FFFD. As transformers' TextStreamer
    holds an incomplete character back while it may still complete, specframe holds it back for good once it can
    no longer complete: not in ``text``, never streamed; its bytes stay in ``token_ids``."""
    model = build_model("llama", vocab_size=256, seed=4)
    tok = byte_tokenizer()
    prompt = tok("naïve café, 東京 — ")["input_ids"]
    ref = hf_greedy(model, prompt, 60)
    # a byte that starts a multi-byte character (for "eos": followed by a byte not seen before, made the EOS)
    lead = [i for i, t in enumerate(ref[:-1]) if 0xC2 <= t <= 0xF4 and ref[i + 1] not in ref[: i + 1]]
    assert lead, "the reference has no multi-byte lead byte: pick another seed"
    cut = lead[0] + 1
    if finish == "eos":  # the next token is an EOS: the model ended inside the character
        monkeypatch.setattr(model.generation_config, "eos_token_id", ref[cut])
        tok = byte_tokenizer(eos=ref[cut])
        cut += 1
    target = Target(model, tok)
    pieces: list[str] = []
    result = greedy_engine(target, NgramProposer(NgramConfig(), target.info)).generate(
        prompt, max_new_tokens=cut if finish == "length" else 60, on_text=pieces.append)
    assert result.token_ids == ref[:cut] and result.finish_reason == ("length" if finish == "length" else "stop")
    decoded = tok.decode(result.token_ids, skip_special_tokens=True)
    assert decoded.endswith("\ufffd")  # what the text was before
    assert result.text == decoded.rstrip("\ufffd") and not result.text.endswith("\ufffd")
    assert "".join(pieces) == result.text
    assert all(not p.endswith("\ufffd") for p in pieces)
