"""The Python API (``specframe.load`` with a prebuilt target): config wiring, verifier choice, overrides."""

from __future__ import annotations

import pytest

import specframe
from specframe.errors import ConfigError, UnknownProposerError
from specframe.target.hf import Target

from tests.fakes import PROMPT, build_model, build_tokenizer, check_metrics, hf_greedy


@pytest.fixture(scope="module")
def target():
    return Target(build_model("llama"), build_tokenizer())


def test_generate_record_equals_plain_greedy(target):
    sf = specframe.load(target=target, proposers=[{"name": "ngram", "k": 4}], max_new_tokens=20)
    record = sf.generate(PROMPT)
    assert record["token_ids"] == hf_greedy(target.model, PROMPT, 20)
    assert record["finish_reason"] == "length" and record["metrics"]["new_tokens"] == 20
    assert record["text"] == target.decode(record["token_ids"])


def test_per_request_overrides(target):
    sf = specframe.load(target=target)
    expected = hf_greedy(target.model, PROMPT, 6)
    for proposers in ([{"name": "none"}], [{"name": "ngram", "k": 2}], None):
        result = sf.generate_result(PROMPT, proposers=proposers, max_new_tokens=6)
        assert result.token_ids == expected
        check_metrics(result)
    none = sf.generate_result(PROMPT, proposers=[{"name": "none"}], max_new_tokens=6)
    assert none.metrics.drafted_nodes == 0 and none.metrics.target_forwards == 6


def test_text_prompt_without_chat_template(target):
    sf = specframe.load(target=target)
    text = " ".join(target.tokenizer.convert_ids_to_tokens(PROMPT))
    assert sf.encode(text) == PROMPT  # no chat template: plain tokenization
    assert sf.generate(text, max_new_tokens=5)["token_ids"] == hf_greedy(target.model, PROMPT, 5)


def test_sampling_picks_the_sampling_verifier_and_is_seeded(target):
    sf = specframe.load(target=target, temperature=1.0)
    a = sf.generate(PROMPT, max_new_tokens=12, seed=1)["token_ids"]
    assert a == sf.generate(PROMPT, max_new_tokens=12, seed=1)["token_ids"]
    assert a != sf.generate(PROMPT, max_new_tokens=12, seed=2)["token_ids"]
    assert sf.generate(PROMPT, max_new_tokens=12, temperature=0.0)["token_ids"] == hf_greedy(target.model, PROMPT, 12)


def test_explicit_sampling_verifier_at_temperature_zero(target):
    # `verifier: speculative-sampling` with the default temperature 0 used to crash (NaN probabilities)
    sf = specframe.load(target=target, verifier="speculative-sampling")
    assert sf.generate(PROMPT, max_new_tokens=8)["token_ids"] == hf_greedy(target.model, PROMPT, 8)


def test_stop_from_config_and_question_id(target):
    expected = hf_greedy(target.model, PROMPT, 12)
    stop = target.decode(expected[3:5])
    sf = specframe.load(target=target, stop=[stop])
    record = sf.generate(PROMPT, max_new_tokens=12, question_id=81)
    assert record["question_id"] == 81
    assert record["finish_reason"] == "stop"
    assert stop not in record["text"] and len(record["token_ids"]) <= 5


def test_load_fails_fast_on_bad_proposers(target):
    with pytest.raises(UnknownProposerError, match="ngram"):
        specframe.load(target=target, proposers=[{"name": "nope"}])
    with pytest.raises(ConfigError, match="ngram"):
        specframe.load(target=target, proposers=[{"name": "ngram", "k": 0}])
