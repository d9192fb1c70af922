"""The EAGLE-3 drafter as published (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language
Models via Training-Time Test"), read from the two layouts the field ships it in:

- **EAGLE-3 native** (SafeAILab/EAGLE, e.g. ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``): a Llama ``config.json`` with
  ``draft_vocab_size`` (and ``target_hidden_size`` when the drafter is narrower than its target); weights
  ``midlayer.*``, ``fc``, ``norm``, ``lm_head``, ``d2t``, ``t2d`` and, for some, ``embed_tokens``;
- **speculators** (vllm-project/speculators, e.g. ``RedHatAI/*-speculator.eagle3``, what ``vllm serve DIR`` reads):
  ``config.json`` with ``speculators_model_type: eagle3``, ``transformer_layer_config`` (a Llama or Qwen3 layer),
  ``draft_vocab_size``, ``norm_before_residual``, ``eagle_aux_hidden_state_layer_ids``, ``speculators_config``
  (``verifier.name_or_path``, ``proposal_methods[].speculative_tokens``); weights ``layers.{i}.*`` and the same
  ``fc``, ``norm``, ``lm_head``, ``d2t``, ``t2d``.

One drafter pass over entry ``t`` (``g_t`` the fused target features, or the drafter's own previous output when
drafting past the committed tokens; ``e_{t+1}`` the embedding of the token after ``t``)::

    g_t  = fc([f_t^(l1) ; f_t^(l2) ; f_t^(l3)])                      fc: [H, 3 H_target], no bias
    x    = [input_layernorm(e_{t+1}) ; hidden_norm(g_t)]              [2H]: the first layer's q/k/v read 2H
    h    = r + o_proj(Attn(q(x), k(x), v(x)))                          r = g_t (hidden_norm(g_t) with
    h    = h + mlp(post_attention_layernorm(h))                             norm_before_residual)
    (further layers: plain pre-norm decoder layers over h)
    q(x_{t+2}) = softmax(lm_head(norm(h)))                             over the draft vocabulary [S]
    target id of draft id i = i + d2t[i]

``f^(l)`` is the stream entering target layer ``l`` (transformers' ``hidden_states[l]``); the default taps are
``(2, L // 2, L - 3)`` of a target with ``L`` layers (EAGLE-3's and vLLM's ``aux_hidden_state_layers``). The rotary
embedding is transformers' for the layer config (so ``rope_scaling`` such as Llama 3.1's ``llama3`` applies as in
the reference). Positions: entry ``t`` sits at position ``t``; RoPE sees only differences, so speculators' ``t + 1``
is the same drafter.

Flags of later speculators releases are read too: ``norm_before_fc`` (one RMSNorm over the concatenated features),
``fc_norm`` (one RMSNorm per feature), ``norm_output`` (the normed output is what feeds the next pass, Eagle 3.1).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from .checkpoints import check_target_name, log, mismatch, read_config, read_weights, weight_files
from .eagle_drafter import attend

NATIVE = "eagle3"  # SafeAILab layout
SPECULATORS = "speculators"
LAYER_TYPES = ("llama", "qwen3")


def default_taps(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's tapped target layers for a target of ``num_layers`` decoder layers: ``(2, L // 2, L - 3)``."""
    return (2, num_layers // 2, num_layers - 3)


def _layer_config(layer_type: str, fields: dict) -> Any:
    """A transformers config of the drafter's decoder layer (Llama or Qwen3)."""
    from transformers import LlamaConfig, Qwen3Config

    if layer_type not in LAYER_TYPES:
        raise ConfigError(f"EAGLE-3 layer type {layer_type!r} is not supported (supported: {', '.join(LAYER_TYPES)})")
    cls = LlamaConfig if layer_type == "llama" else Qwen3Config
    known = {k: v for k, v in fields.items() if not k.startswith("_") and k not in ("architectures", "auto_map")}
    cfg = cls(**known)
    cfg.num_hidden_layers = int(fields.get("num_hidden_layers", 1) or 1)
    cfg.mlp_bias = bool(getattr(cfg, "mlp_bias", False))
    cfg.attention_bias = bool(getattr(cfg, "attention_bias", False))
    return cfg


class Eagle3Attention(nn.Module):
    """Grouped-query self-attention whose q/k/v read ``in_size`` (2H for the first EAGLE-3 layer), with the layer
    config's biases and, for a Qwen3 layer, per-head q/k RMSNorm before RoPE."""

    def __init__(self, cfg: Any, in_size: int, qk_norm: bool) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        self.heads, self.kv_heads = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)
        bias = bool(getattr(cfg, "attention_bias", False))
        self.q_proj = nn.Linear(in_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(in_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(in_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)
        if qk_norm:
            self.q_norm = LlamaRMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
            self.k_norm = LlamaRMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.qk_norm = qk_norm

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], past: tuple[Tensor, Tensor] | None, mask: Tensor | None,
                into: Any = None, at: int = 0) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """``x [B, n, in]``, ``rope`` (cos, sin) ``[B, n, d]``; ``past``/``mask``/``into``/``at`` as
        :meth:`specframe.learned.eagle_drafter.DecoderLayer.forward`. Returns ``(out [B, n, H], (k, v) [B, kv, n, d])``."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), *rope)
        att = attend(q, k, v, past, mask, into, at)
        return self.o_proj(att.transpose(1, 2).reshape(b, n, self.heads * self.head_dim)), (k, v)


class Eagle3Layer(nn.Module):
    """One drafter decoder layer; the first (``first``) reads ``[input_layernorm(e) ; hidden_norm(g)]``."""

    def __init__(self, cfg: Any, first: bool, qk_norm: bool, norm_before_residual: bool) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        h = int(cfg.hidden_size)
        self.first, self.norm_before_residual = first, norm_before_residual
        self.self_attn = Eagle3Attention(cfg, 2 * h if first else h, qk_norm)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
        if first:
            self.hidden_norm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)

    def forward(self, g: Tensor, embeds: Tensor | None, rope: tuple[Tensor, Tensor], past: Any, mask: Tensor | None,
                into: Any = None, at: int = 0) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        if self.first:
            hn = self.hidden_norm(g)
            residual = hn if self.norm_before_residual else g
            x = torch.cat([self.input_layernorm(embeds.to(g.dtype)), hn], -1)
        else:
            residual, x = g, self.input_layernorm(g)
        att, kv = self.self_attn(x, rope, past, mask, into, at)
        h = residual + att
        return h + self.mlp(self.post_attention_layernorm(h)), kv


class Eagle3Drafter(nn.Module):
    """An EAGLE-3 drafter (see the module docstring). Built by :func:`load_eagle3` or :meth:`new`.

    Attributes:
        feature_layers: the target ``hidden_states`` indices fused by ``fc``, in ``fc``'s input order.
        token_map: ``[S]`` int64, the target id of each draft id (``arange(S) + d2t``).
        meta: where it came from (format, verifier name, speculative tokens), for export and the model card.
    """

    def __init__(self, layer_cfg: Any, layer_type: str, feature_layers: tuple[int, ...], draft_vocab: int,
                 target_vocab: int, target_hidden: int, own_embed: bool = False, norm_before_residual: bool = False,
                 norm_before_fc: bool = False, fc_norm: bool = False, norm_output: bool = False) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        self.layer_cfg, self.layer_type = layer_cfg, layer_type
        h, nf = int(layer_cfg.hidden_size), len(feature_layers)
        self.hidden_size, self.target_hidden = h, target_hidden
        self.feature_layers = tuple(int(i) for i in feature_layers)
        self.flags = {"norm_before_residual": norm_before_residual, "norm_before_fc": norm_before_fc,
                      "fc_norm": fc_norm, "norm_output": norm_output}
        qk = layer_type == "qwen3"
        self.embed_tokens = nn.Embedding(target_vocab, h) if own_embed else None
        self.input_norm = LlamaRMSNorm(nf * target_hidden, eps=layer_cfg.rms_norm_eps) if norm_before_fc else None
        self.fc_norm = nn.ModuleList(LlamaRMSNorm(target_hidden, eps=layer_cfg.rms_norm_eps) for _ in range(nf)) \
            if fc_norm else None
        self.fc = nn.Linear(nf * target_hidden, h, bias=False)
        self.layers = nn.ModuleList(Eagle3Layer(layer_cfg, i == 0, qk, norm_before_residual)
                                    for i in range(layer_cfg.num_hidden_layers))
        self.norm = LlamaRMSNorm(h, eps=layer_cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(target_vocab, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(layer_cfg)
        self.norm_output = norm_output
        self.target_embed: nn.Module | None = None  # the target's input embedding, when there is no own one
        self.meta: dict = {}

    # --- the interface the eagle proposer drives ------------------------------------------------------------
    @property
    def token_map(self) -> Tensor:
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def new_kv(self) -> list:
        from .eagle_drafter import KVBuffer

        return [KVBuffer() for _ in self.layers]

    def embed(self, tokens: Tensor) -> Tensor:
        """``tokens [B, n]`` int64 target ids -> ``[B, n, H]``: the drafter's own embedding, else the target's."""
        table = self.embed_tokens if self.embed_tokens is not None else self.target_embed
        if table is None:
            raise ConfigError("this EAGLE-3 drafter has no embedding of its own and none was borrowed from the target")
        return table(tokens)

    def fuse(self, feats: Tensor) -> Tensor:
        """``feats [..., F, H_target]`` (in ``feature_layers`` order) -> ``g [..., H]``."""
        x = feats.to(self.fc.weight.dtype)
        if self.fc_norm is not None:
            x = torch.cat([norm(x[..., i, :]) for i, norm in enumerate(self.fc_norm)], -1)
        else:
            x = x.flatten(-2)
            if self.input_norm is not None:
                x = self.input_norm(x)
        return self.fc(x)

    def step(self, g: Tensor, tokens: Tensor, positions: Tensor, mask: Tensor | None, kv: list | None = None,
             at: int = 0, past: list | None = None) -> tuple[Tensor, list]:
        """One pass over ``n`` entries: ``g [B, n, H]`` (fused features or own previous outputs), ``tokens [B, n]``
        (the token after each entry), ``positions [B, n]`` int64; keys/values go to ``kv`` (one
        :class:`~specframe.learned.eagle_drafter.KVBuffer` per layer) at ``at``, or extend ``past`` (a list of
        ``(k, v)`` per layer). Returns ``(a [B, n, H], [(k, v)] per layer)``; ``a`` feeds the next pass."""
        return self._run(g, self.embed(tokens), positions, mask, kv, at, past)

    def _run(self, g: Tensor, embeds: Tensor, positions: Tensor, mask: Tensor | None, kv: list | None, at: int,
             past: list | None) -> tuple[Tensor, list]:
        cos, sin = self.rotary(g, positions)
        h, kvs = g, []
        for i, layer in enumerate(self.layers):
            h, new = layer(h, embeds, (cos, sin), None if past is None else past[i], mask,
                           None if kv is None else kv[i], at)
            kvs.append(new)
        return (self.norm(h) if self.norm_output else h), kvs

    def logits(self, a: Tensor, head_rows: Tensor | None = None) -> Tensor:
        """``a [..., H]`` -> logits ``[..., S]`` over the draft vocabulary (``head_rows`` is ignored: the head is
        the drafter's own)."""
        return self.lm_head(a if self.norm_output else self.norm(a))

    # --- training-time test (for ``specframe train eagle --arch eagle3``) ----------------------------------
    def fuse_features(self, feats: Tensor) -> Tensor:
        return self.fuse(feats)

    def unrolled(self, g: Tensor, embeds: Tensor, steps: int, valid: Tensor | None = None) -> list[Tensor]:
        """As :meth:`specframe.learned.eagle_drafter.EagleDrafter.unrolled`: ``steps`` passes ``[B, T, H]``, pass
        ``j`` reading its own pass ``j - 1`` output shifted one position right, with the diagonal mask."""
        b, t, _ = g.shape
        pos = torch.arange(t, device=g.device).expand(b, t)
        idx = torch.arange(t, device=g.device)
        outs: list[Tensor] = []
        pasts: list[list] = [[] for _ in self.layers]
        inp = g
        for j in range(1, steps + 1):
            if j > 1:
                inp = torch.cat([torch.zeros_like(outs[-1][:, :1]), outs[-1][:, :-1]], 1)
            blocks = [idx[None, :] <= (idx[:, None] - j + 1)]
            blocks += [idx[None, :] == (idx[:, None] - j + i) for i in range(2, j + 1)]
            mask = torch.cat(blocks, 1)
            if valid is not None:
                mask = mask[None, None] & valid.repeat(1, j)[:, None, None, :]
            diag = torch.zeros_like(mask)
            diag[..., idx, (j - 1) * t + idx] = True
            mask = mask | (diag & ~mask.any(-1, keepdim=True))
            past = None if j == 1 else [(torch.cat([p[0] for p in ps], 2), torch.cat([p[1] for p in ps], 2))
                                        for ps in pasts]
            a, kvs = self._run(inp, embeds, pos, mask, None, 0, past)
            for ps, kv in zip(pasts, kvs):
                ps.append(kv)
            outs.append(a)
        return outs

    # --- construction ------------------------------------------------------------------------------------------
    @staticmethod
    def new(target_config: Any, token_map: Tensor, feature_layers: tuple[int, ...] | None = None, seed: int = 0,
            intermediate_size: int | None = None) -> "Eagle3Drafter":
        """A random float32 drafter shaped like one decoder layer of the target (transformers ``target_config``),
        drafting over ``token_map`` ([S] ascending target ids), tapping ``feature_layers`` (default
        :func:`default_taps`). Linear layers ~ N(0, 1/fan_in), seeded."""
        cfg = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        n = int(cfg.num_hidden_layers)
        taps = tuple(feature_layers) if feature_layers else default_taps(n)
        if any(not 0 <= i < n for i in taps):
            raise ConfigError(f"feature layers {list(taps)} must be in [0, {n - 1}] (the target has {n} layers)")
        fields = {k: getattr(cfg, k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                               "intermediate_size", "rms_norm_eps", "max_position_embeddings",
                                               "vocab_size", "hidden_act") if getattr(cfg, k, None) is not None}
        fields["head_dim"] = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        if intermediate_size:
            fields["intermediate_size"] = intermediate_size
        rp = getattr(cfg, "rope_parameters", None)
        if isinstance(rp, dict) and "sliding_attention" not in rp:
            fields["rope_parameters"] = dict(rp)
        layer_cfg = _layer_config("llama", {**fields, "num_hidden_layers": 1})
        d = Eagle3Drafter(layer_cfg, "llama", taps, int(token_map.numel()), int(cfg.vocab_size), int(cfg.hidden_size))
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for mod in d.modules():
                if isinstance(mod, nn.Linear):
                    mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) / math.sqrt(mod.weight.shape[1]))
            tm = token_map.to(torch.int64).cpu()
            d.d2t.copy_(tm - torch.arange(tm.numel()))
            d.t2d.zero_()
            d.t2d[tm] = True
        return d


def init_eagle3_from_target(d: Eagle3Drafter, target_model: nn.Module) -> bool:
    """Start the drafter's first layer from the target's last decoder layer when the shapes match (Llama-like
    targets): q/k/v read both halves of ``[input_layernorm(e) ; hidden_norm(g)]`` with the target's projection each
    (halved), the output projection, MLP and norms copied. Returns whether it did."""
    try:
        src = target_model.model.layers[-1].state_dict()
    except (AttributeError, IndexError):
        return False
    layer = d.layers[0]
    own = layer.state_dict()
    names = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
             "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight",
             "post_attention_layernorm.weight"]
    if any(n not in src for n in names):
        return False
    h = d.hidden_size
    with torch.no_grad():
        for n in names:
            w = src[n].float()
            if n.split(".")[1] in ("q_proj", "k_proj", "v_proj"):
                if own[n].shape != (w.shape[0], 2 * h) or w.shape[1] != h:
                    return False
                w = torch.cat([w, w], 1) / 2
            elif own[n].shape != w.shape:
                return False
            own[n] = w
        own["hidden_norm.weight"] = src["input_layernorm.weight"].float()
        layer.load_state_dict(own)
    return True


# --- reading the published layouts -----------------------------------------------------------------------------
def is_eagle3(config: dict) -> bool:
    """Whether ``config`` (a ``config.json``) describes an EAGLE-3 drafter in either layout."""
    if config.get("speculators_model_type") == "eagle3":
        return True
    arch = " ".join(config.get("architectures") or [])
    return "Eagle3" in arch or "draft_vocab_size" in config


def _aux_layers(config: dict) -> list[int] | None:
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if ids is None and isinstance(config.get("eagle_config"), dict):
        ids = config["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
    return None if ids is None else [int(i) for i in ids]


def _layout(folder: Path, config: dict) -> tuple[str, str, Any, str | None, dict[str, bool]]:
    """Which published layout ``config`` (the folder's ``config.json``) is in, and what it says of the drafter:
    ``(format, layer type, layer config, verifier name or None, flags)``; the flags are the
    :class:`Eagle3Drafter` keywords ``norm_before_residual``, ``norm_before_fc``, ``fc_norm`` and ``norm_output``.

    Raises:
        ConfigError: a speculators checkpoint of another algorithm, a config that describes no EAGLE-3 drafter, or
            an unsupported layer type."""
    spec_type = config.get("speculators_model_type")
    if spec_type is not None and spec_type != "eagle3":
        raise ConfigError(f"{folder} is a speculators {spec_type!r} checkpoint; specframe's eagle proposer reads "
                          f"speculators eagle3 checkpoints (and EAGLE-3 native ones)")
    if not is_eagle3(config):
        raise ConfigError(f"{folder}/config.json describes no EAGLE-3 drafter (no speculators_model_type: eagle3, "
                          f"no draft_vocab_size): is it an EAGLE-1/2 drafter or a whole model?")
    fmt = SPECULATORS if spec_type else NATIVE
    if fmt == SPECULATORS:
        layer = dict(config.get("transformer_layer_config") or {})
        layer_type = layer.get("model_type", "qwen3")  # speculators' own default layer config
        verifier = ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
        flags = {k: bool(config.get(k, False)) for k in ("norm_before_residual", "norm_before_fc", "fc_norm",
                                                           "norm_output")}
    else:
        layer = {k: v for k, v in config.items() if k not in ("draft_vocab_size", "target_hidden_size")}
        layer_type = "llama"
        layer.pop("head_dim", None)  # the reference computes hidden_size // num_attention_heads
        verifier = config.get("base_model_name_or_path") or config.get("_name_or_path") or None
        flags = {k: bool(config.get(k, False)) for k in ("norm_before_fc", "fc_norm", "norm_output")}
        flags["norm_before_residual"] = False
    return fmt, layer_type, _layer_config(layer_type, layer), verifier, flags


def _drafter_weights(folder: Path) -> dict[str, Tensor]:
    """The weights in ``folder`` under :class:`Eagle3Drafter`'s names (native ``midlayer.*`` read as ``layers.0.*``),
    without the verifier's own ``verifier_lm_head.*`` / ``verifier_norm.*``; tensors as stored.

    Raises:
        ConfigError: unreadable weights, or no ``fc.weight`` or ``lm_head.weight`` among them."""
    state = read_weights(weight_files(folder))
    state = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if not k.startswith(("verifier_lm_head.", "verifier_norm."))}
    if "fc.weight" not in state or "lm_head.weight" not in state:
        raise ConfigError(f"{folder}: the weights lack fc.weight or lm_head.weight: not an EAGLE-3 drafter")
    return state


def _vocabulary_maps(folder: Path, state: dict[str, Tensor], draft_vocab: int, vocab: int) -> None:
    """Set ``state``'s ``d2t`` (``[draft_vocab]`` int64, target id minus draft id) and ``t2d`` (``[vocab]`` bool, the
    target ids the head drafts), in place: a checkpoint without ``d2t`` has a full-vocabulary head (``d2t`` zeros,
    ``t2d`` all true); one without ``t2d`` gets all false.

    Raises:
        ConfigError: no ``d2t`` and a draft vocabulary smaller than the target's."""
    if "d2t" not in state:  # a full-vocabulary head
        if draft_vocab != vocab:
            raise ConfigError(f"{folder}: the draft vocabulary ({draft_vocab}) is smaller than the target's ({vocab}) "
                              f"but there is no d2t to map it")
        state["d2t"] = torch.zeros(draft_vocab, dtype=torch.int64)
        state["t2d"] = torch.ones(vocab, dtype=torch.bool)
    state["d2t"] = state["d2t"].to(torch.int64)
    state["t2d"] = state.get("t2d", torch.zeros(vocab)).to(torch.bool)


def load_eagle3(folder: Path, target_hidden: int, target_vocab: int, target_layers: int, target_name: str = "",
                target_path: str = "") -> Eagle3Drafter:
    """Load an EAGLE-3 drafter from a native or speculators checkpoint folder, for a target with hidden size
    ``target_hidden``, vocabulary ``target_vocab`` and ``target_layers`` decoder layers.

    Raises:
        ConfigError: not an EAGLE-3 checkpoint, an unsupported layer type or algorithm, unreadable weights, weights
            that do not match the config, or a drafter for another target's hidden size, vocabulary or depth."""
    config = read_config(folder)
    fmt, layer_type, layer_cfg, verifier, flags = _layout(folder, config)
    t_hidden = config.get("target_hidden_size")
    state = _drafter_weights(folder)
    h = int(layer_cfg.hidden_size)
    draft_vocab = int(state["lm_head.weight"].shape[0])
    vocab = int(state["t2d"].shape[0]) if "t2d" in state else int(layer_cfg.vocab_size)
    t_hidden = int(t_hidden or h)
    if t_hidden != target_hidden:
        raise mismatch("EAGLE-3", folder, "target hidden size", t_hidden, target_hidden, verifier)
    if vocab != target_vocab:
        raise mismatch("EAGLE-3", folder, "target vocabulary", vocab, target_vocab, verifier)
    fc_in = int(state["fc.weight"].shape[1])
    if fc_in % t_hidden:
        raise mismatch("EAGLE-3", folder, "fc input width", fc_in, f"a multiple of {t_hidden}", verifier)
    taps = _aux_layers(config) or list(default_taps(target_layers))
    if len(taps) * t_hidden != fc_in:
        raise ConfigError(f"{folder}: fc reads {fc_in // t_hidden} target layers but {len(taps)} are named "
                          f"({taps}): set eagle_aux_hidden_state_layer_ids in its config.json")
    if any(not 0 <= i < target_layers for i in taps):
        raise mismatch("EAGLE-3", folder, "tapped layers", taps, f"layers 0..{target_layers - 1}", verifier)
    check_target_name("EAGLE-3", folder, verifier, target_name, (target_path,))
    drafter = Eagle3Drafter(layer_cfg, layer_type, tuple(taps), draft_vocab, vocab, t_hidden,
                            own_embed="embed_tokens.weight" in state, **flags)
    _vocabulary_maps(folder, state, draft_vocab, vocab)
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("rotary.")]
    if missing or unexpected:
        raise ConfigError(f"{folder}: the weights do not match its config.json (missing {missing[:4]}, unexpected "
                          f"{unexpected[:4]})")
    tm = drafter.token_map
    if int(tm.min()) < 0 or int(tm.max()) >= vocab:
        raise ConfigError(f"{folder}: d2t maps draft ids outside the target vocabulary [0, {vocab})")
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or []
    drafter.meta = {"format": fmt, "verifier": verifier, "folder": str(folder), "dtype": state["fc.weight"].dtype,
                    "speculative_tokens": next((int(m["speculative_tokens"]) for m in methods
                                                if "speculative_tokens" in m), None)}
    log.info("EAGLE-3 drafter %s (%s layout): %d layer(s), taps %s, draft vocabulary %d", folder, fmt,
             len(drafter.layers), taps, draft_vocab)
    return drafter.float().eval()


# --- writing the published layouts -----------------------------------------------------------------------------
def _layer_fields(d: Eagle3Drafter) -> dict:
    cfg = d.layer_cfg.to_dict()
    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "rms_norm_eps", "max_position_embeddings", "vocab_size", "hidden_act", "attention_bias", "mlp_bias",
            "rope_parameters", "num_hidden_layers", "model_type")
    out = {k: cfg[k] for k in keep if k in cfg}
    rp = out.pop("rope_parameters", None) or {}
    out["rope_theta"] = float(rp.get("rope_theta", 10000.0))
    scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
    out["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
    return out


def save_eagle3(d: Eagle3Drafter, out: Path, fmt: str, verifier: str, verifier_arch: str,
                speculative_tokens: int = 3, dtype: torch.dtype = torch.float32) -> list[Path]:
    """Write ``d`` to ``out`` in ``fmt`` (``speculators`` or ``eagle3``): ``config.json`` and
    ``model.safetensors`` (floating tensors in ``dtype``; no embedding unless the drafter has its own). Returns the
    files written."""
    import safetensors.torch

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in d.state_dict().items() if not k.startswith("rotary.")}
    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()}
    dname = str(dtype).removeprefix("torch.")
    layer = _layer_fields(d)
    aux = list(d.feature_layers)
    if fmt == SPECULATORS:
        layer["model_type"] = d.layer_type
        config = {
            "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.3.0",
            "transformer_layer_config": layer, "draft_vocab_size": int(d.d2t.numel()),
            "target_hidden_size": None if d.target_hidden == d.hidden_size else d.target_hidden,
            "eagle_aux_hidden_state_layer_ids": aux, "embed_requires_grad": False, **d.flags,
            "speculators_config": {
                "algorithm": "eagle3", "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens),
                                      "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                "verifier": {"name_or_path": verifier, "architectures": [verifier_arch]},
            },
            "torch_dtype": dname, "dtype": dname,
        }
    elif fmt == NATIVE:
        if d.layer_type != "llama" or len(d.layers) != 1 or d.flags["norm_before_residual"]:
            raise ConfigError("the EAGLE-3 native layout holds one Llama layer without norm_before_residual: "
                              "export this drafter with --format speculators")
        state = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in state.items()}
        layer.pop("model_type", None)
        config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **layer,
                  "draft_vocab_size": int(d.d2t.numel()), "eagle_aux_hidden_state_layer_ids": aux,
                  "base_model_name_or_path": verifier, "torch_dtype": dname,
                  **{k: v for k, v in d.flags.items() if v}}
        if d.target_hidden != d.hidden_size:
            config["target_hidden_size"] = d.target_hidden
    else:
        raise ConfigError(f"unknown EAGLE-3 layout {fmt!r} (speculators or eagle3)")
    safetensors.torch.save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return [out / "config.json", out / "model.safetensors"]
