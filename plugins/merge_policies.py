"""Built-in merge policies: how several combined proposers' drafts share the merged tree's node budget.

A policy only *plans* the merge — which proposer's nodes go in first and how many of each (a prefix of its
draft); the merge itself, with deduplication, provenance and the exactness rules, is core
(:func:`specframe.decode.merged_tree.merge_drafts`), so no policy can change what is emitted, only how fast.

- ``priority``: proposers in the configured order; each draft goes in whole while the budget lasts, so an earlier
  proposer's nodes always come first. Duplicates of nodes already in the tree cost nothing.
- ``confidence``: the budget is shared in proportion to each proposer's live acceptance (an exponential moving
  average of accepted / drafted nodes, credited as in the attribution), the most trusted proposer first; a
  proposer that drafted fewer nodes than its share leaves the rest to the others.

Worked example (``confidence``, ``max_nodes = 8``): live acceptances 0.6 (ngram, drafted 6 nodes) and 0.2
(draft-model, drafted 5) share 8 nodes 6 : 2 -> plan ``[(0, 6), (1, 2)]``; had ngram drafted 3 nodes, the plan
would be ``[(0, 3), (1, 5)]``.
"""

from __future__ import annotations

from typing import Literal, Sequence

from pydantic import Field

from specframe import DraftTree, MergePolicyBase, MergePolicyConfig, StepReport, hookimpl


class PriorityConfig(MergePolicyConfig):
    name: Literal["priority"] = "priority"


class PriorityPolicy(MergePolicyBase):
    """Proposers in the configured order: earlier ones' nodes first until the node budget is spent."""

    name = "priority"
    Config = PriorityConfig

    def plan(self, drafts: Sequence[DraftTree], max_nodes: int) -> list[tuple[int, int]]:
        return [(j, d.num_nodes) for j, d in enumerate(drafts)]


class ConfidenceConfig(MergePolicyConfig):
    name: Literal["confidence"] = "confidence"
    decay: float = Field(0.8, ge=0.0, lt=1.0, description="Weight of the past in each proposer's acceptance average.")
    prior: float = Field(0.5, ge=0.0, le=1.0, description="Acceptance assumed for a proposer not verified yet.")
    floor: float = Field(0.05, gt=0.0, le=1.0, description="Least weight of a proposer that drafted, so it keeps a share.")


def share_budget(sizes: Sequence[int], weights: Sequence[float], max_nodes: int) -> list[tuple[int, int]]:
    """Water-filling: ``max_nodes`` shared in proportion to ``weights`` among proposers that drafted, each capped
    at its draft's size (what it cannot use goes to the others); heaviest first, ties in proposer order.

    Example: ``share_budget([6, 5], [0.6, 0.2], 8) == [(0, 6), (1, 2)]``.
    """
    order = sorted((j for j, n in enumerate(sizes) if n > 0), key=lambda j: (-weights[j], j))
    quota = {j: 0 for j in order}
    left, open_ = max_nodes, list(order)
    while left > 0 and open_:
        total = sum(weights[j] for j in open_)
        grant = {j: int(left * weights[j] / total) for j in open_}
        if not any(grant.values()):
            grant[open_[0]] = 1  # the last few nodes go one at a time to the most trusted
        for j in open_:
            g = min(grant[j], sizes[j] - quota[j], left)
            quota[j] += g
            left -= g
        open_ = [j for j in open_ if quota[j] < sizes[j]]
    return [(j, quota[j]) for j in order if quota[j] > 0]


class ConfidencePolicy(MergePolicyBase):
    """Shares the node budget by each proposer's live acceptance (EMA of accepted / drafted nodes)."""

    name = "confidence"
    Config = ConfidenceConfig

    def start(self, proposers: Sequence[str]) -> None:
        super().start(proposers)
        self.acceptance = [self.config.prior] * len(proposers)

    def plan(self, drafts: Sequence[DraftTree], max_nodes: int) -> list[tuple[int, int]]:
        weights = [max(a, self.config.floor) for a in self.acceptance]
        return share_budget([d.num_nodes for d in drafts], weights, max_nodes)

    def on_step(self, report: StepReport) -> None:
        decay = self.config.decay
        for j, step in enumerate(report.proposers):
            if step.drafted:
                rate = step.accepted / step.drafted
                self.acceptance[j] = decay * self.acceptance[j] + (1 - decay) * rate


@hookimpl
def specframe_register_merge_policies(register) -> None:
    register(PriorityPolicy)
    register(ConfidencePolicy)
