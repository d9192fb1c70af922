"""Acceptance: the rules as pure functions (chains batched, token trees per node) and the built-in verifiers
``greedy`` and ``speculative-sampling`` that apply them. No model, no engine.

**Chains** (``greedy_chain``, ``sampling_chain``, batched). Names map to Leviathan et al. 2022, "Fast Inference from Transformers via Speculative Decoding", Algorithm 1:
``target_probs`` is their p (the target model), ``draft_probs`` their q (the approximation model).

- accepted: draft token ``x_i`` kept with probability ``min(1, p_i(x_i) / q_i(x_i))``;
- recovered: after the first rejection at position ``i``, a token drawn from
  ``norm(max(0, p_i - q_i))`` (their §2.3, the residual distribution);
- bonus: when all K drafts pass, a token drawn from ``p_K`` (the target after the last draft).

Deterministic proposals are one-hot q: acceptance probability ``p_i(x_i)`` and residual
``p_i`` with ``x_i`` removed.

**Trees** (``greedy_tree``, ``sampling_tree``; the forward's layout is in :mod:`specframe.token_tree`). Sampling over
a tree follows SpecInfer (Miao et al. 2024, "SpecInfer", Algorithm 2, multi-step speculative sampling): at a node, children are tried in order; child ``c`` with token ``x`` drawn from ``q_c`` is accepted
with probability ``min(1, p(x) / q_c(x))``; after a rejection the target distribution is replaced by the
residual ``norm(max(0, p − q_c))`` before the next sibling is tried; if every child is rejected the recovered
token is drawn from the current residual. When a path reaches a leaf, the bonus token is drawn from the target
distribution after it. Deterministic nodes use one-hot ``q``, so a second sibling with the token of an already
rejected one is rejected with certainty (its residual mass is zero).

The verifiers are registered through the same hook as any plugin's verifiers (see :mod:`specframe.registry`).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from .contracts import DraftTree, VerifyResult
from .hookspecs import hookimpl
from .sampling import SamplingParams, probs_from_logits
from .token_tree import children_of

# Below this residual mass the residual is "all zero up to rounding": p == q at that position, so a rejection
# had probability ~0; we draw from p itself instead of dividing by ~0 (which would give NaN).
RESIDUAL_EPS = 1e-7


def greedy_chain(target_logits: Tensor, draft_tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Greedy verification of a chain: accept while the draft equals the target's argmax.

    Args:
        target_logits: ``[B, K + 1, V]`` any float dtype.
        draft_tokens: ``[B, K]`` int64.

    Returns:
        ``(num_accepted [B] int64, next_token [B] int64)``; ``next_token`` is the target's argmax after the
        accepted prefix, so the output equals plain greedy decoding token for token.
    """
    target_argmax = target_logits.argmax(-1)  # [B, K+1]
    k = draft_tokens.shape[1]
    matches = (draft_tokens == target_argmax[:, :k]).to(torch.int64)
    num_accepted = matches.cumprod(1).sum(1)
    next_token = target_argmax.gather(1, num_accepted[:, None]).squeeze(1)
    return num_accepted, next_token


def sampling_chain(
    target_probs: Tensor,
    draft_probs: Tensor | None,
    draft_tokens: Tensor,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """Speculative sampling of a chain (Leviathan et al. 2022, Algorithm 1).

    Args:
        target_probs: ``[B, K + 1, V]`` float32, the warped target distributions.
        draft_probs: ``[B, K, V]`` float32 draft distributions the tokens were drawn from, or None for
            deterministic drafts (one-hot q).
        draft_tokens: ``[B, K]`` int64.
        generator: randomness; draws ``B*K`` uniforms then one categorical sample per row.

    Returns:
        ``(num_accepted [B] int64, next_token [B] int64)``: the emitted tokens are
        ``draft_tokens[b, :num_accepted[b]]`` then ``next_token[b]``, distributed exactly as sampling from the
        target one token at a time.
    """
    b, k = draft_tokens.shape
    device = target_probs.device
    rows = torch.arange(b, device=device)
    p_x = target_probs[:, :k].gather(2, draft_tokens[..., None]).squeeze(2)  # [B, K]
    if draft_probs is None:
        q_x = torch.ones_like(p_x)
    else:
        q_x = draft_probs.gather(2, draft_tokens[..., None]).squeeze(2)
    u = torch.rand((b, k), generator=generator, device=device, dtype=torch.float32)
    accept = (u * q_x < p_x).to(torch.int64)  # u < p/q without dividing by q
    num_accepted = accept.cumprod(1).sum(1)  # [B]

    p_sel = target_probs[rows, num_accepted]  # [B, V]: p at the first rejection, or p_K for the bonus
    rejected = num_accepted < k
    if draft_probs is None:
        q_sel = torch.zeros_like(p_sel)
        if k > 0:
            x_sel = draft_tokens.gather(1, num_accepted.clamp(max=k - 1)[:, None])  # [B, 1]
            q_sel.scatter_(1, x_sel, rejected[:, None].to(q_sel.dtype))
    else:
        q_pad = torch.cat([draft_probs, draft_probs.new_zeros((b, 1, draft_probs.shape[-1]))], 1)
        q_sel = q_pad[rows, num_accepted]
    residual = (p_sel - q_sel).clamp_min(0.0)
    degenerate = residual.sum(-1, keepdim=True) <= RESIDUAL_EPS
    residual = torch.where(degenerate, p_sel, residual)
    next_token = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    return num_accepted, next_token


def greedy_tree(target_argmax: list[int], tokens: list[int], parent: list[int]) -> tuple[list[int], int]:
    """Longest path whose every node equals the target's argmax at its parent.

    Args:
        target_argmax: ``N + 1`` ids; entry 0 after the newest token, entry ``i + 1`` after node ``i``.
        tokens: ``N`` node tokens; parent: ``N`` parent indices.

    Returns:
        ``(path, next_token)``: accepted node indices root-first and the target's argmax after the path.
    """
    kids = children_of(parent)
    path: list[int] = []
    row = 0
    while True:
        want = target_argmax[row]
        nxt = next((c for c in kids[row] if tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        row = nxt + 1


def sampling_tree(
    target_probs: Tensor, draft_probs: Tensor | None, tokens: list[int], parent: list[int], generator: torch.Generator
) -> tuple[list[int], int]:
    """Multi-draft recursive rejection sampling over a token tree (see the module docstring).

    Args:
        target_probs: ``[N + 1, V]`` float32 warped target distributions (row 0: after the newest token).
        draft_probs: ``[N, V]`` float32, ``q`` each node's token was drawn from; None = one-hot for all.
        tokens, parent: ``N`` node tokens and parent indices.
        generator: randomness.

    Returns:
        ``(path, next_token)``; the emitted tokens are distributed as sampling the target one token at a time.
    """
    kids = children_of(parent)
    path: list[int] = []
    row = 0
    while True:
        p = target_probs[row]
        accepted = None
        for c in kids[row]:
            x = tokens[c]
            if draft_probs is None:
                q = torch.zeros_like(p)
                q[x] = 1.0
            else:
                q = draft_probs[c]
            u = float(torch.rand((), generator=generator, device=p.device))
            if u * float(q[x]) < float(p[x]):
                accepted = c
                break
            residual = (p - q).clamp_min(0.0)
            mass = float(residual.sum())
            p = p if mass <= RESIDUAL_EPS else residual / mass
        if accepted is None:
            return path, int(torch.multinomial(p, 1, generator=generator))
        path.append(accepted)
        row = accepted + 1


def _result(num_accepted: Tensor, next_token: Tensor) -> VerifyResult:
    """``[B]`` accepted counts and ``[B]`` next tokens read in one host sync."""
    counts, tokens = torch.stack([num_accepted.to(torch.int64), next_token.to(torch.int64)]).tolist()
    return VerifyResult(accepted_nodes=tuple(tuple(range(a)) for a in counts), next_token=tuple(tokens))


def _greedy(draft: DraftTree, target_logits: Tensor) -> VerifyResult:
    """Chains and trees alike: the target's argmax read once (one host sync), walked on the host against the draft's
    tokens, which the engine keeps there (a chain through :func:`greedy_chain` would copy them to the device)."""
    if not draft.num_nodes:  # the target's own token: only row 0 is read
        return VerifyResult(((),) * target_logits.shape[0], tuple(target_logits[:, 0].argmax(-1).tolist()))
    argmax = target_logits.argmax(-1).tolist()
    ids, parent = draft.token_ids.tolist(), draft.parent.tolist()
    rows = [greedy_tree(argmax[b], ids[b], parent[b]) for b in range(len(argmax))]
    return VerifyResult(tuple(tuple(path) for path, _ in rows), tuple(tok for _, tok in rows))


class GreedyVerifier:
    """Accept a draft node iff its token is the target's argmax: output is token-identical to greedy decoding."""

    name: ClassVar[str] = "greedy"
    supports_trees: ClassVar[bool] = True

    def verify(
        self, draft: DraftTree, target_logits: Tensor, sampling: SamplingParams, generator: torch.Generator
    ) -> VerifyResult:
        return _greedy(draft, target_logits)


class SpeculativeSamplingVerifier:
    """Leviathan et al. 2022 rejection sampling; the target distribution is preserved exactly."""

    name: ClassVar[str] = "speculative-sampling"
    supports_trees: ClassVar[bool] = True

    def verify(
        self, draft: DraftTree, target_logits: Tensor, sampling: SamplingParams, generator: torch.Generator
    ) -> VerifyResult:
        device = target_logits.device
        if sampling.is_greedy:  # the temperature -> 0 limit; warping by 1/0 would give NaN probabilities
            return _greedy(draft, target_logits)
        target_probs = probs_from_logits(target_logits, sampling)
        draft_probs = None if draft.draft_probs is None else draft.draft_probs.to(device, torch.float32)
        if draft.is_chain():
            return _result(*sampling_chain(target_probs, draft_probs, draft.token_ids.to(device), generator))
        rows = [
            sampling_tree(target_probs[b], None if draft_probs is None else draft_probs[b],
                          draft.token_ids[b].tolist(), draft.parent[b].tolist(), generator)
            for b in range(target_probs.shape[0])
        ]
        return VerifyResult(tuple(tuple(path) for path, _ in rows), tuple(tok for _, tok in rows))


@hookimpl
def specframe_register_verifiers(register) -> None:
    register(GreedyVerifier)
    register(SpeculativeSamplingVerifier)
