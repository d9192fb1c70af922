"""DFlash and DFlash2 block drafters (DFlash: "Block Diffusion for Flash Speculative Decoding", arXiv 2602.06036),
read from and written in the layout z-lab publishes them in (``config.json`` + ``model.safetensors``, e.g.
``z-lab/Qwen3-8B-DFlash-b16``; the reference implementation is the ``dflash`` package on PyPI).

A block drafter fills a whole block of draft positions in **one** forward. The block is ``b`` rows: the newest
committed token followed by ``b - 1`` copies of ``mask_token_id``; the output of row ``i >= 1`` is the drafter's
guess for the token ``i`` places after the newest one. The drafter has no embedding and no LM head of its own: it
embeds the block with the target's embedding table and scores its rows with the target's LM head. What tells it the
context is the target's own hidden states at every committed position, fused once and read by every draft layer as
extra keys and values::

    c_t  = hidden_norm(fc([f_t^(l_1) ; ... ; f_t^(l_F)]))     f^(l): the output of target decoder layer l
                                                             (``target_layer_ids``, 0-based; transformers'
                                                             hidden_states[l + 1]); fc [H, F·H], no bias
    x    = E[block] · input_embedding_scale                 [b, H]; E the target's embedding table (its rows, as
                                                             stored: no scaling the embedding module may add)
    per draft layer (Qwen3-style, pre-norm):
        y    = input_layernorm(x)
        q    = RoPE(q_norm(q_proj(y)))                       block rows at positions T-1 .. T-2+b
        k, v = RoPE(k_norm(k_proj([c ; y]))), v_proj([c ; y])   context rows at 0 .. T-2, then the block rows
        x    = x + o_proj(softmax(q k^T / sqrt(d)) v)        no causal mask: each block row sees the whole context
                                                             and the whole block (``layer_types`` with
                                                             ``sliding_window``, or ``is_causal``, may restrict it)
        x    = x + mlp(post_attention_layernorm(x))
    logits = lm_head(norm(x)[1:]) · output_multiplier       then ``s · tanh(logits / s)`` when
                                                             ``final_logit_softcapping`` s is set

(``T`` committed tokens: the target has run the first ``T - 1``; the newest is the block's first row.) The context
rows only give keys and values — the same ``c`` in every layer, projected by that layer — so they are computed
once per committed position and cached; a step adds the rows committed since the last step, and the block's rows,
which are recomputed each step, are written after them (and overwritten by the next step).

**DFlash2** adds two pieces.

- Per draft layer, two grouped dynamic causal convolutions along the block (``attention_conv`` around attention,
  ``mlp_conv`` around the MLP). Each reads the normed input ``y`` of its sub-layer: a projection of ``y_t`` gives
  per-row kernels ``D_t = W_k y_t`` of shape [2, K, G] (two sets, K taps, G channel groups of ``conv_group_size``),
  added to per-channel base kernels ``base [2, K, H]``. The first set filters the sub-layer's input, the second its
  output::

      conv_j(z)_t[c] = sum_{o < K} (base[j, o, c] + D_t[j, o, g(c)]) · z_{t-o}[c]     (z before the block: 0)
      x = x + conv_1(Attention(conv_0(y)))          (and the same around the MLP, with its own weights)

- A candidate selector after the LM head that makes the block's tokens agree along the chain: at draft row ``i``
  the ``selector_top_k`` best tokens ``C_i`` by logit ``u_i`` are re-scored by a low-rank bilinear term in the token
  chosen before::

      score_i(c) = u_i[c] + < P[prev] ⊙ (W_h h_i) , S[c] >      P, S: [V, r] codebooks, W_h: [r, H], h_i = norm(x)_i
      prev = the token chosen at row i - 1 (the newest committed token for row 1)

  Greedy drafting takes the best score at each row; sampling draws from the warped ``score_i`` over ``C_i``. The
  block's scores are therefore causal within the block, not independent per-slot marginals.

Layout (both versions): a Qwen3 layer config — ``hidden_size`` (the target's), ``num_attention_heads``,
``num_key_value_heads``, ``head_dim``, ``intermediate_size``, ``hidden_act``, ``rms_norm_eps``, RoPE
(``rope_theta`` / ``rope_scaling`` or ``rope_parameters``), ``num_hidden_layers`` (draft layers), ``layer_types``,
``sliding_window``, ``attention_bias`` — with ``num_target_layers`` and ``dflash_config``: ``target_layer_ids``,
``mask_token_id``, ``block_size`` and optionally ``input_embedding_scale``, ``output_multiplier``,
``final_logit_softcapping``; DFlash2 (``architectures: ["DFlash2DraftModel"]``) adds ``conv_kernel_size``,
``conv_group_size``, ``selector_rank`` and ``selector_top_k``. Each of these is read from ``dflash_config`` first,
then from the top level (z-lab's DFlash checkpoints keep ``block_size`` at the top level). Weights::

    layers.{j}.self_attn.{q,k,v,o}_proj.weight (and .bias with attention_bias), layers.{j}.self_attn.{q,k}_norm.weight
    layers.{j}.mlp.{gate,up,down}_proj.weight, layers.{j}.{input,post_attention}_layernorm.weight
    fc.weight [H, F·H], hidden_norm.weight [H], norm.weight [H]
    DFlash2: layers.{j}.{attention,mlp}_conv.base_kernel [2, K, H], ...kernel_projection.weight [2·K·H/group, H],
             candidate_selector.{predecessor,successor}_codebook [V, r] (published without ``.weight``; read either
             way), candidate_selector.hidden_projection.weight [r, H]
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError
from .checkpoints import log, mismatch, read_config, read_weights, weight_files
from .eagle_drafter import KVBuffer

DFLASH, DFLASH2 = "dflash", "dflash2"
ARCHITECTURES = {DFLASH: "DFlashDraftModel", DFLASH2: "DFlash2DraftModel"}
CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")
_DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
_NOT_LAYER_FIELDS = ("architectures", "auto_map", "dflash_config", "transformers_version", "_name_or_path")


def default_target_layers(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """The target layers a DFlash drafter reads when its config names none: the middle layer for a one-layer
    drafter, else one layer per draft layer, spread evenly from layer 1 to layer ``L - 3`` (each rounded to the
    nearest integer, halves to even as Python's ``round``)."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    first, last = 1, num_target_layers - 3
    step = (last - first) / (num_draft_layers - 1)
    return tuple(int(round(first + i * step)) for i in range(num_draft_layers))


@dataclass
class DFlashSpec:
    """What a DFlash ``config.json`` says, in one place (see the module docstring for each field).

    Attributes:
        kind: ``"dflash"`` or ``"dflash2"``.
        layer_cfg: the draft layers' transformers ``Qwen3Config`` (its RoPE, ``layer_types``, ``sliding_window``
            and ``is_causal`` are those the layers use).
        target_layer_ids: 0-based target decoder layers whose outputs ``fc`` reads, in ``fc``'s input order.
    """

    kind: str
    layer_cfg: Any
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None
    block_size: int
    mask_token_id: int
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0
    vocab_size: int | None = None  # ``vocab_size`` as the config gives it (None: not given)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The transformers ``hidden_states`` indices of ``target_layer_ids`` (the output of layer ``l`` is entry
        ``l + 1``): what a proposer asks the engine for (``DecodeState.features``)."""
        return tuple(i + 1 for i in self.target_layer_ids)

    def attention_kind(self, layer: int) -> tuple[bool, int | None]:
        """``(causal, window)`` of draft layer ``layer``: a ``sliding_attention`` layer is causal with its
        ``sliding_window`` unless ``is_causal`` says otherwise; any other layer sees the whole block, unless
        ``is_causal`` is true."""
        cfg = self.layer_cfg
        types = getattr(cfg, "layer_types", None)
        sliding = bool(types) and types[layer] == "sliding_attention"
        flag = getattr(cfg, "is_causal", None)
        causal = sliding if flag is None else bool(flag)
        window = getattr(cfg, "sliding_window", None) if sliding else None
        return causal, (int(window) if window else None)


def _value(config: dict, name: str, default: Any = None) -> Any:
    """``dflash_config[name]``, else ``config[name]``, else ``default``."""
    inner = config.get("dflash_config") or {}
    return inner[name] if name in inner else config.get(name, default)


def _kind(folder: Path, config: dict) -> str:
    """``"dflash2"`` when the config names DFlash2's architecture or its fields, else ``"dflash"``.

    Raises:
        ConfigError: a speculators checkpoint (another layout), or half of DFlash2's fields."""
    if config.get("speculators_model_type"):
        raise ConfigError(f"{folder} is a speculators {config['speculators_model_type']!r} checkpoint; the dflash "
                          f"proposer reads z-lab's DFlash layout (config.json with dflash_config)")
    arch = " ".join(config.get("architectures") or [])
    have = [f for f in _DFLASH2_FIELDS if _value(config, f) is not None]
    if "DFlash2" in arch or len(have) == len(_DFLASH2_FIELDS):
        missing = [f for f in _DFLASH2_FIELDS if f not in have]
        if missing:
            raise ConfigError(f"{folder}/config.json describes a DFlash2 drafter but lacks dflash_config."
                              f"{missing[0]}")
        return DFLASH2
    return DFLASH


def read_spec(folder: Path, config: dict | None = None) -> DFlashSpec:
    """The :class:`DFlashSpec` of the checkpoint in ``folder`` (its ``config.json``, or ``config`` when given).

    Raises:
        ConfigError: not a DFlash config (no ``dflash_config`` and no ``block_size``), no ``mask_token_id``, a
            ``block_size`` below 2, a ``target_layer_ids`` that is not a list of integers, DFlash2 fields that do
            not fit (``hidden_size`` not a multiple of ``conv_group_size``), each naming the field."""
    from transformers import Qwen3Config

    config = read_config(folder) if config is None else config
    if not isinstance(config.get("dflash_config"), dict) and "block_size" not in config:
        raise ConfigError(f"{folder}/config.json describes no DFlash drafter (no dflash_config, no block_size)")
    kind = _kind(folder, config)
    fields = {k: v for k, v in config.items() if k not in _NOT_LAYER_FIELDS}
    try:
        layer_cfg = Qwen3Config(**fields)
    except Exception as e:  # noqa: BLE001 - transformers' own checks of the layer fields (layer_types, RoPE, ...)
        raise ConfigError(f"{folder}/config.json: {str(e).splitlines()[-1].strip()}") from None
    n_layers = int(layer_cfg.num_hidden_layers)
    n_target = config.get("num_target_layers")
    ids = _value(config, "target_layer_ids")
    if ids is None:
        if n_target is None:
            raise ConfigError(f"{folder}/config.json names neither dflash_config.target_layer_ids nor "
                              f"num_target_layers: which target layers the drafter reads is unknown")
        ids = default_target_layers(int(n_target), n_layers)
    if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(i, int) and not isinstance(i, bool)
                                                                for i in ids):
        raise ConfigError(f"{folder}/config.json: dflash_config.target_layer_ids must be a list of layer numbers, "
                          f"not {ids!r}")
    mask = _value(config, "mask_token_id")
    if not isinstance(mask, int) or isinstance(mask, bool):
        raise ConfigError(f"{folder}/config.json: dflash_config.mask_token_id must be a token id, not {mask!r}")
    block = int(_value(config, "block_size", 16))
    if block < 2:
        raise ConfigError(f"{folder}/config.json: dflash_config.block_size is {block}; a block holds the newest "
                          f"token and at least one draft position (2 or more)")
    cap = _value(config, "final_logit_softcapping")
    spec = DFlashSpec(
        kind, layer_cfg, tuple(int(i) for i in ids), None if n_target is None else int(n_target), block, int(mask),
        float(_value(config, "input_embedding_scale", 1.0)), float(_value(config, "output_multiplier", 1.0)),
        None if cap is None or float(cap) <= 0 else float(cap),
        vocab_size=None if config.get("vocab_size") is None else int(config["vocab_size"]))
    if kind == DFLASH2:
        spec.conv_kernel_size, spec.conv_group_size, spec.selector_rank, spec.selector_top_k = (
            int(_value(config, f)) for f in _DFLASH2_FIELDS)
        h = int(layer_cfg.hidden_size)
        if spec.conv_kernel_size < 1 or spec.conv_group_size < 1 or h % spec.conv_group_size:
            raise ConfigError(f"{folder}/config.json: dflash_config.conv_group_size ({spec.conv_group_size}) must "
                              f"divide hidden_size ({h}) and conv_kernel_size ({spec.conv_kernel_size}) be >= 1")
        if spec.selector_rank < 1 or spec.selector_top_k < 1:
            raise ConfigError(f"{folder}/config.json: dflash_config.selector_rank and selector_top_k must be >= 1")
    return spec


# --- the network -------------------------------------------------------------------------------------------------
def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE (rotate-half layout) of ``x [B, heads, n, d]`` with ``cos``/``sin [B, n, d]``."""
    from transformers.models.qwen3.modeling_qwen3 import rotate_half

    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def _visible(n_q: int, n_k: int, causal: bool, window: int | None, device: torch.device) -> Tensor | None:
    """``[n_q, n_k]`` bool (True = may attend) for the block's ``n_q`` rows, the last of ``n_k`` key rows (key row
    ``j`` is position ``j``); None when every row sees every key."""
    if not causal and window is None:
        return None
    q = torch.arange(n_k - n_q, n_k, device=device)[:, None]
    k = torch.arange(n_k, device=device)[None, :]
    ok = torch.ones((n_q, n_k), dtype=torch.bool, device=device)
    if causal:
        ok &= k <= q
    if window is not None:
        ok &= (q - k) < window
        if not causal:
            ok &= (k - q) < window
    return ok


def _blocks_visible(anchors: Tensor, w: int, b: int, causal: bool, window: int | None) -> Tensor:
    """``[N, 1, b, w + b]`` bool (True = may attend) for ``N`` blocks of ``b`` rows anchored at ``anchors [N]``
    over ``w`` context rows (positions ``0 .. w - 1``) and then their own rows: the context rows before the anchor,
    and the block's rows as :func:`_visible` lets a block see them at decoding time."""
    dev = anchors.device
    rows = torch.arange(b, device=dev)
    q = (anchors[:, None] + rows)[:, :, None]  # [N, b, 1] the rows' positions
    k = torch.cat([torch.arange(w, device=dev).expand(len(anchors), w), anchors[:, None] + rows], 1)[:, None]
    ok = torch.cat([(torch.arange(w, device=dev) < anchors[:, None])[:, None].expand(-1, b, -1),
                    torch.ones((len(anchors), b, b), dtype=torch.bool, device=dev)], 2)
    if causal:
        ok &= k <= q
    if window is not None:
        ok &= (q - k) < window
        if not causal:
            ok &= (k - q) < window
    return ok[:, None]


class DynamicConv(nn.Module):
    """DFlash2's grouped dynamic causal convolution along the block (see the module docstring): ``base_kernel
    [2, K, H]`` and ``kernel_projection`` ``[H] -> [2, K, G]`` (G = H / ``group_size`` channel groups)."""

    def __init__(self, hidden: int, kernel_size: int, group_size: int) -> None:
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * kernel_size * (hidden // group_size), bias=False)

    def kernels(self, y: Tensor) -> Tensor:
        """``y [B, n, H]`` -> the per-row dynamic kernels ``[B, n, 2, K, G]``."""
        return self.kernel_projection(y).unflatten(-1, (2, self.kernel_size, -1))

    def filter(self, z: Tensor, dynamic: Tensor, which: int) -> Tensor:
        """Set ``which`` (0: the sub-layer's input, 1: its output) of the convolution over ``z [B, n, H]`` with
        the rows' ``dynamic [B, n, K, G]`` kernels; rows before the block count as zeros. Returns ``[B, n, H]``."""
        b, n, h = z.shape
        groups = h // self.group_size
        zg = z.view(b, n, groups, self.group_size)
        out = torch.zeros_like(zg)
        for o in range(min(self.kernel_size, n)):  # a tap reaching before the block's first row adds nothing
            shifted = zg if o == 0 else F.pad(zg[:, : n - o], (0, 0, 0, 0, o, 0))
            out = out + self.base_kernel[which, o].view(1, 1, groups, self.group_size).to(z.dtype) * shifted
            out = out + dynamic[:, :, o, :, None] * shifted
        return out.view(b, n, h)


class DFlashAttention(nn.Module):
    """Grouped-query attention of the block's rows over the context rows and themselves (Qwen3 projections with
    per-head q/k RMSNorm before RoPE)."""

    def __init__(self, cfg: Any, causal: bool, window: int | None) -> None:
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

        h = int(cfg.hidden_size)
        self.heads, self.kv_heads = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or h // self.heads)
        bias = bool(getattr(cfg, "attention_bias", False))
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.causal, self.window = causal, window

    def queries(self, y: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """``y [B, n, H]`` normed rows at the positions of ``cos``/``sin [B, n, d]`` -> queries ``[B, heads, n, d]``."""
        b, n, _ = y.shape
        return _rotate(self.q_norm(self.q_proj(y).view(b, n, self.heads, self.head_dim)).transpose(1, 2), cos, sin)

    def keys_values(self, src: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """``src [B, m, H]`` rows (fused context rows or normed block rows) at the positions of ``cos``/``sin``
        -> their keys (RoPE applied) and values, ``[B, kv_heads, m, d]`` each."""
        b, m, _ = src.shape
        k = self.k_norm(self.k_proj(src).view(b, m, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(src).view(b, m, self.kv_heads, self.head_dim).transpose(1, 2)
        return _rotate(k, cos, sin), v

    def attend(self, q: Tensor, keys: Tensor, vals: Tensor, mask: Tensor | None) -> Tensor:
        """Attention of ``q [B, heads, n, d]`` over ``keys``/``vals [B, kv_heads, m, d]`` (``mask``: True = may
        attend, broadcast to ``[B, heads, n, m]``; None: every key) and the output projection: ``[B, n, H]``."""
        b, _, n, _ = q.shape
        out = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))

    def forward(self, y: Tensor, ctx: Tensor, cos: Tensor, sin: Tensor, kv: KVBuffer | None, start: int) -> Tensor:
        """``y [B, b, H]`` the block's normed rows, ``ctx [B, c, H]`` the new fused context rows (positions
        ``start .. start + c - 1``, the block after them); ``cos``/``sin [B, c + b, d]``; ``kv`` holds the keys and
        values of positions ``0 .. start - 1`` (the new rows are written after them), or None (``start`` must then
        be 0). Returns ``[B, b, H]``."""
        n = y.shape[1]
        q = self.queries(y, cos[:, -n:], sin[:, -n:])
        k, v = self.keys_values(torch.cat([ctx, y], 1), cos, sin)
        keys, vals = kv.write(start, k, v) if kv is not None else (k, v)
        return self.attend(q, keys, vals, _visible(n, keys.shape[2], self.causal, self.window, y.device))

    def blocks(self, y: Tensor, ctx_kv: tuple[Tensor, Tensor], seq: Tensor, cos: Tensor, sin: Tensor,
               visible: Tensor) -> Tensor:
        """Many blocks at once (training): ``y [N, b, H]`` the blocks' normed rows at the positions of
        ``cos``/``sin [N, b, d]``; ``ctx_kv``: the keys and values ``[S, kv_heads, W, d]`` of ``S`` sequences'
        context rows; block ``j`` reads sequence ``seq[j]``'s; ``visible [N, 1, b, W + b]`` (True = may attend)
        over that sequence's context rows, then the block's own rows (:func:`_blocks_visible`). Returns
        ``[N, b, H]``."""
        k, v = self.keys_values(y, cos, sin)
        keys, vals = torch.cat([ctx_kv[0][seq], k], 2), torch.cat([ctx_kv[1][seq], v], 2)
        return self.attend(self.queries(y, cos, sin), keys, vals, visible)


class DFlashLayer(nn.Module):
    """One draft layer: pre-norm attention over [context ; block] and a SwiGLU MLP; DFlash2's convolutions around
    each when ``conv`` is ``(kernel_size, group_size)``."""

    def __init__(self, cfg: Any, causal: bool, window: int | None, conv: tuple[int, int] | None) -> None:
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm

        h = int(cfg.hidden_size)
        self.self_attn = DFlashAttention(cfg, causal, window)
        self.mlp = Qwen3MLP(cfg)
        self.input_layernorm = Qwen3RMSNorm(h, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(h, eps=cfg.rms_norm_eps)
        self.attention_conv = DynamicConv(h, *conv) if conv else None
        self.mlp_conv = DynamicConv(h, *conv) if conv else None

    @staticmethod
    def _around(conv: DynamicConv | None, y: Tensor, sublayer: Any) -> Tensor:
        if conv is None:
            return sublayer(y)
        dyn = conv.kernels(y)
        return conv.filter(sublayer(conv.filter(y, dyn[:, :, 0], 0)), dyn[:, :, 1], 1)

    def forward(self, x: Tensor, ctx: Tensor, cos: Tensor, sin: Tensor, kv: KVBuffer | None, start: int) -> Tensor:
        return self.run(x, lambda y: self.self_attn(y, ctx, cos, sin, kv, start))

    def run(self, x: Tensor, attention: Any) -> Tensor:
        """The layer over the block rows ``x [B, b, H]``, ``attention`` mapping its normed rows to the attention
        output (:meth:`DFlashAttention.forward` at decoding time, :meth:`DFlashAttention.blocks` in training)."""
        x = x + self._around(self.attention_conv, self.input_layernorm(x), attention)
        return x + self._around(self.mlp_conv, self.post_attention_layernorm(x), self.mlp)


class CandidateSelector(nn.Module):
    """DFlash2's selector: re-scores each draft row's ``top_k`` LM-head candidates by a bilinear term in the token
    chosen at the row before (see the module docstring)."""

    def __init__(self, vocab: int, hidden: int, rank: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Embedding(vocab, rank)
        self.successor_codebook = nn.Embedding(vocab, rank)
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)

    def candidates(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """``logits [B, n, V]`` -> ``(unary [B, n, k], ids [B, n, k])``, the ``top_k`` best per row."""
        return logits.topk(min(self.top_k, logits.shape[-1]), dim=-1)

    def scores(self, projected: Tensor, prev: Tensor, unary: Tensor, ids: Tensor) -> Tensor:
        """One row's candidate scores ``[B, k]``: ``projected [B, r]`` (``hidden_projection`` of the row),
        ``prev [B]`` the token chosen before, ``unary``/``ids [B, k]`` the row's candidates."""
        pair = self.predecessor_codebook(prev) * projected  # [B, r]
        return unary + torch.einsum("br,bkr->bk", pair, self.successor_codebook(ids))

    def greedy(self, hidden: Tensor, logits: Tensor, anchor: Tensor) -> Tensor:
        """The best-scoring chain: ``hidden [B, n, H]`` the draft rows' outputs, ``logits [B, n, V]``, ``anchor
        [B]`` the newest committed token. Returns ``[B, n]`` int64 token ids."""
        unary, ids = self.candidates(logits)
        projected = self.hidden_projection(hidden)
        prev, out = anchor, []
        for i in range(hidden.shape[1]):
            best = self.scores(projected[:, i], prev, unary[:, i], ids[:, i]).argmax(-1)
            prev = ids[:, i].gather(-1, best[:, None])[:, 0]
            out.append(prev)
        return torch.stack(out, 1)


class DFlashDrafter(nn.Module):
    """A DFlash or DFlash2 drafter (see the module docstring). Built by :func:`load_dflash` or :meth:`new`.

    Attributes:
        spec: the config it was built from.
        feature_layers: ``hidden_states`` indices the drafter reads (``target_layer_ids`` + 1), in ``fc``'s order.
        block_size: rows of a full block (the newest token and ``block_size - 1`` draft rows).
        mask_token_id: the token id filling the draft rows.
    """

    def __init__(self, spec: DFlashSpec) -> None:
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding

        cfg = spec.layer_cfg
        h = int(cfg.hidden_size)
        self.spec = spec
        conv = (spec.conv_kernel_size, spec.conv_group_size) if spec.kind == DFLASH2 else None
        self.layers = nn.ModuleList(DFlashLayer(cfg, *spec.attention_kind(j), conv)
                                    for j in range(int(cfg.num_hidden_layers)))
        self.norm = Qwen3RMSNorm(h, eps=cfg.rms_norm_eps)
        self.fc = nn.Linear(len(spec.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = Qwen3RMSNorm(h, eps=cfg.rms_norm_eps)
        self.rotary = Qwen3RotaryEmbedding(cfg)
        vocab = spec.vocab_size or int(cfg.vocab_size)
        self.candidate_selector = (CandidateSelector(vocab, h, spec.selector_rank, spec.selector_top_k)
                                   if spec.kind == DFLASH2 else None)
        self.feature_layers = spec.feature_layers
        self.block_size, self.mask_token_id = spec.block_size, spec.mask_token_id
        self.meta: dict = {}

    @property
    def hidden_size(self) -> int:
        return int(self.spec.layer_cfg.hidden_size)

    def new_kv(self) -> list[KVBuffer]:
        """Empty per-layer key/value buffers for :meth:`forward`'s ``kv``."""
        return [KVBuffer() for _ in self.layers]

    def fuse(self, feats: Tensor) -> Tensor:
        """``feats [B, n, F, H]`` (the target's hidden states of ``feature_layers``, in that order) -> the context
        rows ``c [B, n, H]`` (``hidden_norm(fc(concat))``), in the drafter's dtype."""
        return self.hidden_norm(self.fc(feats.to(self.fc.weight.dtype).flatten(-2)))

    def embed(self, block: Tensor, table: Tensor) -> Tensor:
        """``block [B, b]`` int64 token ids -> ``[B, b, H]``: rows of the target's embedding ``table [V, H]`` times
        ``input_embedding_scale``."""
        return F.embedding(block, table).to(self.fc.weight.dtype) * self.spec.input_embedding_scale

    def forward(self, ctx: Tensor, embeds: Tensor, start: int = 0, kv: list[KVBuffer] | None = None) -> Tensor:
        """One forward over a whole block.

        Args:
            ctx: ``[B, c, H]`` fused context rows (:meth:`fuse`) of positions ``start .. start + c - 1``; ``c`` may
                be 0 when ``kv`` already holds every committed position.
            embeds: ``[B, b, H]`` the block's embeddings (:meth:`embed`), at positions ``start + c ..``.
            start: the position of ``ctx``'s first row.
            kv: per-layer buffers holding positions ``0 .. start - 1``; the new context rows are kept there (and the
                block's rows written after them, to be overwritten by the next call). None: no cache, ``start``
                must be 0 (``ctx`` is the whole context).

        Returns:
            ``[B, b, H]``, the block rows after the final norm (row 0 is the newest token's; rows ``1 ..`` draft).
        """
        if kv is None and start:
            raise ValueError("a forward without a key/value cache starts at position 0")
        b, c, n = embeds.shape[0], ctx.shape[1], embeds.shape[1]
        pos = torch.arange(start, start + c + n, device=embeds.device)[None].expand(b, -1)
        cos, sin = self.rotary(embeds, pos)
        x = embeds
        ctx = ctx.to(embeds.dtype)
        for j, layer in enumerate(self.layers):
            x = layer(x, ctx, cos, sin, None if kv is None else kv[j], start)
        return self.norm(x)

    def forward_blocks(self, ctx: Tensor, embeds: Tensor, seq: Tensor, anchors: Tensor) -> Tensor:
        """Many blocks over shared contexts in one forward, for training (DFlash's multi-anchor training: each
        block sees the target's context rows before its anchor and its own rows, and no other block).

        Args:
            ctx: ``[S, W, H]`` fused context rows (:meth:`fuse`) of ``S`` sequences, positions ``0 .. W - 1``.
            embeds: ``[N, b, H]`` the blocks' embeddings (:meth:`embed`; row 0 the anchor token, then masks).
            seq: ``[N]`` int64, the sequence each block belongs to.
            anchors: ``[N]`` int64, the position of each block's first row in its sequence.

        Returns:
            ``[N, b, H]`` after the final norm: block ``j`` as :meth:`forward` gives it from
            ``ctx[seq[j], :anchors[j]]`` (same weights, same positions; up to rounding).
        """
        s, w = ctx.shape[:2]
        b = embeds.shape[1]
        dev = embeds.device
        cos_c, sin_c = self.rotary(embeds, torch.arange(w, device=dev)[None].expand(s, -1))
        cos_b, sin_b = self.rotary(embeds, anchors[:, None] + torch.arange(b, device=dev))
        ctx = ctx.to(embeds.dtype)
        x = embeds
        for layer in self.layers:
            att = layer.self_attn
            visible = _blocks_visible(anchors, w, b, att.causal, att.window)
            ctx_kv = att.keys_values(ctx, cos_c, sin_c)
            x = layer.run(x, lambda y, att=att, ctx_kv=ctx_kv, visible=visible:
                          att.blocks(y, ctx_kv, seq, cos_b, sin_b, visible))
        return self.norm(x)

    def logits(self, rows: Tensor, head: nn.Module) -> Tensor:
        """``rows [..., H]`` -> ``[..., V]``: the target's LM ``head`` times ``output_multiplier``, soft-capped when
        the config says so."""
        out = head(rows)
        if self.spec.output_multiplier != 1.0:
            out = out * self.spec.output_multiplier
        cap = self.spec.final_logit_softcapping
        return out if cap is None else torch.tanh(out / cap) * cap

    def draft_greedy(self, rows: Tensor, logits: Tensor, anchor: Tensor) -> Tensor:
        """The greedy block: per-row argmax (DFlash), or the selector's best chain from ``anchor [B]`` (DFlash2).
        ``rows [B, n, H]`` and ``logits [B, n, V]`` of the draft rows. Returns ``[B, n]`` int64."""
        if self.candidate_selector is None:
            return logits.argmax(-1)
        return self.candidate_selector.greedy(rows, logits, anchor)

    def draft_scored(self, rows: Tensor, logits: Tensor, anchor: Tensor, others: int
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The greedy block with its scores and ``others`` candidates per row, for
        :func:`specframe.block_drafts.block_tree`. Row 0 of ``rows [1, n, H]`` / ``logits [1, n, V]``; ``anchor [1]``.

        Returns ``(chain [n] int64, chain_scores [n] float32, candidates [n, others] int64, candidate_scores [n,
        others] float32)``: DFlash scores each row by its softmax (a per-slot marginal: the rows read mask tokens);
        DFlash2 by the selector's softmax over the row's candidates given the chain's token before (causal in the
        block). The chain is :meth:`draft_greedy`'s."""
        sel = self.candidate_selector
        if sel is None:
            probs = logits[0].float().softmax(-1)  # [n, V]
            top = probs.topk(min(others + 1, probs.shape[-1]), dim=-1)
            chain = logits[0].argmax(-1)
            return chain, probs.gather(-1, chain[:, None])[:, 0], top.indices, top.values
        unary, ids = sel.candidates(logits)
        projected = sel.hidden_projection(rows)
        prev = anchor
        chain, chain_scores, cands, cand_scores = [], [], [], []
        for i in range(rows.shape[1]):
            raw = sel.scores(projected[:, i], prev, unary[:, i], ids[:, i])[0]  # [k]
            best = int(raw.argmax(-1))  # (as draft_greedy: the argmax of the scores in the drafter's dtype)
            p = raw.float().softmax(-1)
            order = [j for j in p.argsort(descending=True).tolist() if j != best]
            prev = ids[:, i, best]
            chain.append(prev[0])
            chain_scores.append(p[best])
            rest = torch.tensor(order[:others], dtype=torch.int64, device=p.device)
            cands.append(ids[0, i, rest])
            cand_scores.append(p[rest])
        return (torch.stack(chain), torch.stack(chain_scores), torch.stack(cands), torch.stack(cand_scores))

    # --- construction -------------------------------------------------------------------------------------------
    @staticmethod
    def new(target_config: Any, kind: str = DFLASH, num_layers: int = 1, target_layer_ids: tuple[int, ...] | None = None,
            block_size: int = 16, mask_token_id: int = 0, seed: int = 0, **fields: Any) -> "DFlashDrafter":
        """A random float32 drafter for the target described by the transformers ``target_config``: its hidden
        size, heads, ``head_dim``, MLP width, RMS epsilon and RoPE, ``num_layers`` draft layers reading
        ``target_layer_ids`` (default: :func:`default_target_layers`). ``fields`` override config values (layer
        fields, or ``dflash_config`` ones such as ``conv_kernel_size``; DFlash2 defaults: kernel 3, group 8, rank 8,
        top-k 8). Weights: normal / sqrt(fan-in) for matrices, 1 + N(0, 0.1) for norms (seeded)."""
        config = dflash_config(target_config, kind, num_layers, target_layer_ids, block_size, mask_token_id, **fields)
        d = DFlashDrafter(read_spec(Path("<new>"), config))
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in d.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
                elif name.endswith("base_kernel"):
                    p.copy_(0.3 * torch.randn(p.shape, generator=gen))
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
        return d.float().eval()


def dflash_config(target_config: Any, kind: str = DFLASH, num_layers: int = 1,
                  target_layer_ids: tuple[int, ...] | None = None, block_size: int = 16, mask_token_id: int = 0,
                  **fields: Any) -> dict:
    """A ``config.json`` dict (z-lab's layout) for a drafter shaped like one decoder layer of the target described
    by ``target_config``; see :meth:`DFlashDrafter.new`."""
    cfg = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    n_target = int(cfg.num_hidden_layers)
    heads = int(cfg.num_attention_heads)
    ids = list(target_layer_ids) if target_layer_ids is not None else list(default_target_layers(n_target, num_layers))
    layer = {"hidden_size": int(cfg.hidden_size), "num_attention_heads": heads,
             "num_key_value_heads": int(getattr(cfg, "num_key_value_heads", None) or heads),
             "head_dim": int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
             "intermediate_size": int(cfg.intermediate_size), "rms_norm_eps": float(getattr(cfg, "rms_norm_eps", 1e-6)),
             "max_position_embeddings": int(getattr(cfg, "max_position_embeddings", 4096)),
             "vocab_size": int(cfg.vocab_size), "hidden_act": str(getattr(cfg, "hidden_act", "silu")),
             "num_hidden_layers": num_layers, "attention_bias": False, "tie_word_embeddings": False}
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict) and "sliding_attention" not in rp:
        layer["rope_parameters"] = dict(rp)
    inner: dict[str, Any] = {"target_layer_ids": ids, "mask_token_id": mask_token_id}
    if kind == DFLASH2:
        inner.update(block_size=block_size, conv_kernel_size=3, conv_group_size=8, selector_rank=8, selector_top_k=8)
    for k, v in fields.items():
        (inner if k in (*_DFLASH2_FIELDS, "input_embedding_scale", "output_multiplier", "final_logit_softcapping")
         else layer)[k] = v
    config = {"architectures": [ARCHITECTURES[kind]], "model_type": "qwen3", **layer, "num_target_layers": n_target,
              "dflash_config": inner}
    if kind == DFLASH:
        config["block_size"] = block_size
    return config


# --- reading and writing the published layout ----------------------------------------------------------------------
def _state(folder: Path) -> dict[str, Tensor]:
    """The weights in ``folder`` under :class:`DFlashDrafter`'s names (the codebooks' published names, without
    ``.weight``, read as the embeddings' ``.weight``)."""
    state = read_weights(weight_files(folder))
    return {(k + ".weight" if k in CODEBOOKS else k): v for k, v in state.items()}


def _check_fit(folder: Path, spec: DFlashSpec, target_hidden: int, target_vocab: int, target_layers: int,
               embed_rows: int) -> None:
    """Raise the one error for a drafter made for another target's shapes, naming the config field."""
    cfg = spec.layer_cfg
    name = "DFlash2" if spec.kind == DFLASH2 else "DFlash"
    if int(cfg.hidden_size) != target_hidden:
        raise mismatch(name, folder, "hidden_size", int(cfg.hidden_size), target_hidden, None)
    bad = [i for i in spec.target_layer_ids if not 0 <= i < target_layers]
    if bad:
        raise mismatch(name, folder, "dflash_config.target_layer_ids", list(spec.target_layer_ids),
                       f"layers 0..{target_layers - 1}", None)
    if spec.num_target_layers is not None and spec.num_target_layers != target_layers:
        raise mismatch(name, folder, "num_target_layers", spec.num_target_layers, target_layers, None)
    if spec.vocab_size is not None and spec.vocab_size not in (target_vocab, embed_rows):
        raise mismatch(name, folder, "vocab_size", spec.vocab_size, target_vocab, None)
    if not 0 <= spec.mask_token_id < embed_rows:
        raise mismatch(name, folder, "dflash_config.mask_token_id", spec.mask_token_id,
                       f"a token id in [0, {embed_rows})", None)


def load_dflash(folder: Path, target_hidden: int, target_vocab: int, target_layers: int,
                embed_rows: int | None = None) -> DFlashDrafter:
    """Load a DFlash or DFlash2 drafter from a checkpoint folder in z-lab's layout, for a target with hidden size
    ``target_hidden``, ``target_vocab`` LM-head rows, ``target_layers`` decoder layers and ``embed_rows``
    embedding rows (default: ``target_vocab``). Returns it in float32, eval mode.

    Raises:
        ConfigError: not a DFlash checkpoint, unreadable weights, weights that do not match its config, or a drafter
            for another target (``hidden_size``, ``dflash_config.target_layer_ids``, ``num_target_layers``,
            ``vocab_size``, ``dflash_config.mask_token_id``): one line naming the field and both sides."""
    spec = read_spec(folder)
    _check_fit(folder, spec, target_hidden, target_vocab, target_layers, embed_rows or target_vocab)
    state = _state(folder)
    fc = state.get("fc.weight")
    want = len(spec.target_layer_ids) * target_hidden
    if fc is not None and tuple(fc.shape) != (target_hidden, want):
        raise ConfigError(f"{folder}: fc.weight is {list(fc.shape)} but dflash_config.target_layer_ids names "
                          f"{len(spec.target_layer_ids)} layers of width {target_hidden} ([{target_hidden}, {want}])")
    drafter = DFlashDrafter(spec)
    own = drafter.state_dict()
    missing = [k for k in own if k not in state and not k.startswith("rotary.")]
    unexpected = [k for k in state if k not in own]
    shapes = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        raise ConfigError(f"{folder}: the weights do not match its config.json (missing {missing[:4]}, unexpected "
                          f"{unexpected[:4]}, other shapes {shapes[:4]})")
    drafter.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    drafter.meta = {"folder": str(folder), "dtype": next(iter(state.values())).dtype}
    log.info("%s drafter %s: %d layer(s), target layers %s, block %d, mask token %d",
             "DFlash2" if spec.kind == DFLASH2 else "DFlash", folder, len(drafter.layers), list(spec.target_layer_ids),
             spec.block_size, spec.mask_token_id)
    return drafter.float().eval()


def _config_of(d: DFlashDrafter) -> dict:
    """``d``'s ``config.json`` in z-lab's layout (legacy ``rope_theta`` / ``rope_scaling`` keys, which transformers
    4 and 5 and the serving engines all read)."""
    spec, cfg = d.spec, d.spec.layer_cfg.to_dict()
    keep = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "rms_norm_eps", "max_position_embeddings", "vocab_size", "hidden_act", "attention_bias",
            "layer_types", "sliding_window", "use_sliding_window", "max_window_layers", "is_causal")
    layer = {k: cfg[k] for k in keep if cfg.get(k) is not None}
    rp = dict(cfg.get("rope_parameters") or {})
    layer["rope_theta"] = float(rp.pop("rope_theta", 10000.0))
    if rp.get("rope_type", "default") != "default":
        layer["rope_scaling"] = rp
    inner: dict[str, Any] = {"target_layer_ids": list(spec.target_layer_ids), "mask_token_id": spec.mask_token_id}
    for k in ("input_embedding_scale", "output_multiplier"):
        if getattr(spec, k) != 1.0:
            inner[k] = getattr(spec, k)
    if spec.final_logit_softcapping is not None:
        inner["final_logit_softcapping"] = spec.final_logit_softcapping
    config = {"architectures": [ARCHITECTURES[spec.kind]], "model_type": "qwen3", **layer,
              "tie_word_embeddings": False}
    if spec.num_target_layers is not None:
        config["num_target_layers"] = spec.num_target_layers
    if spec.kind == DFLASH2:
        inner["block_size"] = spec.block_size
        inner.update({f: getattr(spec, f) for f in _DFLASH2_FIELDS})
    else:
        config["block_size"] = spec.block_size
    config["dflash_config"] = inner
    return config


def save_dflash(d: DFlashDrafter, out: Path, dtype: torch.dtype = torch.float32) -> list[Path]:
    """Write ``d`` to ``out`` in z-lab's layout: ``config.json`` and ``model.safetensors`` (floating tensors in
    ``dtype``; DFlash2's codebooks under their published names, without ``.weight``). Returns the files written."""
    import safetensors.torch

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().to(dtype).contiguous() for k, v in d.state_dict().items()
             if not k.startswith("rotary.")}
    state = {(k[: -len(".weight")] if k[: -len(".weight")] in CODEBOOKS else k): v for k, v in state.items()}
    config = _config_of(d)
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    safetensors.torch.save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return [out / "config.json", out / "model.safetensors"]
