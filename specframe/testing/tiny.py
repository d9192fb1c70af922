"""The kit's target: a tiny random Llama (V = 16) built from a config, plus exact references computed from it
without a KV cache (so they are independent of the engine's cache handling).

Why V = 16 and a sharpened head: the sampling checks compare empirical token frequencies with exact
distributions; a small vocabulary keeps the number of outcomes low (16 first tokens, 256 first pairs), and
logits with spread (mean entropy ≈ 1.8 nats out of ln 16 ≈ 2.77) make a wrong draft distribution show up as a
large total-variation distance instead of drowning in near-uniform noise.

Device: the tiny target is built on ``device`` (default :func:`default_device`: the environment variable
``SPECFRAME_TEST_DEVICE`` when it is set, e.g. ``cuda`` or ``cuda:1``, else the CPU), so a plugin author can run the
whole kit on a GPU without changing a test::

    SPECFRAME_TEST_DEVICE=cuda pytest tests/            # the kit's target, its references and the engine on CUDA
    Kit(MyProposer, {"k": 4}, target=tiny_target(device="cuda")).check_all()

The references here feed the model on ``target.device`` and return what the kit compares with CPU values on the CPU
(token lists, the exact ``[V, V]`` distribution); the hidden states and features they return stay on the target's
device, as the engine's ``DecodeState.hidden`` / ``features`` do. The weights are drawn on the CPU and then moved, so
a seed gives the same model on every device (its outputs agree up to floating-point rounding; a greedy tie may break
differently on another device).
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch

from ..sampling import SamplingParams, probs_from_logits
from ..target.hf import Target

VOCAB = 16
DEVICE_ENV = "SPECFRAME_TEST_DEVICE"  # the device tests (and the kit's tiny target) run on; unset: the CPU


def default_device() -> torch.device:
    """The device tests run on: ``$SPECFRAME_TEST_DEVICE`` (e.g. ``cuda``, ``cuda:1``) when set and not empty, else
    the CPU. specframe's own test suite sets it from its ``--device`` option."""
    return torch.device(os.environ.get(DEVICE_ENV, "").strip() or "cpu")


def tiny_target(seed: int = 0, vocab_size: int = VOCAB, device: str | torch.device | None = None) -> Target:
    """A deterministic tiny random Llama target, float32, with no tokenizer and no EOS.

    Args:
        seed: weights seed (the global RNG is restored afterwards).
        vocab_size: V.
        device: where the model lives; default :func:`default_device` (``$SPECFRAME_TEST_DEVICE``, else the CPU).
            The weights are drawn on the CPU and moved, so a seed gives the same weights on every device.
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
    model.to(default_device() if device is None else torch.device(device))
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
    """Plain greedy decoding with a full forward per token (no KV cache), on the target's device."""
    tokens = list(prompt)
    for _ in range(max_new_tokens):
        logits = target.model(input_ids=torch.tensor([tokens], device=target.device)).logits[0, -1]
        tokens.append(int(logits.argmax()))
    return tokens[len(prompt):]


@torch.inference_mode()
def first_two_tokens(target: Target, prompt: list[int], sampling: SamplingParams) -> torch.Tensor:
    """Exact distribution of the first two sampled tokens after ``prompt``.

    Returns:
        ``[V, V]`` float64 on the CPU: ``P[a, b] = p(a | prompt) * p(b | prompt + [a])`` under ``sampling``'s warp
        (computed on the target's device).
    """
    model, v, device = target.model, target.vocab_size, target.device
    first = probs_from_logits(model(input_ids=torch.tensor([prompt], device=device)).logits[0, -1], sampling)
    batch = torch.tensor([prompt + [a] for a in range(v)], device=device)
    second = probs_from_logits(model(input_ids=batch).logits[:, -1], sampling)
    return (first.double()[:, None] * second.double()).cpu()


@torch.inference_mode()
def last_hidden(target: Target, tokens: list[int]) -> torch.Tensor | None:
    """What the engine puts in ``DecodeState.hidden`` for committed ``tokens``: the last layer's hidden state at
    the position before the newest token (``[1, H]``, on the target's device), or None for a one-token sequence."""
    if len(tokens) < 2:
        return None
    out = target.model(input_ids=torch.tensor([tokens[:-1]], device=target.device), output_hidden_states=True)
    return out.hidden_states[-1][:, -1]


@torch.inference_mode()
def committed_features(target: Target, tokens: list[int], layers: tuple[int, ...]) -> torch.Tensor | None:
    """What the engine puts in ``DecodeState.features`` for committed ``tokens``: the hidden states of ``layers`` at
    every position but the newest (``[1, T - 1, F, H]``, on the target's device), or None (no layers, or a one-token
    sequence)."""
    if not layers or len(tokens) < 2:
        return None
    out = target.model(input_ids=torch.tensor([tokens[:-1]], device=target.device), output_hidden_states=True)
    return torch.stack([out.hidden_states[i] for i in layers], 2)


def weights_checksum(target: Target) -> float:
    """Sum of absolute parameter values (detects a proposer writing into the target's weights)."""
    with torch.no_grad():
        return float(sum(p.double().abs().sum() for p in target.model.parameters()))
