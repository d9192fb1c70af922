"""Stop strings that are special tokens (``<|im_end|>`` on a chat model): the decoded text never shows them, so they
are matched by token id (kept in ``token_ids`` like an EOS, not in the text); a stop string holding a special token
and other text, which could never match, is refused with one line before any output."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from typer.testing import CliRunner

from specframe import cli
from specframe.acceptance import GreedyVerifier
from specframe.decode.engine import Engine
from specframe.decode.stopping import special_stop_ids
from specframe.errors import ConfigError
from specframe.target.hf import Target
from specframe_plugins.ngram import NgramConfig, NgramProposer

from tests.fakes import PROMPT, WORDS, build_model, build_tokenizer, plain_generate

END = "<|im_end|>"


def _reference() -> list[int]:
    return plain_generate(Target(build_model("llama"), build_tokenizer()), PROMPT, 40).token_ids


def special_tokenizer(special_id: int) -> PreTrainedTokenizerFast:
    """The tests' word-level tokenizer with the word of ``special_id`` renamed to a special ``<|im_end|>``."""
    words = list(WORDS)
    words[special_id] = END
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", additional_special_tokens=[END])


@pytest.fixture(scope="module")
def case():
    """(target whose tokenizer makes a token of the greedy answer the special <|im_end|>, reference, its index)."""
    reference = _reference()
    j = next(i for i in range(5, len(reference)) if reference[i] not in reference[:i] and reference[i] not in PROMPT)
    target = Target(build_model("llama"), special_tokenizer(reference[j]))
    return target, reference, j


@pytest.mark.parametrize("proposer", ["ngram", "none"])
def test_a_special_token_stop_string_is_matched_by_id(case, proposer):
    target, reference, j = case
    assert END not in target.decode(reference)  # why matching on text cannot work
    proposers = [NgramProposer(NgramConfig(), target.info)] if proposer == "ngram" else []
    if not proposers:
        from specframe_plugins.autoregressive import NoneConfig, NoProposer

        proposers = [NoProposer(NoneConfig(), target.info)]
    result = Engine(target, proposers, GreedyVerifier()).generate(PROMPT, max_new_tokens=40, stop_strings=(END,))
    assert result.token_ids == reference[: j + 1] and result.finish_reason == "stop"
    assert result.text == target.decode(reference[:j])  # like an EOS: in token_ids, not in the text


def test_special_and_text_stop_strings_together(case):
    target, reference, j = case
    assert special_stop_ids((END, "zz"), target.tokenizer) == (("zz",), frozenset({reference[j]}))
    assert special_stop_ids(("<pad>",), target.tokenizer) == ((), frozenset({0}))


@pytest.mark.parametrize("stop", [END + "\n", "answer: " + END])
def test_a_stop_string_holding_a_special_token_and_text_is_refused(case, stop):
    target, _, _ = case
    with pytest.raises(ConfigError, match=r"contains the special token '<\|im_end\|>'"):
        Engine(target, [NgramProposer(NgramConfig(), target.info)], GreedyVerifier()).generate(
            PROMPT, max_new_tokens=8, stop_strings=(stop,))


def test_the_cli_refuses_it_with_one_line_before_any_output(case, tmp_path):
    target, _, _ = case
    path = tmp_path / "model"
    target.model.save_pretrained(path)
    target.tokenizer.save_pretrained(path)
    prompt = " ".join(WORDS[t] for t in PROMPT)
    res = CliRunner().invoke(cli.app, ["generate", prompt, "--model", str(path), "--dtype", "float32", "--threads", "1",
                                       "--no-chat", "--stop", END + " aa"])
    assert res.exit_code == 2, (res.output, res.exception)
    assert res.stdout == ""
    assert res.stderr.strip().splitlines()[-1].startswith("error: stop string '<|im_end|> aa' contains the special")
