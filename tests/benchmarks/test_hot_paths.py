"""Micro-benchmarks of the per-step hot functions (pytest-benchmark). Skipped by the default test command;
run them with:

    .venv/bin/python -m pytest tests/benchmarks -o addopts="" --benchmark-only

Sizes follow the default model: V = 49152, draft length K = 8, 30 layers x 3 KV heads x 64 dims.
"""

from __future__ import annotations

import random

import torch
from transformers import LlamaConfig

from specframe.acceptance import greedy_chain, sampling_chain
from specframe.target.kv_cache import new_cache, rollback
from specframe_plugins.ngram import NgramIndex

V, K = 49152, 8


def test_greedy_chain(benchmark):
    logits = torch.randn(1, K + 1, V)
    draft = logits[:, :K].argmax(-1)
    draft[0, 5] = (draft[0, 5] + 1) % V  # reject at position 5
    num, _ = benchmark(greedy_chain, logits, draft)
    assert int(num) == 5


def test_sampling_chain(benchmark):
    g = torch.Generator().manual_seed(0)
    target = torch.randn(1, K + 1, V).softmax(-1)
    draft_probs = torch.randn(1, K, V).softmax(-1)
    draft = torch.multinomial(draft_probs[0], 1, generator=g).T
    num, nxt = benchmark(sampling_chain, target, draft_probs, draft, g)
    assert 0 <= int(num) <= K and 0 <= int(nxt) < V


def test_ngram_lookup(benchmark):
    rng = random.Random(0)
    tokens = [rng.randrange(2000) for _ in range(1000)]
    index = NgramIndex(1, 4)
    index.extend(tokens)
    result = benchmark(index.lookup, K)
    assert len(result) <= K


def test_ngram_extend_one_step(benchmark):
    rng = random.Random(0)
    index = NgramIndex(1, 4)
    index.extend([rng.randrange(2000) for _ in range(1000)])
    step = [rng.randrange(2000) for _ in range(3)]
    benchmark(index.extend, step)
    assert len(index.tokens) > 1000


def test_kv_rollback(benchmark):
    cfg = LlamaConfig(num_hidden_layers=30, num_key_value_heads=3, num_attention_heads=9, hidden_size=576)
    cache = new_cache(cfg)
    for layer in range(30):
        cache.update(torch.randn(1, 3, 512 + K + 1, 64), torch.randn(1, 3, 512 + K + 1, 64), layer)

    def grow_and_roll():
        for layer in range(30):
            cache.update(torch.zeros(1, 3, 4, 64), torch.zeros(1, 3, 4, 64), layer)
        rollback(cache, 512 + K + 1)

    benchmark(grow_and_roll)
    assert cache.get_seq_length() == 512 + K + 1
