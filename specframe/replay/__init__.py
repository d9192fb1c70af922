"""Replay: compare proposers in seconds against recorded target traces (docs/replay.md).

Under greedy decoding the output does not depend on the proposer, so the target's continuation of each prompt is
recorded once (``specframe trace record``: :mod:`.record`, format :mod:`.trace`) and any proposer is replayed
against it (``specframe replay``: :mod:`.driver`): the real proposer objects go through the engine's own
propose -> verify -> commit -> feedback step, with verification against the recorded continuation instead of a
target forward. Strategies — and grids of their settings — run here or as Ray tasks (:mod:`.sweep`); the report is
the bench's, with predicted speed-ups from the trace's cost curve (:mod:`.report`).
"""
