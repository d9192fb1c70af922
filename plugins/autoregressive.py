"""``none``: no speculation. Each step the target decodes one token through the same engine loop.

This is the baseline every benchmark compares to (τ = 1 by construction).
"""

from __future__ import annotations

from typing import Literal

from specframe import DecodeState, DraftTree, ProposerBase, ProposerConfig, hookimpl


class NoneConfig(ProposerConfig):
    name: Literal["none"] = "none"


class NoProposer(ProposerBase):
    """Drafts nothing: plain autoregressive decoding."""

    name = "none"
    Config = NoneConfig

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        return DraftTree.empty(state.tokens.shape[0])


@hookimpl
def specframe_register_proposers(register) -> None:
    register(NoProposer)
