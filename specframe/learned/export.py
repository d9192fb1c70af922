"""``specframe export``: write a drafter in a layout other projects load (docs/drafters.md).

- ``eagle3``: an EAGLE-3 drafter (one trained with ``specframe train eagle --arch eagle3``, or a published one) as
  ``speculators`` (what ``vllm serve DIR`` and vLLM's ``method: eagle3`` read) or ``eagle3`` (SafeAILab's layout,
  read by EAGLE's own code, SGLang and llama.cpp's converter);
- ``medusa``: specframe's Medusa heads (with the target's LM head as each head's own) or published heads as
  ``medusa`` (FasterDecoding's ``medusa_lm_head.safetensors``) or ``vllm-medusa`` (vLLM's ``model_type: medusa``);
- ``dflash``: a DFlash or DFlash2 drafter (``specframe train dflash`` writes one) checked against the target and
  written in z-lab's layout (``config.json`` + ``model.safetensors``) in the dtype asked (published ones: bfloat16).

Each output folder gets a model card (``README.md``) naming the source, the target and who loads the layout, and
appears whole or not at all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError

EAGLE3_FORMATS = ("speculators", "eagle3")
MEDUSA_FORMATS = ("medusa", "vllm-medusa")
LOADERS = {
    "speculators": "vLLM (`vllm serve DIR`, or `--speculative-config '{\"method\": \"eagle3\", \"model\": DIR}'`), "
                   "speculators, specframe (`{name: eagle, checkpoint: DIR}`)",
    "eagle3": "SafeAILab/EAGLE (`EaModel.from_pretrained(ea_model_path=DIR)`), SGLang (`--speculative-algorithm EAGLE3`), "
              "vLLM (`method: eagle3`), specframe (`{name: eagle, checkpoint: DIR}`)",
    "medusa": "FasterDecoding/Medusa (`MedusaModel.from_pretrained`), TensorRT-LLM's converter, specframe "
              "(`{name: medusa, checkpoint: DIR}`)",
    "vllm-medusa": "vLLM (`--speculative-config '{\"method\": \"medusa\", \"model\": DIR}'`), specframe "
                   "(`{name: medusa, checkpoint: DIR}`)",
    "dflash": "z-lab's `dflash` package (`DFlashDraftModel.from_pretrained(DIR)` and `dflash_generate`: checked in "
              "specframe's tests), specframe (`{name: dflash, checkpoint: DIR}`); it is the layout z-lab publishes, "
              "which the serving engines' DFlash support reads (vLLM `method: dflash`; not run by specframe)",
}


def target_config(model: str) -> tuple[Any, Path]:
    """The transformers config of a specframe model (built-in name, folder or .gguf) and its folder."""
    from transformers import AutoConfig

    from ..target.models import model_directory, resolve_model

    folder = model_directory(resolve_model(model))
    return AutoConfig.from_pretrained(folder).get_text_config(), folder


def export_eagle3(src: Path, fmt: str, out: Path, model: str, verifier: str | None = None,
                  speculative_tokens: int | None = None, dtype: str | None = None) -> Path:
    """Write the EAGLE-3 drafter in ``src`` to ``out`` in ``fmt``.

    Raises:
        ConfigError: ``src`` holds specframe's own EAGLE format (another architecture, which no EAGLE-3 layout
            holds), no drafter, or one for another target; an unknown ``fmt``."""
    from ..io.atomic import replace_folder
    from .eagle3 import load_eagle3, save_eagle3

    if fmt not in EAGLE3_FORMATS:
        raise ConfigError(f"--format {fmt!r}: an EAGLE-3 drafter exports as {' or '.join(EAGLE3_FORMATS)}")
    if (src / "eagle.json").is_file():
        raise ConfigError(
            f"{src} holds specframe's own EAGLE drafter (per-feature norms, a 2H -> H input projection, one standard "
            f"layer, the target's LM-head rows), an architecture no EAGLE-3 layout holds, so it cannot be exported "
            f"faithfully: train one in the EAGLE-3 architecture with `specframe train eagle --arch eagle3` and export "
            f"that (the shipped one: plugins/weights/<target>/eagle3)")
    cfg, _ = target_config(model)
    d = load_eagle3(src, int(cfg.hidden_size), int(cfg.vocab_size), int(cfg.num_hidden_layers), model)
    name = verifier or d.meta.get("verifier") or model
    k = speculative_tokens or d.meta.get("speculative_tokens") or 3
    if dtype not in (None, "float32", "bfloat16", "float16"):
        raise ConfigError(f"--dtype {dtype!r}: choose float32, bfloat16 or float16 (default: the source's)")
    dtype = getattr(torch, dtype) if dtype else d.meta.get("dtype", torch.float32)

    def fill(tmp: Path) -> None:
        save_eagle3(d, tmp, fmt, name, _architecture(cfg), k, dtype)
        (tmp / "README.md").write_text(_card("EAGLE-3 drafter", src, fmt, model, name, {
            "tapped target layers (transformers hidden_states indices = vLLM aux layer ids)": list(d.feature_layers),
            "decoder layers": len(d.layers), "layer type": d.layer_type,
            "draft vocabulary": int(d.d2t.numel()), "own embedding": d.embed_tokens is not None,
            "speculative tokens (speculators config)": k, "weights dtype": str(dtype).removeprefix("torch."),
            **{f: v for f, v in d.flags.items() if v}}))

    replace_folder(out, fill, sources=[src])
    return out


def export_medusa(src: Path, fmt: str, out: Path, model: str, verifier: str | None = None) -> Path:
    """Write the Medusa heads in ``src`` (specframe's ``medusa.json`` heads, or published ones) to ``out`` in ``fmt``.

    Raises:
        ConfigError: no heads in ``src``, heads for another target, or an unknown ``fmt``."""
    from ..io.atomic import replace_folder
    from ..target.models import load_model
    from .medusa_heads import MedusaHeads
    from .medusa_published import from_own, load_medusa, save_medusa

    if fmt not in MEDUSA_FORMATS:
        raise ConfigError(f"--format {fmt!r}: Medusa heads export as {' or '.join(MEDUSA_FORMATS)}")
    cfg, folder = target_config(model)
    if (src / "medusa.json").is_file():
        net, _ = load_model(folder, torch.float32, "cpu", tokenizer=False)
        heads = MedusaHeads.load(src, int(cfg.hidden_size))
        module = from_own(heads, net.get_output_embeddings(), full_vocab=True)
        source = ("specframe's Medusa heads, each head's LM head = the target's whole LM head" + (
            f" (specframe drafts from its {heads.token_map.numel()} most frequent tokens; the exported heads score every "
            "token, as Medusa's and vLLM's loaders expect, so their drafts can differ where the best token lies "
            "outside that subset)" if heads.token_map is not None else ""))
    elif (src / "config.json").is_file():
        module = load_medusa(src, int(cfg.hidden_size), int(cfg.vocab_size), model)
        source = f"published Medusa heads ({module.meta['format']} layout)"
    else:
        raise ConfigError(f"{src} holds no Medusa heads (needs medusa.json, or config.json with medusa_num_heads)")
    name = verifier or model

    def fill(tmp: Path) -> None:
        save_medusa(module, tmp, fmt, name)
        facts = {"heads": module.num_heads, "residual blocks per head": module.num_layers, "source": source}
        if module.token_map is not None:
            facts["token map"] = f"{module.token_map.numel()} target ids (`token_map`, `truncated_vocab_size`)"
        (tmp / "README.md").write_text(_card("Medusa heads", src, fmt, model, name, facts))

    replace_folder(out, fill, sources=[src])
    return out


def export_dflash(src: Path, out: Path, model: str, dtype: str | None = None) -> Path:
    """Write the DFlash / DFlash2 drafter in ``src`` to ``out`` in z-lab's layout, after checking it fits ``model``.

    Raises:
        ConfigError: ``src`` holds no drafter in that layout, one for another target (the field named), or an unknown
            ``dtype``."""
    from ..io.atomic import replace_folder
    from .dflash import load_dflash, save_dflash

    if dtype not in (None, "float32", "bfloat16", "float16"):
        raise ConfigError(f"--dtype {dtype!r}: choose float32, bfloat16 or float16 (default: the source's)")
    cfg, _ = target_config(model)
    d = load_dflash(src, int(cfg.hidden_size), int(cfg.vocab_size), int(cfg.num_hidden_layers))
    stored = json.loads((src / "config.json").read_text()).get("torch_dtype") or "float32"
    dtype_t = getattr(torch, dtype or stored, torch.float32)

    def fill(tmp: Path) -> None:
        save_dflash(d, tmp, dtype_t)
        (tmp / "README.md").write_text(_card(("DFlash2" if d.candidate_selector is not None else "DFlash") + " block drafter", src, "dflash", model, model, {
            "architecture": json.loads((tmp / "config.json").read_text())["architectures"][0],
            "block size (newest token + drafts)": d.block_size, "mask token id": d.mask_token_id,
            "target layers read (0-based decoder layers)": list(d.spec.target_layer_ids),
            "decoder layers": len(d.layers), "weights dtype": str(dtype_t).removeprefix("torch.")}))

    replace_folder(out, fill, sources=[src])
    return out


def _architecture(cfg: Any) -> str:
    archs = getattr(cfg, "architectures", None) or []
    return archs[0] if archs else "LlamaForCausalLM"


def _card(what: str, src: Path, fmt: str, model: str, verifier: str, facts: dict) -> str:
    rows = "\n".join(f"| {k} | {json.dumps(v) if not isinstance(v, str) else v} |" for k, v in facts.items())
    return (f"# {what} for `{model}` ({fmt} layout)\n\nExported by `specframe export` from `{src}`. Target (verifier): "
            f"`{verifier}`.\n\nLoaded by: {LOADERS[fmt]}.\n\n| field | value |\n|---|---|\n{rows}\n\n"
            "Greedy output with this drafter is the target's own (speculative decoding is lossless); what it changes is "
            "speed. See specframe's docs/drafters.md for what was checked against which reference.\n")
