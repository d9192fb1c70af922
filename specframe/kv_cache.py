"""The shared target KV cache: creation and rollback to the committed length.

We use transformers' ``DynamicCache`` with past recording on, so sliding-window layers (Gemma 3) keep enough
past to be cropped after a partial acceptance; ``crop`` is called after every verification forward.
"""

from __future__ import annotations

from typing import Any

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
