"""The shared target KV cache: creation and rollback to the committed length.

We use transformers' ``DynamicCache`` with past recording on, so sliding-window layers (Gemma 3) keep enough
past to be cropped after a partial acceptance. After every verification forward the scorer keeps the accepted
path only: :func:`rollback` (``crop``) after a chain, :func:`compact` after a tree.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache


def new_cache(config: Any) -> DynamicCache:
    cache = DynamicCache(config=config)
    cache.activate_past_recording()
    return cache


def cache_length(cache: DynamicCache) -> int:
    """Positions held by the cache (for sliding-window layers: positions seen)."""
    return int(cache.get_seq_length())


def rollback(cache: DynamicCache, length: int) -> None:
    """Drop every position at index ``>= length`` (rejected draft nodes).

    Raises:
        ValueError: ``length`` is larger than the cache.
    """
    current = cache_length(cache)
    if length > current:
        raise ValueError(f"cannot roll the KV cache forward: holds {current} positions, asked for {length}")
    cache.crop(-(current - length))  # negative = number to remove; 0 still trims sliding-window layers


def restore(cache: DynamicCache, length: int) -> None:
    """Undo a forward that raised partway: each layer drops what it appended beyond ``length`` positions (the
    layers before the failing one grew, the others did not); sliding-window layers go back to their window."""
    for layer in cache.layers:
        extra = int(layer.get_seq_length()) - length
        if extra > 0:
            layer.crop(-extra)


def compact(cache: DynamicCache, base_len: int, keep: list[int]) -> None:
    """Keep only the accepted path of a verified token tree.

    The cache holds ``base_len`` positions and then ``N`` draft nodes; afterwards it holds ``base_len`` positions
    and the nodes ``keep`` (indices into the draft, in path order). Equivalent to a fresh prefill of the
    accepted path (node keys were computed at their final positions), without re-running the target.
    """
    n = cache_length(cache) - base_len
    if keep == list(range(len(keep))):  # a prefix (always so for chains): a crop suffices
        rollback(cache, base_len + len(keep))
        return
    for layer in cache.layers:
        keys, values = layer.keys, layer.values
        offset = keys.shape[-2] - n  # this layer's first draft position
        idx = torch.tensor(keep, dtype=torch.long, device=keys.device) + offset
        layer.keys = torch.cat([keys[..., :offset, :], keys.index_select(-2, idx)], dim=-2)
        layer.values = torch.cat([values[..., :offset, :], values.index_select(-2, idx)], dim=-2)
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length -= n - len(keep)
