"""Medusa heads as published (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads", §2.1.1), read from and written to the two layouts peers load:

- **Medusa** (FasterDecoding/Medusa, e.g. ``FasterDecoding/medusa-vicuna-7b-v1.3``): ``config.json`` with
  ``medusa_num_heads``, ``medusa_num_layers``, ``base_model_name_or_path``; weights ``medusa_lm_head.safetensors``
  (or ``medusa_lm_head.pt``) with ``{h}.{l}.linear.{weight,bias}`` (residual SiLU blocks) and ``{h}.{L}.weight``
  (head ``h``'s own LM head ``[V, H]``); a Medusa-2 model folder's ``medusa_head.*`` keys are read alike;
- **vLLM** (``vllm/model_executor/models/medusa.py``): ``config.json`` with ``model_type: medusa``, ``num_heads``,
  ``num_hidden_layers``, ``truncated_vocab_size``; weights ``blocks.{h}.layers.{l}.{weight,bias}``,
  ``lm_heads.{h}.weight`` and an optional ``token_map`` (the draft vocabulary's target ids).

Head ``h`` maps the target's last hidden state ``h_t`` (after the final norm) to the token ``h + 2`` positions
ahead::

    z = h_t;  z = z + SiLU(W_l z + b_l)  for each of the L blocks;   p^(h) = softmax(W_lm^(h) z)

With a ``token_map`` (``[S]`` int64) the heads score those ``S`` target ids only (a vLLM ``truncated_vocab_size``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from .checkpoints import check_target_name, mismatch, read_config, read_weights, weight_files

MEDUSA = "medusa"  # FasterDecoding layout
VLLM = "vllm-medusa"
WEIGHT_NAMES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")


class PublishedMedusa(nn.Module):
    """``num_heads`` heads of ``num_layers`` residual blocks, each with its own LM head.

    ``logits(h [.., H]) -> [.., num_heads, S]`` (S = V without a token map)."""

    def __init__(self, hidden: int, num_heads: int, num_layers: int, vocab: int, bias: bool,
                 token_map: Tensor | None = None) -> None:
        super().__init__()
        self.hidden_size, self.num_heads, self.num_layers = hidden, num_heads, num_layers
        self.blocks = nn.ModuleList(nn.ModuleList(nn.Linear(hidden, hidden, bias=bias) for _ in range(num_layers))
                                    for _ in range(num_heads))
        rows = vocab if token_map is None else int(token_map.numel())
        self.lm_heads = nn.ModuleList(nn.Linear(hidden, rows, bias=False) for _ in range(num_heads))
        self.token_map = None if token_map is None else token_map.to(torch.int64).cpu()
        self.vocab = vocab
        self.meta: dict = {}

    def logits(self, h: Tensor) -> Tensor:
        out = []
        for block, head in zip(self.blocks, self.lm_heads):
            z = h
            for lin in block:
                z = z + torch.nn.functional.silu(lin(z))
            out.append(head(z))
        return torch.stack(out, -2)


def is_medusa(config: dict) -> bool:
    return "medusa_num_heads" in config or config.get("model_type") == "medusa"


def _fasterdecoding(state: dict[str, Tensor], heads: int, layers: int) -> dict[str, Tensor]:
    """FasterDecoding keys -> this module's."""
    out = {}
    for k, v in state.items():
        k = re.sub(r"^(medusa_heads?\.)", "", k)
        m = re.fullmatch(r"(\d+)\.(\d+)\.(?:linear\.)?(weight|bias)", k)
        if not m:
            out[k] = v
            continue
        h, layer, kind = int(m[1]), int(m[2]), m[3]
        out[f"lm_heads.{h}.weight" if layer == layers else f"blocks.{h}.{layer}.{kind}"] = v
    return out


def _vllm(state: dict[str, Tensor]) -> dict[str, Tensor]:
    out = {}
    for k, v in state.items():
        k = re.sub(r"^medusa_heads\.", "", k)
        out[re.sub(r"^blocks\.(\d+)\.layers\.(\d+)\.", r"blocks.\1.\2.", k)] = v
    return out


def load_medusa(folder: Path, hidden: int, vocab: int, target_name: str = "", target_path: str = "") -> PublishedMedusa:
    """Heads from a Medusa (FasterDecoding) or vLLM Medusa checkpoint folder, for a target of hidden size ``hidden``
    and vocabulary ``vocab``.

    Raises:
        ConfigError: not a Medusa checkpoint, unreadable weights, weights that do not match the config, or heads for
            another target's hidden size or vocabulary."""
    config = read_config(folder)
    if not is_medusa(config):
        raise ConfigError(f"{folder}/config.json describes no Medusa heads (no medusa_num_heads, no model_type "
                          f"medusa)")
    vllm = config.get("model_type") == "medusa" and "medusa_num_heads" not in config
    heads = int(config.get("num_heads") if vllm else config["medusa_num_heads"])
    layers = int(config.get("num_hidden_layers", 1) if vllm else config.get("medusa_num_layers", 1))
    named = config.get("base_model_name_or_path") or config.get("_name_or_path") or None
    state = read_weights(weight_files(folder, WEIGHT_NAMES))
    state = _vllm(state) if vllm else _fasterdecoding(state, heads, layers)
    token_map = state.pop("token_map", None)
    if "lm_heads.0.weight" not in state and "lm_head.weight" in state:  # vLLM original_lm_head: one shared head
        state.update({f"lm_heads.{h}.weight": state["lm_head.weight"] for h in range(heads)})
    state.pop("lm_head.weight", None)
    w0 = state.get("blocks.0.0.weight")
    if w0 is None or "lm_heads.0.weight" not in state:
        raise ConfigError(f"{folder}: no Medusa head weights found (expected {{h}}.{{l}}.linear.weight and "
                          f"{{h}}.{layers}.weight, or blocks.* and lm_heads.*)")
    if int(w0.shape[1]) != hidden:
        raise mismatch("Medusa", folder, "hidden size", int(w0.shape[1]), hidden, named)
    rows = int(state["lm_heads.0.weight"].shape[0])
    if token_map is not None:
        token_map = token_map.to(torch.int64)
        if int(token_map.max()) >= vocab:
            raise mismatch("Medusa", folder, "token map's largest id", int(token_map.max()), f"< {vocab}", named)
        for h in range(heads):  # full-vocabulary heads with a map: keep the map's rows (as vLLM does)
            w = state[f"lm_heads.{h}.weight"]
            if w.shape[0] > token_map.numel():
                state[f"lm_heads.{h}.weight"] = w[token_map]
    elif rows != vocab:
        raise mismatch("Medusa", folder, "vocabulary", rows, vocab, named)
    check_target_name("Medusa", folder, named, target_name, (target_path,))
    bias = "blocks.0.0.bias" in state
    module = PublishedMedusa(hidden, heads, layers, vocab, bias, token_map)
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConfigError(f"{folder}: the weights do not match medusa_num_heads={heads}, medusa_num_layers={layers} "
                          f"(missing {missing[:4]}, unexpected {unexpected[:4]})")
    module.meta = {"format": VLLM if vllm else MEDUSA, "verifier": named, "folder": str(folder)}
    return module.float().eval()


def save_medusa(module: PublishedMedusa, out: Path, fmt: str, base_model: str) -> list[Path]:
    """Write ``module`` to ``out`` as ``medusa`` (FasterDecoding: ``config.json`` + ``medusa_lm_head.safetensors``,
    each head's LM head over the full vocabulary; a token map is kept as ``token_map`` with
    ``truncated_vocab_size`` for vLLM) or ``vllm-medusa``. Returns the files written."""
    import safetensors.torch

    out.mkdir(parents=True, exist_ok=True)
    heads, layers = module.num_heads, module.num_layers
    state: dict[str, Tensor] = {}
    for h in range(heads):
        for layer, lin in enumerate(module.blocks[h]):
            pre = f"{h}.{layer}.linear." if fmt == MEDUSA else f"blocks.{h}.layers.{layer}."
            state[pre + "weight"] = lin.weight
            if lin.bias is not None:
                state[pre + "bias"] = lin.bias
        w = module.lm_heads[h].weight
        if module.token_map is not None and fmt == MEDUSA:  # FasterDecoding heads are [V, H]: zero rows elsewhere
            full = w.new_zeros((module.vocab, w.shape[1]))
            full[module.token_map] = w
            w = full
        state[f"{h}.{layers}.weight" if fmt == MEDUSA else f"lm_heads.{h}.weight"] = w
    if module.token_map is not None:
        state["token_map"] = module.token_map
    state = {k: (v.detach().float() if v.is_floating_point() else v).cpu().contiguous() for k, v in state.items()}
    sub = None if module.token_map is None else int(module.token_map.numel())
    if fmt == MEDUSA:
        weights = out / "medusa_lm_head.safetensors"
        config = {"medusa_num_heads": heads, "medusa_num_layers": layers, "base_model_name_or_path": base_model,
                  "hidden_size": module.hidden_size, "vocab_size": module.vocab}
    elif fmt == VLLM:
        weights = out / "model.safetensors"
        config = {"architectures": ["MedusaModel"], "model_type": "medusa", "num_heads": heads,
                  "num_hidden_layers": layers, "hidden_size": module.hidden_size, "vocab_size": module.vocab,
                  "base_model_name_or_path": base_model, "medusa_fc_bias": module.blocks[0][0].bias is not None}
    else:
        raise ConfigError(f"unknown Medusa layout {fmt!r} (medusa or vllm-medusa)")
    if sub is not None:
        config["truncated_vocab_size"] = sub
    safetensors.torch.save_file(state, str(weights), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return [out / "config.json", weights]


def from_own(heads: nn.Module, lm_head: nn.Module, full_vocab: bool = False) -> PublishedMedusa:
    """specframe's :class:`~specframe.learned.medusa_heads.MedusaHeads` with the target's LM head as every head's
    own: its token subset, if any, as the token map (the same drafts), or with ``full_vocab`` every row of the LM
    head and no map (what vLLM 0.32 loads: its Medusa asserts full-vocabulary heads)."""
    tm = None if full_vocab else heads.token_map
    weight = lm_head.weight.detach().float().cpu()
    vocab = int(weight.shape[0])
    lin0 = heads.heads[0][0].linear
    m = PublishedMedusa(heads.hidden_size, heads.num_heads, heads.num_layers, vocab, lin0.bias is not None, tm)
    with torch.no_grad():
        for h in range(heads.num_heads):
            for layer in range(heads.num_layers):
                src = heads.heads[h][layer].linear
                m.blocks[h][layer].weight.copy_(src.weight.float())
                if src.bias is not None:
                    m.blocks[h][layer].bias.copy_(src.bias.float())
            m.lm_heads[h].weight.copy_(weight if tm is None else weight[tm])
    if getattr(lm_head, "bias", None) is not None:
        raise ConfigError("the target's LM head has a bias, which Medusa's published heads cannot hold")
    return m
