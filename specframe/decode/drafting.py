"""One request's drafting: route -> each proposer proposes (isolated, timed) -> merge -> attribution + feedback.

With one proposer its draft is verified as it is (the identity merge). With several, an optional
:class:`~specframe.contracts.combining.Router` picks which proposers run this step and their node budgets, each proposer
drafts with its own budget, in the configured order (after each, the router's ``revise`` may skip the proposers
still to run or trim the drafts made so far: a cascade), a :class:`~specframe.contracts.combining.MergePolicy` plans how
their drafts share the merged tree's node budget, and :func:`specframe.decode.merged_tree.merge_drafts` builds the one tree the target verifies. Afterwards
each proposer gets a :class:`~specframe.contracts.VerifyOutcome` about its own draft, and its attribution
(:class:`~specframe.contracts.combining.ProposerStep`) goes to the policy, the router and, in the step's
:class:`~specframe.contracts.combining.StepReport`, the request's :class:`~specframe.decode.metrics.MetricsWriter` (metrics, observers).

Everything here works through the contracts: no proposer, policy or router is named, and every call into one is a
direct call inside its fault guard (``with s.guard.call("on_verified"): s.proposer.on_verified(outcome)``,
:mod:`specframe.decode.isolation`). Faults are isolated per proposer
(:class:`~specframe.decode.isolation.FaultGuard`): a faulty proposer's draft is left out of the step, the
others keep drafting. A merge policy or router that raises or returns a malformed plan or answer is replaced for
the rest of the request by the plain fallback (proposers in order, every proposer with the step's node budget),
with one warning; none of this can change the output, only the speed.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import torch

from ..contracts import DecodeState, DraftTree, TargetModel, VerifyOutcome
from ..contracts.combining import MergePolicyBase, ProposerStep, StepReport
from ..errors import ProposerTimeoutError
from ..target.device_sync import clock
from .draft_checks import check_draft
from .isolation import FaultGuard, Guard, UnbuiltProposer
from .lineup import Lineup
from .merged_tree import MergedDraft, check_plan, merge_drafts
from .metrics import MetricsWriter

log = logging.getLogger("specframe")

_EMPTY = DraftTree.empty()  # shared: a no-node draft (zero-size tensors cannot be written into)


class _Slot:
    """One proposer in one request: its guard and this step's draft."""

    __slots__ = ("proposer", "label", "guard", "trees_ok", "branches", "draft", "asked", "budget", "draft_s",
                 "proposed", "reads_tokens", "block")

    def __init__(self, proposer: Any, label: str, guard: FaultGuard, branches: bool, trees_ok: bool,
                 reads_tokens: bool = False, block: int = 0) -> None:
        self.proposer, self.label, self.guard, self.reads_tokens = proposer, label, guard, reads_tokens
        self.block = block  # a block proposer's rows per forward (Capabilities.block_size); 0 = not one
        self.branches = branches  # declares trees: may return them
        self.trees_ok = trees_ok  # and verifier and target take them: they are verified as trees
        self.clear()

    def clear(self) -> None:
        self.draft, self.asked, self.budget, self.draft_s, self.proposed = _EMPTY, False, 0, 0.0, 0
        self.guard.new_step()


class Drafting:
    """The drafting side of one request.

    Args:
        lineup: the engine's plugins (proposers in provenance order, merge policy, router, isolation policy).
        target: what the target is (``vocab_size``; ``supports_trees``: one tree mask serves all its layers).
        writer: the request's metrics writer (faults, skipped proposers).
        greedy: the request decodes greedily (greedy: every duplicate node is merged; sampling: only
            deterministic ones).

    Tree support is worked out here: the merged tree may branch when the verifier and the target take trees
    (otherwise a merge that branches falls back to the chain of the first proposer in the policy's plan that
    drafted); a proposer's own draft may branch when it also declares ``produces_trees`` (otherwise its leading
    chain is kept).
    """

    def __init__(self, lineup: Lineup, target: TargetModel, writer: MetricsWriter, greedy: bool,
                 constraint: Any = None) -> None:
        self.writer, self.isolation, self.greedy = writer, lineup.isolation, greedy
        self.constraint = constraint  # each draft is cut to the prefix it allows (see _allowed)
        self.vocab_size = int(target.vocab_size)
        self.device = getattr(target, "device", None)  # drafting's time waits for the target device's queued work
        self.merged_trees_ok = lineup.verifies_trees and bool(target.supports_trees)
        self.slots: list[_Slot] = []
        for p, label, caps in zip(lineup.proposers, lineup.labels, lineup.capabilities):
            guard = FaultGuard(p.name, label, lineup.origins.get(label, ""), lineup.isolation, writer)
            if isinstance(p, UnbuiltProposer):  # left out of the whole request
                guard.unbuilt()
            self.slots.append(_Slot(p, label, guard, caps.produces_trees, caps.produces_trees and self.merged_trees_ok,
                                    caps.reads_target_tokens, caps.block_size))
        self.off = False  # the target refused a chain draft: no more drafts this request (see restrict)
        self.policy = lineup.merge if len(self.slots) > 1 else None
        self.router = lineup.router  # a lone proposer is routed too: its draft is trimmed to what pays on this machine
        self.policy_guard, self.router_guard = Guard(self._policy_fault), Guard(self._router_fault)
        # the merged tree's node budget; a lone proposer's draft has none beyond the step's
        self.max_nodes = int(self.policy.max_nodes) if self.policy is not None else 1 << 16
        self.batch: tuple[int, int] | None = None  # (rows, others' width) of a shared forward: see set_batch
        for s in self.slots:
            if s.block - 1 > self.max_nodes:
                clipped_once(s.label, s.block, self.max_nodes)

    def set_batch(self, rows: int, width: int) -> None:
        """The next step's forward is shared by ``rows`` requests, the others' rows ``width`` tokens wide (the router's
        ``on_batch``; :mod:`specframe.decode.batch`)."""
        self.batch = (rows, width)

    # --- per request ---------------------------------------------------------------------------------------
    def start(self, state: DecodeState, seed: int) -> None:
        labels = [s.label for s in self.slots]
        for s in self.slots:
            if not s.guard.disabled:
                with s.guard.call("start"):
                    s.proposer.start(state)
        if self.policy is not None:
            with self.policy_guard.call("start"):
                self.policy.start(labels)
        if self.router is not None:
            with self.router_guard.call("start"):
                self.router.start(labels, seed, self.greedy)

    # --- 1. propose ----------------------------------------------------------------------------------------
    def propose(self, state: DecodeState, budget: int) -> MergedDraft:
        """Every proposer the router picks drafts; their drafts merge into one tree. With ``budget < 1`` (the
        step can only commit the target's own token) nobody is asked and the tree is empty."""
        for s in self.slots:
            s.clear()
        if budget < 1 or self.off:
            return MergedDraft.single(_EMPTY, len(self.slots))
        if self.batch is not None and self.router is not None:
            with self.router_guard.call("on_batch"):
                self.router.on_batch(*self.batch)
        budgets = self._route(budget)
        seen: list[DraftTree | None] = [None] * len(self.slots)
        for j, s in enumerate(self.slots):
            b = budgets[j]
            seen[j] = _EMPTY
            if s.guard.disabled:
                continue
            if b <= 0:
                self.writer.skipped(s.label)
                continue
            # a block proposer drafts its whole block whenever it runs (one forward: the same cost at any budget);
            # the router's revise (below) or the merged tree's node budget keeps the prefix that pays
            s.asked, s.budget = True, budget if s.block else min(budget, b)
            s.draft = self._allowed(self._propose_one(s, state, s.budget))
            s.proposed = s.draft.num_nodes
            seen[j] = s.draft
            if self.router is not None:
                budgets = self._revise(budget, seen, budgets)
        for j, s in enumerate(self.slots):  # the router's last word on how much of each draft to keep
            if s.asked and budgets[j] < s.draft.num_nodes:
                s.draft = s.draft.truncate(budgets[j]) if budgets[j] > 0 else _EMPTY
        drafts = [s.draft for s in self.slots]
        if self.policy is None:
            return MergedDraft.single(drafts[0])
        plan = self._plan(drafts)
        merged = merge_drafts(drafts, plan, self.max_nodes, greedy=self.greedy)
        if not self.merged_trees_ok and not merged.tree.is_chain():
            first = next((j, q) for j, q in plan if q > 0 and drafts[j].num_nodes)  # (a branch needs two drafts)
            merged = merge_drafts(drafts, [first], self.max_nodes, greedy=self.greedy)
        return merged

    def _allowed(self, draft: DraftTree) -> DraftTree:
        """``draft`` cut to the prefix the request's constraint allows (no target row for a forbidden node). Under
        sampling a draft with its own probabilities is left whole: cutting a sampled node for its own token would
        change the emitted distribution; the masked verification rejects it instead."""
        if self.constraint is None or not draft.num_nodes or not (self.greedy or draft.draft_probs is None):
            return draft
        return draft.truncate(self.constraint.allowed_prefix(draft))

    def _propose_one(self, s: _Slot, state: DecodeState, budget: int) -> DraftTree:
        """One proposer's draft; a fault leaves it out of this step (output is unaffected)."""
        timeout = self.isolation.propose_timeout_s
        out = _EMPTY
        t0 = time.perf_counter()
        try:
            with s.guard.call("propose"):
                draft = s.proposer.propose(state, budget)
                if isinstance(draft, DraftTree) and all(isinstance(t, torch.Tensor) for t in (draft.token_ids,
                                                                                                draft.parent)):
                    draft = draft.truncate(budget).on_host()  # its structure is read on the host (DraftTree)
                elapsed = clock(self.device) - t0
                if timeout is not None and elapsed > timeout:
                    raise ProposerTimeoutError(f"propose took {elapsed:.3f} s, over the {timeout:g} s time limit")
                check_draft(draft, self.vocab_size, s.trees_ok or s.branches, 1)
                # a proposer that declares trees, where the target or verifier takes chains only: its leading chain
                # (one that does not declare them drafted a chain: check_draft refuses anything else)
                out = draft.leading_chain() if s.branches and not s.trees_ok else draft
        finally:
            s.draft_s = clock(self.device) - t0
        return out

    # --- 5. feedback (the engine's step 5) -----------------------------------------------------------------
    def feedback(self, merged: MergedDraft, path: Sequence[int], committed: Sequence[int], finished: bool,
                 forward_s: float, logits: Any = None) -> StepReport:
        """Attribution, then each enabled proposer's ``on_verified`` about its own draft, then the policy's and
        router's feedback. Returns the step's report (for the metrics writer and observers). ``logits``: the
        step's ``[B, N + 1, V]`` target logits, whose argmax goes to the proposers that read target tokens (or, in a
        replay, ``[B, N + 1]`` int64: the recorded tokens themselves)."""
        depths = merged.depths()
        single = len(self.slots) == 1  # the identity merge: the merged tree is the draft
        best: list[int] | None = None  # the target's argmax after the root and each merged node (when read)
        if logits is not None and any(s.reads_tokens and not s.guard.disabled for s in self.slots):
            row = logits[0]  # [N + 1, V] scores, or [N + 1] int64 tokens (a replay's recorded continuation)
            best = (row if row.dim() == 1 else row.argmax(-1)).tolist()
        steps = []
        for j, s in enumerate(self.slots):
            kept = merged.kept(j)
            tokens = None
            if best is not None and s.reads_tokens:
                tokens = ((best[0], *(best[1 + m] for m in merged.node_of[j][:kept])),)
            if single:
                own, alone, by_depth = tuple(path), len(path), _count_depths(depths)
            else:
                own = merged.own_accepted(j, path, s.draft.parent[0, :kept].tolist()) if kept else ()
                alone = merged.alone(j, path)
                by_depth = _count_depths(depths[m] for m in merged.node_of[j])
            t0 = time.perf_counter()
            if not s.guard.disabled:
                outcome = VerifyOutcome(s.draft.truncate(kept), (own,), (tuple(committed),), finished, tokens)
                with s.guard.call("on_verified"):
                    s.proposer.on_verified(outcome)
            steps.append(ProposerStep(s.label, s.asked, s.budget, s.proposed, kept, by_depth, len(own), alone,
                                      s.draft_s, s.guard.tripped, time.perf_counter() - t0))
        report = StepReport(tuple(steps), merged.tree.num_nodes, len(path), forward_s)
        if self.policy is not None:
            with self.policy_guard.call("on_step"):
                self.policy.on_step(report)
        if self.router is not None:
            with self.router_guard.call("on_step"):
                self.router.on_step(report)
        return report

    def restrict(self, chains_only: bool) -> None:
        """After the target refused a draft (its forward raised): ``chains_only`` — no branching drafts for the rest
        of the request (tree drafts keep their leading chain); otherwise no drafts at all (target-only steps)."""
        self.merged_trees_ok = False
        for s in self.slots:
            s.trees_ok = False
        if not chains_only:
            self.off = True

    # --- plumbing ------------------------------------------------------------------------------------------
    def _route(self, budget: int) -> list[int]:
        """The router's node budget per proposer, checked; every proposer with the full budget without one."""
        if self.router is not None:
            available = [not s.guard.disabled for s in self.slots]
            with self.router_guard.call("route") as call:
                return self._budgets(call.where, self.router.route(budget, self.max_nodes, available))
        return [budget] * len(self.slots)

    def _revise(self, budget: int, seen: list[DraftTree | None], budgets: list[int]) -> list[int]:
        """The router's revised numbers after a proposer ran (node budgets ahead, nodes to keep behind)."""
        if self.router is not None:
            available = [not s.guard.disabled for s in self.slots]
            with self.router_guard.call("revise") as call:
                return self._budgets(call.where, self.router.revise(budget, self.max_nodes, available, list(seen),
                                                                    list(budgets)))
        return [budget] * len(self.slots)

    def _budgets(self, method: str, answer: Sequence[int]) -> list[int]:
        """A router's answer as ints, checked: one number >= 0 per proposer.

        Raises:
            ValueError: another length, or a negative number (the router's fault: it is dropped).
        """
        out = [int(b) for b in answer]
        if len(out) != len(self.slots) or any(b < 0 for b in out):
            raise ValueError(f"{method} must return {len(self.slots)} numbers >= 0, got {out}")
        return out

    def _plan(self, drafts: list[DraftTree]) -> list[tuple[int, int]]:
        if self.policy is not None:
            with self.policy_guard.call("plan"):
                return check_plan(self.policy.plan(drafts, self.max_nodes), len(drafts))
        return [(j, d.num_nodes) for j, d in enumerate(drafts)]

    def _policy_fault(self, where: str, exc: Exception) -> None:
        """The merge policy faulted: warn; the proposers' order for the rest of the request."""
        _warn("merge policy", self.policy, where, exc, "the proposers' order")
        self.policy = FallbackPolicy(self.max_nodes)

    def _router_fault(self, where: str, exc: Exception) -> None:
        """The router faulted: warn; no router for the rest of the request (every proposer, full budget)."""
        _warn("router", self.router, where, exc, "no router (every proposer, full budget)")
        self.router = None


def _warn(kind: str, obj: Any, where: str, exc: BaseException, instead: str) -> None:
    log.warning("%s %r raised %s in %s: %s; the rest of the request uses %s, output is unaffected", kind, obj.name,
                type(exc).__name__, where, exc, instead)


class FallbackPolicy(MergePolicyBase):
    """Stands in for a faulty merge policy: proposers in the configured order, each draft whole."""

    name = "fallback"

    def __init__(self, max_nodes: int) -> None:
        self.target, self.max_nodes = None, max_nodes

    def plan(self, drafts: Sequence[DraftTree], max_nodes: int) -> list[tuple[int, int]]:
        return [(j, d.num_nodes) for j, d in enumerate(drafts)]


_CLIPPED: set[tuple[str, int, int]] = set()  # (label, block, limit) already said in this process


def clipped_once(label: str, block: int, limit: int) -> None:
    """Say once per process that proposer ``label``'s block of ``block`` rows (``block - 1`` drafts) is more than
    the ``limit`` nodes a step verifies, so only the block's first ``limit`` drafts can be verified."""
    if (label, block, limit) in _CLIPPED:
        return
    _CLIPPED.add((label, block, limit))
    log.warning("proposer %r drafts blocks of %d tokens but a step verifies at most %d draft nodes here "
                "(the merge policy's max_nodes): each block is clipped to its first %d", label, block - 1, limit, limit)


def _count_depths(depths: Any) -> tuple[int, ...]:
    out: list[int] = []
    for d in depths:
        if d > len(out):
            out.extend([0] * (d - len(out)))
        out[d - 1] += 1
    return tuple(out)
