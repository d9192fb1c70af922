"""The plugins one engine runs, checked once: proposers (with labels, origins and capabilities), the verifier,
the merge policy and router that combine several proposers, and the isolation policy for faulty ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..contracts import Capabilities, Proposer, Verifier
from ..contracts.combining import MergePolicy, Router
from ..errors import ConfigError
from .isolation import IsolationPolicy


def proposer_labels(names: Sequence[str]) -> list[str]:
    """Unique labels for proposers: the name, then ``name#2``, ``name#3`` for repeats of a name."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return out


@dataclass(frozen=True)
class Lineup:
    """What one engine runs. Build it with :meth:`build`, which checks it.

    Proposer order is the provenance order (bit ``j`` of a merged node's sources = ``proposers[j]``).
    """

    proposers: tuple[Proposer, ...]
    labels: tuple[str, ...]  # one unique label per proposer (metrics keys)
    capabilities: tuple[Capabilities, ...]  # one per proposer, read once
    verifier: Verifier
    merge: MergePolicy | None = None  # required with two or more proposers
    router: Router | None = None
    isolation: IsolationPolicy = field(default_factory=IsolationPolicy)
    origins: Mapping[str, str] = field(default_factory=dict)  # label -> the plugin it comes from, for warnings

    @staticmethod
    def build(proposers: Sequence[Proposer], verifier: Verifier, *, merge: MergePolicy | None = None,
              router: Router | None = None, isolation: IsolationPolicy | None = None,
              origins: Mapping[str, str] | None = None) -> "Lineup":
        """Check and build a lineup.

        Raises:
            ConfigError: no proposer, the same proposer object twice, or two or more proposers without a merge
                policy.
        """
        if not proposers:
            raise ConfigError("at least one proposer is needed (the `none` proposer decodes without drafts)")
        if len({id(p) for p in proposers}) != len(proposers):
            raise ConfigError("the same proposer object is listed twice: each combined proposer needs its own instance")
        if len(proposers) > 1 and merge is None:
            raise ConfigError(f"{len(proposers)} proposers are combined, which needs a merge policy (merge=...)")
        return Lineup(tuple(proposers), tuple(proposer_labels([p.name for p in proposers])),
                      tuple(Capabilities.of(p) for p in proposers), verifier, merge, router,
                      isolation or IsolationPolicy(), dict(origins or {}))

    @property
    def verifies_trees(self) -> bool:
        """The verifier takes branching drafts (``supports_trees``)."""
        return bool(self.verifier.supports_trees)

    @property
    def needs_hidden_states(self) -> bool:
        """Some proposer reads the target's last hidden state (``DecodeState.hidden``)."""
        return any(c.needs_hidden_states for c in self.capabilities)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """``[F]`` hidden_states indices some proposer reads as features, ascending."""
        return tuple(sorted({i for c in self.capabilities for i in c.feature_layers}))
