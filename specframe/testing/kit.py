"""The conformance kit's driver: one proposer class + its config, run against the tiny target.

    from specframe.testing import Kit
    Kit(MyProposer, {"k": 4}).check_all()          # raises ConformanceError with a readable message

Each ``check_*`` method is one conformance property (see :mod:`specframe.testing.exactness` and
:mod:`specframe.testing.protocol`); runs shared between checks (the greedy battery) are computed once per kit.

On a GPU: the kit runs wherever its target lives. The default target (:func:`specframe.testing.tiny.tiny_target`)
is built on ``$SPECFRAME_TEST_DEVICE`` when that is set, else on the CPU; or pass one::

    SPECFRAME_TEST_DEVICE=cuda pytest tests/test_my_proposer.py     # conformance_suite / fixtures included
    Kit(MyProposer, {"k": 4}, target=tiny_target(device="cuda")).check_all()

The kit hands the proposer what the engine does: ``state.tokens`` on the CPU, ``state.generator`` and the hidden
states / features on the target's device (``target_info.device``); its references run on the target's device and
are compared on the CPU. A proposer that builds tensors should put them on ``target_info.device`` (drafts may stay
on the CPU: the engine moves them).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from pydantic import ValidationError

from ..acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from ..contracts import ProposerConfig
from ..decode.engine import Engine, GenerationResult
from ..decode.isolation import NEVER_DISABLED, IsolationPolicy
from ..errors import ConfigError, PluginContractError
from ..registry import check_proposer_class
from ..sampling import SamplingParams
from ..target.hf import Target
from . import exactness, protocol
from .calls import CallLog
from .report import ConformanceError, NotApplicable, describe_exc
from .tiny import reference_greedy, single_thread, tiny_target, weights_checksum

# Prompts over V = 16. The tiny model's greedy output falls into loops, so copying proposers get drafts
# accepted; the last prompt repeats the first, so proposers that learn across requests get to draft too.
PROMPTS: tuple[tuple[int, ...], ...] = (
    (1, 2, 3, 4, 5, 6, 7, 8),
    (3, 7, 3, 7, 3, 7, 3, 7),
    (11, 4, 9, 0, 15, 2, 6, 13, 4, 9),
    (1, 2, 3, 4, 5, 6, 7, 8),
)
NEW_TOKENS = 32
GREEDY = SamplingParams()
SAMPLING = SamplingParams(temperature=1.0)
# Faults must be seen, not hidden: no time limit (a slow CI machine is not a bug) and never disable.
KIT_ISOLATION = IsolationPolicy(propose_timeout_s=None, max_faults=NEVER_DISABLED)


class Kit:
    """Runs the conformance checks for one proposer class.

    Args:
        proposer: the proposer class under test.
        config: its options (``name`` is added); validated by ``proposer.Config``.
        samples: requests / proposals per statistical check (more = more power, slower).
        target: the target to run against (default: :func:`specframe.testing.tiny.tiny_target` on
            ``$SPECFRAME_TEST_DEVICE``, else the CPU).
    """

    prompts = PROMPTS
    new_tokens = NEW_TOKENS
    greedy = GREEDY
    sampling = SAMPLING

    def __init__(
        self, proposer: type, config: dict[str, Any] | None = None, *, samples: int = 1000, target: Target | None = None
    ) -> None:
        self.cls = proposer
        self.entry = {"name": getattr(proposer, "name", ""), **(config or {})}
        self.samples = samples
        self._target = target

    @cached_property
    def target(self) -> Target:
        return self._target or tiny_target()

    @cached_property
    def config(self) -> ProposerConfig:
        try:
            check_proposer_class(self.cls, "the class under test")
        except PluginContractError as exc:
            raise ConformanceError(str(exc)) from None
        try:
            return self.cls.Config.model_validate(self.entry)
        except ValidationError as exc:
            raise ConformanceError(
                f"{self.cls.Config.__name__} rejects the kit's config {self.entry}: {exc.errors()[0]['msg']} "
                f"(at {'.'.join(map(str, exc.errors()[0]['loc']))}); pass valid options to the kit"
            ) from None

    def make(self) -> CallLog:
        """A fresh instance of the proposer, wrapped in a :class:`CallLog`."""
        config = self.config
        try:
            instance = self.cls(config, self.target.info)
        except Exception as exc:  # noqa: BLE001 - any constructor fault is the author's, reported in their terms
            raise ConformanceError(
                f"{self.cls.__name__}(config, target_info) raised {describe_exc(exc)}; the constructor must "
                "accept its config and a specframe.TargetInfo (the kit's target has no tokenizer, V = "
                f"{self.target.vocab_size})"
            ) from None
        return CallLog(instance, self.target.vocab_size)

    def generate(
        self, rec: CallLog, prompt: tuple[int, ...], sampling: SamplingParams = GREEDY, seed: int = 0,
        max_new_tokens: int = NEW_TOKENS, constraint: Any = None,
    ) -> GenerationResult:
        verifier = GreedyVerifier() if sampling.is_greedy else SpeculativeSamplingVerifier()
        try:
            engine = Engine(self.target, [rec], verifier, isolation=KIT_ISOLATION)
        except ConfigError as exc:
            raise ConformanceError(f"the engine cannot run this proposer: {exc}") from None
        with single_thread():
            return engine.generate(list(prompt), max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                                   constraint=constraint)

    def fail_on_problems(self, rec: CallLog, during: str) -> None:
        """Raise the first problem the call log noted (a fault the engine silently isolated)."""
        if rec.problems:
            more = f" (and {len(rec.problems) - 1} more problem(s))" if len(rec.problems) > 1 else ""
            raise ConformanceError(f"during {during}: {rec.problems[0]}{more}")

    # --- shared runs ------------------------------------------------------------------------------------
    @cached_property
    def weights_before(self) -> float:
        return weights_checksum(self.target)

    @cached_property
    def references(self) -> list[list[int]]:
        """Plain greedy continuations of :data:`PROMPTS`, computed before the proposer runs."""
        _ = self.weights_before
        with single_thread():
            return [reference_greedy(self.target, list(p), NEW_TOKENS) for p in PROMPTS]

    @cached_property
    def greedy_battery(self) -> tuple[CallLog, list[GenerationResult]]:
        """All :data:`PROMPTS` at greedy, one proposer instance across them (as in serving)."""
        _ = self.references
        rec = self.make()
        return rec, [self.generate(rec, p) for p in PROMPTS]

    # --- the checks (functions of the kit, defined in exactness.py and protocol.py) ------------------------
    check_contract = protocol.check_contract
    check_greedy_lossless = exactness.check_greedy_lossless
    check_sampling_lossless = exactness.check_sampling_lossless
    check_draft_probs_match_samples = exactness.check_draft_probs_match_samples
    check_constrained_greedy_lossless = exactness.check_constrained_greedy_lossless
    check_constrained_sampling_lossless = exactness.check_constrained_sampling_lossless
    check_rollback_after_partial_acceptance = protocol.check_rollback_after_partial_acceptance
    check_determinism = protocol.check_determinism
    check_feedback = protocol.check_feedback

    def replay(self, trace: Any = None, **kwargs: Any) -> Any:
        """The proposer's τ on recorded traces of a real target (default: the shipped dev-set trace), without loading
        it: :func:`specframe.testing.replay.replay_proposer` with this kit's class and config."""
        from .replay import replay_proposer

        options = {k: v for k, v in self.entry.items() if k != "name"}
        return replay_proposer(self.cls, options, trace, **kwargs)

    def check_all(self) -> None:
        """Every check, in order; a check that does not apply (:class:`NotApplicable`) is passed over."""
        for check in CHECKS:
            try:
                getattr(self, check)()
            except NotApplicable:
                pass


CHECKS = (
    "check_contract",
    "check_greedy_lossless",
    "check_sampling_lossless",
    "check_draft_probs_match_samples",
    "check_constrained_greedy_lossless",
    "check_constrained_sampling_lossless",
    "check_rollback_after_partial_acceptance",
    "check_determinism",
    "check_feedback",
)

