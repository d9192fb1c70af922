"""What the router remembers across requests: costs, which belong to the machine, not the request.

Costs outlive a request: the draft seconds and the forward cost measured per proposer label, the one-token
forward time and the cost curve's measured correction (:meth:`.cost.StepCost.learn`) carry over to the next request of the same lineup (target, router settings, proposer labels) in the
process, whichever router instance serves it (acceptance statistics start afresh), so a proposer an earlier request
found costly is not drafted unmeasured again, and its first probe waits its cost per drafted step / ``probe_share``
steps. The ledger's verdict carries over too (see :mod:`.ledger`). Kept per process, not per router instance: the
instance pool may drop an idle router between requests. A router without a target shares nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specframe import TargetInfo


@dataclass(frozen=True, slots=True)
class LineupKey:
    """A lineup: the target, the router's settings and the proposer labels (engine order)."""

    target: str  # TargetInfo.name
    anchor: int  # id() of the target's model, or of the TargetInfo when it has none (TargetInfo may be built anew
    # per request: the model it describes is what stays)
    settings: str  # the router config as JSON (AdaptiveConfig.model_dump_json())
    labels: tuple[str, ...]  # proposer labels, engine order

    @classmethod
    def of(cls, target: TargetInfo, settings: str, labels: tuple[str, ...]) -> "LineupKey":
        anchor = target.model
        return cls(target.name, id(anchor if anchor is not None else target), settings, labels)


@dataclass(slots=True)
class LabelCosts:
    """One proposer label's costs, as the last request of the lineup left them."""

    draft_s: float | None = None  # seconds per drafted step (propose + feedback work, EMA); None = never measured
    forward: float | None = None  # what its nodes added to the forward, one-token forwards (EMA); None = never
    losing: bool = False  # the ledger's verdict at its last judged step: net gain per verified step below 0


@dataclass(slots=True)
class LineupMemory:
    """A lineup's costs carried from request to request."""

    t1: float | None = None  # seconds of a one-token target forward (EMA); None = never measured
    t1_plain: bool = False  # t1 comes from one-token forwards (steps that verified nothing), not the curve
    labels: dict[str, LabelCosts] = field(default_factory=dict)  # per proposer label
    below_plain: bool = False  # a request of the lineup ran slower than plain decoding's best settings (said once)
    points: dict[int, tuple[float, float]] = field(default_factory=dict)  # measured (width, v) per width bucket

    def label(self, name: str) -> LabelCosts:
        """``name``'s costs, an empty entry (nothing measured) created when there are none."""
        found = self.labels.get(name)
        if found is None:
            found = self.labels[name] = LabelCosts()
        return found


_LINEUPS: dict[LineupKey, LineupMemory] = {}


def recall(key: LineupKey | None) -> LineupMemory:
    """The process's memory of lineup ``key`` (created empty on first use), or a fresh, unshared one for None."""
    if key is None:
        return LineupMemory()
    found = _LINEUPS.get(key)
    if found is None:
        found = _LINEUPS[key] = LineupMemory()
    return found
