"""The built-in verifiers: ``greedy`` and ``speculative-sampling``, for chains (batched, vectorised) and token
trees (:mod:`specframe.tree`).

They are registered through the same hook as any plugin's verifiers (see :mod:`specframe.registry`).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from .contracts import DraftTree, VerifyResult
from .hookspecs import hookimpl
from .sampling import SamplingParams, probs_from_logits
from .tree import greedy_tree, sampling_tree
from .verify import greedy_chain, sampling_chain


def _result(num_accepted: Tensor, next_token: Tensor) -> VerifyResult:
    accepted = tuple(tuple(range(a)) for a in num_accepted.tolist())
    return VerifyResult(accepted_nodes=accepted, next_token=tuple(next_token.tolist()))


def _greedy(draft: DraftTree, target_logits: Tensor) -> VerifyResult:
    if draft.is_chain():
        return _result(*greedy_chain(target_logits, draft.token_ids.to(target_logits.device)))
    argmax = target_logits.argmax(-1).tolist()
    rows = [greedy_tree(argmax[b], draft.token_ids[b].tolist(), draft.parent[b].tolist()) for b in range(len(argmax))]
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
