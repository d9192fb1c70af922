"""``synthetic``: a stand-in drafter for synthetic-acceptance runs (``specframe bench`` strategies with
``synthetic:``, :mod:`specframe.bench.synthetic`): it drafts chains of a scheduled length at a chosen cost, so the
engine's speed can be measured at any acceptance and draft length without a drafter that earns them. Its drafts
are the newest token repeated: they mean nothing, and only a synthetic verifier accepts them (under the real
acceptance rules it is a valid, lossless proposer that is almost never right).

Draft lengths: ``k`` every step, or ``widths`` — ``{N: steps}``, the verified node counts per step of a recorded
strategy (its speculation profile's ``specframe.steps_by_shape``, summed over A; ``profile:`` reads them from the
file) — in a minimum-variance order (after t steps each N was drafted ``t * share`` times, give or take one).
``draft_ms`` is spent per call (a busy wait: the recorded strategy's drafting time per step, which its profile
gives as ``specframe.propose_ms_per_step``; ``profile:`` reads that too unless ``draft_ms`` is set). The schedule
runs on across the requests an instance serves (restarting it each request would favour the commonest widths at
every request's start).
"""

from __future__ import annotations

import json
import time
from typing import Literal

from pydantic import Field, model_validator

from specframe import DecodeState, DraftTree, ProposerBase, ProposerConfig, TargetInfo, hookimpl


class SyntheticConfig(ProposerConfig):
    name: Literal["synthetic"] = "synthetic"
    k: int = Field(4, ge=1, le=64, description="Draft length every step (without widths / profile).")
    widths: dict[int, int] | None = Field(
        None, description="Verified nodes N -> steps: draft lengths in these proportions (N = 0: no draft).")
    profile: str | None = Field(
        None, description="A specframe speculation_profile.json: widths (and draft_ms unless given) from it.")
    draft_ms: float | None = Field(None, ge=0, le=10_000, description="Milliseconds spent per call (default 0).")

    @model_validator(mode="after")
    def _widths(self) -> "SyntheticConfig":
        if self.widths is not None and self.profile is not None:
            raise ValueError("synthetic: give widths or profile, not both")
        if self.widths is not None and (not self.widths or any(n < 0 or c < 0 for n, c in self.widths.items())
                                        or sum(self.widths.values()) == 0):
            raise ValueError("synthetic: widths must map node counts >= 0 to step counts >= 0, not all 0")
        return self


def _from_profile(path: str) -> tuple[dict[int, int], float]:
    """``(widths, propose ms per step)`` of a specframe speculation profile.

    Raises:
        ValueError: unreadable, or a profile without specframe's ``steps_by_shape`` (another engine's).
    """
    try:
        doc = json.loads(open(path).read())
        extra = doc["specframe"]
        widths: dict[int, int] = {}
        for key, n in extra["steps_by_shape"].items():
            nodes = int(key.split("/")[0])
            widths[nodes] = widths.get(nodes, 0) + int(n)
        return widths, float(extra.get("propose_ms_per_step") or 0.0)
    except OSError as exc:
        raise ValueError(f"synthetic: profile {path}: cannot read it ({exc.strerror})") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(f"synthetic: profile {path}: not a specframe speculation_profile.json with "
                         "specframe.steps_by_shape (written by specframe bench / replay)") from None


class SyntheticProposer(ProposerBase):
    """Chains of the newest token, of scheduled lengths (see the module docstring)."""

    name = "synthetic"
    Config = SyntheticConfig

    def __init__(self, config: SyntheticConfig, target: TargetInfo) -> None:
        super().__init__(config, target)
        widths, ms = ({config.k: 1}, 0.0)
        if config.widths is not None:
            widths = dict(config.widths)
        elif config.profile is not None:
            widths, ms = _from_profile(config.profile)
        self.draft_s = (config.draft_ms if config.draft_ms is not None else ms) / 1e3
        total = sum(widths.values())
        self.share = {n: c / total for n, c in sorted(widths.items()) if c}
        self.credit = dict.fromkeys(self.share, 0.0)

    def _next_width(self) -> int:
        for n, p in self.share.items():
            self.credit[n] += p
        best = max(sorted(self.credit), key=lambda n: self.credit[n])
        self.credit[best] -= 1.0
        return best

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        until = time.perf_counter() + self.draft_s
        n = min(self._next_width(), budget)
        while time.perf_counter() < until:  # the recorded drafting time, spent
            pass
        if n <= 0:
            return DraftTree.empty(state.tokens.shape[0])
        return DraftTree.chain([int(state.tokens[0, -1])] * n)


@hookimpl
def specframe_register_proposers(register) -> None:
    register(SyntheticProposer)
