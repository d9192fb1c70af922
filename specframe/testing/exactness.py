"""Exactness checks: the proposer never changes what the target would have generated.

- greedy: token-identical to plain greedy decoding;
- sampling: the first two generated tokens follow the target's exact distribution (total-variation test);
- both again under a constraint (:mod:`specframe.testing.constraint`): equal to constrained decoding without
  speculation;
- draft probabilities: each drafted token follows the ``draft_probs`` the proposer reports — the property
  speculative sampling's exactness rests on, tested directly so that a mismatch is caught even when the
  end-to-end distance is small.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..contracts import DecodeState
from .constraint import constrained_first_two, constrained_greedy, kit_constraint
from .report import ConformanceError, NotApplicable, ids
from .stats import TVTest, calibration_table, tv_test_fixed, tv_tests_mixture, worst_outcomes
from .tiny import committed_features, first_two_tokens, last_hidden, single_thread

if TYPE_CHECKING:
    from .kit import Kit

DRAFT_DEPTH = 3  # draft nodes examined per proposal by the draft-probability check
MIN_NODE_SAMPLES = 100  # fewer samples of a node than this: too few to test


def _first_difference(got: list[int], ref: list[int]) -> int:
    return next((j for j, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))


def check_greedy_lossless(kit: "Kit") -> None:
    """Speculative greedy decoding equals plain greedy decoding, token for token, on every kit prompt."""
    rec, results = kit.greedy_battery
    kit.fail_on_problems(rec, "greedy decoding of the kit's prompts")
    for i, (ref, res) in enumerate(zip(kit.references, results)):
        got = res.token_ids
        if got != ref:
            raise ConformanceError(
                f"greedy output differs from plain greedy decoding on kit prompt {i} {ids(kit.prompts[i])} at "
                f"generated token {_first_difference(got, ref)}: expected {ids(ref)}, got {ids(got)}. The greedy "
                "verifier only keeps the target's argmax, so the proposer changed shared state: the target model, "
                "the KV cache or DecodeState (treat all three as read-only)"
            )


def check_constrained_greedy_lossless(kit: "Kit") -> None:
    """Under a constraint (the kit's token automaton, :mod:`specframe.testing.constraint`), speculative greedy
    decoding equals constrained greedy decoding without speculation (the masked argmax), on every kit prompt."""
    _ = kit.weights_before
    with single_thread():
        refs = [constrained_greedy(kit.target, list(p), kit.new_tokens) for p in kit.prompts]
    rec = kit.make()
    for i, (prompt, ref) in enumerate(zip(kit.prompts, refs)):
        got = kit.generate(rec, prompt, constraint=kit_constraint(kit.target.vocab_size)).token_ids
        kit.fail_on_problems(rec, f"constrained greedy decoding of kit prompt {i}")
        if got != ref:
            raise ConformanceError(
                f"under a constraint, greedy output differs from constrained greedy decoding on kit prompt {i} "
                f"{ids(kit.prompts[i])} at generated token {_first_difference(got, ref)}: expected {ids(ref)}, got "
                f"{ids(got)}. The engine cuts drafts the constraint forbids and masks the target's rows, so the "
                "proposer changed shared state (DecodeState.constraint included: read it, never commit to it)"
            )


def check_sampling_lossless(kit: "Kit") -> None:
    """Under sampling, the first two generated tokens follow the target's exact joint distribution."""
    prompt = kit.prompts[2]
    with single_thread():
        exact = first_two_tokens(kit.target, list(prompt), kit.sampling)  # [V, V]
    _sampled_like(kit, prompt, exact, None)


def check_constrained_sampling_lossless(kit: "Kit") -> None:
    """Under sampling and a constraint, the first two generated tokens follow the exact joint of constrained
    sampling (mask, then temperature), with the kit's token automaton."""
    prompt = kit.prompts[2]
    with single_thread():
        exact = constrained_first_two(kit.target, list(prompt), kit.sampling)
    _sampled_like(kit, prompt, exact, lambda: kit_constraint(kit.target.vocab_size))


def _sampled_like(kit: "Kit", prompt: tuple[int, ...], exact: torch.Tensor, constraint) -> None:
    """Sample ``kit.samples`` requests (seeds 0, 1, ...) and test their first two tokens against ``exact``."""
    v = kit.target.vocab_size
    rec = kit.make()
    counts = torch.zeros(v, v, dtype=torch.float64)
    for seed in range(kit.samples):
        out = kit.generate(rec, prompt, kit.sampling, seed=seed, max_new_tokens=3,
                           constraint=None if constraint is None else constraint()).token_ids
        counts[out[0], out[1]] += 1
    under = "" if constraint is None else " and the kit's constraint"
    kit.fail_on_problems(rec, f"sampling {kit.samples} requests{under}")
    n = kit.samples
    tests = {
        "first token": (tv_test_fixed(counts.sum(1), exact.sum(1)), counts.sum(1), exact.sum(1), lambda i: f"token {i}"),
        "first two tokens": (tv_test_fixed(counts, exact, seed=1), counts, exact, lambda i: f"pair {divmod(i, v)}"),
    }
    for what, (test, observed, expected, label) in tests.items():
        if not test.passed:
            off = "; ".join(
                f"{label(i)} generated {e:.1%} of the time, the target gives {x:.1%}"
                for i, e, x in worst_outcomes(observed / n, expected, 2)
            )
            raise ConformanceError(
                f"under sampling (temperature {kit.sampling.temperature:g}){under} the {what} after kit prompt "
                f"{ids(prompt)} is not distributed as the target's: {test.summary()}. Most off: {off}. "
                "Speculative sampling is exact only when every draft token is sampled from the draft_probs the "
                "proposer reports (None = the token is certain); check the temperature/top-k/top-p you sample "
                "with against the distribution you return"
                + ("" if constraint is None else ", and do not draw a sampled draft again because the constraint "
                   "forbids it (the engine rejects forbidden sampled nodes itself)")
            )


def check_draft_probs_match_samples(kit: "Kit") -> None:
    """Each drafted token is distributed as the ``draft_probs`` reported for it (sampled proposals only)."""
    if not kit.cls.provides_draft_probs:
        raise NotApplicable(f"{kit.cls.__name__} declares provides_draft_probs = False: drafts are deterministic")
    prompt = list(kit.prompts[2])
    hidden = last_hidden(kit.target, prompt) if kit.cls.needs_hidden_states else None
    rec = kit.make()
    tokens: list[list[int]] = [[] for _ in range(DRAFT_DEPTH)]
    rows: list[list[torch.Tensor]] = [[] for _ in range(DRAFT_DEPTH)]
    with single_thread(), torch.inference_mode():
        for seed in range(kit.samples):
            draft = None
            gen = torch.Generator(device=kit.target.device).manual_seed(seed)  # as the engine's: on the target's device
            state = DecodeState(torch.tensor([prompt]), len(prompt), kit.sampling, gen,
                                hidden, committed_features(kit.target, prompt, rec.feature_layers), rec.feature_layers)
            try:
                rec.start(state)
                draft = rec.propose(state, DRAFT_DEPTH)
            except Exception:  # noqa: BLE001 - logged by the CallLog, reported just below
                pass
            kit.fail_on_problems(rec, f"proposal {seed} from kit prompt {ids(prompt)}")
            if draft.draft_probs is None:
                continue
            for i in range(min(draft.num_nodes, DRAFT_DEPTH)):
                tokens[i].append(int(draft.token_ids[0, i]))
                rows[i].append(draft.draft_probs[0, i].detach().double().cpu())
    if not rows[0]:
        raise NotApplicable(f"{kit.cls.__name__} returned no draft_probs on the kit's prompt")
    for i in range(DRAFT_DEPTH):
        if len(tokens[i]) < MIN_NODE_SAMPLES:
            continue
        toks, q = torch.tensor(tokens[i]), torch.stack(rows[i])
        for name, test in tv_tests_mixture(toks, q).items():
            if not test.passed:
                raise ConformanceError(_draft_probs_message(i, name, test, toks, q))


def _draft_probs_message(node: int, name: str, test: TVTest, toks: torch.Tensor, q: torch.Tensor) -> str:
    if name == "calibration":
        lo, hi, drawn, predicted = max(calibration_table(toks, q), key=lambda r: abs(r[2] - r[3]))
        detail = (f"tokens you reported with probability {lo:.1f}-{hi:.1f} were drawn {drawn} times where your "
                  f"draft_probs predict {predicted:.0f}")
    else:
        i, e, x = worst_outcomes(torch.bincount(toks, minlength=q.shape[1]) / len(toks), q.mean(0), 1)[0]
        detail = f"token {i} was drawn {e:.1%} of the time where your draft_probs average {x:.1%}"
    return (
        f"draft node {node} is not distributed as the draft_probs you report ({name} test over {test.samples} "
        f"proposals from one state, seeds 0..{test.samples - 1}): {test.summary()}; {detail}. Speculative sampling "
        "is exact only if each draft token is sampled from exactly the distribution in draft_probs: apply the same "
        "temperature/top-k/top-p (state.sampling) to both, add no extra sharpening, and do not re-draw or drop "
        "nodes depending on the token sampled"
    )
