"""The ``adaptive`` router's probes: how a proposer it leaves out (or trims every step) gets measured again.

One left out (or whose draft was trimmed) for ``wait`` steps in a row (``probe_every`` at first) is run once with a
probe's budget and its draft kept whole; with probability ``explore`` per step one costly proposer (drawn from the
router's own ``random.Random`` seeded with the request's seed: deterministic, no global RNG, the request's generator
untouched) is run too, unless its last probe did not pay (its wait is above ``probe_every``). A probe's budget is
the most nodes that add at most ``probe_cost`` one-token forwards to the step's forward
(:meth:`.cost.StepCost.probe_nodes`); a timed proposer's first draft, before its cost is measured, gets the same.

A probe costs its draft and the nodes it adds to the forward; one whose accepted tokens do not pay for that
multiplies the wait by ``probe_backoff`` (up to ``probe_max``), and at least to its cost per drafted step /
``probe_share`` steps (:func:`cost_wait`); one that pays resets it to ``probe_every`` (and ends a probation, see
:mod:`.ledger`). So what probing a proposer that does not pay costs stays a small fraction (``probe_share``) of the
run.
"""

from __future__ import annotations

import math

from .config import AdaptiveConfig
from .stats import ProposerStats


def due(st: ProposerStats) -> bool:
    """Left out for ``wait`` steps in a row, counting this one."""
    return st.idle + 1 >= st.wait


def stale(st: ProposerStats) -> bool:
    """Trimmed for ``wait`` steps in a row, counting this one (its deeper depths would never be measured again)."""
    return st.starved + 1 >= st.wait


def cost_wait(st: ProposerStats, draft_cost: float, wait: int, config: AdaptiveConfig) -> int:
    """``wait``, raised so that one probe per wait costs at most ``probe_share`` of the steps' time: its draft cost
    (one-token forwards) and what its nodes added to the forward when it last drafted; at most ``probe_max``."""
    return min(config.probe_max, max(wait, math.ceil((draft_cost + st.fwd_cost) / config.probe_share)))


def judge(st: ProposerStats, paid: bool, draft_cost: float, config: AdaptiveConfig) -> None:
    """After a probe: when its accepted tokens paid for its draft and its nodes (``paid``), the next one after
    ``probe_every`` steps and a probation ends (the ledger judges it afresh); else after ``probe_backoff`` times the
    last wait (at least :func:`cost_wait`'s, at most ``probe_max``)."""
    if paid:
        st.wait = config.probe_every
        if st.probation:
            st.probation, st.net_steps = False, 0
    else:
        backed_off = min(config.probe_max, max(config.probe_every, int(st.wait * config.probe_backoff)))
        st.wait = cost_wait(st, draft_cost, backed_off, config)
