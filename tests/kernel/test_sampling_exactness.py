"""Speculative sampling preserves the target distribution (Leviathan et al. 2022, Theorem 1), checked statistically.

Each check is one batched call of :func:`specframe.acceptance.sampling_chain` over N = 200 000 rows (independent
trials) with V = 10. The emitted token's empirical distribution must be within total-variation distance
sqrt(V / n) of the target distribution (n = trials that emitted it); the expected TV of an exact sampler is about
0.4 * sqrt(V / n), and everything is seeded, so the tests are deterministic. Two deliberately broken samplers
(swapped ratio, wrong residual) must land above the same threshold: the test has power.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from specframe.acceptance import SpeculativeSamplingVerifier, sampling_chain
from specframe.contracts import DraftTree, ProposerBase, ProposerConfig
from specframe.decode.engine import Engine
from specframe.sampling import SamplingParams, probs_from_logits
from specframe.target.hf import Target
from specframe_plugins.ngram import NgramConfig, NgramProposer

from tests.fakes import build_model

V = 10
N = 200_000

WARPS = {
    "plain": SamplingParams(temperature=1.0),
    "warped": SamplingParams(temperature=0.7, top_k=6, top_p=0.9),
}


def threshold(n: int) -> float:
    return math.sqrt(V / n)


def tv(samples: Tensor, probs: Tensor) -> float:
    """Total-variation distance between the empirical distribution of ``samples`` and ``probs`` ([V])."""
    freq = torch.bincount(samples, minlength=V).double() / samples.numel()
    return 0.5 * (freq - probs.double()).abs().sum().item()


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- deliberately broken samplers (same structure as sampling_chain, one bug each) -------------------------------


def swapped_ratio_chain(target_probs, draft_probs, draft_tokens, generator):
    """BUG: accepts with min(1, q/p) instead of min(1, p/q)."""
    b, k = draft_tokens.shape
    rows = torch.arange(b)
    p_x = target_probs[:, :k].gather(2, draft_tokens[..., None]).squeeze(2)
    q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs.gather(2, draft_tokens[..., None]).squeeze(2)
    u = torch.rand((b, k), generator=generator)
    num_accepted = (u * p_x < q_x).to(torch.int64).cumprod(1).sum(1)
    return num_accepted, _recover(target_probs, draft_probs, draft_tokens, num_accepted, rows, generator)


def wrong_residual_chain(target_probs, draft_probs, draft_tokens, generator):
    """BUG: after a rejection, draws the recovered token from p instead of norm(max(0, p - q))."""
    b, k = draft_tokens.shape
    p_x = target_probs[:, :k].gather(2, draft_tokens[..., None]).squeeze(2)
    q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs.gather(2, draft_tokens[..., None]).squeeze(2)
    u = torch.rand((b, k), generator=generator)
    num_accepted = (u * q_x < p_x).to(torch.int64).cumprod(1).sum(1)
    p_sel = target_probs[torch.arange(b), num_accepted]
    return num_accepted, torch.multinomial(p_sel, 1, generator=generator).squeeze(1)


def _recover(target_probs, draft_probs, draft_tokens, num_accepted, rows, generator):
    """The correct residual / bonus draw (shared by the swapped-ratio variant)."""
    b, k = draft_tokens.shape
    p_sel = target_probs[rows, num_accepted]
    rejected = num_accepted < k
    if draft_probs is None:
        q_sel = torch.zeros_like(p_sel)
        x_sel = draft_tokens.gather(1, num_accepted.clamp(max=k - 1)[:, None])
        q_sel.scatter_(1, x_sel, rejected[:, None].to(q_sel.dtype))
    else:
        q_sel = torch.cat([draft_probs, draft_probs.new_zeros((b, 1, V))], 1)[rows, num_accepted]
    residual = (p_sel - q_sel).clamp_min(0.0)
    residual = torch.where(residual.sum(-1, keepdim=True) <= 1e-7, p_sel, residual)
    return torch.multinomial(residual, 1, generator=generator).squeeze(1)


SAMPLERS = {"correct": sampling_chain, "swapped-ratio": swapped_ratio_chain, "wrong-residual": wrong_residual_chain}


# --- problems -----------------------------------------------------------------------------------------------------


def distributions(seed: int, k: int, params: SamplingParams) -> tuple[Tensor, Tensor]:
    """Target ``p`` ([K+1, V]) and draft ``q`` ([K, V]) from random logits, both warped by ``params``.

    Logits are scaled so that p and q are far apart (the broken samplers then fail by a wide margin).
    """
    g = gen(seed)
    p = probs_from_logits(torch.randn(k + 1, V, generator=g) * 1.5, params)
    q = probs_from_logits(torch.randn(k, V, generator=g) * 1.5, params)
    return p, q


def draft(kind: str, q: Tensor, p: Tensor, seed: int) -> tuple[Tensor | None, Tensor]:
    """``(draft_probs [N, K, V] or None, draft_tokens [N, K])`` for one proposal kind."""
    k = q.shape[0]
    g = gen(seed + 1000)
    if kind == "q":  # tokens drawn from q, q given to the verifier
        tokens = torch.stack([torch.multinomial(q[i], N, replacement=True, generator=g) for i in range(k)], 1)
        return q.expand(N, k, V), tokens
    if kind == "one-hot-fixed":  # the same deterministic token every trial: the 2nd most likely under p
        tokens = torch.stack([p[i].argsort(descending=True)[1].expand(N) for i in range(k)], 1)
        return None, tokens
    if kind == "one-hot-random":  # deterministic proposals that vary from trial to trial (drawn from q, which
        # the verifier is not told: one-hot q). Not uniform: with uniform proposals the wrong residual is exact.
        tokens = torch.stack([torch.multinomial(q[i], N, replacement=True, generator=g) for i in range(k)], 1)
        return None, tokens
    raise ValueError(kind)


def emitted(num_accepted: Tensor, next_token: Tensor, draft_tokens: Tensor, position: int) -> tuple[Tensor, Tensor]:
    """Token emitted at ``position`` (0-based) of a step, and the mask of trials that emitted one there.

    Position ``i`` is emitted iff the first ``i`` drafts were accepted; it is draft ``i`` if that was accepted
    too, else the step's recovered/bonus token.
    """
    k = draft_tokens.shape[1]
    mask = num_accepted >= position
    tok = next_token.clone()
    if position < k:
        took_draft = num_accepted > position
        tok = torch.where(took_draft, draft_tokens[:, position], next_token)
    return tok[mask], mask


CASES = [(kind, k) for kind in ("q", "one-hot-fixed", "one-hot-random") for k in (1, 2)]


@pytest.mark.parametrize("warp", list(WARPS))
@pytest.mark.parametrize("kind, k", CASES)
def test_emitted_tokens_follow_the_target(kind, k, warp):
    params = WARPS[warp]
    p, q = distributions(seed=k, k=k, params=params)
    draft_probs, draft_tokens = draft(kind, q, p, seed=k)
    target_probs = p.expand(N, k + 1, V)
    num_accepted, next_token = sampling_chain(target_probs, draft_probs, draft_tokens, gen(7))

    # first token: every trial emits one; its marginal is p_0
    first, _ = emitted(num_accepted, next_token, draft_tokens, 0)
    assert first.numel() == N
    assert tv(first, p[0]) <= threshold(N)
    # second token: emitted where the first draft was accepted; p_1 does not depend on the first token here,
    # so its distribution given that acceptance is p_1
    second, mask = emitted(num_accepted, next_token, draft_tokens, 1)
    n1 = int(mask.sum())
    assert n1 > 2000, "too few acceptances for the second-token check"
    assert tv(second, p[1]) <= threshold(n1)
    if k == 2:  # bonus token after two acceptances: drawn from p_2
        bonus, mask2 = emitted(num_accepted, next_token, draft_tokens, 2)
        n2 = int(mask2.sum())
        assert n2 > 1000
        assert tv(bonus, p[2]) <= threshold(n2)


@pytest.mark.parametrize("warp", list(WARPS))
def test_acceptance_rate_matches_theory(warp):
    # For q-drafts, P(accept) = sum_x min(p(x), q(x)) (Leviathan et al. §3.1); within a few std of N trials.
    params = WARPS[warp]
    p, q = distributions(seed=3, k=1, params=params)
    draft_probs, draft_tokens = draft("q", q, p, seed=3)
    num_accepted, _ = sampling_chain(p.expand(N, 2, V), draft_probs, draft_tokens, gen(11))
    alpha = torch.minimum(p[0], q[0]).sum().item()
    assert abs(num_accepted.double().mean().item() - alpha) < 5 * math.sqrt(alpha * (1 - alpha) / N)


@pytest.mark.parametrize("buggy", ["swapped-ratio", "wrong-residual"])
@pytest.mark.parametrize("kind", ["q", "one-hot-fixed", "one-hot-random"])
def test_broken_samplers_fail_the_same_check(buggy, kind):
    """Power: the same statistic and threshold reject each broken sampler, by a wide margin."""
    params = WARPS["plain"]
    p, q = distributions(seed=1, k=1, params=params)
    draft_probs, draft_tokens = draft(kind, q, p, seed=1)
    num_accepted, next_token = SAMPLERS[buggy](p.expand(N, 2, V), draft_probs, draft_tokens, gen(7))
    first, _ = emitted(num_accepted, next_token, draft_tokens, 0)
    assert tv(first, p[0]) > 3 * threshold(N)
    # and the correct sampler passes on exactly this problem
    num_accepted, next_token = sampling_chain(p.expand(N, 2, V), draft_probs, draft_tokens, gen(7))
    first, _ = emitted(num_accepted, next_token, draft_tokens, 0)
    assert tv(first, p[0]) <= threshold(N)


def test_probs_from_logits_matches_transformers_warpers():
    # Same warp as HF generate: temperature, then top-k, then top-p (with at least one token kept).
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    x = torch.randn(64, V, generator=gen(0)) * 3
    for t, k, top_p in [(1.0, 0, 1.0), (0.7, 6, 0.9), (1.3, 3, 1.0), (0.5, 0, 0.5), (1.0, 1, 0.3), (2.0, 9, 0.01)]:
        params = SamplingParams(temperature=t, top_k=k, top_p=top_p)
        ref = TemperatureLogitsWarper(t)(None, x.clone())
        if k:
            ref = TopKLogitsWarper(k)(None, ref)
        if top_p < 1:
            ref = TopPLogitsWarper(top_p)(None, ref)
        assert torch.allclose(probs_from_logits(x, params), ref.softmax(-1), atol=1e-6), (t, k, top_p)


# --- end to end through the Engine ------------------------------------------------------------------------------


class QSampler(ProposerBase):
    """Drafts ``k`` tokens sampled (with the request's generator) from a fixed distribution q, giving q."""

    name = "q-sampler"
    provides_draft_probs = True

    def __init__(self, target, q: Tensor, k: int) -> None:
        super().__init__(ProposerConfig(name=self.name), target)
        self.q, self.k = q, k

    def propose(self, state, budget: int) -> DraftTree:
        k = min(self.k, budget)
        tokens = torch.multinomial(self.q, k, replacement=True, generator=state.generator)
        return DraftTree.chain(tokens, self.q.expand(k, -1).clone())


@pytest.fixture(scope="module")
def peaky_target():
    # Large init -> sharp, strongly context-dependent next-token distributions over a 16-token vocabulary.
    model = build_model("llama", seed=3, vocab_size=16, initializer_range=0.3, max_position_embeddings=4096)
    return Target(model, None)


@pytest.mark.parametrize("proposer", ["ngram", "q-sampler"])
def test_engine_sampling_is_calibrated(peaky_target, proposer):
    """One long sampled generation: the tokens must be draws from the target's own next-token distributions.

    With p_t the (warped) target distribution at step t (one fresh forward over the final sequence) and y_t the
    token generated there, sum_t 1[y_t = v] - p_t(v) and sum_t p_t(y_t) - sum_v p_t(v)^2 are martingales with
    known variance, so (1) the token histogram is within TV sqrt(V/n) of the mean of p_t and (2) the z-score of
    the chosen tokens' probabilities is small. (2) is the sensitive one: with a lenient acceptance test
    (u q < 2 p) z is +7 (ngram); with the bonus drawn from the wrong row, -5 (ngram) and -11 (q drafts); with the
    recovered token drawn from p instead of the residual, -5 (q drafts).
    """
    target, vocab, n = peaky_target, 16, 1500
    params = SamplingParams(temperature=1.0, top_k=12)
    if proposer == "ngram":
        prop = NgramProposer(NgramConfig(k=4, max_n=3), target.info)
    else:
        prop = QSampler(target.info, torch.softmax(torch.randn(vocab, generator=gen(5)), -1), k=3)
    prompt = [1, 2, 3, 1, 2, 3, 4]
    engine = Engine(target, [prop], SpeculativeSamplingVerifier())
    result = engine.generate(prompt, max_new_tokens=n, sampling=params, seed=1)
    assert len(result.token_ids) == n and result.finish_reason == "length"
    assert result.metrics.proposer_faults == 0
    assert result.metrics.accepted_nodes > n // 10  # the proposer's drafts did get accepted (and rejected)
    assert result.metrics.accepted_nodes < result.metrics.drafted_nodes

    with torch.inference_mode():
        ids = torch.tensor([prompt + result.token_ids])
        logits = target.model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    p = probs_from_logits(logits, params).double()  # [n, V]
    y = torch.tensor(result.token_ids)
    # (1) histogram vs the average target distribution
    freq = torch.bincount(y, minlength=vocab).double() / n
    assert 0.5 * (freq - p.mean(0)).abs().sum().item() <= math.sqrt(vocab / n)
    # (2) calibration of the chosen tokens' probabilities
    chosen = p[torch.arange(n), y]
    expected = (p**2).sum(-1)
    variance = ((p**3).sum(-1) - expected**2).sum()
    z = (chosen - expected).sum() / variance.sqrt()
    assert abs(z.item()) < 4, f"calibration z-score {z.item():+.2f}"
    assert chosen.mean().item() > 0.15  # the distributions are sharp, so (2) is a demanding check


# --- temperatures too small to divide by ------------------------------------------------------------------------

TINY_TEMPERATURES = [1e-45, 1e-38, 1e-30, 5e-6]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_tiny_temperatures_never_give_nan_probabilities(dtype):
    """Below GREEDY_BELOW (1e-5) the warp is the temperature -> 0 limit (one-hot at the argmax) in every dtype;
    at and above it, dividing cannot overflow for any logit a model gives."""
    logits = (torch.randn(8, V, generator=gen(1)) * 40).to(dtype)
    for t in [*TINY_TEMPERATURES, 1e-5, 2e-5]:
        for k, top_p in [(0, 1.0), (3, 0.9)]:
            probs = probs_from_logits(logits, SamplingParams(temperature=t, top_k=k, top_p=top_p))
            assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(8)), (t, k, top_p)
            if t < 1e-5:
                assert torch.equal(probs.argmax(-1), logits.float().argmax(-1)) and bool((probs.max(-1).values == 1).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", TINY_TEMPERATURES)
def test_a_temperature_too_small_to_divide_by_decodes_greedily(dtype, temperature, tmp_path_factory):
    """``--temperature 1e-45 --dtype float32`` ended in "probability tensor contains either inf, nan or element < 0":
    now it is greedy decoding, token for token, with every proposer (deterministic, sampled drafts, combined)."""
    import specframe
    from specframe.registry import build_registry

    from tests.fakes import PROMPT, build_tokenizer

    model = build_model("llama").to(dtype)
    folder = tmp_path_factory.getbasetemp() / f"tiny-t-draft-{str(dtype).split('.')[-1]}"
    if not folder.exists():
        build_model("llama", seed=1).to(dtype).save_pretrained(folder)
        build_tokenizer().save_pretrained(folder)
    sf = specframe.load(target=Target(model, build_tokenizer()), registry=build_registry())
    greedy = sf.generate(PROMPT, max_new_tokens=16, temperature=0.0, proposers=["none"])["token_ids"]
    for proposers in (["none"], ["ngram"], [{"name": "draft-model", "model": str(folder)}],
                      ["ngram", {"name": "draft-model", "model": str(folder)}]):
        rec = sf.generate(PROMPT, max_new_tokens=16, temperature=temperature, seed=5, proposers=proposers)
        assert rec["token_ids"] == greedy, proposers
        assert rec["metrics"]["proposer_faults"] == 0, proposers
