"""The ``adaptive`` router's ledger: each proposer's realised net gain, which leaves out one that does not pay.

The estimates the ascent uses lag (moving averages of depths), and on a steep curve each kept node that is rejected
costs most of a forward. So each proposer also keeps its realised net gain per verified step, ``accepted - what its
nodes added to the forward (measured when timed) - draft cost`` (tokens minus the forwards it added); once the
moving average is below 0 over at least ``ledger_steps`` verified steps, it is left out of every step, free ones too,
but for probes (:mod:`.probes`), whose outcomes update the ledger.

With timings the verdict carries over as the costs do (:mod:`.memory`): a proposer that the previous request of the
lineup ended leaving out is judged after ``ledger_steps_known`` verified steps of the new request — on that request's
own gains, so one that pays on the new prompt stays in. A costly one (draft cost above ``free_cost``) so carried over
starts on ``probation``: out but for probes, the first at the request's first step, until a probe pays for itself.
"""

from __future__ import annotations

from .config import AdaptiveConfig
from .stats import ProposerStats


def record(st: ProposerStats, gain: float, decay: float) -> None:
    """Add one verified step's net gain (tokens - one-token forwards it added) to the moving average."""
    st.net = gain if not st.net_steps else decay * st.net + (1 - decay) * gain
    st.net_steps += 1


def losing(st: ProposerStats) -> bool:
    """On probation, or its net gain per verified step below 0 over at least ``judge_after`` steps."""
    n = st.judge_after
    return st.probation or (n > 0 and st.net_steps >= n and st.net < 0)


def verdict(st: ProposerStats) -> bool | None:
    """What the next request of the lineup inherits: losing (True / False) once judged, None before."""
    return st.net < 0 if st.net_steps >= st.judge_after else None


def carry_over(st: ProposerStats, costly: bool, config: AdaptiveConfig) -> None:
    """The previous request of the lineup ended leaving this proposer out: judge it sooner, and when ``costly``
    (and ``probation``) start it out but for probes, the first at this request's first step."""
    if config.ledger_steps_known:
        st.judge_after = min(config.ledger_steps, config.ledger_steps_known)
    if config.probation and costly:
        st.probation = True
        st.idle = st.wait - 1
