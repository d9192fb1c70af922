"""specframe's conformance kit for proposer plugins.

One line per proposer class, in the plugin's own tests::

    from specframe.testing import conformance_suite
    TestMyProposer = conformance_suite(MyProposer, config={"k": 4})

runs, on a tiny random model (V = 16; on the CPU, or on ``$SPECFRAME_TEST_DEVICE`` such as ``cuda`` when set):
the contract and shape checks, greedy losslessness (token-identical), sampling losslessness (a total-variation test
against the exact target distribution), draft probabilities that match the tokens actually sampled, rollback after
partial acceptance, determinism under a seed, and the feedback counts. Outside pytest:
``Kit(MyProposer, {"k": 4}).check_all()`` raises :class:`ConformanceError`.

Replay (:mod:`specframe.testing.replay`): ``replay_proposer(MyProposer, {"k": 4})`` (or ``Kit(...).replay()``) gives
the proposer's τ, α and predicted speed-up on the dev-set traces of a real target shipped with specframe, without
loading that target.

The pytest side (option ``--specframe-samples``, fixtures) is :mod:`specframe.testing.plugin`, registered as a
``pytest11`` entry point. Names are imported lazily, so loading the pytest plugin costs nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ConformanceError", "Kit", "NotApplicable", "ProposerConformance", "ReplayResult", "conformance_suite",
           "replay_proposer", "shipped_traces", "tiny_target"]

_WHERE = {
    "ConformanceError": "report",
    "NotApplicable": "report",
    "Kit": "kit",
    "ProposerConformance": "suite",
    "conformance_suite": "suite",
    "tiny_target": "tiny",
    "replay_proposer": "replay",
    "shipped_traces": "replay",
    "ReplayResult": "replay",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(name)
