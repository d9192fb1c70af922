"""The shared target KV cache: creation and rollback to the committed length.

We use transformers' ``DynamicCache`` with past recording on, so sliding-window layers (Gemma 3) keep enough
past to be cropped after a partial acceptance. After every verification forward the scorer keeps the accepted
path only: :func:`rollback` (``crop``) after a chain, :func:`compact` after a tree.

Recurrent layers (Mamba / Mamba-2 scans, gated-delta and other linear attention, short convolutions: transformers'
``LinearAttentionLayer`` cache layers, as in Qwen3-Next / Qwen3.5, Nemotron-H, Granite-4, Jamba, Falcon-H1) hold a
state, not one entry per position, so a rejected draft cannot be cut off the end. :class:`SpecCache` keeps, for
every forward after the prefill, the state after each of its positions (transformers' recorded intermediate
states: the model runs those positions through its one-token recurrent update, as plain decoding does; copied into
buffers the cache reuses from step to step) until the next :func:`rollback`, which restores the accepted position's state and drops the rest. Memory is bounded by the
positions between two rollbacks (the draft length + 1 in the engine), never the context; the prefill records
none (it runs the model's chunked scan, as transformers' own ``generate`` does) and keeps only the convolution
window, as a cache without recording does.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import LinearAttentionCacheLayerMixin as _RECURRENT


class SpecCache(DynamicCache):
    """``DynamicCache`` whose recurrent layers record the state after every position of each forward but the
    first (the prefill), so :func:`rollback` can return to any of them (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.state_buffers: dict[tuple[int, int], list[torch.Tensor]] = {}  # (layer, state) -> reused kept states

    def get_recurrent_states_to_keep(self, layer_idx: int | None = None) -> int:
        # transformers' scans take min(this, new positions): all of them once the layer holds a state, none at the
        # prefill (a layer's recurrent state is initialised by the first forward that writes it)
        layers = self.layers if layer_idx is None else [self.layers[layer_idx]]
        return max((_ALL if _holds_state(layer) else 0 for layer in layers), default=0)

    def update_conv_state(self, conv_states: Any, layer_idx: int, state_idx: int = 0, **kwargs: Any) -> Any:
        layer = self.layers[layer_idx]
        prefill = not layer.has_previous_state[state_idx]
        out = super().update_conv_state(conv_states, layer_idx, state_idx, **kwargs)
        if prefill:  # keep the convolution window only, as without recording (the prompt's columns are never undone)
            kept, width = layer.conv_states[state_idx], layer.conv_kernel_size[state_idx]
            if kept.shape[-1] >= width:
                layer.conv_states[state_idx] = kept[..., -width:].clone()
            else:
                layer.conv_states[state_idx] = torch.nn.functional.pad(kept, (width - kept.shape[-1], 0))
        return out

    def update_recurrent_state(self, recurrent_states: Any, layer_idx: int, state_idx: int = 0, **kwargs: Any) -> Any:
        layer = self.layers[layer_idx]
        if not layer.is_recurrent_states_initialized[state_idx]:  # the prefill: nothing to return to
            out = super().update_recurrent_state(recurrent_states, layer_idx, state_idx, **kwargs)
            layer.recurrent_states_history[state_idx] = []
            return out
        # the state before this forward and after each of its positions but the last, copied into buffers this cache
        # keeps (transformers keeps the model's own tensors: fresh memory every step, which costs page faults)
        new, last = ([], recurrent_states) if isinstance(recurrent_states, torch.Tensor) else \
            (list(recurrent_states[:-1]), recurrent_states[-1])
        history = layer.recurrent_states_history[state_idx]
        pool = self.state_buffers.setdefault((layer_idx, state_idx), [])
        need = len(history) + 1 + len(new)
        pool.extend(torch.empty_like(last) for _ in range(need - len(pool)))
        slots = pool[len(history):need]
        for slot, state in zip(slots, [layer.recurrent_states[state_idx], *new]):
            slot.copy_(state)
        history.extend(slots)
        layer.recurrent_states[state_idx].copy_(last)
        return layer.recurrent_states[state_idx]


_ALL = 1 << 30  # "every new position": transformers caps it at the forward's length


def _holds_state(layer: Any) -> bool:
    return bool(getattr(layer, "record_past", False) and any(getattr(layer, "is_recurrent_states_initialized",
                                                                     {}).values()))


def _holds_anything(layer: Any) -> bool:
    if isinstance(layer, _RECURRENT):
        return any(layer.is_conv_states_initialized.values()) or any(layer.is_recurrent_states_initialized.values())
    return bool(getattr(layer, "is_initialized", True))


def recurrent_layers(cache: DynamicCache) -> list[Any]:
    """The cache layers that keep a recurrent / convolution state (transformers' linear-attention cache layers)."""
    return [layer for layer in cache.layers if isinstance(layer, _RECURRENT)]


def new_cache(config: Any) -> DynamicCache:
    """An empty cache for a model with ``config``: every kind of layer can be rolled back (see the module
    docstring)."""
    cache = SpecCache(config=config)
    cache.activate_past_recording(recurrent_states_to_keep=0)
    for layer in recurrent_layers(cache):  # one history list per state (transformers shares one list among them)
        layer.recurrent_states_history = {i: [] for i in range(layer.number_of_states)}
    return cache


def cache_length(cache: DynamicCache) -> int:
    """Positions held by the cache (for sliding-window layers: positions seen)."""
    return int(cache.get_seq_length())


def rollback(cache: DynamicCache, length: int) -> None:
    """Drop every position at index ``>= length`` (rejected draft nodes).

    Raises:
        ValueError: ``length`` is larger than the cache, or a recurrent layer kept no state for ``length`` (rolled
            back into a prefill, or a cache not made by :func:`new_cache`).
    """
    current = cache_length(cache)
    if length > current:
        raise ValueError(f"cannot roll the KV cache forward: holds {current} positions, asked for {length}")
    for layer in recurrent_layers(cache) if length < current else ():
        kept = min((len(h) for i, h in layer.recurrent_states_history.items() if layer.is_recurrent_states_initialized[i]),
                   default=current - length)
        if kept < current - length:
            raise ValueError(f"cannot roll a recurrent layer back {current - length} positions: it kept the states "
                             f"of the last {kept} only")
    for layer in cache.layers:  # negative = number to remove; 0 still trims sliding-window layers
        if _holds_anything(layer):  # (a layer a layer-skip draft never ran holds nothing to crop)
            _crop(layer, current - length)


def _crop(layer: Any, tokens: int) -> None:
    """``layer.crop(-tokens)``; a recurrent layer's kept state is copied into its live state first (the kept ones
    are buffers the cache reuses: transformers' crop would make one of them the live state)."""
    if isinstance(layer, _RECURRENT) and tokens > 0:
        for i, history in layer.recurrent_states_history.items():
            if layer.is_recurrent_states_initialized[i] and len(history) >= tokens:
                layer.recurrent_states[i].copy_(history[-tokens])
                layer.recurrent_states_history[i] = [layer.recurrent_states[i]] * tokens
    layer.crop(-tokens)


def restore(cache: DynamicCache, length: int) -> None:
    """Undo a forward that raised partway: each layer drops what it appended beyond ``length`` positions (the
    layers before the failing one grew, the others did not); sliding-window layers go back to their window."""
    for layer in cache.layers:
        extra = int(layer.get_seq_length()) - length
        if extra > 0:
            _crop(layer, extra)


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
    # (layers without keys: a cross-attention layer with no image, a layer a layer-skip draft never ran)
    layers = [layer for layer in cache.layers if _holds_anything(layer) and layer.keys is not None]
    if not layers:
        return
    idx = torch.tensor(keep, dtype=torch.long, device=layers[0].keys.device)  # [len(keep)], made once per compact
    for layer in layers:
        keys, values = layer.keys, layer.values
        offset = keys.shape[-2] - n  # this layer's first draft position
        at = idx if idx.device == keys.device else idx.to(keys.device)  # (a model split over devices)
        layer.keys = torch.cat([keys[..., :offset, :], keys[..., offset:, :].index_select(-2, at)], dim=-2)
        layer.values = torch.cat([values[..., :offset, :], values[..., offset:, :].index_select(-2, at)], dim=-2)
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length -= n - len(keep)
