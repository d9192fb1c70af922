"""Pre-packed oneDNN weights for a CPU target's linear layers (``prepack``).

``torch.nn.functional.linear`` in bfloat16 on CPU re-orders the weight into oneDNN's blocked layout on every
call. For a small model that re-ordering is most of the work: measured on a 2-core Xeon with AMX, a ``[1, 576] x
[576, 1536]`` bf16 product took 78 us plain and 33 us pre-packed, the ``[576, 49152]`` LM head 2.0 ms vs 1.2 ms,
and a whole SmolLM2-135M forward at a 512-token context 45 ms vs 34 ms (T(1)), flat up to 16 tokens. The packed
kernel is the same oneDNN matmul, so each layer's result is the one oneDNN gives for that input: speculative
decoding with packed weights is exact against plain decoding with packed weights (the exactness reference, as
for any change of kernels). Whether it pays depends on the machine (in float32 it was slower there), so
``prepack: auto`` lets the machine profile decide (:mod:`specframe.target.profile`).

The original ``weight`` (and ``bias``) stay on each module, so code that reads ``lm_head.weight`` (tied
embeddings, heads that reuse the target's LM head) is unaffected; the packed copy costs one more copy of the
linear weights in memory.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def packing_available(dtype: torch.dtype, device: torch.device | str) -> bool:
    """True where oneDNN pre-packing exists for this dtype and device (CPU, float32 or bfloat16; bfloat16 needs a
    CPU with oneDNN's bf16 path, e.g. AVX-512 BW/VL/DQ or AVX-NE-CONVERT: on an AVX2-only CPU packing raises)."""
    ops = torch.ops.mkldnn
    return (
        torch.device(device).type == "cpu"
        and dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
        and (dtype != torch.bfloat16 or bool(getattr(ops, "_is_mkldnn_bf16_supported", lambda: False)()))
    )


class PackedLinear(nn.Module):
    """A ``nn.Linear`` whose weight is pre-packed for oneDNN once.

    Args:
        linear: the layer to replace; its ``weight`` ``[out, in]`` and ``bias`` ``[out]`` are kept (shared).

    ``forward(x [..., in]) -> [..., out]`` in the layer's dtype.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1)
        self.register_buffer("packed", packed, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=True"


def pack_linears(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` in ``model`` (LM head included) by a :class:`PackedLinear`, in place.

    Returns:
        the number of layers packed.

    Raises:
        ValueError: packing is not available for the model's dtype/device (see :func:`packing_available`).
    """
    param = next(model.parameters())
    if not packing_available(param.dtype, param.device):
        raise ValueError(f"pre-packed weights need a CPU model in float32 or bfloat16 with oneDNN, got {param.dtype} "
                         f"on {param.device}")
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear(child))
                count += 1
    return count


def is_packed(model: Any) -> bool:
    return any(isinstance(m, PackedLinear) for m in model.modules())
