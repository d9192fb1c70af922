"""Low-rank adapters on a transformers model's linear layers (LoRA: Hu et al. 2021, "LoRA: Low-Rank Adaptation of
Large Language Models", arXiv 2106.09685, eq. 3: ``h = W0 x + (alpha / r) B A x``), for training a self-drafting block
drafter from the target itself and merging it back into plain weights.

:func:`add_lora` wraps the chosen ``nn.Linear`` modules in place; the adapters' weights live in one
:class:`Adapters` module (only they train, only they are checkpointed: a few MB instead of the model's hundreds);
:func:`merge_lora` folds them into the wrapped layers' weights and unwraps them, leaving an ordinary model with
the same outputs (up to float rounding), which is what the PARD layout stores.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch
from torch import Tensor, nn

#: the linear layers of a Llama / Qwen / Mistral decoder layer
DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class Adapters(nn.Module):
    """The adapters' weights, ``A [r, in]`` and ``B [out, r]`` per wrapped layer (``B`` starts at zero, so a fresh
    adapter changes nothing), keyed by the layer's name with dots as ``__``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.ParameterDict()
        self.b = nn.ParameterDict()


class LoRALinear(nn.Module):
    """``base(x) + scale * (x A^T) B^T``; ``base`` stays frozen. The adapter's tensors are read from ``adapters``
    (held outside this module's own state, so the model's state dict keeps its own names)."""

    def __init__(self, base: nn.Linear, adapters: Adapters, key: str, scale: float) -> None:
        super().__init__()
        self.base, self.key, self.scale = base, key, scale
        self._adapters = (adapters,)  # (a tuple: not registered as a submodule)

    def forward(self, x: Tensor) -> Tensor:
        ad = self._adapters[0]
        a, b = ad.a[self.key], ad.b[self.key]
        return self.base(x) + (x.to(a.dtype) @ a.t() @ b.t()).to(x.dtype) * self.scale


def add_lora(model: nn.Module, rank: int, alpha: float | None = None, names: Iterable[str] = DECODER_LINEARS,
             seed: int = 0) -> Adapters:
    """Wrap every ``nn.Linear`` of ``model`` whose attribute name is in ``names`` with a rank-``rank`` adapter
    (``A`` Kaiming-uniform, seeded; ``B`` zero; scale ``alpha / rank``, default ``alpha = 2 rank``), freeze every
    other weight, and return the adapters (float32, on the model's device).

    Raises:
        ValueError: ``rank < 1``, or no layer of ``model`` is named in ``names``.
    """
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, not {rank}")
    scale = (alpha if alpha is not None else 2.0 * rank) / rank
    wanted = set(names)
    for p in model.parameters():
        p.requires_grad_(False)
    adapters = Adapters()
    gen = torch.Generator().manual_seed(seed)
    found = [(name, mod) for name, mod in model.named_modules()
             if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in wanted]
    if not found:
        raise ValueError(f"no linear layer named {sorted(wanted)} in the model")
    for name, mod in found:
        key = name.replace(".", "__")
        bound = 1.0 / math.sqrt(mod.in_features)
        a = (torch.rand(rank, mod.in_features, generator=gen) * 2 - 1) * bound
        adapters.a[key] = nn.Parameter(a.to(mod.weight.device))
        adapters.b[key] = nn.Parameter(torch.zeros(mod.out_features, rank, device=mod.weight.device))
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        setattr(parent, name.rsplit(".", 1)[-1], LoRALinear(mod, adapters, key, scale))
    return adapters


@torch.no_grad()
def merge_lora(model: nn.Module) -> int:
    """Fold every :class:`LoRALinear` of ``model`` into its base layer's weight (``W0 + scale B A``) and put the base
    layer back in its place. Returns how many layers were merged."""
    merged = 0
    for name, mod in list(model.named_modules()):
        if isinstance(mod, LoRALinear):
            ad = mod._adapters[0]
            delta = (ad.b[mod.key] @ ad.a[mod.key]) * mod.scale
            mod.base.weight.add_(delta.to(mod.base.weight.dtype))
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, name.rsplit(".", 1)[-1], mod.base)
            merged += 1
    return merged


def trainable(module: Any) -> list[nn.Parameter]:
    """The parameters of ``module`` that train."""
    return [p for p in module.parameters() if p.requires_grad]
