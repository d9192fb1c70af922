"""Python API and CLI input handling found by a new-user pass: seeds, stop strings, prompt types, verifier."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import specframe
from specframe.cli import app
from specframe.errors import ConfigError
from specframe.registry import build_registry
from specframe.target import Target

from .support import build_model, build_tokenizer


@pytest.fixture(scope="module")
def sf():
    return specframe.load(target=Target(build_model("llama"), build_tokenizer()), registry=build_registry())


@pytest.mark.parametrize("seed", ["-1", str(2**63), "99999999999999999999"])
def test_cli_seed_out_of_range_is_one_line_exit_2(seed):
    res = CliRunner().invoke(app, ["generate", "hi", "--seed", seed, "--model", "no-such-model"])
    assert res.exit_code == 2
    assert "--seed must be in [0, 2**63)" in res.output and "Traceback" not in res.output


def test_single_stop_string_is_not_split_into_characters(sf):
    plain = sf.generate("aa ab ac", max_new_tokens=12, proposers=[{"name": "none"}])
    words = plain["text"].split()
    stop = words[3]  # a two-letter word that occurs in the output
    rec = sf.generate("aa ab ac", max_new_tokens=12, proposers=[{"name": "none"}], stop=stop)
    assert rec["finish_reason"] == "stop"
    assert rec["text"] == plain["text"][: plain["text"].index(stop)]


def test_list_of_prompts_is_a_clear_type_error(sf):
    with pytest.raises(TypeError, match="one prompt per call"):
        sf.generate(["aa ab", "ac ad"])


def test_token_id_prompt_is_accepted(sf):
    ids = sf.encode("aa ab ac")
    assert sf.generate(ids, max_new_tokens=4)["token_ids"] == sf.generate("aa ab ac", max_new_tokens=4)["token_ids"]


def test_unknown_verifier_and_bad_combinations_fail_at_load():
    target = Target(build_model("llama"), build_tokenizer())
    with pytest.raises(KeyError, match="unknown verifier"):
        specframe.load(target=target, registry=build_registry(), verifier="nope")
    # several proposers are combined (docs/combining.md); a proposer repeated with the same options is refused
    with pytest.raises(ConfigError, match=r"proposers\[1\] repeats proposers\[0\]"):
        specframe.load(target=target, registry=build_registry(), proposers=[{"name": "ngram"}, {"name": "ngram", "k": 8}])
    with pytest.raises(KeyError, match="unknown merge policy 'nope'; installed: confidence, priority"):
        specframe.load(target=target, registry=build_registry(), proposers=[{"name": "ngram"}, {"name": "none"}],
                       merge={"policy": "nope"})
