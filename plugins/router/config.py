"""The ``adaptive`` router's settings (``router:`` in the config) and where its cost curve ``v(n)`` comes from.

The cost curve ``v(n)`` (target forward time for ``n`` tokens over the time for one) comes from ``cost_curve``
(a list v(1), v(2), ...), or ``cost_profile`` (a ``specframe bench --profile`` results.json; its
``profile.v``), or else this machine's measured profile for the target as it runs (``TargetInfo.cost``, see
:mod:`specframe.target.profile`; it follows thread changes under load), or else the linear default
``1 + cost_slope * (n - 1)`` (the choice among them: :mod:`.cost`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, field_validator

from specframe import ConfigError, RouterConfig
from specframe.services import CostCurve


class AdaptiveConfig(RouterConfig):
    """Settings of the ``adaptive`` router (each field's description gives its unit: one-token target forwards,
    steps, or a fraction)."""

    name: Literal["adaptive"] = "adaptive"
    decay: float = Field(0.9, ge=0.0, lt=1.0, description="Weight of the past in the moving averages.")
    prior: float = Field(0.6, gt=0.0, lt=1.0, description="Reach at depth d assumed before any feedback: prior ** d.")
    max_depth: int = Field(12, ge=1, le=64, description="Deepest level the router plans for.")
    cost_curve: Optional[list[float]] = Field(
        None, min_length=1, description="v(1), v(2), ...: target forward time for n tokens over one token's."
    )
    cost_profile: Optional[str] = Field(None, description="A `specframe bench --profile` results.json to take v(n) from.")
    cost_slope: float = Field(0.03, ge=0.0, description="Default curve without a profile: v(n) = 1 + slope * (n - 1).")
    draft_cost: dict[str, float] = Field(
        default_factory=dict,
        description="Draft cost per step by proposer label, in one-token target forwards (e.g. {draft-model: 0.3}); "
        "used when timings are not measured (missing: 0).",
    )
    measure: Literal["auto", "always", "never"] = Field(
        "auto", description="Measure draft and forward times: auto = under greedy decoding only (keeps sampled "
        "output reproducible under a seed); always; never (use draft_cost).",
    )
    free_cost: float = Field(
        0.05, ge=0.0, description="A proposer whose draft costs at most this (one-token forwards) drafts with the full "
        "budget every step; what of its draft is kept is decided once it is known.",
    )
    probe_every: int = Field(16, ge=1, description="Run a proposer left out this many steps in a row once, fully.")
    probe_backoff: float = Field(
        2.0, ge=1.0, description="After a probe (or exploration) that did not pay for itself, the wait before the next "
        "one grows by this factor, up to probe_max; a probe that pays brings it back to probe_every (1 = fixed).")
    probe_max: int = Field(512, ge=1, description="The longest wait between probes of one proposer, in steps.")
    probe_share: float = Field(
        0.02, gt=0.0, le=1.0, description="Most of a run's time the probes of one proposer that does not pay may cost: "
        "its wait after such a probe is at least its draft cost (one-token forwards) / probe_share steps, and so is "
        "the first wait of a request for a proposer whose cost an earlier request measured.")
    probe_cost: float = Field(
        0.5, gt=0.0, description="Most a probe (or a proposer's first, unmeasured draft) may add to its step's "
        "forward, in one-token forwards: it drafts at most the largest n nodes with v(1 + n) - v(1) <= this (on a "
        "flat cost curve the whole budget, on a steep one a node or two).")
    ledger_steps: int = Field(
        8, ge=0, description="Leave a proposer out for the rest of the request (but for probes) once, over at least "
        "this many verified steps, its accepted tokens fell short of what its nodes and draft cost (a moving average "
        "of the net gain per step below 0); 0 = never.")
    ledger_steps_known: int = Field(
        4, ge=0, description="With timings: the ledger's verdict on a proposer that the previous request of this lineup "
        "ended leaving out (its net gain below 0) needs only this many verified steps of the new request (its own "
        "gains: a proposer that pays here is kept); 0 = as ledger_steps.")
    probation: bool = Field(
        True, description="With timings: a costly proposer (draft cost above free_cost) that the previous request of "
        "this lineup ended leaving out starts the next one left out but for probes, the first at its first step, "
        "until a probe pays for itself (then the ledger judges it afresh).")
    keep_tolerance: float = Field(
        0.03, ge=0.0, lt=1.0, description="Keep a draft whole when that lowers the expected tokens per cost by at most "
        "this fraction (the nodes a trim saves must pay clearly; 0 = trim to the exact optimum).")
    explore: float = Field(0.05, ge=0.0, le=1.0, description="Chance per step to also run one left-out proposer.")

    @field_validator("cost_profile")
    @classmethod
    def _profile_readable(cls, v: Optional[str]) -> Optional[str]:
        if v:
            read_profile(Path(v).expanduser())  # a missing or malformed profile fails with the config, not mid-request
        return v

    @field_validator("cost_curve")
    @classmethod
    def _positive(cls, v: Optional[list[float]]) -> Optional[list[float]]:
        if v is not None and any(not x > 0 for x in v):
            raise ValueError("cost_curve values must be > 0 (v(n) = T(n) / T(1))")
        return v


def read_profile(path: Path) -> list[float]:
    """``profile.v`` of a ``specframe bench --profile`` results.json.

    Raises:
        ConfigError: the file is missing or unreadable, has no ``profile.v``, or a value there is not > 0.
    """
    fix = "run `specframe bench --profile` to write one, or give cost_curve"
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; {fix}")
    try:
        doc = json.loads(path.read_text())
        curve = [float(x) for x in (doc.get("profile") or {})["v"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path} has no profile.v ({type(exc).__name__}); {fix}") from None
    if not curve or any(not x > 0 for x in curve):
        raise ConfigError(f"{path}: profile.v must be a non-empty list of times > 0; {fix}")
    return curve


def load_cost_curve(config: AdaptiveConfig) -> CostCurve | None:
    """The router's own curve v(n), from ``cost_curve`` or ``cost_profile`` (normalised to v(1) = 1); None when
    neither is set (then the target's measured curve, else the linear default).

    Raises:
        ConfigError: as :func:`read_profile`.
    """
    curve = config.cost_curve
    if curve is None and config.cost_profile:
        try:
            curve = read_profile(Path(config.cost_profile).expanduser())
        except ConfigError as exc:
            raise ConfigError(f"router adaptive: cost_profile {exc}") from None
    return CostCurve.from_v(curve) if curve else None
