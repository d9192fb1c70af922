"""Sampling parameters and the logits warp shared by the target and every draft distribution.

The same warp (temperature, then top-k, then top-p, the order HF transformers applies them) must be applied to
the target logits and to any draft distribution a proposer samples from, so that rejection sampling compares
like with like (Leviathan et al. 2022, §2.3: speculative sampling works for any warp applied to both models).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .errors import ConfigError

# A temperature below this decodes greedily, as 0 does (vLLM's threshold, ``_SAMPLING_EPS``). Dividing logits by a
# smaller one overflows float32 for large logits (1e-45 gives inf, then NaN probabilities) and, for any logit gap
# above 1e-3, makes the distribution one-hot up to rounding anyway: what changes is only the choice among tokens
# whose logits lie within ~1e-4 of the top one (greedy takes the first).
GREEDY_BELOW = 1e-5


def is_greedy_temperature(temperature: float) -> bool:
    """True when ``temperature`` decodes greedily: 0, or any value below :data:`GREEDY_BELOW`."""
    return temperature < GREEDY_BELOW


# --- the value rules, written once: SamplingParams, the pydantic config models and the per-request settings use
# them; each returns the value (normalised) or raises ValueError with what is wrong, and the caller names the value
# as its user spelled it ("temperature", "sampling.temperature", "--temperature")


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _whole(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_temperature(v: object) -> float:
    if not _number(v):
        raise ValueError("must be a number")
    if not 0 <= v < float("inf"):
        raise ValueError("must be a finite number >= 0 (0 = greedy)")
    return float(v)


def check_top_p(v: object) -> float:
    if not _number(v):
        raise ValueError("must be a number")
    if not 0 < v <= 1:
        raise ValueError("must be in (0, 1]")
    return float(v)


def check_top_k(v: object) -> int:
    if not _whole(v):
        raise ValueError("must be a whole number >= 0 (0 = off)")
    if v < 0:
        raise ValueError("must be >= 0 (0 = off)")
    return int(v)


def check_logprobs(v: object) -> None:
    """``logprobs`` (alternatives per generated token) is None or an integer >= 0.

    Raises:
        ConfigError: anything else (a bool, a float, a negative number).
    """
    from .errors import ConfigError

    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise ConfigError(f"logprobs must be an integer >= 0 (alternatives per token) or None, got {v!r}")


def check_seed(v: object) -> int:
    if not (_whole(v) and 0 <= v < 2**63):
        raise ValueError("must be a whole number in [0, 2**63)")
    return int(v)


def check_max_new_tokens(v: object) -> int:
    """Any budget up to int64's range: generation never passes the context (the engine sizes its buffers by the
    room the prompt leaves), so ``10**12`` means "until EOS or the context is full"."""
    if not (_whole(v) and 1 <= v < 2**63):
        raise ValueError("must be a whole number in [1, 2**63)")
    return int(v)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How tokens are chosen from the target distribution.

    ``temperature`` below :data:`GREEDY_BELOW` (1e-5; 0 included) means greedy decoding (argmax of the raw
    logits); ``top_k == 0`` and ``top_p == 1`` disable those filters. Messages name the Python parameters.

    Raises:
        ConfigError: temperature negative or not finite, top_p outside (0, 1], or top_k < 0.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        for name, rule in (("temperature", check_temperature), ("top_p", check_top_p), ("top_k", check_top_k)):
            value = getattr(self, name)
            try:
                rule(value)
            except ValueError as exc:
                raise ConfigError(f"{name} {exc}, got {value!r}") from None

    @property
    def is_greedy(self) -> bool:
        return is_greedy_temperature(self.temperature)


def warp_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """Apply temperature, top-k and top-p to logits.

    Args:
        logits: ``[..., V]`` any float dtype.
        params: sampling parameters. Greedy ones (a temperature below :data:`GREEDY_BELOW`) give the limit of the
            warp as the temperature goes to 0: the argmax (first, at ties) stays 0, every other entry ``-inf``.

    Returns:
        ``[..., V]`` float32 warped logits; filtered entries are ``-inf``. At least one entry per row stays finite.
    """
    if params.is_greedy:  # never divide by a temperature this small: it overflows to inf and NaN probabilities
        x = torch.full(logits.shape, float("-inf"), dtype=torch.float32, device=logits.device)
        return x.scatter_(-1, logits.argmax(-1, keepdim=True), 0.0)
    x = logits.float() / params.temperature
    vocab = x.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1)  # ascending
        cumulative = sorted_x.softmax(-1).cumsum(-1)
        remove_sorted = cumulative <= (1.0 - params.top_p)
        remove_sorted[..., -1] = False  # always keep the most likely token
        remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
        x = x.masked_fill(remove, float("-inf"))
    return x


def probs_from_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """Sampling distribution for logits under ``params``.

    Args:
        logits: ``[..., V]`` any float dtype.

    Returns:
        ``[..., V]`` float32 probabilities summing to 1 along the last axis.
    """
    return warp_logits(logits, params).softmax(-1)
