"""An EAGLE-style feature-level drafter (the format ``specframe train eagle`` writes and the ``eagle`` proposer
reads).

Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty": the draft runs one
decoder layer over the target's own hidden features, shifted by one token, so it predicts the next feature (and
token) with the target's representation of the context instead of re-reading the tokens. EAGLE-3 (Li et al.
2025, "Scaling up Inference Acceleration of LLMs via Training-Time Test") fuses a low, a middle and a high target
layer and drops the feature-regression loss; training-time test unrolls the drafter on its own outputs.

One drafter step at position ``t`` (``x`` token ids, ``f_t^(l)`` the target's hidden state after layer ``l``)::

    g_t = W_fuse · [norm(f_t^(l1)) ; norm(f_t^(l2)) ; norm(f_t^(l3))]        (EAGLE-3 fusion, [F·H] -> [H])
    a_t = Layer(W_in · [g_t ; norm(E x_{t+1})])                             (one Llama-style decoder layer)
    q(x_{t+2}) = softmax(norm(a_t) · W_lm[S]^T)                              (target LM-head rows, subset S)

When drafting past the committed tokens, ``g_t`` is replaced by the drafter's own previous output ``a_{t-1}``
(EAGLE-3 §3.2). The output head is the target's own LM head restricted to the ``S`` most frequent corpus tokens
(FR-Spec, Zhao et al. 2025); only ``token_map`` is stored, the rows come from the target at load time.

Directory layout::

    eagle.json            {"format": 1, "target", "target_vocab_size", "hidden_size", "feature_layers",
                           "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "rope_theta", "rms_eps"}
    eagle.safetensors     drafter weights (float32) and ``specframe.token_map`` int64 [S]
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError

FORMAT = 1
META = "eagle.json"
WEIGHTS = "eagle.safetensors"
TOKEN_MAP = "specframe.token_map"


@dataclass(frozen=True)
class EagleSpec:
    """Shape of a drafter (all sizes in elements)."""

    hidden_size: int
    feature_layers: tuple[int, ...]  # indices into the target's hidden_states (0 = embeddings, i = after layer i)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    target: str = ""
    target_vocab_size: int = 0
    extra: dict = field(default_factory=dict, compare=False)

    @staticmethod
    def for_target(config: Any, target: str = "", feature_layers: tuple[int, ...] | None = None) -> "EagleSpec":
        """A drafter shaped like one decoder layer of the target described by the transformers ``config``;
        default feature layers: a low, a middle and a high one (after layers 2, L/2 and L-2 of L)."""
        cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
        h, n = int(cfg.hidden_size), int(cfg.num_hidden_layers)
        heads = int(cfg.num_attention_heads)
        kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
        if feature_layers is None:
            feature_layers = tuple(sorted({min(2, n), max(n // 2, 1), max(n - 2, 1)}))
        bad = [i for i in feature_layers if not 0 <= i <= n]
        if bad or not feature_layers:
            raise ConfigError(f"feature layers {list(feature_layers)} must be in [0, {n}] (the target has {n} layers)")
        theta = getattr(cfg, "rope_theta", None)
        if theta is None:
            rp = getattr(cfg, "rope_parameters", None) or {}
            theta = (rp.get("rope_theta") if isinstance(rp, dict) else None) or 10000.0
        return EagleSpec(h, tuple(int(i) for i in feature_layers), heads, kv if heads % kv == 0 else heads, h // heads,
                         int(getattr(cfg, "intermediate_size", 4 * h)), float(theta),
                         float(getattr(cfg, "rms_norm_eps", 1e-5)), target, int(cfg.vocab_size))


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight.to(x.dtype)


def rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Rotary position embedding (Su et al. 2021), rotate-half layout. ``x [B, h, n, d]``, ``positions [B, n]``."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.to(torch.float32)[:, None, :, None] * inv  # [B, 1, n, d/2]
    cos, sin = torch.cos(ang).repeat(1, 1, 1, 2), torch.sin(ang).repeat(1, 1, 1, 2)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    rot = torch.cat([-x2, x1], -1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


def attend(q: Tensor, k: Tensor, v: Tensor, past: tuple[Tensor, Tensor] | None, mask: Tensor | None,
           into: "KVBuffer | None" = None, at: int = 0) -> Tensor:
    """A drafter layer's attention after its projections and RoPE, written once for every learned drafter (EAGLE,
    EAGLE-3): store the new keys and values, then grouped-query scaled-dot-product attention over the past and new
    rows.

    Args:
        q: ``[B, h, n, d]`` queries of the n new rows; ``k``, ``v``: ``[B, kv, n, d]`` their keys and values.
        past: earlier keys and values ``[B, kv, m, d]`` (concatenated before the new ones), or None.
        mask: ``[n, m + n]`` bool (True = may attend), or None for causal over the new rows after all of the past.
        into: a :class:`KVBuffer` to write the new rows into at ``at .. at + n`` instead (``past`` is then ignored
            and the rows attend to the buffer's first ``at + n`` entries: no cache is copied).

    Returns:
        ``[B, h, n, d]``, the attention output before the output projection.
    """
    n = q.shape[2]
    if into is not None:
        keys, vals = into.write(at, k, v)
    else:
        keys, vals = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
    if mask is None:
        m = keys.shape[2] - n
        mask = torch.ones((n, m + n), dtype=torch.bool, device=q.device)
        mask[:, m:] = torch.ones((n, n), dtype=torch.bool, device=q.device).tril()
    # grouped-query attention without copying keys per query head
    return F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


class DecoderLayer(nn.Module):
    """Pre-norm Llama-style layer: grouped-query self-attention with RoPE, SwiGLU MLP."""

    def __init__(self, s: EagleSpec) -> None:
        super().__init__()
        self.s = s
        h, d = s.hidden_size, s.head_dim
        self.q_proj = nn.Linear(h, s.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, s.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, s.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(s.num_heads * d, h, bias=False)
        self.gate_proj = nn.Linear(h, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, h, bias=False)
        self.input_layernorm = RMSNorm(h, s.rms_eps)
        self.post_attention_layernorm = RMSNorm(h, s.rms_eps)

    def forward(self, x: Tensor, positions: Tensor, past: tuple[Tensor, Tensor] | None, mask: Tensor | None,
                into: "KVBuffer | None" = None, at: int = 0) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """``x [B, n, H]``, ``positions [B, n]`` int64, ``past`` keys/values ``[B, kv, m, d]`` or None, ``mask``
        ``[n, m + n]`` bool (True = may attend) or None for causal over the new rows after all of ``past``.

        With ``into`` (a :class:`KVBuffer`), ``past`` is ignored: the new rows' keys and values are written at
        ``at .. at + n`` and the rows attend to the buffer's first ``at + n`` entries (``m = at``), so drafting
        copies no cache.

        Returns ``(out [B, n, H], (k, v) [B, kv, n, d] of the new rows)``."""
        s = self.s
        b, n, _ = x.shape
        y = self.input_layernorm(x)
        q = self.q_proj(y).view(b, n, s.num_heads, s.head_dim).transpose(1, 2)
        k = self.k_proj(y).view(b, n, s.num_kv_heads, s.head_dim).transpose(1, 2)
        v = self.v_proj(y).view(b, n, s.num_kv_heads, s.head_dim).transpose(1, 2)
        q, k = rope(q, positions, s.rope_theta), rope(k, positions, s.rope_theta)
        att = attend(q, k, v, past, mask, into, at)
        x = x + self.o_proj(att.transpose(1, 2).reshape(b, n, s.num_heads * s.head_dim))
        y = self.post_attention_layernorm(x)
        x = x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))
        return x, (k, v)


class KVBuffer:
    """The drafter's keys and values ``[B, kv, capacity, d]``, preallocated and grown by doubling: committed
    positions first, a step's tree entries after them (overwritten by the next step). Run-time drafting only."""

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def write(self, at: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``k, v [B, kv, n, d]`` at ``at .. at + n``; returns views of entries ``0 .. at + n``."""
        end = at + k.shape[2]
        if self.k is None or self.k.shape[2] < end or self.k.dtype != k.dtype:
            cap = max(64, 1 << (end - 1).bit_length())
            grown_k = k.new_empty((*k.shape[:2], cap, k.shape[3]))
            grown_v = v.new_empty((*v.shape[:2], cap, v.shape[3]))
            if self.k is not None and self.k.dtype == k.dtype:
                keep = min(at, self.k.shape[2])
                grown_k[:, :, :keep] = self.k[:, :, :keep]
                grown_v[:, :, :keep] = self.v[:, :, :keep]
            self.k, self.v = grown_k, grown_v
        self.k[:, :, at:end] = k
        self.v[:, :, at:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]


class EagleDrafter(nn.Module):
    """The drafter's trainable part; the target's input embedding and LM-head rows are borrowed at run time.

    Args:
        spec: shapes (see :class:`EagleSpec`).
        token_map: ``[S]`` int64 ascending target token ids the head scores.
    """

    def __init__(self, spec: EagleSpec, token_map: Tensor) -> None:
        super().__init__()
        self.spec = spec
        h, nf = spec.hidden_size, len(spec.feature_layers)
        self.feature_norms = nn.ModuleList(RMSNorm(h, spec.rms_eps) for _ in range(nf))
        self.fuse = nn.Linear(nf * h, h, bias=False)
        self.embed_norm = RMSNorm(h, spec.rms_eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layer = DecoderLayer(spec)
        self.norm = RMSNorm(h, spec.rms_eps)
        self.register_buffer("token_map", token_map.to(torch.int64).cpu(), persistent=False)

    # --- building blocks ---------------------------------------------------------------------------------
    def fuse_features(self, feats: Tensor) -> Tensor:
        """``feats [..., F, H]`` (target hidden states of ``spec.feature_layers``) -> ``g [..., H]``."""
        parts = [norm(feats[..., i, :].to(self.fuse.weight.dtype)) for i, norm in enumerate(self.feature_norms)]
        return self.fuse(torch.cat(parts, -1))

    def step(self, g: Tensor, embeds: Tensor, positions: Tensor, past: tuple[Tensor, Tensor] | None,
             mask: Tensor | None, into: KVBuffer | None = None, at: int = 0) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """One drafter pass over ``n`` entries: ``g [B, n, H]`` (fused target features or the drafter's own previous
        outputs), ``embeds [B, n, H]`` (target input embeddings of the next tokens). Returns ``(a [B, n, H], kv)``.
        ``into`` / ``at``: keep the keys and values in a :class:`KVBuffer` instead of ``past`` (see
        :meth:`DecoderLayer.forward`)."""
        x = self.fc(torch.cat([g, self.embed_norm(embeds.to(g.dtype))], -1))
        return self.layer(x, positions, past, mask, into, at)

    def logits(self, a: Tensor, head_rows: Tensor) -> Tensor:
        """``a [..., H]`` -> logits ``[..., S]`` over the subset (``head_rows [S, H]``: target LM-head rows)."""
        return self.norm(a) @ head_rows.to(a.dtype).T

    # --- training-time test (EAGLE-3 §3.3) ---------------------------------------------------------------
    def unrolled(self, g: Tensor, embeds: Tensor, steps: int, valid: Tensor | None = None) -> list[Tensor]:
        """All ``steps`` unrolled drafter passes over a batch of sequences, in parallel.

        Args:
            g: ``[B, T, H]`` fused target features of positions ``0..T-1``.
            embeds: ``[B, T, H]`` input embeddings of tokens ``1..T`` (the token after each position).
            steps: unroll depth ``s``; pass ``j`` at index ``t`` is the drafter's ``j``-th step when the real features
                end at position ``t - j + 1``: it reads its own pass-``j-1`` output at ``t - 1``, attends to pass-1
                entries ``<= t - j + 1`` and to pass-``i`` entries at ``t - j + i`` (the diagonal mask).
            valid: ``[B, T]`` bool, False at padding (padding is never attended to).

        Returns:
            ``steps`` tensors ``[B, T, H]``: outputs ``a`` of each pass (each predicts the token at ``t + 2``).
        """
        b, t, h = g.shape
        pos = torch.arange(t, device=g.device).expand(b, t)
        outs: list[Tensor] = []
        keys: list[Tensor] = []
        vals: list[Tensor] = []
        idx = torch.arange(t, device=g.device)
        inp = g
        for j in range(1, steps + 1):
            if j > 1:  # own previous output, shifted one position right
                inp = torch.cat([torch.zeros_like(outs[-1][:, :1]), outs[-1][:, :-1]], 1)
            # mask [T, j*T]: pass-1 keys at <= t-j+1, pass-i keys (1 < i <= j) exactly at t-j+i
            blocks = [idx[None, :] <= (idx[:, None] - j + 1)]
            for i in range(2, j + 1):
                blocks.append(idx[None, :] == (idx[:, None] - j + i))
            mask = torch.cat(blocks, 1)
            if valid is not None:
                mask = mask[None, None] & valid.repeat(1, j)[:, None, None, :]
            x = self.fc(torch.cat([inp, self.embed_norm(embeds.to(inp.dtype))], -1))
            past = None if j == 1 else (torch.cat(keys, 2), torch.cat(vals, 2))
            m = mask.clone()
            # rows with nothing to attend to (t < j - 1) get themselves, so softmax stays finite; their loss is masked
            diag = torch.zeros_like(m)
            diag[..., idx, (j - 1) * t + idx] = True
            m = m | (diag & ~m.any(-1, keepdim=True))
            a, (k, v) = self.layer(x, pos, past, m)
            keys.append(k)
            vals.append(v)
            outs.append(a)
        return outs

    # --- save / load ---------------------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        import safetensors.torch

        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in self.state_dict().items()}
        state[TOKEN_MAP] = self.token_map.cpu().contiguous()
        safetensors.torch.save_file(state, str(directory / WEIGHTS), metadata={"format": "pt"})
        meta = {"format": FORMAT, **{k: v for k, v in asdict(self.spec).items() if k != "extra"},
                "vocab_subset": int(self.token_map.numel())}
        meta["feature_layers"] = list(self.spec.feature_layers)
        (directory / META).write_text(json.dumps(meta, indent=1) + "\n")

    @staticmethod
    def load(directory: Path, hidden_size: int | None = None, vocab_size: int | None = None) -> "EagleDrafter":
        """Load a drafter saved by :meth:`save`.

        Raises:
            ConfigError: missing files, another format, or a drafter made for a target with another hidden size or
                vocabulary.
        """
        import safetensors.torch

        meta_path, weights = directory / META, directory / WEIGHTS
        if not meta_path.is_file() or not weights.is_file():
            raise ConfigError(f"{directory} holds no EAGLE drafter (needs {META} and {WEIGHTS})")
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != FORMAT:
            raise ConfigError(f"{meta_path}: format {meta.get('format')!r}, this specframe reads format {FORMAT}")
        if (hidden_size is not None and meta["hidden_size"] != hidden_size) or (
            vocab_size is not None and meta.get("target_vocab_size") not in (0, vocab_size)
        ):
            raise ConfigError(
                f"the EAGLE drafter in {directory} was trained for {meta.get('target')!r} (hidden {meta['hidden_size']}, "
                f"vocabulary {meta.get('target_vocab_size')}); this target has hidden {hidden_size}, vocabulary "
                f"{vocab_size}: train one for it with `specframe train eagle`"
            )
        names = {f for f in EagleSpec.__dataclass_fields__ if f != "extra"}
        spec = EagleSpec(**{k: (tuple(v) if k == "feature_layers" else v) for k, v in meta.items() if k in names})
        state = safetensors.torch.load_file(str(weights))
        drafter = EagleDrafter(spec, state.pop(TOKEN_MAP))
        missing, unexpected = drafter.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ConfigError(f"{weights} does not match {META} (missing {missing[:3]}, unexpected {unexpected[:3]})")
        return drafter.eval()


def init_from_target(drafter: EagleDrafter, target_model: nn.Module, layer: int | None = None) -> bool:
    """Copy one of the target's decoder layers (default: the last) into the drafter's layer when the shapes match
    (Llama-like targets); returns whether it did. The fusion and input projections keep their random init."""
    try:
        layers = target_model.model.layers
        src = layers[len(layers) - 1 if layer is None else layer].state_dict()
    except (AttributeError, IndexError):
        return False
    names = {"self_attn.q_proj.weight": "q_proj.weight", "self_attn.k_proj.weight": "k_proj.weight",
             "self_attn.v_proj.weight": "v_proj.weight", "self_attn.o_proj.weight": "o_proj.weight",
             "mlp.gate_proj.weight": "gate_proj.weight", "mlp.up_proj.weight": "up_proj.weight",
             "mlp.down_proj.weight": "down_proj.weight", "input_layernorm.weight": "input_layernorm.weight",
             "post_attention_layernorm.weight": "post_attention_layernorm.weight"}
    own = drafter.layer.state_dict()
    if set(names) - set(src) or any(src[k].shape != own[v].shape for k, v in names.items()):
        return False
    with torch.no_grad():
        drafter.layer.load_state_dict({v: src[k].float() for k, v in names.items()})
    return True


def new_drafter(spec: EagleSpec, token_map: Tensor, seed: int = 0) -> EagleDrafter:
    """A randomly initialised float32 drafter (seeded; linear layers ~ N(0, 1/fan_in))."""
    gen = torch.Generator().manual_seed(seed)
    d = EagleDrafter(spec, token_map)
    with torch.no_grad():
        for mod in d.modules():
            if isinstance(mod, nn.Linear):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) / math.sqrt(mod.weight.shape[1]))
    return d
