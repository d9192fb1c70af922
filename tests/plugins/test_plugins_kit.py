"""The conformance kit (specframe.testing): the built-in proposers pass it, honest stochastic proposers pass it,
and each realistic bug is caught by the check meant for it, with a message in the plugin author's terms —
including an exactness bug that greedy decoding cannot see (must-show c)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from specframe.testing import ConformanceError, Kit, NotApplicable, conformance_suite
from specframe_plugins.autoregressive import NoProposer
from specframe_plugins.forced_tokens import GrammarProposer
from specframe_plugins.ngram import NgramProposer

from tests.fakes import (
    ROOT,
    BadFeedback,
    ConstraintCommitter,
    DropUnlikely,
    GlobalRng,
    LeakyDraftModel,
    Mutator,
    OtherModelDraft,
    SelfDraft,
    UndeclaredProbs,
)

# The built-in proposers, through the same one-liner a third-party author writes.
TestNgramConformance = conformance_suite(NgramProposer, config={"k": 4}, samples=400)
TestNoneConformance = conformance_suite(NoProposer, samples=400)


@pytest.fixture
def kit(specframe_tiny_target):
    def make(cls, config=None, samples=600):
        return Kit(cls, config, samples=samples, target=specframe_tiny_target)

    return make


def test_an_honest_sampling_proposer_passes_every_check(kit):
    k = kit(SelfDraft, samples=400)
    k.check_all()  # any ConformanceError fails this test
    with pytest.raises(NotApplicable):  # NotApplicable is only for checks that do not apply
        kit(NgramProposer).check_draft_probs_match_samples()


# --- must-show c: reported draft probabilities differ from the distribution actually sampled ------------------


def test_kit_catches_draft_probs_that_are_not_what_was_sampled(kit):
    k = kit(SelfDraft, {"sharpen": 0.7})
    k.check_greedy_lossless()  # the bug is invisible to greedy decoding...
    k.check_contract()  # ...and breaks no shape or contract rule
    with pytest.raises(ConformanceError) as direct:
        k.check_draft_probs_match_samples()
    msg = str(direct.value)
    assert msg.startswith("draft node 0 is not distributed as the draft_probs you report")
    assert "a correct proposer stays below" in msg and "add no extra sharpening" in msg
    with pytest.raises(ConformanceError) as end_to_end:  # and the output distribution is measurably wrong
        k.check_sampling_lossless()
    assert "is not distributed as the target's" in str(end_to_end.value)
    assert "generated" in str(end_to_end.value) and "the target gives" in str(end_to_end.value)


def test_kit_catches_a_separate_draft_model_sampling_at_the_wrong_temperature(kit):
    with pytest.raises(ConformanceError, match=r"draft node \d is not distributed as the draft_probs you report"):
        kit(OtherModelDraft).check_draft_probs_match_samples()


def test_kit_catches_nodes_dropped_depending_on_the_sampled_token(kit):
    with pytest.raises(ConformanceError, match=r"draft node 1 is not distributed.*do not re-draw or drop nodes"):
        kit(DropUnlikely).check_draft_probs_match_samples()


# --- protocol bugs --------------------------------------------------------------------------------------------


def test_kit_catches_state_leaking_from_rejected_drafts(kit):
    k = kit(LeakyDraftModel)
    k.check_greedy_lossless()  # exactness holds: only the drafts suffer
    with pytest.raises(ConformanceError) as err:
        k.check_rollback_after_partial_acceptance()
    msg = str(err.value)
    assert msg.startswith("after a partial acceptance (")
    assert "a fresh instance given the same committed tokens" in msg and "roll back" in msg


def test_kit_catches_use_of_the_global_rng(kit):
    with pytest.raises(ConformanceError, match=r"two runs with the same seeds drafted differently.*state\.generator"):
        kit(GlobalRng).check_determinism()


@pytest.mark.parametrize(
    "cls, message",
    [
        (Mutator, r"propose modified state\.tokens in place \(request 0, step 0\)"),
        (UndeclaredProbs, r"returned draft_probs but the class declares provides_draft_probs = False"),
    ],
)
def test_kit_catches_contract_breaks(kit, cls, message):
    with pytest.raises(ConformanceError, match=message):
        kit(cls).check_contract()


def test_kit_reports_an_exception_with_its_location(kit):
    with pytest.raises(ConformanceError) as err:
        kit(BadFeedback).check_feedback()
    msg = str(err.value)
    assert "on_verified raised AttributeError" in msg and "num_rejected" in msg
    assert "fakes.py:" in msg and "in on_verified (request 0, step 0)" in msg


def test_kit_refuses_a_config_the_proposer_rejects(kit):
    with pytest.raises(ConformanceError, match=r"NgramConfig rejects the kit's config .* \(at k\)"):
        kit(NgramProposer, {"k": 0}).check_contract()


# --- as a pytest plugin, the way a third-party author runs it --------------------------------------------------


def test_kit_runs_as_a_pytest_plugin_with_readable_failures(tmp_path):
    (tmp_path / "test_mine.py").write_text(textwrap.dedent("""
        from specframe.testing import conformance_suite
        from tests.fakes import SelfDraft

        TestHonest = conformance_suite(SelfDraft)
        TestSharpened = conformance_suite(SelfDraft, config={"sharpen": 0.6})
    """))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--specframe-samples", "300",
         "-k", "draft_probs or greedy", str(tmp_path / "test_mine.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    text = out.stdout + out.stderr
    assert "1 failed, 5 passed" in text, text  # greedy, constrained greedy (x2 classes), draft_probs
    assert "FAILED test_mine.py::TestSharpened::test_draft_probs_match_samples" in text
    assert "SelfDraft ('selfdraft'): draft node 0 is not distributed as the draft_probs you report" in text
    assert "specframe/testing/" not in text  # no traceback into the kit's internals


# --- under a constraint (the kit's token automaton) --------------------------------------------------------------

TestGrammarConformance = conformance_suite(GrammarProposer, samples=400)
TestGrammarForcedConformance = conformance_suite(GrammarProposer, config={"branch": 0}, samples=400)


def test_the_kit_automaton_forces_and_cuts(specframe_tiny_target):
    """The kit's constraint forces token 9 after any of 1..8, and a draft is cut where it leaves the automaton."""
    from specframe import DraftTree
    from specframe.testing.constraint import constrained_greedy, kit_constraint

    c = kit_constraint(16)
    c.commit([4])
    assert c.forced(5) == [9]
    assert c.allowed_prefix(DraftTree.chain([9, 7, 2, 5])) == 3  # 9, then 7 -> state 0, then 2; 5 needs 9 first
    masked = c.mask(DraftTree.chain([9]), torch.zeros(1, 2, 16))
    assert torch.isfinite(masked[0, 0]).nonzero().flatten().tolist() == [9]
    assert torch.isfinite(masked[0, 1]).nonzero().flatten().tolist() == [3, 7, 11]
    ref = constrained_greedy(specframe_tiny_target, [1, 2, 3], 12)
    assert ref[1] == 9 and ref[0] in range(1, 9)


def test_kit_catches_a_proposer_advancing_the_constraint(kit):
    k = kit(ConstraintCommitter)
    k.check_greedy_lossless()  # invisible without a constraint
    with pytest.raises(ConformanceError) as err:
        k.check_constrained_greedy_lossless()
    assert "'ConstraintView' object has no attribute 'commit'" in str(err.value), err.value
