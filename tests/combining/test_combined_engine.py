"""Combined decoding through the engine: greedy exactness on llama / qwen2 / qwen2-sliding with ngram + a tree
proposer + the draft-model proposer, the merged tree the verifier sees, per-proposer feedback and attribution,
and the calibration of combined sampling."""

from __future__ import annotations

import math

import pytest
import torch

from specframe import ProposerBase, ProposerConfig
from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from specframe.decode.engine import Engine
from specframe.sampling import SamplingParams, probs_from_logits
from specframe.target.hf import Target
from specframe.testing.calls import CallLog
from specframe_plugins.draft_model import DraftModelConfig, DraftModelProposer
from specframe_plugins.ngram import NgramConfig, NgramProposer
from specframe_plugins.router import AdaptiveConfig, AdaptiveRouter

from tests.fakes import (
    ARCHS,
    PROMPT,
    PROMPT_2,
    VOCAB,
    ScriptedChain,
    ScriptedTree,
    build_model,
    chain,
    check_metrics,
    policy_of,
)
from tests.fakes import COMBINING_N_NEW as N_NEW  # the references in envs (conftest) hold N_NEW + 8 tokens

# --- greedy: combined == plain greedy ---------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("policy", ["priority", "confidence"])
@pytest.mark.parametrize("routed", [False, True], ids=["no-router", "adaptive"])
def test_combined_greedy_equals_plain_greedy(envs, arch, policy, routed):
    target, refs, folder = envs[arch]
    for i, prompt in enumerate((PROMPT, PROMPT_2)):
        proposers = [
            CallLog(NgramProposer(NgramConfig(k=4), target.info), VOCAB),
            CallLog(ScriptedTree(target.info, refs[i]), VOCAB),
            CallLog(DraftModelProposer(DraftModelConfig(model=str(folder), k=3, min_confidence=0.0), target.info),
                     VOCAB),
        ]
        router = AdaptiveRouter(AdaptiveConfig()) if routed else None
        engine = Engine(target, proposers, GreedyVerifier(), merge=policy_of(policy), router=router)
        res = engine.generate(prompt, max_new_tokens=N_NEW)
        assert res.token_ids == refs[i][:N_NEW]
        check_metrics(res)
        m = res.metrics
        assert list(m.proposers) == ["ngram", "scripted-tree", "draft-model"]
        assert m.accepted_nodes > N_NEW // 3  # the scripted tree alone is accepted 3 deep per step
        credited = sum(pm.accepted_nodes for pm in m.proposers.values())
        alone = sum(pm.accepted_alone for pm in m.proposers.values())
        assert alone <= m.accepted_nodes <= credited
        assert m.drafted_nodes <= sum(pm.drafted_nodes for pm in m.proposers.values())
        for pm in m.proposers.values():
            assert pm.wasted_nodes == pm.drafted_nodes - pm.accepted_nodes >= 0
            assert pm.drafted_nodes <= pm.proposed_nodes and pm.faults == 0
            assert sum(pm.drafted_by_depth) == pm.drafted_nodes
            assert sum(pm.accepted_by_depth) == pm.accepted_nodes
        for rec in proposers:
            assert not rec.problems, rec.problems


def test_merged_trees_respect_the_node_budget_and_the_verifier_sees_one_tree(envs):
    target, refs, folder = envs["llama"]
    seen = []

    class Spy(GreedyVerifier):
        def verify(self, draft, target_logits, sampling, generator):
            seen.append((draft.num_nodes, target_logits.shape[1]))
            return super().verify(draft, target_logits, sampling, generator)

    proposers = [ScriptedChain(target.info, refs[0], k=6, correct=2), ScriptedTree(target.info, refs[0], good=4),
                 NgramProposer(NgramConfig(k=6), target.info)]
    res = Engine(target, proposers, Spy(), merge=policy_of("priority", max_nodes=5)).generate(PROMPT, max_new_tokens=N_NEW)
    assert res.token_ids == refs[0][:N_NEW]
    assert all(n <= 5 and rows == n + 1 for n, rows in seen)  # one forward over the merged tree
    assert len(seen) == res.metrics.target_forwards


def test_sliding_window_target_verifies_one_chain_the_policy_picks(envs):
    target, refs, _ = envs["qwen2-sliding"]
    assert not target.supports_trees
    chains = []

    class Spy(GreedyVerifier):
        def verify(self, draft, target_logits, sampling, generator):
            chains.append((draft.is_chain(), draft.token_ids[0].tolist()))
            return super().verify(draft, target_logits, sampling, generator)

    # two chains that diverge after their first token would make a tree: the first proposer's chain is verified
    a, b = ScriptedChain(target.info, refs[0], k=4, correct=1, name="a"), ScriptedChain(target.info, refs[0], k=4, name="b")
    res = Engine(target, [a, b], Spy(), merge=policy_of("priority")).generate(PROMPT, max_new_tokens=N_NEW)
    assert res.token_ids == refs[0][:N_NEW]
    assert all(is_chain for is_chain, _ in chains)
    a_m, b_m = res.metrics.proposers["a"], res.metrics.proposers["b"]
    assert a_m.drafted_nodes == a_m.proposed_nodes > 0  # a's chain every step
    assert b_m.drafted_nodes <= 1 and b_m.accepted_alone == 0  # b only where its draft was a's (a 1-token step)
    assert res.metrics.proposer_faults == 0


# --- feedback --------------------------------------------------------------------------------------------------------


def test_each_proposer_hears_about_its_own_draft(envs):
    target, refs, _ = envs["llama"]
    a = CallLog(ScriptedChain(target.info, refs[0], k=4, name="a"), VOCAB)  # always right
    b = CallLog(ScriptedChain(target.info, refs[0], k=3, correct=1, name="b"), VOCAB)  # right once, then wrong
    res = Engine(target, [a, b], GreedyVerifier(), merge=policy_of("priority")).generate(PROMPT, max_new_tokens=21)
    assert res.token_ids == refs[0][:21]
    for rec, want in ((a, lambda d: tuple(range(d.num_nodes))), (b, lambda d: (0,) if d.num_nodes else ())):
        outcomes = [c.outcome for c in rec.calls if c.method == "on_verified"]
        drafts = rec.drafts()
        assert len(outcomes) == res.metrics.target_forwards
        for o, d in zip(outcomes, drafts):
            assert torch.equal(o.draft.token_ids, d.token_ids)  # its own draft, own node indices
            assert o.accepted_nodes == (want(d),)
    m = res.metrics.proposers
    assert m["a"].accepted_nodes == res.metrics.accepted_nodes  # a's chain is the accepted path
    assert m["b"].accepted_nodes == m["a"].steps == m["b"].steps  # b's first node shared: credited to both
    assert m["b"].accepted_alone == 0 and m["a"].accepted_alone == res.metrics.accepted_nodes - m["b"].accepted_nodes


def test_a_truncated_draft_hears_about_the_part_that_was_verified(envs):
    target, refs, _ = envs["llama"]
    a = CallLog(ScriptedChain(target.info, refs[0], k=3, correct=0, name="a"), VOCAB)
    b = CallLog(ScriptedChain(target.info, refs[0], k=5, name="b"), VOCAB)
    res = Engine(target, [a, b], GreedyVerifier(), merge=policy_of("priority", max_nodes=5)).generate(
        PROMPT, max_new_tokens=13)
    assert res.token_ids == refs[0][:13]
    first = next(c.outcome for c in b.calls if c.method == "on_verified")
    assert first.draft.num_nodes == 2 and first.accepted_nodes == ((0, 1),)  # 3 of a's nodes, then 2 of b's
    assert res.metrics.proposers["b"].proposed_nodes > res.metrics.proposers["b"].drafted_nodes


# --- sampling through the engine --------------------------------------------------------------------------------------


class QSampler(ProposerBase):
    """A stochastic chain: ``k`` tokens sampled from a fixed q with the request's generator, q given."""

    name = "q-sampler"
    provides_draft_probs = True

    def __init__(self, target, q, k):
        super().__init__(ProposerConfig(name=self.name), target)
        self.q, self.k = q, k

    def propose(self, state, budget):
        k = min(self.k, budget)
        tokens = torch.multinomial(self.q, k, replacement=True, generator=state.generator)
        return chain(tokens, self.q.expand(k, -1).clone())


class Mode(ProposerBase):
    """Deterministic: always proposes q's most likely token (so it often equals the stochastic chain's first)."""

    name = "mode"

    def __init__(self, target, q, name="mode", k=1):
        super().__init__(ProposerConfig(name=name), target)
        self.name, self.token, self.k = name, int(q.argmax()), k

    def propose(self, state, budget):
        return chain([self.token] * min(self.k, budget))


@pytest.fixture(scope="module")
def peaky_target():
    model = build_model("llama", seed=3, vocab_size=16, initializer_range=0.3, max_position_embeddings=4096)
    return Target(model, None)


@pytest.mark.parametrize("routed", [False, True], ids=["no-router", "adaptive"])
def test_combined_sampling_is_calibrated(peaky_target, routed):
    """One long sampled generation with a stochastic chain, ngram and two deterministic proposers that often
    draft the stochastic chain's token at the same path (see test_engine_sampling_is_calibrated in
    tests/kernel/test_sampling_exactness.py for the statistics)."""
    target, vocab, n = peaky_target, 16, 1500
    params = SamplingParams(temperature=1.0, top_k=12)
    prompt = [1, 2, 3, 1, 2, 3, 4]
    with torch.inference_mode():  # q: the target's average next-token distribution over the prompt
        q = probs_from_logits(target.model(input_ids=torch.tensor([prompt])).logits[0], params).mean(0)
    proposers = [Mode(target.info, q, "mode", 2), QSampler(target.info, q, 3),
                 NgramProposer(NgramConfig(k=3, max_n=3), target.info), Mode(target.info, q, "mode-1", 1)]
    router = AdaptiveRouter(AdaptiveConfig()) if routed else None
    engine = Engine(target, proposers, SpeculativeSamplingVerifier(), merge=policy_of("priority", 8), router=router)
    result = engine.generate(prompt, max_new_tokens=n, sampling=params, seed=1)
    assert len(result.token_ids) == n and result.metrics.proposer_faults == 0
    m = result.metrics
    if not routed:  # every proposer's drafts got accepted (and rejected)
        assert all(pm.accepted_nodes > 25 for pm in m.proposers.values())
        assert m.proposers["mode-1"].accepted_alone == 0  # always the same node as mode's first: shared credit
    again = [engine.generate(prompt, max_new_tokens=40, sampling=params, seed=s).token_ids for s in (7, 7, 8)]
    assert again[0] == again[1] != again[2]  # seeded: same seed, same tokens
    with torch.inference_mode():
        logits = target.model(input_ids=torch.tensor([prompt + result.token_ids])).logits[0, len(prompt) - 1 : -1]
    p = probs_from_logits(logits, params).double()
    y = torch.tensor(result.token_ids)
    freq = torch.bincount(y, minlength=vocab).double() / n
    assert 0.5 * (freq - p.mean(0)).abs().sum().item() <= math.sqrt(vocab / n)
    chosen = p[torch.arange(n), y]
    expected = (p**2).sum(-1)
    z = (chosen - expected).sum() / ((p**3).sum(-1) - expected**2).sum().sqrt()
    assert abs(z.item()) < 4, f"calibration z-score {z.item():+.2f}"
