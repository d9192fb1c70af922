"""Acceptance rules as pure, batched functions (no model, no engine).

Names map to Leviathan et al. 2022, "Fast Inference from Transformers via Speculative Decoding", Algorithm 1:
``target_probs`` is their p (the target model), ``draft_probs`` their q (the approximation model).

- accepted: draft token ``x_i`` kept with probability ``min(1, p_i(x_i) / q_i(x_i))``;
- recovered: after the first rejection at position ``i``, a token drawn from
  ``norm(max(0, p_i - q_i))`` (their §2.3, the residual distribution);
- bonus: when all K drafts pass, a token drawn from ``p_K`` (the target after the last draft).

Deterministic proposals are one-hot q: acceptance probability ``p_i(x_i)`` and residual
``p_i`` with ``x_i`` removed.
"""

from __future__ import annotations

import torch
from torch import Tensor

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
