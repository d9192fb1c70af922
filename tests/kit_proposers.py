"""Proposers for testing the conformance kit itself: honest ones it must pass, and ones with a single,
realistic bug it must catch (each docstring says which check should fail)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from specframe import DraftTree, ProposerBase, ProposerConfig
from specframe.sampling import probs_from_logits
from specframe.testing.tiny import tiny_target


class SelfDraftConfig(ProposerConfig):
    name: Literal["selfdraft"] = "selfdraft"
    k: int = Field(2, ge=1, description="Draft length.")
    sharpen: float = Field(1.0, gt=0, description="Sample from q ** (1 / sharpen), normalised; 1 = honest.")


class SelfDraft(ProposerBase):
    """Samples drafts from the target itself (no cache) and reports q = the target's warped distribution.

    With ``sharpen != 1`` it samples from a sharpened q but still reports q: the exactness bug of must-show c
    (caught by ``check_draft_probs_match_samples`` and ``check_sampling_lossless``, invisible to greedy).
    """

    name = "selfdraft"
    Config = SelfDraftConfig
    provides_draft_probs = True

    def _logits(self, tokens: list[int]) -> torch.Tensor:
        return self.target.model(input_ids=torch.tensor([tokens])).logits[0, -1]

    def propose(self, state, budget):
        tokens, ids, qs = state.tokens[0].tolist(), [], []
        for _ in range(min(self.config.k, budget)):
            logits = self._logits(tokens + ids)
            if state.sampling.is_greedy:
                ids.append(int(logits.argmax()))
                continue
            q = probs_from_logits(logits, state.sampling)
            sample_from = torch.softmax(torch.log(q) / self.config.sharpen, -1)
            ids.append(int(torch.multinomial(sample_from, 1, generator=state.generator)))
            qs.append(q)
        return DraftTree.chain(ids, torch.stack(qs) if qs else None)


class OtherModelConfig(ProposerConfig):
    name: Literal["othermodel"] = "othermodel"
    k: int = Field(2, ge=1, description="Draft length.")
    sample_temperature: float = Field(0.7, gt=0, description="Temperature actually sampled at (bug if != target's).")


class OtherModelDraft(SelfDraft):
    """A separate draft model (another tiny random Llama) that samples at ``sample_temperature`` but reports the
    distribution at the request's temperature: q differs from p, so the end-to-end bias is diluted, and the direct
    draft-probability check is what catches it."""

    name = "othermodel"
    Config = OtherModelConfig

    def __init__(self, config, target) -> None:
        super().__init__(config, target)
        self.draft_model = tiny_target(seed=1).model

    def propose(self, state, budget):
        tokens, ids, qs = state.tokens[0].tolist(), [], []
        for _ in range(min(self.config.k, budget)):
            logits = self.draft_model(input_ids=torch.tensor([tokens + ids])).logits[0, -1]
            q = probs_from_logits(logits, state.sampling)
            sampled = torch.softmax(logits / self.config.sample_temperature, -1)
            ids.append(int(torch.multinomial(sampled, 1, generator=state.generator)))
            qs.append(q)
        return DraftTree.chain(ids, torch.stack(qs))


class DropUnlikely(SelfDraft):
    """Honest sampling, but drops the last draft node when the sampled token had q < 0.3 ("low confidence").
    Deciding *after* seeing the token biases the drafts that remain: caught by the draft-probability check."""

    name = "dropunlikely"

    class Config(SelfDraftConfig):
        name: Literal["dropunlikely"] = "dropunlikely"

    def propose(self, state, budget):
        draft = super().propose(state, budget)
        n = draft.num_nodes
        if n and draft.draft_probs is not None and float(draft.draft_probs[0, n - 1, draft.token_ids[0, n - 1]]) < 0.3:
            return draft.truncate(n - 1)
        return draft


class LeakyDraftModelConfig(ProposerConfig):
    name: Literal["leaky"] = "leaky"


class LeakyDraftModel(SelfDraft):
    """A greedy draft model keeping its own context (standing in for a draft KV cache): it appends its drafts,
    and on feedback appends only the last committed token, as if every draft had been accepted. Output stays
    exact (the verifier guards it), but after a rejection the drafts come from a wrong context. Caught by the
    rollback check."""

    name = "leaky"
    Config = LeakyDraftModelConfig

    def start(self, state):
        self.context = state.tokens[0].tolist()

    def propose(self, state, budget):
        draft = []
        for _ in range(min(3, budget)):
            draft.append(int(self._logits(self.context + draft).argmax()))
        self.context += draft
        return DraftTree.chain(draft)

    def on_verified(self, outcome):
        self.context.append(outcome.committed[0][-1])  # bug: the rejected drafts are never cropped


class GlobalRngConfig(ProposerConfig):
    name: Literal["globalrng"] = "globalrng"


class GlobalRng(SelfDraft):
    """Samples with the global torch RNG instead of ``state.generator``: caught by the determinism check."""

    name = "globalrng"
    Config = GlobalRngConfig

    def propose(self, state, budget):
        if state.sampling.is_greedy:
            return DraftTree.empty()
        q = probs_from_logits(self._logits(state.tokens[0].tolist()), state.sampling)
        return DraftTree.chain([int(torch.multinomial(q, 1))], q[None])


class MutatorConfig(ProposerConfig):
    name: Literal["mutator"] = "mutator"


class Mutator(ProposerBase):
    """Writes into ``state.tokens`` (the engine's committed tokens): caught by the contract check."""

    name = "mutator"
    Config = MutatorConfig

    def propose(self, state, budget):
        state.tokens[0, -1] = 0
        return DraftTree.empty()


class UndeclaredProbsConfig(ProposerConfig):
    name: Literal["undeclared"] = "undeclared"


class UndeclaredProbs(ProposerBase):
    """Returns draft_probs while declaring ``provides_draft_probs = False``: caught by the contract check."""

    name = "undeclared"
    Config = UndeclaredProbsConfig

    def propose(self, state, budget):
        v = self.target.vocab_size
        return DraftTree.chain([1], torch.full((1, v), 1.0 / v))


class BadFeedbackConfig(ProposerConfig):
    name: Literal["badfeedback"] = "badfeedback"


class BadFeedback(ProposerBase):
    """Adapts its draft length from feedback but reads a field that does not exist: caught by the feedback check."""

    name = "badfeedback"
    Config = BadFeedbackConfig

    def propose(self, state, budget):
        return DraftTree.empty()

    def on_verified(self, outcome):
        self.k = outcome.num_accepted + outcome.num_rejected  # AttributeError: there is no num_rejected


class ConstraintCommitterConfig(SelfDraftConfig):
    name: Literal["constraintcommitter"] = "constraintcommitter"


class ConstraintCommitter(SelfDraft):
    """Honest drafts, but it advances the request's constraint itself (``state.constraint.commit``) after drafting,
    as an author might who thinks the proposer keeps the grammar state: the engine's grammar state runs ahead of the
    committed tokens. The proposer sees a read-only view, so its commit raises (isolated: output unchanged) and
    ``check_constrained_greedy_lossless`` reports it; invisible without a constraint."""

    name = "constraintcommitter"
    Config = ConstraintCommitterConfig

    def propose(self, state, budget):
        draft = super().propose(state, budget)
        if state.constraint is not None and draft.num_nodes:
            state.constraint.commit(draft.token_ids[0, :1].tolist())
        return draft
