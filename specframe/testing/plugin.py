"""specframe's pytest plugin (entry point ``pytest11: specframe``), loaded in every pytest run where specframe is
installed. Light on purpose: nothing heavy is imported until a kit fixture is used.

Provides:

- ``--specframe-samples N``: requests / proposals per statistical check of the conformance kit (default 1000);
- ``specframe_tiny_target``: the kit's tiny random target, built once per session (on ``$SPECFRAME_TEST_DEVICE``,
  e.g. ``cuda``, when set; else the CPU);
- ``specframe_kit_factory``: ``factory(ProposerClass, config) -> Kit`` for ad-hoc checks in any test.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specframe", "specframe proposer conformance kit")
    group.addoption(
        "--specframe-samples", type=int, default=None, dest="specframe_samples",
        help="requests/proposals per statistical conformance check (default 1000; more = more power, slower)",
    )


@pytest.fixture(scope="session")
def specframe_tiny_target():
    """The conformance kit's tiny random Llama target (V = 16, float32) on ``$SPECFRAME_TEST_DEVICE``, else the CPU."""
    from .tiny import tiny_target

    return tiny_target()


@pytest.fixture
def specframe_kit_factory(request: pytest.FixtureRequest, specframe_tiny_target):
    """``factory(ProposerClass, config=None, samples=None) -> specframe.testing.Kit``."""
    from .kit import Kit
    from .suite import DEFAULT_SAMPLES

    default = request.config.getoption("specframe_samples") or DEFAULT_SAMPLES

    def factory(proposer: type, config: dict | None = None, samples: int | None = None) -> Kit:
        return Kit(proposer, config, samples=samples or default, target=specframe_tiny_target)

    return factory
