"""Python API and CLI input handling found by a new-user pass: seeds, stop strings, prompt types, verifier,
chat (a bool, nothing else)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import specframe
from specframe.cli import app
from specframe.errors import ConfigError
from specframe.registry import build_registry
from specframe.target.hf import Target

from tests.fakes import build_model, build_tokenizer


@pytest.fixture(scope="module")
def sf():
    return specframe.load(target=Target(build_model("llama"), build_tokenizer()), registry=build_registry())


@pytest.mark.parametrize("seed", ["-1", str(2**63), "99999999999999999999"])
def test_cli_seed_out_of_range_is_one_line_exit_2(seed):
    res = CliRunner().invoke(app, ["generate", "hi", "--seed", seed, "--model", "no-such-model"])
    assert res.exit_code == 2
    assert "--seed must be a whole number in [0, 2**63)" in res.output and "Traceback" not in res.output


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


# --- Python API edges: names as the caller spells them ------------------------------------------------------------


def test_a_proposer_name_string_is_accepted(sf):
    """``proposers="ngram"`` was read one character at a time ("unknown proposer 'n'")."""
    want = sf.generate("aa ab ac aa ab", max_new_tokens=8, proposers=[{"name": "ngram"}])
    for spelled in ("ngram", ["ngram"], ("ngram",)):
        rec = sf.generate("aa ab ac aa ab", max_new_tokens=8, proposers=spelled)
        assert (rec["token_ids"], list(rec["metrics"]["proposers"])) == (want["token_ids"], ["ngram"])
    mixed = sf.generate("aa ab ac aa ab", max_new_tokens=8, proposers=["ngram", {"name": "none"}])
    assert list(mixed["metrics"]["proposers"]) == ["ngram", "none"] and mixed["token_ids"] == want["token_ids"]
    with pytest.raises(ConfigError, match="^proposers: give at least one proposer"):
        sf.generate("aa", proposers=[])


@pytest.mark.parametrize("kwargs, message", [
    ({"max_new_tokens": 0}, "max_new_tokens must be a whole number in [1, 2**63), got 0"),
    ({"max_new_tokens": 2.5}, "max_new_tokens must be a whole number in [1, 2**63)"),
    ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
    ({"temperature": "hot"}, "temperature must be a number, got 'hot'"),
    ({"top_p": 1.5}, "top_p must be in (0, 1]"),
    ({"top_k": -2}, "top_k must be >= 0"),
    ({"top_k": 1.5}, "top_k must be a whole number"),
    ({"seed": -1}, "seed must be a whole number in [0, 2**63)"),
    ({"seed": 2**64}, "seed must be a whole number in [0, 2**63)"),
    ({"stop": [""]}, "stop must be a non-empty string or a list of them"),
    ({"stop": 5}, "stop must be a non-empty string or a list of them"),
    ({"on_text": "print"}, "on_text must be a function"),
])
def test_bad_arguments_name_the_python_parameter(sf, kwargs, message):
    """Errors raised from Python named CLI flags ("--max-new-tokens must be >= 1"); now the parameter as spelled."""
    with pytest.raises(ConfigError) as info:
        sf.generate("aa ab", **kwargs)
    assert str(info.value).startswith(message) and "--" not in str(info.value)


def test_prompt_token_ids_outside_the_vocabulary(sf):
    with pytest.raises(ConfigError, match=r"^prompt: token id 999 is outside the model's vocabulary \[0, 64\)"):
        sf.generate([1, 2, 999])


def test_unknown_keyword_names_the_method_called_and_the_closest_one(sf):
    """An unknown keyword surfaced as a TypeError naming an internal method (generate_result)."""
    with pytest.raises(TypeError) as info:
        sf.generate("aa", max_tokens=4)
    msg = str(info.value)
    assert msg.startswith("generate() got an unexpected keyword argument 'max_tokens' (did you mean 'max_new_tokens'?)")
    assert "generate_result" not in msg
    with pytest.raises(TypeError, match=r"^load\(\) got an unexpected keyword argument 'temprature' \(did you mean "
                                        r"'temperature'\?\)"):
        specframe.load(target=sf.target, registry=sf.registry, temprature=0.5)
    # the entry points take the keywords spelled once (RequestKeywords), each naming itself in the error
    with pytest.raises(TypeError, match=r"^generate_result\(\) got an unexpected keyword argument 'temprature' "
                                        r"\(did you mean 'temperature'\?\)"):
        sf.generate_result("a b", temprature=0.5)
    with pytest.raises(TypeError, match=r"^submit\(\) got an unexpected keyword argument 'max_tokens'"):
        sf.submit("a b", max_tokens=3)
    with pytest.raises(TypeError, match=r"^generate_batch_results\(\) got an unexpected keyword argument 'on_text'"):
        sf.generate_batch_results(["a b"], on_text=print)  # one callback per prompt makes no sense: on_result
    assert sf.generate_result([1, 2, 3], max_new_tokens=2, question_id="q").question_id == "q"


# --- from issue 39's fourth round of reports (each failed on the code before its fix) ---------------------------------


@pytest.mark.parametrize("chat", ["false", "no", 2, 0.0])
def test_chat_must_be_a_bool(chat):
    sf = specframe.load(target=Target(build_model("llama"), build_tokenizer(), name="tiny"), max_new_tokens=4)
    with pytest.raises(ConfigError, match="chat must be True or False"):
        sf.generate("ba bb", chat=chat)
    assert len(sf.generate_result("ba bb", chat=False).token_ids) == 4  # a bool still works
