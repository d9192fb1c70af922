"""The kit's target: a tiny random Llama (V = 16) built from a config, plus exact references computed from it
without a KV cache (so they are independent of the engine's cache handling).

Why V = 16 and a sharpened head: the sampling checks compare empirical token frequencies with exact
distributions; a small vocabulary keeps the number of outcomes low (16 first tokens, 256 first pairs), and
logits with spread (mean entropy ≈ 1.8 nats out of ln 16 ≈ 2.77) make a wrong draft distribution show up as a
large total-variation distance instead of drowning in near-uniform noise.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from ..sampling import SamplingParams, probs_from_logits
from ..target.hf import Target

VOCAB = 16


def tiny_target(seed: int = 0, vocab_size: int = VOCAB) -> Target:
    """A deterministic tiny random Llama target on CPU, float32, with no tokenizer and no EOS.

    Args:
        seed: weights seed (the global RNG is restored afterwards).
        vocab_size: V.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.1,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)  # spread the logits: see the module docstring
    return Target(model, None, name=f"specframe-kit-tiny-v{vocab_size}-s{seed}")


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one thread for tiny models (many threads only add overhead); restores the setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@torch.inference_mode()
def reference_greedy(target: Target, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Plain greedy decoding with a full forward per token (no KV cache)."""
    tokens = list(prompt)
    for _ in range(max_new_tokens):
        logits = target.model(input_ids=torch.tensor([tokens], device=target.device)).logits[0, -1]
        tokens.append(int(logits.argmax()))
    return tokens[len(prompt):]


@torch.inference_mode()
def first_two_tokens(target: Target, prompt: list[int], sampling: SamplingParams) -> torch.Tensor:
    """Exact distribution of the first two sampled tokens after ``prompt``.

    Returns:
        ``[V, V]`` float64: ``P[a, b] = p(a | prompt) * p(b | prompt + [a])`` under ``sampling``'s warp.
    """
    model, v = target.model, target.vocab_size
    first = probs_from_logits(model(input_ids=torch.tensor([prompt])).logits[0, -1], sampling)
    batch = torch.tensor([prompt + [a] for a in range(v)])
    second = probs_from_logits(model(input_ids=batch).logits[:, -1], sampling)
    return first.double()[:, None] * second.double()


@torch.inference_mode()
def last_hidden(target: Target, tokens: list[int]) -> torch.Tensor | None:
    """What the engine puts in ``DecodeState.hidden`` for committed ``tokens``: the last layer's hidden state at
    the position before the newest token (``[1, H]``), or None for a one-token sequence."""
    if len(tokens) < 2:
        return None
    out = target.model(input_ids=torch.tensor([tokens[:-1]]), output_hidden_states=True)
    return out.hidden_states[-1][:, -1]


@torch.inference_mode()
def committed_features(target: Target, tokens: list[int], layers: tuple[int, ...]) -> torch.Tensor | None:
    """What the engine puts in ``DecodeState.features`` for committed ``tokens``: the hidden states of ``layers`` at
    every position but the newest (``[1, T - 1, F, H]``), or None (no layers, or a one-token sequence)."""
    if not layers or len(tokens) < 2:
        return None
    out = target.model(input_ids=torch.tensor([tokens[:-1]]), output_hidden_states=True)
    return torch.stack([out.hidden_states[i] for i in layers], 2)


def weights_checksum(target: Target) -> float:
    """Sum of absolute parameter values (detects a proposer writing into the target's weights)."""
    with torch.no_grad():
        return float(sum(p.double().abs().sum() for p in target.model.parameters()))
