"""Structured output: the built-in constraint engine (:mod:`.llguidance_engine`) and the grammar-state bookkeeping
the decode loop needs (see :mod:`specframe.contracts.constraint` for how a constraint enters a step)."""
