"""Running a transformers target with some of its decoder layers skipped: the draft of self-speculative decoding
(Zhang et al. 2024, "Draft & Verify", ACL: a subset of the layers skipped; Elhoushi et al. 2024, "LayerSkip", ACL:
an early exit, every layer from one on skipped, through the model's own final norm and LM head).

A skipped layer passes its input through unchanged (the residual stream goes on), so the model's own forward —
embeddings, masks, rotary embeddings, the final norm and LM head — runs as it is, for any architecture whose decoder
loop calls each layer with the hidden states first and takes back the hidden states, alone or first in a tuple (a
skipped layer returns what the layer returns when it runs, with its input in place of its output). Which layers are
skipped is a per-thread setting, active only inside :func:`skipping`: the target's own
forwards (any thread, and this one outside the block) run every layer, so sharing the weights never changes the
target's output. The draft keeps its own KV cache (:func:`specframe.target.kv_cache.new_cache`); a skipped layer's
cache layer stays empty, so layer 0 (whose cache gives the sequence length) is always run.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

from ..errors import ConfigError

__all__ = ["check_skip", "decoder_layers", "skipping"]

_local = threading.local()  # .skip: frozenset of layer indices skipped in this thread (absent: none)
_MARK = "_specframe_skippable"
_RETURNS = "_specframe_returns"  # how many values the layer returned when it last ran (None: a tensor)
_installing = threading.Lock()


def decoder_layers(model: Any) -> Any:
    """The ``nn.ModuleList`` of ``model``'s decoder layers, in order.

    Raises:
        ConfigError: the model has none where transformers decoders keep them (``model.model.layers`` or
            ``get_decoder().layers``).
    """
    for get in (lambda m: m.model.layers, lambda m: m.get_decoder().layers, lambda m: m.layers,
                lambda m: m.transformer.h, lambda m: m.transformer.layers, lambda m: m.transformer.blocks,
                lambda m: m.base_model.encoder.layer):  # (GPT-2 / GPT-Neo / BLOOM / MPT / BERT-as-decoder layouts)
        try:
            layers = get(model)
        except (AttributeError, TypeError, NotImplementedError):
            continue
        if layers is not None and len(layers) > 0:
            return layers
    raise ConfigError(f"{type(model).__name__} has no list of decoder layers where transformers keeps them "
                      "(model.layers): layer-skipping drafts need a transformers decoder-only model")


def check_skip(skip: Iterable[int], num_layers: int) -> frozenset[int]:
    """``skip`` as a frozenset, checked against a model of ``num_layers`` decoder layers.

    Raises:
        ConfigError: an index outside ``1 .. num_layers - 1`` (layer 0 always runs: its KV cache gives the
            draft's sequence length).
    """
    out = frozenset(int(i) for i in skip)
    bad = sorted(i for i in out if not 1 <= i < num_layers)
    if bad:
        raise ConfigError(f"layers to skip must lie in 1..{num_layers - 1} (this model has {num_layers} decoder "
                          f"layers, and layer 0 always runs), got {bad}")
    return out


def _install(model: Any, layers: Any) -> None:
    """Make each layer skippable (once per layer; the weights are shared by every proposer and request)."""
    if getattr(layers[-1], _MARK, None) is not None:  # (installed: every draft forward passes here)
        return
    with _installing:
        for index, layer in enumerate(layers):
            if getattr(layer, _MARK, None) is not None:
                continue

            def forward(*args: Any, _run: Any = layer.forward, _index: int = index, _layer: Any = layer,
                        **kwargs: Any) -> Any:
                skip = getattr(_local, "skip", None)
                if skip and _index in skip:
                    hidden = args[0] if args else kwargs["hidden_states"]
                    width = getattr(_layer, _RETURNS, None)  # a layer that returns (hidden, weights, ...): same arity
                    return hidden if width is None else (hidden,) + (None,) * (width - 1)
                out = _run(*args, **kwargs)
                if not hasattr(_layer, _RETURNS):  # (learnt once: see _learn_returns)
                    setattr(_layer, _RETURNS, len(out) if isinstance(out, tuple) else None)
                return out

            layer.forward = forward
            setattr(layer, _MARK, index)
        _learn_returns(model)


def _learn_returns(model: Any) -> None:
    """Run the whole model once on one token (no cache, nothing skipped) so that every wrapped layer records what it
    returns (a skipped layer returns the same arity)."""
    import torch

    device = next(model.parameters()).device
    with torch.inference_mode():
        model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=False)


@contextmanager
def skipping(model: Any, skip: frozenset[int]) -> Iterator[None]:
    """Within the block, forwards of ``model`` in this thread skip the decoder layers ``skip``.

    Raises:
        ConfigError: as :func:`decoder_layers` and :func:`check_skip`.
    """
    layers = decoder_layers(model)
    skip = check_skip(skip, len(layers))
    _install(model, layers)
    before = getattr(_local, "skip", None)
    _local.skip = skip
    try:
        yield
    finally:
        _local.skip = before
