"""``cross-draft``: a draft with another tokenizer (tiny random models over two different tokenizers of one text).

The target reads two-letter words (``aa ab ...``, one token each); the draft reads the same text in characters and a
few merged pieces (``ab``, `` ab``, ``cd``, `` cd``), with its own chat template. Nothing is downloaded.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from specframe import DecodeState
from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from specframe.decode.engine import Engine
from specframe.errors import ConfigError
from specframe.learned.crossvocab import TextBridge, check_lossless, piece_texts, shared_tokens
from specframe.sampling import SamplingParams, probs_from_logits
from specframe.target.hf import Target
from specframe.testing import Kit
from specframe.testing.calls import CallLog
from specframe.testing.stats import tv_test_fixed
from specframe.testing.tiny import first_two_tokens
from specframe_plugins.cross_draft import CrossDraftConfig, CrossDraftProposer

from tests.fakes import (
    PROMPT,
    PROMPT_2,
    VOCAB,
    WORDS,
    build_model,
    build_tokenizer,
    check_metrics,
    hf_greedy,
)

N_NEW = 30
LETTERS = list("abcdefgh")
TARGET_TEMPLATE = ("{% for m in messages %}hg hg {{ m['content'] }} hf hf{% endfor %}"
                   "{% if add_generation_prompt %} he{% endif %}")
DRAFT_TEMPLATE = ("{% for m in messages %}<u>{{ m['content'] }}</u>{% endfor %}"
                  "{% if add_generation_prompt %}<a>{% endif %}")


def char_tokenizer(letters: list[str] = LETTERS, template: str | None = DRAFT_TEMPLATE) -> PreTrainedTokenizerFast:
    """Characters and the space, plus the merged pieces ``ab``, `` ab``, ``cd`` and `` cd``; special tokens ``<pad>``,
    ``</s>`` (EOS) and the chat markers."""
    vocab = {"<pad>": 0, "</s>": 1, "<u>": 2, "</u>": 3, "<a>": 4, " ": 5}
    for ch in letters:
        vocab[ch] = len(vocab)
    merges = []
    if "a" in letters and "b" in letters:
        merges += [("a", "b"), (" ", "ab")]
        vocab["ab"], vocab[" ab"] = len(vocab), len(vocab) + 1
    if "c" in letters and "d" in letters:
        merges += [("c", "d"), (" ", "cd")]
        vocab["cd"], vocab[" cd"] = len(vocab), len(vocab) + 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<pad>"))
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                   additional_special_tokens=["<u>", "</u>", "<a>"])
    if template:
        fast.chat_template = template
    return fast


def target_tokenizer(template: str | None = None) -> PreTrainedTokenizerFast:
    tok = build_tokenizer()
    if template:
        tok.chat_template = template
    return tok


def save(model, tok, folder: Path) -> str:
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target, draft folder, a lossy draft folder, the target saved as a draft folder)."""
    root = tmp_path_factory.mktemp("cross")
    target_model = build_model("llama")
    target = Target(target_model, target_tokenizer(), name="specframe-test-cross-target")
    ctok = char_tokenizer()
    draft = save(build_model("llama", seed=3, vocab_size=len(ctok)), ctok, root / "draft")
    lossy_tok = char_tokenizer(LETTERS[:-1])  # no "h": cannot spell the target's words with an h
    lossy = save(build_model("llama", seed=3, vocab_size=len(lossy_tok)), lossy_tok, root / "lossy")
    itself = save(target_model, target_tokenizer(), root / "itself")
    other_same = save(build_model("llama", seed=5), target_tokenizer(), root / "same-tokenizer")
    return {"target": target, "draft": draft, "lossy": lossy, "itself": itself, "same": other_same,
            "ref": {i: hf_greedy(target_model, p, N_NEW) for i, p in enumerate((PROMPT, PROMPT_2))}}


def proposer(pair, **options) -> CrossDraftProposer:
    return CrossDraftProposer(CrossDraftConfig(model=pair["draft"], **options), pair["target"].info)


# --- the bridge -----------------------------------------------------------------------------------------------------


def test_pieces_and_the_shared_vocabulary():
    ttok, dtok = target_tokenizer(), char_tokenizer()
    t_pieces = piece_texts(ttok, range(VOCAB))
    assert t_pieces[0] is None and t_pieces[1] == " " + WORDS[1]  # special <pad> left out; a word after a word
    d_pieces = piece_texts(dtok, range(len(dtok)))
    assert d_pieces[:5] == [None] * 5 and d_pieces[dtok.convert_tokens_to_ids(" ab")] == " ab"
    d, t = shared_tokens(ttok, VOCAB, dtok, len(dtok))
    # the pieces both write alike: " ab" and " cd" (the target's words "ab", "cd" after another word)
    assert d.tolist() == dtok.convert_tokens_to_ids([" ab", " cd"]) and t.tolist() == [WORDS.index("ab"), WORDS.index("cd")]
    with pytest.raises(ConfigError, match="share no token"):
        shared_tokens(ttok, VOCAB, char_tokenizer(list("efgh")), len(char_tokenizer(list("efgh"))))


def test_the_prompt_is_rewritten_in_the_drafts_chat_template():
    ttok, dtok = target_tokenizer(TARGET_TEMPLATE), char_tokenizer()
    bridge = TextBridge(ttok, dtok)
    content = "ab cd ef"
    prompt = ttok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                      tokenize=True, return_dict=True)["input_ids"]
    want = dtok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                    tokenize=True, return_dict=True)["input_ids"]
    assert bridge.draft_prompt(prompt) == list(want)
    assert dtok.decode(want) == "<u>ab cd ef</u><a>"
    answer = ttok.encode("aa ab", add_special_tokens=False)
    ids, n, text = bridge.draft_ids(want, prompt + answer, len(prompt))
    assert ids[:n] == list(want) and text == "aa ab" and dtok.decode(ids[n:]) == "aa ab"
    # a prompt that is not one user turn of the target's template: the whole committed text, re-encoded
    plain = ttok.encode("ab cd ef", add_special_tokens=False)
    assert bridge.draft_prompt(plain) is None
    ids, n, text = bridge.draft_ids(None, plain + answer, len(plain))
    assert n == 0 and text == "ab cd ef aa ab" and dtok.decode(ids) == text
    # no template on the target's side: plain text as well
    assert TextBridge(target_tokenizer(), dtok).draft_prompt(prompt) is None


def test_text_goes_back_as_the_targets_own_tokens():
    ttok, dtok = target_tokenizer(), char_tokenizer()
    bridge = TextBridge(ttok, dtok)
    committed = ttok.encode("aa ab ac", add_special_tokens=False)
    assert bridge.to_target(committed, " ad ae") == ttok.encode("ad ae", add_special_tokens=False)
    assert bridge.to_target(committed, "") == []
    # the draft's text of its new tokens after its own tokens of the committed text ("ab" then " ab" pieces)
    own, _, text = bridge.draft_ids(None, ttok.encode("ab ab", add_special_tokens=False), 0)
    assert dtok.convert_ids_to_tokens(own) == ["ab", " ab"] and text == "ab ab"
    new = dtok.encode(" cd", add_special_tokens=False)
    assert bridge.draft_text(own, new, text) == " cd"
    assert bridge.to_target(ttok.encode("ab ab", add_special_tokens=False), " cd") == [WORDS.index("cd")]


def test_a_lossy_draft_tokenizer_is_found():
    ttok = target_tokenizer()
    check_lossless(char_tokenizer(), ttok, VOCAB, "draft")  # spells every target word
    with pytest.raises(ConfigError, match=r"cannot encode the target's text \(it loses 'h'"):
        check_lossless(char_tokenizer(LETTERS[:-1]), ttok, VOCAB, "draft")


# --- exactness ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mapping", ["text", "shared"])
def test_greedy_equals_plain_greedy(pair, mapping):
    rec = CallLog(proposer(pair, mapping=mapping, k=4), pair["target"].vocab_size)
    engine = Engine(pair["target"], [rec], GreedyVerifier())
    drafted = 0
    for i, prompt in enumerate((PROMPT, PROMPT_2)):
        res = engine.generate(prompt, max_new_tokens=N_NEW)
        assert res.token_ids == pair["ref"][i]
        check_metrics(res)
        drafted += res.metrics.drafted_nodes
    assert not rec.problems
    assert drafted > 0
    drafts = [c.draft for c in rec.calls if c.method == "propose"]
    assert all(d.is_chain() and d.draft_probs is None for d in drafts)


def test_the_drafts_cache_follows_the_committed_text(pair):
    """After every step the draft's cached tokens are its own encoding of the committed text (no drift), and its
    logits there equal a fresh forward's."""
    prop = proposer(pair, k=3)
    target = pair["target"]
    engine = Engine(target, [prop], GreedyVerifier())
    res = engine.generate(PROMPT, max_new_tokens=N_NEW)
    tokens = PROMPT + res.token_ids
    state = DecodeState(torch.tensor([tokens]), len(PROMPT), SamplingParams(), torch.Generator().manual_seed(0))
    d = prop.draft
    want, _, _ = d.bridge.draft_ids(None, tokens, len(PROMPT))
    prop.propose(state, 4)
    assert prop._seen[: len(want)] == want  # what is cached starts with the draft's encoding of the committed text
    with torch.inference_mode():
        feed = prop._sync(want)  # roll back to it: only the last token is fed again
        assert feed == want[-1:]
        cached = prop._run.feed(feed)
        fresh = d.model(input_ids=torch.tensor([want])).logits[0, -1]
    torch.testing.assert_close(cached, fresh, atol=1e-5, rtol=1e-4)


def test_a_bounded_context_bounds_every_catch_up(pair):
    """With ``context: 6`` no step feeds the draft more than 6 tokens (the prompt alone is 11 target words, 33
    draft characters), output stays the target's, and the draft still drafts."""
    prop = proposer(pair, k=3, context=6)
    fed: list[int] = []
    engine = Engine(pair["target"], [prop], GreedyVerifier())
    prop.start(DecodeState(torch.tensor([PROMPT]), len(PROMPT), SamplingParams(), torch.Generator()))
    run = prop._run
    feed = run.feed
    run.feed = lambda ids: (fed.append(len(ids)), feed(ids))[1]
    prop.start = lambda state: (setattr(prop, "_base", 0), setattr(prop, "_seen", []), run.rollback(0),
                                setattr(prop, "_prompt", None))  # keep the instrumented runner
    res = engine.generate(PROMPT, max_new_tokens=N_NEW)
    assert res.token_ids == pair["ref"][0]
    assert res.metrics.drafted_nodes > 0 and fed and max(fed) <= 6
    assert prop._base > 0  # it restarted on the text's tail


@pytest.mark.parametrize("mapping", ["text", "shared"])
def test_sampling_keeps_the_targets_distribution(pair, mapping):
    """First two generated tokens follow the target's exact joint distribution (one-hot q for text drafts, the
    mapped q over shared tokens for shared ones); for shared drafts the drafted tokens also follow the q they report
    (the kit's check)."""
    target, sampling = pair["target"], SamplingParams(temperature=0.9)
    options = {"model": pair["draft"], "mapping": mapping, "k": 2}
    kit = Kit(CrossDraftProposer, options, samples=300, target=target)
    kit.sampling = sampling
    if mapping == "shared":
        kit.check_draft_probs_match_samples()
    prompt = list(PROMPT)
    exact = first_two_tokens(target, prompt, sampling)  # [V, V]
    rec = kit.make()
    engine = Engine(target, [rec], SpeculativeSamplingVerifier())
    n, v = 400, target.vocab_size
    counts = torch.zeros(v, v, dtype=torch.float64)
    drafted = accepted = 0
    for seed in range(n):
        res = engine.generate(prompt, max_new_tokens=3, sampling=sampling, seed=seed)
        counts[res.token_ids[0], res.token_ids[1]] += 1
        drafted += res.metrics.drafted_nodes
        accepted += res.metrics.accepted_nodes
        assert res.metrics.proposer_faults == 0
    assert not rec.problems
    assert 0 < accepted < drafted  # both the accepted and the rejected branches were exercised
    first = counts.sum(1)
    assert 0.5 * float((first / n - exact.sum(1)).abs().sum()) <= math.sqrt(v / n)
    assert tv_test_fixed(first, exact.sum(1)).passed
    assert tv_test_fixed(counts, exact, seed=1).passed


def test_shared_draft_probs_are_the_drafts_warped_distribution(pair):
    sampling = SamplingParams(temperature=0.7)
    prop = proposer(pair, mapping="shared", k=2)
    state = DecodeState(torch.tensor([PROMPT]), len(PROMPT), sampling, torch.Generator().manual_seed(2))
    prop.start(state)
    tree = prop.propose(state, 4)
    d_ids, t_ids, _ = prop.draft.shared_map()
    assert tree.num_nodes >= 1 and tree.draft_probs.shape == (1, tree.num_nodes, VOCAB)
    ids, _, _ = prop.draft.bridge.draft_ids(None, PROMPT, len(PROMPT))
    with torch.inference_mode():
        logits = prop.draft.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    full = torch.full((VOCAB,), float("-inf")).index_copy_(0, t_ids, logits[d_ids])
    torch.testing.assert_close(tree.draft_probs[0, 0], probs_from_logits(full, sampling))
    assert set(tree.token_ids[0].tolist()) <= set(t_ids.tolist())  # only shared tokens are drafted


# --- bad input ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which, message", [
    ("lossy", r"cannot encode the target's text \(it loses 'h'"),
    ("itself", "is the target itself"),
    ("same", "shares the target's tokenizer; use proposer draft-model"),
])
def test_bad_drafts_are_refused_with_one_line(pair, which, message):
    with pytest.raises(ConfigError, match=message) as info:
        CrossDraftProposer(CrossDraftConfig(model=pair[which]), pair["target"].info)
    assert "\n" not in str(info.value)


def test_a_target_without_a_tokenizer_is_refused(pair):
    bare = Target(build_model("llama"), None, name="specframe-test-cross-bare")
    with pytest.raises(ConfigError, match="needs the target's tokenizer"):
        CrossDraftProposer(CrossDraftConfig(model=pair["draft"]), bare.info)
