"""Multi-token-prediction (MTP) layers that ship inside a target checkpoint and that transformers' model classes drop
(DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §2.2; the layout GLM-4.5 reuses): with ``num_nextn_predict_layers
= D`` in the config, layers ``L .. L + D - 1`` after the ``L`` decoder layers hold, each::

    model.layers.{k}.enorm, .hnorm            RMSNorm [H]
    model.layers.{k}.eh_proj                  [H, 2H], no bias
    model.layers.{k}.<a decoder layer>        the target's own layer class (DeepSeek-V3: MLA attention, MoE)
    model.layers.{k}.shared_head.norm, .head  RMSNorm [H] and an LM head [V, H] (the target's, repeated)
    model.layers.{k}.embed_tokens             (optional) the target's input embedding, repeated

One MTP pass over entry ``t`` (``h_t`` the target's last hidden state, after its final norm, as vLLM passes it;
``e`` the embedding of the token after ``t``, zeroed at position 0 as vLLM does)::

    x = eh_proj([enorm(e_{t+1}) ; hnorm(h_t)]);   a_t = Layer(x);   q(x_{t+2}) = softmax(head(norm(a_t)))

Drafting past the committed tokens feeds ``a`` back as ``h`` (module ``k mod D`` at draft step ``k``, as vLLM's
``deepseek_mtp``). The decoder layer and the rotary embedding are transformers' own for the target's architecture,
so attention, routing and RoPE are computed as the model computes them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from .checkpoints import read_weights, weight_files

log = logging.getLogger("specframe")


def mtp_layer_count(config: Any) -> int:
    """MTP modules a transformers ``config`` declares (``num_nextn_predict_layers``), 0 when none."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(cfg, "num_nextn_predict_layers", 0) or 0)


class MtpModule(nn.Module):
    """One MTP module: ``enorm``, ``hnorm``, ``eh_proj``, the decoder layer ``block`` and ``shared_head``."""

    def __init__(self, block: nn.Module, norm_cls: type, hidden: int, eps: float, vocab: int) -> None:
        super().__init__()
        self.enorm, self.hnorm = norm_cls(hidden, eps=eps), norm_cls(hidden, eps=eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.block = block
        self.head_norm = norm_cls(hidden, eps=eps)
        self.head = nn.Linear(hidden, vocab, bias=False)


class MtpDrafter(nn.Module):
    """The target's MTP modules, with the target's rotary embedding and input embedding.

    ``step(h [1, n, H], tokens [1, n], positions [1, n], cache, module)`` -> ``a [1, n, H]``; ``logits(a, module)``
    -> ``[.., V]``."""

    def __init__(self, modules: list[MtpModule], rotary: nn.Module, embed: nn.Module) -> None:
        super().__init__()
        self.mtp = nn.ModuleList(modules)
        self.rotary = rotary
        self.embed = embed

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache()

    def step(self, h: Tensor, tokens: Tensor, positions: Tensor, cache: Any, module: int) -> Tensor:
        """One pass of module ``module`` over ``n`` entries appended after the ``m`` entries ``cache`` holds for it
        (causal among the new, all of the old)."""
        m = self.mtp[module]
        e = self.embed(tokens).to(h.dtype)
        e = torch.where((positions == 0)[..., None], torch.zeros_like(e), e)
        x = m.eh_proj(torch.cat([m.enorm(e), m.hnorm(h)], -1))
        n = x.shape[1]
        past = cache.get_seq_length(module) if len(cache.layers) > module else 0
        mask = torch.zeros((1, 1, n, past + n), dtype=x.dtype, device=x.device)
        mask[..., past:] = torch.full((n, n), float("-inf"), dtype=x.dtype, device=x.device).triu(1)
        rope = self.rotary(x, positions)
        out = m.block(x, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                      position_embeddings=rope)
        return out[0] if isinstance(out, tuple) else out

    def logits(self, a: Tensor, module: int) -> Tensor:
        m = self.mtp[module]
        return m.head(m.head_norm(a))


def _decoder_parts(model: nn.Module) -> tuple[type, type, nn.Module]:
    """The target's decoder layer class, RMSNorm class and rotary embedding (transformers' own modules)."""
    try:
        inner = model.model
        layer_cls = type(inner.layers[0])
        norm_cls = type(inner.norm)
        rotary = inner.rotary_emb
    except AttributeError as e:
        raise ConfigError(f"mtp needs a decoder-only transformers model with model.layers, model.norm and "
                          f"model.rotary_emb ({e})") from None
    return layer_cls, norm_cls, rotary


def load_mtp(model: nn.Module, folder: Path | None = None) -> MtpDrafter:
    """The MTP modules of a loaded transformers ``model`` (its config's ``num_nextn_predict_layers``), read from the
    checkpoint folder ``folder`` (default: the folder the model was loaded from).

    Raises:
        ConfigError: the config declares no MTP layers, the folder has no weights or they lack a module's tensors."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    count = mtp_layer_count(cfg)
    if count < 1:
        raise ConfigError(f"the target's config declares no MTP layers (num_nextn_predict_layers is "
                          f"{getattr(cfg, 'num_nextn_predict_layers', None)}): mtp needs a checkpoint that carries "
                          f"them (DeepSeek-V3/R1, GLM-4.5)")
    folder = Path(folder or getattr(model.config, "_name_or_path", "") or "")
    if not folder.is_dir():
        raise ConfigError(f"mtp reads the MTP layers from the target's checkpoint folder, and {str(folder)!r} is none: "
                          f"set `checkpoint: DIR` to the model's folder")
    n, h, v = int(cfg.num_hidden_layers), int(cfg.hidden_size), int(cfg.vocab_size)
    prefixes = tuple(f"model.layers.{n + i}." for i in range(count))
    state = read_weights(weight_files(folder), keep=lambda k: k.startswith(prefixes))
    layer_cls, norm_cls, rotary = _decoder_parts(model)
    eps = float(getattr(cfg, "rms_norm_eps", 1e-6))
    modules = []
    for i, pre in enumerate(prefixes):
        own = {k[len(pre):]: t for k, t in state.items() if k.startswith(pre)}
        if "eh_proj.weight" not in own:
            raise ConfigError(f"{folder}: the checkpoint has no MTP module {n + i} ({pre}eh_proj.weight is missing)")
        block = layer_cls(cfg, n + i)
        if hasattr(block, "self_attn"):
            block.self_attn.layer_idx = i  # its own entry in the drafter's cache
        m = MtpModule(block, norm_cls, h, eps, v)
        head = own.pop("shared_head.head.weight", None)
        if head is None:
            head = model.get_output_embeddings().weight.detach()
        own.pop("embed_tokens.weight", None)  # the target's own embedding, repeated
        mapped = {"head.weight": head, "head_norm.weight": own.pop("shared_head.norm.weight", None)}
        for k in ("enorm.weight", "hnorm.weight", "eh_proj.weight"):
            mapped[k] = own.pop(k)
        mapped.update({"block." + k: t for k, t in own.items()})
        if mapped["head_norm.weight"] is None:
            raise ConfigError(f"{folder}: MTP module {n + i} lacks shared_head.norm.weight")
        missing, unexpected = m.load_state_dict(mapped, strict=False)
        if missing or unexpected:
            raise ConfigError(f"{folder}: MTP module {n + i} does not match the target's layer (missing "
                              f"{missing[:4]}, unexpected {unexpected[:4]})")
        modules.append(m)
    dev, dtype = model.get_input_embeddings().weight.device, model.get_input_embeddings().weight.dtype
    drafter = MtpDrafter(modules, rotary, model.get_input_embeddings())
    drafter.mtp.to(device=dev, dtype=dtype)
    log.info("MTP: %d module(s) from %s", count, folder)
    return drafter.eval()
