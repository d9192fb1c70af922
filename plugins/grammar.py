"""``grammar``: drafts the tokens a request's constraint forces (structured output; issue 54).

Under a JSON schema, regex or grammar (``constraint:``), much of the output is fixed by the constraint alone:
braces, quotes, whole key names, the text between two fields. This proposer drafts those tokens — the grammar
engine's forced continuation after the committed tokens (llguidance's fast-forward tokens), up to ``k`` — and the
target verifies them like any draft, in the same forward as the other proposers' (SGLang's jump-forward decoding
commits such strings without the model; here they are verified, so output stays exactly the target's constrained
output). Drafts are deterministic (one-hot q): exact under greedy and sampling. Without a constraint, or where the
grammar forces nothing, it drafts nothing.

The forced tokens are the grammar engine's own tokenization of the forced text; where the model would write the
same text in other tokens, the draft is rejected at that token (output unchanged, only τ).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from specframe import DecodeState, DraftTree, ProposerBase, ProposerConfig, hookimpl


class GrammarConfig(ProposerConfig):
    name: Literal["grammar"] = "grammar"
    k: int = Field(16, ge=1, le=64, description="Most forced tokens drafted per step.")


class GrammarProposer(ProposerBase):
    """Drafts the constraint's forced continuation (see the module docstring)."""

    name = "grammar"
    Config = GrammarConfig

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        constraint = state.constraint
        if constraint is None:
            return DraftTree.empty(state.tokens.shape[0])
        return DraftTree.chain(constraint.forced(min(self.config.k, budget)))


@hookimpl
def specframe_register_proposers(register) -> None:
    register(GrammarProposer)
