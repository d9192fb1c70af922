"""Acceptance rules on hand-built logits: :func:`greedy_chain`, :func:`sampling_chain` and the verifier classes.

Vocabulary V = 6 throughout; ``row(...)`` builds one row of logits that is ``-inf`` except where given.
"""

from __future__ import annotations

import math

import pytest
import torch

from specframe.acceptance import RESIDUAL_EPS, GreedyVerifier, SpeculativeSamplingVerifier, greedy_chain, sampling_chain
from specframe.contracts import DraftTree
from specframe.sampling import SamplingParams, probs_from_logits

from tests.fakes import test_device

pytestmark = pytest.mark.device_subset

DEV = test_device()  # every tensor and generator here lives on the test device (--device)
V = 6
INF = math.inf


def row(**finite: float) -> list[float]:
    """Logits over V tokens: ``-inf`` everywhere except ``t<i>=value`` entries, e.g. ``row(t3=0.0)``."""
    out = [-INF] * V
    for key, value in finite.items():
        out[int(key[1:])] = value
    return out


def logits(*rows: list[float]) -> torch.Tensor:
    """``[1, len(rows), V]`` float32 logits."""
    return torch.tensor([list(rows)], dtype=torch.float32, device=DEV)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator(device=DEV).manual_seed(seed)


# --- greedy_chain ---------------------------------------------------------------------------------------------

GREEDY_CASES = [
    pytest.param(
        [3, 1],
        logits(row(t3=0.0), row(t1=0.0), row(t4=0.0)),
        (2, 4),
        id="accepts 3, accepts 1, bonus 4",
    ),
    pytest.param(
        [3, 1],
        logits(row(t2=0.0), row(t1=0.0), row(t4=0.0)),
        (0, 2),
        id="rejects 3 (argmax 2), recovered 2",
    ),
    pytest.param(
        [3, 1],
        logits(row(t3=0.0), row(t5=INF, t1=1e30), row(t4=0.0)),
        (1, 5),
        id="accepts 3, rejects 1 (+inf beats 1e30 at 5), recovered 5",
    ),
    pytest.param(
        [2, 1],
        logits(row(t3=1.0, t2=0.5), row(t1=0.0), row(t0=0.0)),
        (0, 3),
        id="rejects 2 (argmax 3); the later match of 1 does not count",
    ),
    pytest.param(
        [0, 0, 0],
        logits([0.0] * V, [0.0] * V, [1.0] + [0.0] * 5, [0.0, 0.0, 2.0, 0.0, 0.0, 0.0]),
        (3, 2),
        id="ties resolve to the lowest id (0): accepts 0, 0, 0, bonus 2",
    ),
    pytest.param(
        [4],
        logits(row(t4=INF), row(t0=-1.0, t5=-0.5)),
        (1, 5),
        id="accepts 4 (+inf), bonus 5 (-0.5 > -1)",
    ),
    pytest.param(
        [],
        logits(row(t1=-3.0, t2=-2.0)),
        (0, 2),
        id="empty draft: no node, the target's argmax 2",
    ),
]


@pytest.mark.parametrize("draft, target_logits, expected", GREEDY_CASES)
def test_greedy_chain(draft, target_logits, expected):
    drafts = torch.tensor([draft], dtype=torch.int64, device=DEV).reshape(1, -1)
    num_accepted, next_token = greedy_chain(target_logits, drafts)
    assert (int(num_accepted[0]), int(next_token[0])) == expected
    assert num_accepted.dtype == torch.int64 and next_token.dtype == torch.int64


def test_greedy_chain_is_batched_row_by_row():
    cases = [c.values for c in GREEDY_CASES[:4]]  # all K = 2
    target_logits = torch.cat([c[1] for c in cases])  # [4, 3, V]
    drafts = torch.tensor([c[0] for c in cases], device=DEV)
    num_accepted, next_token = greedy_chain(target_logits, drafts)
    assert list(zip(num_accepted.tolist(), next_token.tolist())) == [c[2] for c in cases]


# --- sampling_chain on hand-built distributions ----------------------------------------------------------------
# Target rows are softmax(logits) with -inf -> probability exactly 0, so every case below is deterministic
# whatever the uniforms drawn: acceptance probability min(1, p/q) is 0 or 1 and each residual has one token.

SAMPLING_CASES = [
    pytest.param(
        [3], None,
        [row(t3=0.0), row(t4=0.0)],
        (1, 4),
        id="one-hot q: accepts 3 (p=1), bonus 4",
    ),
    pytest.param(
        [3], None,
        [row(t5=0.0), row(t4=0.0)],
        (0, 5),
        id="one-hot q: rejects 3 (p=0), recovered 5",
    ),
    pytest.param(
        [3, 1], None,
        [row(t3=0.0), row(t2=0.0), row(t0=0.0)],
        (1, 2),
        id="one-hot q: accepts 3, rejects 1 (p=0), recovered 2 from p1",
    ),
    pytest.param(
        [3, 1], None,
        [row(t3=0.0), row(t1=0.0, t2=-INF), row(t0=0.0)],
        (2, 0),
        id="one-hot q: accepts 3, accepts 1, bonus 0 from p2",
    ),
    pytest.param(
        [3, 2], [row(t3=0.0), row(t2=0.0, t4=0.0)],
        [row(t3=0.0), row(t4=0.0), row(t0=0.0)],
        (1, 4),
        id="q given: accepts 3 (p=q=1), rejects 2 (p=0, q=.5), recovered 4 = norm(max(0, p-q))",
    ),
    pytest.param(
        [3], [row(t3=0.0, t4=0.0)],
        [row(t3=0.0, t4=0.0), row(t1=0.0)],
        (1, 1),
        id="q given: accepts 3 (p = q = .5, u < 1 always), bonus 1",
    ),
    pytest.param(
        [3], [row(t3=0.0, t5=0.0)],
        [row(t3=math.log(2.0), t5=-INF, t1=0.0), row(t1=0.0)],
        (1, 1),
        id="q given: accepts 3 (p=2/3 > q=1/2), bonus 1",
    ),
    pytest.param(
        [0], [row(t0=0.0, t1=0.0)],
        [row(t1=0.0, t2=0.0), row(t5=0.0)],
        (0, 2),
        id="q given: rejects 0 (p=0), max(0, p-q) = [0, 0, .5] -> recovered 2 (1 has p = q = .5)",
    ),
]


@pytest.mark.parametrize("draft, draft_logits, target_rows, expected", SAMPLING_CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampling_chain_hand_built(draft, draft_logits, target_rows, expected, seed):
    target_probs = logits(*target_rows).softmax(-1)
    draft_probs = None if draft_logits is None else logits(*draft_logits).softmax(-1)
    num_accepted, next_token = sampling_chain(
        target_probs, draft_probs, torch.tensor([draft], dtype=torch.int64, device=DEV), gen(seed)
    )
    assert (int(num_accepted[0]), int(next_token[0])) == expected


def test_sampling_chain_one_hot_residual_removes_the_drafted_token():
    # p = [.5 at 3, .5 at 4], deterministic draft 3: accepted half the time; a rejection must recover 4, never 3
    b = 4000
    target_probs = logits(row(t3=0.0, t4=0.0), row(t1=0.0)).softmax(-1).expand(b, -1, -1)
    num_accepted, next_token = sampling_chain(target_probs, None, torch.full((b, 1), 3, device=DEV), gen(0))
    rejected = num_accepted == 0
    assert bool((next_token[rejected] == 4).all())
    assert bool((next_token[~rejected] == 1).all())  # bonus from p1
    assert 0.45 < rejected.float().mean().item() < 0.55


def test_sampling_chain_q_residual_is_max_p_minus_q():
    # p = [.8 at 1, .2 at 2], q = [.5 at 1, .5 at 2], draft 2: accepted w.p. p/q = .4; a rejection recovers
    # from max(0, p - q) = [.3 at 1] -> always 1, never 2.
    b = 4000
    target_probs = torch.zeros(b, 2, V, device=DEV)
    target_probs[:, 0, 1], target_probs[:, 0, 2], target_probs[:, 1, 5] = 0.8, 0.2, 1.0
    draft_probs = torch.zeros(b, 1, V, device=DEV)
    draft_probs[:, 0, 1] = draft_probs[:, 0, 2] = 0.5
    num_accepted, next_token = sampling_chain(target_probs, draft_probs, torch.full((b, 1), 2, device=DEV), gen(1))
    rejected = num_accepted == 0
    assert bool((next_token[rejected] == 1).all())
    assert bool((next_token[~rejected] == 5).all())
    assert abs((~rejected).float().mean().item() - 0.4) < 0.03


# --- degenerate residual ----------------------------------------------------------------------------------------


def test_degenerate_residual_p_equals_q_gives_a_valid_token():
    # p == q exactly, and the draft token lies outside both supports (q(x) = 0), so it is always rejected and
    # max(0, p - q) is all zero: dividing by its sum would give NaN (multinomial would raise). The verifier must
    # fall back to p and return a token in p's support.
    b = 512
    p = logits(row(t1=0.0, t2=1.0, t4=-1.0), row(t0=0.0)).softmax(-1).expand(b, -1, -1)
    q = p[:, :1].clone()
    num_accepted, next_token = sampling_chain(p, q, torch.zeros((b, 1), dtype=torch.int64, device=DEV), gen(3))
    assert bool((num_accepted == 0).all())
    assert set(next_token.tolist()) <= {1, 2, 4}
    assert set(next_token.tolist()) == {1, 2, 4}  # drawn from p itself, so every token in its support shows up


def test_degenerate_residual_below_eps_gives_a_valid_token():
    # residual mass 1e-8 < RESIDUAL_EPS: treated as p == q up to rounding; still a token from p, never NaN.
    p = torch.tensor([[[0.0, 0.5, 0.5, 0, 0, 0], [0, 0, 0, 0, 0, 1.0]]], device=DEV)
    q = torch.tensor([[[1e-8, 0.5, 0.5 - 1e-8, 0, 0, 0]]], device=DEV)
    assert (p[0, 0] - q[0, 0]).clamp_min(0).sum() <= RESIDUAL_EPS
    for seed in range(20):
        num_accepted, next_token = sampling_chain(p, q, torch.tensor([[0]], device=DEV), gen(seed))
        assert int(num_accepted[0]) == 0  # p(0) = 0: always rejected
        assert int(next_token[0]) in (1, 2)


def test_probs_from_logits_with_minus_inf_has_no_nan():
    x = logits(row(t2=0.0), row(t1=3.0, t5=-2.0))
    for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.3, top_k=1, top_p=0.5)):
        p = probs_from_logits(x, params)
        assert not bool(p.isnan().any())
        assert torch.allclose(p.sum(-1), torch.ones(1, 2, device=DEV))
        assert p[0, 0, 2] == 1.0 and p[0, 1].argmax() == 1


# --- seeded determinism ------------------------------------------------------------------------------------------


def _random_problem(seed: int, b: int = 256, k: int = 3):
    g = gen(seed)
    target_probs = torch.randn(b, k + 1, V, generator=g, device=DEV).softmax(-1)
    draft_probs = torch.randn(b, k, V, generator=g, device=DEV).softmax(-1)
    draft_tokens = torch.multinomial(draft_probs.reshape(-1, V), 1, generator=g).reshape(b, k)
    return target_probs, draft_probs, draft_tokens


@pytest.mark.parametrize("with_q", [True, False])
def test_sampling_chain_same_seed_same_tokens(with_q):
    tp, dp, dt = _random_problem(0)
    dp = dp if with_q else None
    a = sampling_chain(tp, dp, dt, gen(42))
    b = sampling_chain(tp, dp, dt, gen(42))
    c = sampling_chain(tp, dp, dt, gen(43))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not (torch.equal(a[0], c[0]) and torch.equal(a[1], c[1]))


def test_sampling_chain_uses_only_the_given_generator():
    tp, dp, dt = _random_problem(1)
    torch.manual_seed(0)
    a = sampling_chain(tp, dp, dt, gen(5))
    torch.manual_seed(1)  # the global RNG must not matter
    b = sampling_chain(tp, dp, dt, gen(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# --- verifier classes -------------------------------------------------------------------------------------------


def test_greedy_verifier_result():
    target_logits = logits(row(t3=0.0), row(t5=0.0), row(t4=0.0))
    result = GreedyVerifier().verify(DraftTree.chain([3, 1]), target_logits, SamplingParams(), gen())
    assert result.accepted_nodes == ((0,),)
    assert result.next_token == (5,)


def test_greedy_verifier_empty_draft():
    result = GreedyVerifier().verify(DraftTree.empty(), logits(row(t2=0.0)), SamplingParams(), gen())
    assert result.accepted_nodes == ((),) and result.next_token == (2,)


def test_speculative_sampling_verifier_warps_the_target_logits():
    # raw target logits favour 4 slightly over 3; top_k=1 keeps only 4, so draft 3 must be rejected, recovered 4
    target_logits = logits(row(t3=1.0, t4=1.1), row(t0=0.0))
    params = SamplingParams(temperature=1.0, top_k=1)
    for seed in range(10):
        result = SpeculativeSamplingVerifier().verify(DraftTree.chain([3]), target_logits, params, gen(seed))
        assert result.accepted_nodes == ((),) and result.next_token == (4,)
    # without the filter, 3 has p ~ 0.475 and is accepted for some seeds
    accepted = {
        SpeculativeSamplingVerifier()
        .verify(DraftTree.chain([3]), target_logits, SamplingParams(temperature=1.0), gen(s))
        .accepted_nodes
        for s in range(20)
    }
    assert accepted == {((),), ((0,),)}


def test_speculative_sampling_verifier_all_accepted_gives_bonus():
    target_logits = logits(row(t3=0.0), row(t1=0.0), row(t5=0.0))
    q = logits(row(t3=0.0), row(t1=0.0, t2=0.0)).softmax(-1)[0]
    result = SpeculativeSamplingVerifier().verify(
        DraftTree.chain([3, 1], q), target_logits, SamplingParams(temperature=0.7), gen()
    )
    assert result.accepted_nodes == ((0, 1),) and result.next_token == (5,)


def test_speculative_sampling_verifier_at_temperature_zero_is_greedy():
    # temperature 0 (e.g. `verifier: speculative-sampling` with default sampling) must not divide by zero
    target_logits = logits(row(t3=0.0, t1=-1.0), row(t2=1.0, t1=0.5), row(t0=0.0))
    for seed in range(5):
        result = SpeculativeSamplingVerifier().verify(
            DraftTree.chain([3, 1]), target_logits, SamplingParams(), gen(seed)
        )
        assert (result.accepted_nodes, result.next_token) == (((0,),), (2,))
