"""The conformance suite as pytest tests: one line per proposer class in the author's own test module.

    from specframe.testing import conformance_suite
    from my_plugin import MyProposer

    TestMyProposer = conformance_suite(MyProposer, config={"k": 4})

or, to tune it::

    class TestMyProposer(ProposerConformance):
        proposer = MyProposer
        config = {"k": 4}
        skip = ("rollback",)      # drafts depend on feedback history by design

Each check is its own test (``test_contract``, ``test_greedy_lossless``, ...); a failure shows only the kit's
message, written in the author's terms; a check that does not apply is reported as skipped, with the reason.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from .report import ConformanceError, NotApplicable

DEFAULT_SAMPLES = 1000


class ProposerConformance:
    """Base class of a conformance test class (pytest collects subclasses named ``Test*``)."""

    proposer: ClassVar[type | None] = None  # the proposer class under test
    config: ClassVar[dict[str, Any]] = {}  # its options (``name`` is filled in)
    samples: ClassVar[int | None] = None  # per statistical check; None = --specframe-samples (default 1000)
    skip: ClassVar[tuple[str, ...]] = ()  # check names to skip: "rollback", "determinism", ...

    @pytest.fixture(scope="class")
    @classmethod
    def specframe_kit(cls, request: pytest.FixtureRequest):
        from .kit import Kit

        cls = request.cls or cls
        if cls.proposer is None:
            pytest.fail("set `proposer = YourProposerClass` on the ProposerConformance subclass", pytrace=False)
        samples = cls.samples or request.config.getoption("specframe_samples", DEFAULT_SAMPLES) or DEFAULT_SAMPLES
        try:
            target = request.getfixturevalue("specframe_tiny_target")
        except pytest.FixtureLookupError:  # the pytest plugin is disabled (-p no:specframe)
            target = None
        return Kit(cls.proposer, dict(cls.config), samples=samples, target=target)

    def _check(self, kit, name: str, method: str) -> None:
        if name in self.skip:
            pytest.skip(f"{name} skipped by {type(self).__name__}.skip")
        problem = None
        try:
            getattr(kit, method)()
        except NotApplicable as exc:
            pytest.skip(str(exc))
        except ConformanceError as exc:
            problem = str(exc)
        if problem is not None:  # failed outside the `except`, so the message is printed once, without its chain
            pytest.fail(f"{kit.cls.__name__} ({kit.cls.name!r}): {problem}", pytrace=False)

    def test_contract(self, specframe_kit) -> None:
        self._check(specframe_kit, "contract", "check_contract")

    def test_greedy_lossless(self, specframe_kit) -> None:
        self._check(specframe_kit, "greedy", "check_greedy_lossless")

    def test_sampling_lossless(self, specframe_kit) -> None:
        self._check(specframe_kit, "sampling", "check_sampling_lossless")

    def test_constrained_greedy_lossless(self, specframe_kit) -> None:
        self._check(specframe_kit, "constrained_greedy", "check_constrained_greedy_lossless")

    def test_constrained_sampling_lossless(self, specframe_kit) -> None:
        self._check(specframe_kit, "constrained_sampling", "check_constrained_sampling_lossless")

    def test_draft_probs_match_samples(self, specframe_kit) -> None:
        self._check(specframe_kit, "draft_probs", "check_draft_probs_match_samples")

    def test_rollback_after_partial_acceptance(self, specframe_kit) -> None:
        self._check(specframe_kit, "rollback", "check_rollback_after_partial_acceptance")

    def test_determinism_under_seed(self, specframe_kit) -> None:
        self._check(specframe_kit, "determinism", "check_determinism")

    def test_feedback_counts(self, specframe_kit) -> None:
        self._check(specframe_kit, "feedback", "check_feedback")


def conformance_suite(
    proposer: type, config: dict[str, Any] | None = None, *, samples: int | None = None, skip: tuple[str, ...] = ()
) -> type:
    """A :class:`ProposerConformance` subclass for ``proposer``; assign it to a ``Test*`` name in a test module."""
    return type(
        f"Test{proposer.__name__}Conformance",
        (ProposerConformance,),
        {"proposer": proposer, "config": dict(config or {}), "samples": samples, "skip": tuple(skip),
         "__module__": ProposerConformance.__module__},
    )
