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

Two more published layouts, the same computation with other names (read from vLLM's ``qwen3_next_mtp`` /
``qwen3_5_mtp`` and ``mimo_mtp``):

- **Qwen3-Next / Qwen3.5** (``mtp_num_hidden_layers`` in the config): ``mtp.fc`` [H, 2H] over
  ``[pre_fc_norm_embedding(e) ; pre_fc_norm_hidden(h)]``, ``mtp.layers.{i}.*`` a full-attention decoder layer of the
  target's class, ``mtp.norm`` and the target's LM head; no zeroing at position 0. Its output is normed before it
  is fed back (``a = norm(Layer(x))``, ``q = softmax(lm_head(a))``).
- **MiMo** (``num_nextn_predict_layers``): ``model.mtp_layers.{i}.input_proj`` [H, 2H] over
  ``[hidden_layernorm(h) ; token_layernorm(e)]`` (hidden first), the decoder layer's own weights beside them,
  ``final_layernorm`` and the target's LM head; position 0 zeroed; its output is normed before it is fed back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from .checkpoints import read_weights, weight_files

log = logging.getLogger("specframe")


def mtp_layer_count(config: Any) -> int:
    """MTP modules a transformers ``config`` declares (``num_nextn_predict_layers``, Qwen3-Next's
    ``mtp_num_hidden_layers``), 0 when none."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    return max(int(getattr(cfg, "num_nextn_predict_layers", 0) or 0), int(getattr(cfg, "mtp_num_hidden_layers", 0) or 0))


@dataclass(frozen=True)
class _Layout:
    """Where one published layout keeps module ``i``'s tensors, and how it computes."""

    name: str
    prefix: str  # module i's own tensors: prefix.format(i=i, n=num_hidden_layers)
    names: dict  # our name -> the checkpoint's name under the prefix (or a full key, with a leading "/")
    hidden_first: bool = False  # the projection takes [h ; e] (MiMo) instead of [e ; h]
    zero_first: bool = True  # the embedding at position 0 is zeroed
    norm_out: bool = False  # the module's output is normed before it is fed back and read by the head
    block_prefix: str = ""  # the decoder layer's tensors under the prefix


_LAYOUTS = (
    _Layout("deepseek", "model.layers.{n_i}.", {"enorm": "enorm", "hnorm": "hnorm", "eh_proj": "eh_proj",
                                                  "head_norm": "shared_head.norm", "head": "shared_head.head"}),
    _Layout("qwen3-next", "mtp.layers.{i}.", {"enorm": "/mtp.pre_fc_norm_embedding", "hnorm": "/mtp.pre_fc_norm_hidden",
                                              "eh_proj": "/mtp.fc", "head_norm": "/mtp.norm"},
            zero_first=False, norm_out=True),
    _Layout("mimo", "model.mtp_layers.{i}.", {"enorm": "token_layernorm", "hnorm": "hidden_layernorm",
                                              "eh_proj": "input_proj", "head_norm": "final_layernorm"},
            hidden_first=True, norm_out=True),
)
_OWN = {"enorm", "hnorm", "eh_proj", "head_norm", "head"}


class MtpModule(nn.Module):
    """One MTP module: ``enorm``, ``hnorm``, ``eh_proj``, the decoder layer ``block`` and ``shared_head``."""

    def __init__(self, block: nn.Module, norm_cls: type, hidden: int, eps: float, vocab: int,
                 layout: _Layout = _LAYOUTS[0]) -> None:
        super().__init__()
        self.layout = layout
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
        if m.layout.zero_first:
            e = torch.where((positions == 0)[..., None], torch.zeros_like(e), e)
        parts = [m.hnorm(h), m.enorm(e)] if m.layout.hidden_first else [m.enorm(e), m.hnorm(h)]
        x = m.eh_proj(torch.cat(parts, -1))
        n = x.shape[1]
        past = cache.get_seq_length(module) if len(cache.layers) > module else 0
        mask = torch.zeros((1, 1, n, past + n), dtype=x.dtype, device=x.device)
        mask[..., past:] = torch.full((n, n), float("-inf"), dtype=x.dtype, device=x.device).triu(1)
        rope = self.rotary(x, positions)
        out = m.block(x, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                      position_embeddings=rope)
        a = out[0] if isinstance(out, tuple) else out
        return m.head_norm(a) if m.layout.norm_out else a

    def logits(self, a: Tensor, module: int) -> Tensor:
        m = self.mtp[module]
        return m.head(a if m.layout.norm_out else m.head_norm(a))


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


def _find_layout(keys: set[str], n: int) -> _Layout | None:
    if f"model.layers.{n}.eh_proj.weight" in keys:
        return _LAYOUTS[0]
    if "mtp.fc.weight" in keys:
        return _LAYOUTS[1]
    if "model.mtp_layers.0.input_proj.weight" in keys:
        return _LAYOUTS[2]
    return None


def _module_tensors(state: dict, layout: _Layout, i: int, n: int, head: Tensor) -> tuple[dict, dict]:
    """Module ``i``'s tensors as (ours: enorm/hnorm/eh_proj/head_norm/head weights, the decoder layer's)."""
    pre = layout.prefix.format(i=i, n_i=n + i)
    own = {k[len(pre):]: t for k, t in state.items() if k.startswith(pre)}
    ours: dict = {}
    for name, where in layout.names.items():
        key = where[1:] + ".weight" if where.startswith("/") else where + ".weight"
        ours[name] = state.get(key) if where.startswith("/") else own.pop(key, None)
    if ours.get("head") is None:
        ours["head"] = head  # the target's LM head (Qwen3-Next, MiMo; DeepSeek repeats it)
    own.pop("embed_tokens.weight", None)  # the target's own embedding, repeated
    return ours, own


def load_mtp(model: nn.Module, folder: Path | None = None) -> MtpDrafter:
    """The MTP modules of a loaded transformers ``model`` (its config's ``num_nextn_predict_layers`` or
    ``mtp_num_hidden_layers``), read from the checkpoint folder ``folder`` (default: the folder the model was loaded
    from) in any of the layouts of the module docstring (found from the tensor names).

    Raises:
        ConfigError: the config declares no MTP layers, the folder has no weights or they lack a module's tensors."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    count = mtp_layer_count(cfg)
    if count < 1:
        raise ConfigError(f"the target's config declares no MTP layers (num_nextn_predict_layers is "
                          f"{getattr(cfg, 'num_nextn_predict_layers', None)}): mtp needs a checkpoint that carries "
                          f"them (DeepSeek-V3/R1, GLM-4.5, Qwen3-Next, Qwen3.5, MiMo)")
    folder = Path(folder or getattr(model.config, "_name_or_path", "") or "")
    if not folder.is_dir():
        raise ConfigError(f"mtp reads the MTP layers from the target's checkpoint folder, and {str(folder)!r} is none: "
                          f"set `checkpoint: DIR` to the model's folder")
    n, h, v = int(cfg.num_hidden_layers), int(cfg.hidden_size), int(cfg.vocab_size)
    starts = tuple(f"model.layers.{n + i}." for i in range(count)) + ("mtp.", "model.mtp_layers.")
    state = read_weights(weight_files(folder), keep=lambda k: k.startswith(starts))
    layout = _find_layout(set(state), n)
    if layout is None:
        raise ConfigError(f"{folder}: the checkpoint has none of the MTP layouts mtp reads (model.layers.{n}.eh_proj "
                          f"as DeepSeek-V3, mtp.fc as Qwen3-Next / Qwen3.5, model.mtp_layers.0.input_proj as MiMo)")
    layer_cls, norm_cls, rotary = _decoder_parts(model)
    kinds = getattr(cfg, "layer_types", None)
    if kinds is not None:  # the MTP layers are full-attention layers after the last decoder layer
        cfg = _with_changes(cfg, layer_types=list(kinds) + ["full_attention"] * count)
    eps = float(getattr(cfg, "rms_norm_eps", 1e-6))
    modules = []
    for i in range(count):
        ours, own = _module_tensors(state, layout, i, n, model.get_output_embeddings().weight.detach())
        absent = sorted(k for k in _OWN if ours.get(k) is None)
        if absent or not own:
            raise ConfigError(f"{folder}: MTP module {i} ({layout.name} layout) lacks "
                              f"{', '.join(absent) if absent else 'its decoder layer'}")
        block = layer_cls(cfg, n + i)
        for attn in ("self_attn", "attention"):
            if hasattr(block, attn):
                getattr(block, attn).layer_idx = i  # its own entry in the drafter's cache
        m = MtpModule(block, norm_cls, h, eps, v, layout)
        mapped = {f"{k}.weight": t for k, t in ours.items()}
        mapped.update({"block." + k: t for k, t in own.items()})
        missing, unexpected = m.load_state_dict(mapped, strict=False)
        if missing or unexpected:
            raise ConfigError(f"{folder}: MTP module {i} ({layout.name} layout) does not match the target's layer "
                              f"(missing {missing[:4]}, unexpected {unexpected[:4]})")
        modules.append(m)
    dev, dtype = model.get_input_embeddings().weight.device, model.get_input_embeddings().weight.dtype
    drafter = MtpDrafter(modules, rotary, model.get_input_embeddings())
    drafter.mtp.to(device=dev, dtype=dtype)
    log.info("MTP: %d module(s) from %s (%s layout)", count, folder, layout.name)
    return drafter.eval()


def _with_changes(cfg: Any, **changes: Any) -> Any:
    """A copy of a transformers config with ``changes``."""
    import copy

    out = copy.deepcopy(cfg)
    for k, val in changes.items():
        setattr(out, k, val)
    return out
