"""Per-request counters and timings. Terms (docs/how-it-works.md, "Vocabulary"): τ (``tau``) =
tokens committed per target forward, bonus included (1.0 for plain decoding); α (``acceptance_rate``) = accepted
nodes / drafted nodes.

:class:`MetricsWriter` is the one writer of these metrics (and of the observer's step events).

Per proposer (``proposers``, keyed by the proposer's label), the attribution of a request's drafting: see
:class:`ProposerMetrics`. The request-level fields keep their meaning whatever the number of proposers:
``drafted_nodes`` counts nodes of the verified (merged) tree, each once.

Names follow the glossary. Records (``--json``, bench and replay results) also carry each field under the name it
had before version 0.2, for parsers written against those (:data:`LEGACY_KEYS`: ``drafted_tokens``,
``accepted_tokens``, ``mean_accepted_length``, ``drafted_by_position``, ``accepted_by_position``); read the new names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

from ..contracts.combining import ProposerStep, StepReport
from .observe import Observers

# old record key -> the glossary's name; ``to_dict`` writes both, :func:`current_names` reads old records
LEGACY_KEYS = {
    "drafted_tokens": "drafted_nodes",
    "accepted_tokens": "accepted_nodes",
    "mean_accepted_length": "tau",
    "drafted_by_position": "drafted_by_depth",
    "accepted_by_position": "accepted_by_depth",
}


def with_legacy_keys(d: dict) -> dict:
    """``d`` (a request's or a proposer's metrics dict) plus each field under its old name (:data:`LEGACY_KEYS`)."""
    d.update({old: d[new] for old, new in LEGACY_KEYS.items() if new in d})
    return d


def current_names(d: dict) -> dict:
    """A metrics dict written by any version, with the glossary's names filled in from old ones where missing
    (for reading stored records: bench journals, traces, results)."""
    out = dict(d)
    for old, new in LEGACY_KEYS.items():
        if new not in out and old in out:
            out[new] = out[old]
    if isinstance(out.get("proposers"), dict):
        out["proposers"] = {k: current_names(v) if isinstance(v, dict) else v for k, v in out["proposers"].items()}
    return out


@dataclass
class ProposerMetrics:
    """One proposer's attribution over a request.

    Crediting rule: an accepted node produced by several proposers (the same token at the same path,
    deduplicated in the merged tree) credits each of them, so the proposers' ``accepted_nodes`` can add up to
    more than the request's; ``accepted_alone`` counts accepted nodes no other proposer produced.
    """

    steps: int = 0  # steps in which propose was called
    skipped_steps: int = 0  # steps the router left it out (no propose call)
    proposed_nodes: int = 0  # nodes its propose calls returned (after truncation to its budget)
    drafted_nodes: int = 0  # of those, nodes the target verified (shared nodes count for every producer)
    accepted_nodes: int = 0  # credited accepted nodes (see the crediting rule)
    accepted_alone: int = 0  # accepted nodes only this proposer produced
    wasted_nodes: int = 0  # drafted nodes of this proposer that were not accepted (drafted - accepted)
    draft_s: float = 0.0  # seconds in its propose calls
    faults: int = 0  # its faults (see specframe.decode.isolation)
    disabled: bool = False  # too many faults: not called for the rest of the request
    drafted_by_depth: list[int] = field(default_factory=list)  # [L] drafted nodes at depth i+1
    accepted_by_depth: list[int] = field(default_factory=list)  # [L] credited accepted nodes at depth i+1

    def add(self, step: ProposerStep) -> None:
        """One step's attribution."""
        if step.asked:
            self.steps += 1
        self.proposed_nodes += step.proposed
        self.drafted_nodes += step.drafted
        self.accepted_nodes += step.accepted
        self.accepted_alone += step.accepted_alone
        self.wasted_nodes += step.wasted
        self.draft_s += step.draft_s
        grow = max(len(step.drafted_by_depth), step.accepted) - len(self.drafted_by_depth)
        if grow > 0:
            self.drafted_by_depth.extend([0] * grow)
            self.accepted_by_depth.extend([0] * grow)
        for d, n in enumerate(step.drafted_by_depth):
            self.drafted_by_depth[d] += n
        for d in range(step.accepted):  # its accepted nodes are the path's first `accepted` nodes
            self.accepted_by_depth[d] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_nodes / self.drafted_nodes if self.drafted_nodes else 0.0


@dataclass
class RequestMetrics:
    prompt_tokens: int = 0
    new_tokens: int = 0
    target_forwards: int = 0  # verification forwards (the prefill is not counted)
    drafted_nodes: int = 0  # drafted nodes: those of the verified (merged) tree, each once
    accepted_nodes: int = 0  # accepted nodes
    proposer_faults: int = 0  # calls where a proposer raised, broke the draft contract or ran over time
    proposer_fault_kinds: dict[str, int] = field(default_factory=dict)  # kind -> n (specframe.decode.isolation:
    # "raised" | "malformed" | "timeout" | "refused" | "build")
    proposer_disabled: bool = False  # too many faults: the rest of the request decoded from the target alone
    wall_s: float = 0.0
    prefill_s: float = 0.0
    ttft_s: float = 0.0  # from the request's start (its prefill) to its first committed token
    queue_s: float = 0.0  # batched decoding: waiting for a row of the batch before the start (0 alone)
    propose_s: float = 0.0
    forward_s: float = 0.0
    verify_s: float = 0.0  # verify + commit + rollback + stop checks + feedback
    drafted_by_depth: list[int] = field(default_factory=list)  # [L] nodes drafted at depth i+1
    accepted_by_depth: list[int] = field(default_factory=list)  # [L] nodes accepted at depth i+1
    steps_by_shape: dict[str, int] = field(default_factory=dict)  # "N/A" -> steps that verified N nodes, accepted A
    tree_steps: int = 0  # steps whose verified draft branched (more nodes than depth)
    proposers: dict[str, ProposerMetrics] = field(default_factory=dict)  # label -> attribution (see above)

    def add_step(self, drafted: int, accepted: int, depths: list[int] | None = None) -> None:
        """One verification step: ``drafted`` nodes (at ``depths``, 1-based; a chain when None), ``accepted``
        of them along the accepted path."""
        self.target_forwards += 1
        self.drafted_nodes += drafted
        self.accepted_nodes += accepted
        shape = f"{drafted}/{accepted}"
        self.steps_by_shape[shape] = self.steps_by_shape.get(shape, 0) + 1
        deepest = max(depths) if depths else drafted
        self.tree_steps += int(deepest < drafted)
        grow = deepest - len(self.drafted_by_depth)
        if grow > 0:
            self.drafted_by_depth.extend([0] * grow)
            self.accepted_by_depth.extend([0] * grow)
        for d in depths if depths else range(1, drafted + 1):
            self.drafted_by_depth[d - 1] += 1
        for i in range(accepted):
            self.accepted_by_depth[i] += 1

    @property
    def tau(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_nodes / self.drafted_nodes if self.drafted_nodes else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tau"] = round(self.tau, 4)
        d["acceptance_rate"] = round(self.acceptance_rate, 4)
        d["tokens_per_s"] = round(self.tokens_per_s, 3)
        for key in ("wall_s", "prefill_s", "ttft_s", "queue_s", "propose_s", "forward_s", "verify_s"):
            d[key] = round(d[key], 6)
        d["other_s"] = round(max(0.0, self.wall_s - self.prefill_s - self.propose_s - self.forward_s - self.verify_s), 6)
        for label, pm in self.proposers.items():
            entry = d["proposers"][label]
            entry["acceptance_rate"] = round(pm.acceptance_rate, 4)
            entry["draft_s"] = round(pm.draft_s, 6)
            with_legacy_keys(entry)
        return with_legacy_keys(d)


class MetricsWriter:
    """The one writer of a request's metrics and observer events.

    The decode loop, drafting and fault isolation report what happened to it; only it writes
    :class:`RequestMetrics` (request counters, per-proposer attribution, fault counts, timings) and builds the
    observer's step events. Faults are counted per step as they happen, so each step event carries that step's own
    faults.

    Args:
        labels: the proposers' labels in the engine's order (keys of ``metrics.proposers``).
        prompt_tokens: the prompt's length in tokens.
        observer: where step events go; None (no plugin observes) builds no event.
    """

    __slots__ = ("metrics", "observer", "labels", "_step_faults")

    def __init__(self, labels: Sequence[str], prompt_tokens: int, observer: Observers | None = None) -> None:
        self.metrics = RequestMetrics(prompt_tokens=prompt_tokens)
        for label in labels:
            self.metrics.proposers.setdefault(label, ProposerMetrics())
        self.labels = tuple(labels)
        self.observer = observer
        self._step_faults = 0  # faults since the last step event

    # --- faults ----------------------------------------------------------------------------------------------
    def fault(self, label: str | None, kind: str, disabled: bool = False) -> None:
        """One fault of ``kind`` (:mod:`specframe.decode.isolation`'s fault kinds; ``label``: the proposer's, None: the
        request's, e.g. ``refused``); ``disabled``: that proposer is off for the rest of the request."""
        m = self.metrics
        m.proposer_faults += 1
        m.proposer_fault_kinds[kind] = m.proposer_fault_kinds.get(kind, 0) + 1
        self._step_faults += 1
        if label is not None:
            own = m.proposers[label]
            own.faults += 1
            if disabled:
                own.disabled = True
                m.proposer_disabled = all(pm.disabled for pm in m.proposers.values())

    def skipped(self, label: str) -> None:
        """The router left this proposer out of the step (no propose call)."""
        self.metrics.proposers[label].skipped_steps += 1

    # --- steps -----------------------------------------------------------------------------------------------
    def prefill(self, seconds: float) -> None:
        self.metrics.prefill_s = seconds

    def step(self, report: StepReport, depths: Sequence[int], committed: Sequence[int], finished: bool,
             propose_s: float, verify_s: float) -> None:
        """One verification step: the merged tree's ``depths`` (1-based, one per node), the attribution in
        ``report``, the committed tokens and the step's seconds per phase (the forward's are ``report.forward_s``);
        then the observer's step event."""
        m = self.metrics
        m.add_step(report.verified, report.accepted, depths)
        m.new_tokens += len(committed)
        for step in report.proposers:
            m.proposers[step.name].add(step)
        m.propose_s += propose_s
        m.forward_s += report.forward_s
        m.verify_s += verify_s
        if self.observer is not None:
            faults, self._step_faults = self._step_faults, 0
            self.observer.step(m.target_forwards - 1, "+".join(self.labels), report.verified, report.accepted,
                               tuple(committed), faults, finished, report.proposers)

    def first_token(self, seconds: float) -> None:
        """The first token was committed ``seconds`` after the request started."""
        self.metrics.ttft_s = seconds

    def finish(self, wall_s: float) -> RequestMetrics:
        """The request's end: its wall time in seconds. Returns the metrics."""
        self.metrics.wall_s = wall_s
        return self.metrics
