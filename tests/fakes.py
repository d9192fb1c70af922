"""Helpers shared by the tests: tiny randomly initialised HF causal LMs (float32, CPU), a word-level tokenizer
whose vocabulary matches them, and references for plain greedy decoding.

Every model is built from a config here and seeded with ``torch.manual_seed``; nothing is downloaded.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from specframe.decode.engine import Engine, GenerationResult
from specframe.sampling import SamplingParams
from specframe.target.hf import Target
from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from specframe_plugins.autoregressive import NoneConfig, NoProposer

# Tiny models spend their time in thread wake-ups, not arithmetic: one thread is ~20x faster on 2 cores.
torch.set_num_threads(1)

VOCAB = 64
# id 0 is the (special) pad token; ids 1..63 are two-letter words, so no word is a substring of another and a
# stop string made of whole words can only match at word boundaries in the decoded text ("aa ab ac ...").
WORDS = ["<pad>"] + ["".join(p) for p in itertools.product("abcdefgh", repeat=2)][: VOCAB - 1]

# llama and qwen2 (full attention), and qwen2 with a sliding-window layer (window 8 < the sequences we decode),
# which exercises KV rollback of sliding-window layers (``activate_past_recording`` + ``crop``).
ARCHS = ("llama", "qwen2", "qwen2-sliding")

# Prompts with repeated n-grams, so that the ngram proposer drafts from the first step.
PROMPT = [5, 9, 12, 7, 5, 9, 12, 30, 41, 5, 9]
PROMPT_2 = [17, 3, 3, 44, 17, 3, 21, 60, 8, 17, 3]


def tiny_config(arch: str, **overrides):
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    common.update(overrides)
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    if arch == "qwen2-sliding":
        return Qwen2Config(**common, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    raise ValueError(arch)


def build_model(arch: str, seed: int = 0, **overrides):
    """A tiny random causal LM in float32, eval mode, with no EOS (tests that need one set it)."""
    torch.manual_seed(seed)
    cfg = tiny_config(arch, **overrides)
    cls = LlamaForCausalLM if arch == "llama" else Qwen2ForCausalLM
    model = cls(cfg).float().eval()
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


BPE_EOS = 0
BPE_CORPUS = ['{"name": "Ada", "age": 36, "tags": ["x", "y"], "ok": true}', '{"city": "Paris", "zip": "75001"}',
              'true false null 0123456789 -1.5e3', '[1, 2, 3] {"a": {"b": null}}', "abc-123 xyz_9 a.b@c.de"]


def build_bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (400 tokens, ``<eos>`` = id 0) trained on JSON-like text: real byte tokens, as a
    grammar engine needs (the word-level one has none)."""
    from tokenizers import decoders, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(BPE_CORPUS * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def build_bpe_model(tokenizer: PreTrainedTokenizerFast, seed: int = 3):
    """A tiny random llama over ``tokenizer`` with EOS (id 0), whose LM head is its embedding (x4): it likes to repeat
    itself, so ngram and lookahead draft and get accepted."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, eos_token_id=BPE_EOS)
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight * 4)
    model.generation_config.eos_token_id = BPE_EOS
    model.generation_config.pad_token_id = BPE_EOS
    return model


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer over :data:`WORDS` (whitespace split); decode joins words with one space."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>")


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos: int | None = None) -> list[int]:
    """Plain greedy decoding by transformers ``generate`` (stops after ``eos`` when given)."""
    ids = torch.tensor([prompt], dtype=torch.int64)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def plain_generate(target: Target, prompt: list[int], max_new_tokens: int, **kwargs) -> GenerationResult:
    """The engine with the ``none`` proposer: one target forward per token."""
    sampling = kwargs.pop("sampling", SamplingParams())
    verifier = GreedyVerifier() if sampling.is_greedy else SpeculativeSamplingVerifier()
    engine = Engine(target, [NoProposer(NoneConfig(), target.info)], verifier)
    return engine.generate(prompt, max_new_tokens=max_new_tokens, sampling=sampling, **kwargs)


def check_metrics(result: GenerationResult) -> None:
    """Counters that must agree with each other and with the output, whatever the proposer."""
    m = result.metrics
    assert m.new_tokens == len(result.token_ids)
    assert m.target_forwards >= 1
    assert 0 <= m.accepted_nodes <= m.drafted_nodes
    assert m.tau == pytest.approx(m.new_tokens / m.target_forwards)
    assert sum(m.drafted_by_depth) == m.drafted_nodes
    assert sum(m.accepted_by_depth) == m.accepted_nodes
    assert all(a <= d for a, d in zip(m.accepted_by_depth, m.drafted_by_depth))
    # each forward commits its counted accepted nodes + 1 token; a stop inside the last block commits (and counts)
    # only the accepted nodes up to the stop, so that block may lack its recovered/bonus token, never more
    assert m.accepted_nodes + m.target_forwards - 1 <= m.new_tokens <= m.accepted_nodes + m.target_forwards
    if result.finish_reason == "length":
        assert m.new_tokens == m.accepted_nodes + m.target_forwards
    for pm in m.proposers.values():  # credited acceptance never counts a node after the stop
        assert pm.accepted_nodes <= m.accepted_nodes and sum(pm.accepted_by_depth) == pm.accepted_nodes
    assert result.finish_reason in ("stop", "length")
    # the engine turns a proposer's exception into a target-only step, so a test proposer's failed assertion
    # would otherwise go unnoticed
    assert m.proposer_faults == 0


def wait_healthy(url: str, tries: int, pause: float) -> bool:
    """Poll ``url``/health until it answers 200 (True), at most ``tries`` times ``pause`` seconds apart."""
    import time

    import httpx

    for _ in range(tries):
        try:
            if httpx.get(url + "/health").status_code == 200:
                return True
        except httpx.HTTPError:
            time.sleep(pause)
    return False


def live_server(app):
    """Serve ``app`` with uvicorn on a free localhost port in a thread: a context manager giving its URL once
    ``/health`` answers, stopped on exit."""
    import contextlib
    import socket
    import threading

    import uvicorn

    @contextlib.contextmanager
    def running():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=srv.run, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, tries=200, pause=0.05)
        try:
            yield url
        finally:
            srv.should_exit = True
            thread.join(timeout=10)

    return running()
