"""Small units the engine is built from: DraftTree, draft validation, stop checks, text streaming, metrics,
sampling parameters."""

from __future__ import annotations

import pytest
import torch

from specframe.contracts import DraftTree
from specframe.decode.draft_checks import check_draft
from specframe.decode.metrics import RequestMetrics
from specframe.decode.stopping import StopChecker, TextStream
from specframe.errors import ConfigError, DraftError
from specframe.sampling import SamplingParams

# --- DraftTree ----------------------------------------------------------------------------------------------------


def test_chain_shapes_and_parents():
    d = DraftTree.chain([4, 5, 6])
    assert d.token_ids.tolist() == [[4, 5, 6]] and d.token_ids.dtype == torch.int64
    assert d.parent.tolist() == [[-1, 0, 1]]
    assert d.num_nodes == 3 and d.is_chain() and d.draft_probs is None


def test_chain_with_probs_and_truncate():
    q = torch.full((3, 8), 1 / 8)
    d = DraftTree.chain(torch.tensor([1, 2, 3]), q)
    assert d.draft_probs.shape == (1, 3, 8)
    t = d.truncate(2)
    assert t.token_ids.tolist() == [[1, 2]] and t.parent.tolist() == [[-1, 0]] and t.draft_probs.shape == (1, 2, 8)
    assert d.truncate(3) is d and d.truncate(10) is d
    assert d.truncate(0).num_nodes == 0


def test_empty_and_tree():
    e = DraftTree.empty()
    assert e.num_nodes == 0 and e.is_chain() and e.token_ids.shape == (1, 0)
    tree = DraftTree(torch.tensor([[1, 2, 3]]), torch.tensor([[-1, -1, 0]]))
    assert not tree.is_chain()


# --- check_draft ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "draft",
    [
        pytest.param(DraftTree(torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([[-1, 0]])), id="int32 ids"),
        pytest.param(DraftTree(torch.tensor([1, 2]), torch.tensor([-1, 0])), id="1-d ids"),
        pytest.param(DraftTree(torch.tensor([[1, 2]]), torch.tensor([[-1]])), id="parent shape"),
        pytest.param(DraftTree.chain([1, 8]), id="id >= V"),
        pytest.param(DraftTree.chain([-1, 2]), id="negative id"),
        pytest.param(DraftTree(torch.tensor([[1, 2]]), torch.tensor([[-1, 1]])), id="parent not before child"),
        pytest.param(DraftTree(torch.tensor([[1, 2]]), torch.tensor([[-1, -1]])), id="tree for a chain verifier"),
        pytest.param(DraftTree.chain([1], torch.full((1, 8), 0.5)), id="probs do not sum to 1"),
        pytest.param(DraftTree.chain([1], torch.full((1, 7), 1 / 7)), id="probs shape"),
        pytest.param(DraftTree.chain([1], torch.eye(8)[2:3]), id="drafted token has q = 0"),
        pytest.param(DraftTree.chain([1], torch.tensor([[-0.5, 1.5, 0, 0, 0, 0, 0, 0]])), id="negative prob"),
    ],
)
def test_check_draft_rejects(draft):
    with pytest.raises(DraftError):
        check_draft(draft, 8, False)


def test_check_draft_accepts():
    check_draft(DraftTree.empty(), 8, False)
    check_draft(DraftTree.chain([0, 7, 3]), 8, False)
    check_draft(DraftTree.chain([2], torch.eye(8)[2:3]), 8, False)
    check_draft(DraftTree(torch.tensor([[1, 2, 3]]), torch.tensor([[-1, -1, 0]])), 8, True)  # trees allowed


# --- StopChecker ---------------------------------------------------------------------------------------------------

WORDS = {i: f"w{i}" for i in range(10)}


def decode(ids):
    return " ".join(WORDS[i] for i in ids)


def test_eos_ends_and_is_kept():
    s = StopChecker(frozenset({9}), 100)
    assert s.feed([1, 2]) == [1, 2] and s.finish_reason is None
    assert s.feed([3, 9, 4, 5]) == [3, 9]
    assert s.finish_reason == "stop" and s.generated == [1, 2, 3, 9]


def test_length_cuts_mid_list():
    s = StopChecker(frozenset(), 5)
    assert s.feed([1, 2, 3]) == [1, 2, 3] and s.finish_reason is None
    assert s.feed([4, 5, 6, 7]) == [4, 5]
    assert s.finish_reason == "length" and len(s.generated) == 5


def test_eos_at_the_last_allowed_position_is_a_stop():
    s = StopChecker(frozenset({9}), 3)
    assert s.feed([1, 2, 9]) == [1, 2, 9] and s.finish_reason == "stop"


def test_stop_string_completed_across_feeds():
    s = StopChecker(frozenset(), 100, ("w3 w4",), decode)
    assert s.feed([1, 2, 3]) == [1, 2, 3] and s.finish_reason is None
    assert s.feed([4, 5, 6]) == [4]  # the token completing the stop string is kept, nothing after it
    assert s.finish_reason == "stop"
    assert decode(s.generated)[: s.stop_text_at] == "w1 w2 "


def test_first_of_several_stop_strings_wins():
    s = StopChecker(frozenset(), 100, ("w5", "w2 w3"), decode)
    assert s.feed([1, 2, 3, 4, 5]) == [1, 2, 3]
    assert s.stop_text_at == len("w1 ")


def test_stop_string_beats_a_later_eos_and_length():
    s = StopChecker(frozenset({9}), 4, ("w2",), decode)
    assert s.feed([1, 2, 9, 3]) == [1, 2] and s.finish_reason == "stop"


# --- TextStream ----------------------------------------------------------------------------------------------------


def test_stream_emits_each_character_once():
    pieces: list[str] = []
    stream = TextStream(decode, pieces.append)
    stream.update([1])
    stream.update([1, 2, 3])
    stream.update([1, 2, 3])  # nothing new: nothing emitted
    stream.update([1, 2, 3], final=True)
    assert pieces == ["w1", " w2 w3"]


def test_stream_holds_back_a_possible_stop_string_prefix():
    pieces: list[str] = []
    stream = TextStream(decode, pieces.append, stop_strings=("w3 w4",))
    stream.update([1, 2, 3])  # "w1 w2 w3": only its end "w3" can still become the stop string "w3 w4"
    assert "".join(pieces) == "w1 w2 "
    stream.update([1, 2, 3, 4], final=True, final_text="w1 w2 ")  # stopped: the final text is cut
    assert "".join(pieces) == "w1 w2 "


def test_stream_waits_for_complete_characters():
    texts = {1: "a", 2: "a\ufffd", 3: "aé"}
    pieces: list[str] = []
    stream = TextStream(lambda ids: texts[len(ids)], pieces.append)
    stream.update([0])
    stream.update([0, 0])  # ends in an incomplete multi-byte character: held back
    stream.update([0, 0, 0])
    assert pieces == ["a", "é"]


# --- metrics and sampling parameters -------------------------------------------------------------------------------


def test_metrics_add_steps():
    m = RequestMetrics(prompt_tokens=3)
    m.add_step(4, 2)
    m.add_step(0, 0)
    m.add_step(2, 2)
    m.new_tokens = 2 + 1 + 0 + 1 + 2 + 1
    assert (m.target_forwards, m.drafted_nodes, m.accepted_nodes) == (3, 6, 4)
    assert m.drafted_by_depth == [2, 2, 1, 1] and m.accepted_by_depth == [2, 2, 0, 0]
    assert m.tau == pytest.approx(7 / 3) and m.acceptance_rate == pytest.approx(4 / 6)
    d = m.to_dict()
    assert d["tau"] == round(7 / 3, 4) and d["acceptance_rate"] == round(4 / 6, 4)
    assert RequestMetrics().tau == 0.0 and RequestMetrics().acceptance_rate == 0.0


def test_metrics_records_carry_the_old_key_names_as_aliases():
    from specframe.decode.metrics import LEGACY_KEYS, ProposerMetrics, current_names

    m = RequestMetrics(prompt_tokens=3, new_tokens=5)
    m.add_step(4, 2, [1, 2, 2, 3])
    m.proposers["ngram"] = ProposerMetrics(drafted_nodes=4, accepted_nodes=2, drafted_by_depth=[1, 2, 1])
    d = m.to_dict()
    assert (d["drafted_tokens"], d["accepted_tokens"], d["mean_accepted_length"]) == (4, 2, 5.0)
    assert d["drafted_by_position"] == d["drafted_by_depth"] == [1, 2, 1]
    assert d["accepted_by_position"] == d["accepted_by_depth"] == [1, 1, 0]
    assert d["proposers"]["ngram"]["accepted_tokens"] == 2 and d["proposers"]["ngram"]["drafted_by_position"] == [1, 2, 1]
    old = {k: v for k, v in d.items() if k not in LEGACY_KEYS.values()}  # a record written before the renames
    old["proposers"] = {"ngram": {k: v for k, v in d["proposers"]["ngram"].items() if k not in LEGACY_KEYS.values()}}
    new = current_names(old)
    assert (new["drafted_nodes"], new["accepted_nodes"], new["tau"]) == (4, 2, 5.0)
    assert new["proposers"]["ngram"]["accepted_nodes"] == 2 and new["accepted_by_depth"] == [1, 1, 0]


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        ({"temperature": -0.1}, "^temperature must"),
        ({"temperature": float("nan")}, "^temperature must"),
        ({"temperature": float("inf")}, "^temperature must be a finite"),
        ({"top_p": 0.0}, "^top_p must"),
        ({"top_p": 1.01}, "^top_p must"),
        ({"top_k": -1}, "^top_k must"),
    ],
)
def test_sampling_params_validation(kwargs, flag):
    """Python-side messages name the parameter as Python spells it (the CLI checks its --flags itself)."""
    with pytest.raises(ConfigError, match=flag):
        SamplingParams(**kwargs)


def test_sampling_params_greedy():
    assert SamplingParams().is_greedy and not SamplingParams(temperature=0.5).is_greedy
    # below the documented threshold a temperature is greedy: dividing by it would overflow
    from specframe.sampling import GREEDY_BELOW

    assert GREEDY_BELOW == 1e-5
    assert SamplingParams(temperature=1e-45).is_greedy and SamplingParams(temperature=9.9e-6).is_greedy
    assert not SamplingParams(temperature=1e-5).is_greedy
