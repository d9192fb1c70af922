"""Streams equal the final text, whatever the tokenizer's decode does to earlier text, and hold back only the end
that can still become a stop string (a 300-character stop string does not hold the whole answer back)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specframe.acceptance import GreedyVerifier
from specframe.decode.engine import Engine
from specframe.decode.stopping import TextStream, stop_prefix_length
from specframe.target.hf import Target
from specframe_plugins.ngram import NgramConfig, NgramProposer

from tests.fakes import PROMPT, VOCAB, WORDS, build_model

# a word-level vocabulary with punctuation and contractions, which clean_up_tokenization_spaces glues to the word
# before ("it ' s" -> "it's", "a ," -> "a,"): decoding one more token rewrites text decoded before
PUNCT = [".", ",", "'", "s", "n't", "?", "!", "'s", "'re"]
CLEANING_WORDS = [w if i % 3 else PUNCT[(i // 3) % len(PUNCT)] for i, w in enumerate(WORDS)]
CLEANING_WORDS[0] = "<pad>"


def cleaning_tokenizer() -> PreTrainedTokenizerFast:
    assert len(set(CLEANING_WORDS)) < len(CLEANING_WORDS)  # (repeated punctuation: ids map to one word each way)
    vocab = {}
    for i, w in enumerate(CLEANING_WORDS):
        vocab.setdefault(w, i)
    vocab.update({f"<unused{i}>": i for i, w in enumerate(CLEANING_WORDS) if vocab[w] != i})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", clean_up_tokenization_spaces=True)
    assert len(hf) == VOCAB
    return hf


def words_decode(ids: list[int]) -> str:
    """Word-level decode with transformers' clean-up of spaces before punctuation and contractions."""
    text = " ".join(CLEANING_WORDS[i] for i in ids if i)
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 's", "'s"),
                 (" 're", "'re")):
        text = text.replace(a, b)
    return text


def stream_of(ids: list[int], decode, steps: list[int], **kwargs) -> tuple[str, list[str]]:
    pieces: list[str] = []
    stream = TextStream(decode, pieces.append, **kwargs)
    for n in steps:
        stream.update(ids[:n])
    final = decode(ids)
    stream.update(ids, final=True, final_text=final)
    return final, pieces


def test_a_decode_that_rewrites_earlier_text_streams_all_of_it():
    it, quote, s, comma = (CLEANING_WORDS.index(w) for w in ("ab", "'", "s", ","))
    ids = [1, it, quote, s, 2, comma, 4, quote, 5, 7]
    assert words_decode(ids[:3]) == "aa ab '" and words_decode(ids[:4]) == "aa ab's"  # the space before ' went
    final, pieces = stream_of(ids, words_decode, list(range(1, len(ids))), hold_last_word=True)
    assert "".join(pieces) == final and len(pieces) > 3
    _, blind = stream_of(ids, words_decode, list(range(1, len(ids))))  # not told: the first rewrite costs text
    assert "".join(blind) != final


def test_after_a_first_rewrite_the_stream_holds_words_back_by_itself():
    pieces: list[str] = []
    stream = TextStream(words_decode, pieces.append)
    quote, s = CLEANING_WORDS.index("'"), CLEANING_WORDS.index("s")
    stream.update([1, quote])
    stream.update([1, quote, s])  # "aa '" -> "aa's": rewritten
    assert stream.hold_last_word


def test_the_engine_streams_the_whole_text_with_a_cleaning_tokenizer():
    tok = cleaning_tokenizer()
    target = Target(build_model("llama"), tok)
    engine = Engine(target, [NgramProposer(NgramConfig(), target.info)], GreedyVerifier())
    pieces: list[str] = []
    result = engine.generate(PROMPT, max_new_tokens=60, on_text=pieces.append)
    ids = result.token_ids
    rewritten = [n for n in range(1, len(ids)) if not target.decode(ids[: n + 1]).startswith(target.decode(ids[:n]))]
    assert rewritten, "this model's output never triggers a rewrite: the test would prove nothing"
    assert "".join(pieces) == result.text == target.decode(ids)
    assert len(pieces) > 3  # streamed as it went


@pytest.mark.parametrize("length", [20, 300])
def test_a_long_stop_string_holds_back_only_what_could_begin_it(length):
    stop = "Z" * length  # never produced: nothing should be held for it
    ids = list(range(1, 40))
    final, pieces = stream_of(ids, lambda x: " ".join(WORDS[i] for i in x), list(range(1, 40)), stop_strings=(stop,))
    assert "".join(pieces) == final
    assert len(pieces) >= 38  # a piece per token, none waiting for the end


def test_stop_prefix_length():
    assert stop_prefix_length("so the END", ("ENDING", "x")) == 3
    assert stop_prefix_length("so the", ("ENDING",)) == 0
    assert stop_prefix_length("aaa", ("aaab",)) == 3
    assert stop_prefix_length("xa", ("ab", "b")) == 1


def test_the_engine_streams_as_it_goes_with_a_300_character_stop_string():
    from tests.fakes import build_tokenizer

    target = Target(build_model("llama"), build_tokenizer())
    engine = Engine(target, [NgramProposer(NgramConfig(), target.info)], GreedyVerifier())
    pieces: list[str] = []
    result = engine.generate(PROMPT, max_new_tokens=60, stop_strings=("zz" * 150,), on_text=pieces.append)
    assert len(result.text) < 300 and "".join(pieces) == result.text
    assert len(pieces) > 10  # not one piece at the end
