"""The ``adaptive`` router, a folder of small parts: :mod:`.adaptive` (the router: route, revise, on_step),
:mod:`.config` (its settings), :mod:`.stats` (one proposer's statistics), :mod:`.cost` (a step's cost and the
clocks), :mod:`.ascent` (the budget choice, pure), :mod:`.probes`, :mod:`.ledger` and :mod:`.memory` (what one
request leaves to the next)."""

from .adaptive import AdaptiveRouter, specframe_register_routers
from .config import AdaptiveConfig

__all__ = ["AdaptiveConfig", "AdaptiveRouter", "specframe_register_routers"]
