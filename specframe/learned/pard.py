"""PARD parallel draft models (An et al. 2025, "PARD: Accelerating LLM Inference with Low-Cost PARallel Draft Model
Adaptation", arXiv 2504.18583): the layout AMD publishes them in, and what reads it.

A PARD draft is an ordinary transformers causal LM sharing the target's vocabulary, fine-tuned so that ``k - 1``
copies of one **mask token** appended after the context make the positions they occupy predict the tokens 2..k
ahead: one forward over ``[context..., newest, mask x (k - 1)]`` (consecutive positions, the model's own causal
attention) drafts ``k`` tokens. It reads nothing of the target, so one draft serves a family of targets.

Layout (AMD's checkpoints amd/PARD-Llama-3.2-1B, amd/PARD-DeepSeek-R1-Distill-Qwen-1.5B, amd/PARD-Qwen2.5-0.5B,
amd/PARD-Qwen3-0.6B; the fields are the ones AMD's training script sets on the model's config before saving): the
usual ``config.json`` / weights / tokenizer files, with two more fields in ``config.json``:

- ``pard_token``: the mask token id. A token the vocabulary reserves and never uses: 128020 in Llama 3's
  (``<|reserved_special_token_12|>``), 151665 in Qwen2.5's (the first embedding row past the tokenizer's 151665
  tokens, a padding row of the 151936);
- ``spd_type``: ``"pard"``.

vLLM reads the same field (``pard_token``) when a draft model runs with ``parallel_drafting: true``.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

PARD_MASK_FIELD = "pard_token"
PARD_TYPE_FIELD = "spd_type"
PARD_TYPE = "pard"


def pard_mask_token(config: Any) -> int | None:
    """The mask token a draft's config declares (``pard_token``), or None when it declares none.

    Args:
        config: a transformers config or a ``config.json`` dict.

    Raises:
        ConfigError: the field holds something other than a non-negative integer.
    """
    value = config.get(PARD_MASK_FIELD) if isinstance(config, dict) else getattr(config, PARD_MASK_FIELD, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"config.json field {PARD_MASK_FIELD} must be a token id (a non-negative integer), "
                          f"not {value!r}")
    return int(value)
