"""Small draft models that share the target's embeddings and tokenizer (the format ``specframe train draft``
writes and the ``draft-model`` proposer reads).

A draft is a few transformer layers of the target's own architecture, read in through the target's input
embedding and read out through a subset of rows of the target's output embedding: the ``S`` most frequent
tokens of the training corpus (``token_map``, ascending target ids), as in FR-Spec (Zhao et al. 2025,
"FR-Spec: Accelerating Large-Vocabulary Language Models via Frequency-Ranked Speculative Sampling"). With the
full 49 152-row head a 2-layer SmolLM2 draft would cost 1/4 of the target per token; with 8 192 rows it costs
about 1/11. Tokens outside the subset get draft probability 0, which the acceptance rule handles exactly.

Directory layout::

    config.json            transformers config of the draft (vocab_size = S, tie_word_embeddings = true)
    model.safetensors      decoder layers + final norm, and ``specframe.token_map`` int64 [S]
    specframe-draft.json   {"format": 1, "target": <name>, "target_vocab_size": V, "hidden_size": H}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError

FORMAT = 1
META = "specframe-draft.json"
TOKEN_MAP = "specframe.token_map"


def is_small_draft(directory: Path) -> bool:
    return (directory / META).is_file()


class SmallDraft(nn.Module):
    """A draft LM over a vocabulary subset, fed by the target's input embedding.

    Args:
        lm: a transformers causal LM whose ``vocab_size`` is ``S`` (its own token embedding is the tied head).
        embed: the target's input embedding module (``[B, n] int64 -> [B, n, H]``), frozen and shared.
        token_map: ``[S]`` int64, draft output index -> target token id.
    """

    def __init__(self, lm: nn.Module, embed: nn.Module, token_map: Tensor) -> None:
        super().__init__()
        self.lm = lm
        self.embed = [embed]  # a list: not registered, so the draft's state_dict never holds the target's weights
        self.register_buffer("token_map", token_map.to(torch.int64), persistent=False)

    @property
    def config(self) -> Any:
        return self.lm.config

    def forward(self, input_ids: Tensor, cache: Any = None, attention_mask: Tensor | None = None) -> Tensor:
        """``input_ids [B, n]`` int64 (target ids) -> logits ``[B, n, S]`` over the subset; ``cache`` grows by n."""
        with torch.no_grad():
            embeds = self.embed[0](input_ids)
        out = self.lm(inputs_embeds=embeds.to(self.lm.dtype), cache=cache, use_cache=cache is not None,
                      attention_mask=attention_mask)
        return out.logits

    def trainable_state(self) -> dict[str, Tensor]:
        """Layers and final norm: everything but the (target-derived) head."""
        skip = self._head_keys()
        return {k: v for k, v in self.lm.state_dict().items() if k not in skip}

    def _head_keys(self) -> set[str]:
        return {k for k in self.lm.state_dict() if k.endswith("embed_tokens.weight") or k.endswith("lm_head.weight")}

    def save(self, directory: Path, target_name: str, target_vocab_size: int) -> None:
        import safetensors.torch

        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in self.trainable_state().items()}
        state[TOKEN_MAP] = self.token_map.cpu().contiguous()
        safetensors.torch.save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
        self.lm.config.save_pretrained(directory)
        meta = {"format": FORMAT, "target": target_name, "target_vocab_size": target_vocab_size,
                "hidden_size": int(self.lm.config.hidden_size)}
        (directory / META).write_text(json.dumps(meta, indent=1) + "\n")


def _head_rows(target_model: nn.Module, token_map: Tensor) -> Tensor:
    weight = target_model.get_output_embeddings().weight.detach()
    return weight[token_map.to(weight.device, torch.int64)]


def build_from_target(target_model: nn.Module, layer_ids: list[int], token_map: Tensor) -> SmallDraft:
    """A draft of ``len(layer_ids)`` layers copied from the target (``layer_ids`` index its decoder layers), the
    target's final norm, and the head rows ``token_map``; float32, on the target's device, ready to train.

    Raises:
        ConfigError: a layer id outside the target.
    """
    from transformers import AutoModelForCausalLM

    cfg = target_model.config.__class__.from_dict(target_model.config.to_dict())
    n_layers = cfg.num_hidden_layers
    if not layer_ids or any(not 0 <= i < n_layers for i in layer_ids):
        raise ConfigError(f"draft layers {layer_ids} must be in [0, {n_layers}) (the target has {n_layers} layers)")
    cfg.num_hidden_layers = len(layer_ids)
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[i] for i in layer_ids]
    cfg.vocab_size = int(token_map.numel())
    cfg.tie_word_embeddings = True
    lm = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    src = target_model.model
    with torch.no_grad():
        for j, i in enumerate(layer_ids):
            lm.model.layers[j].load_state_dict({k: v.float() for k, v in src.layers[i].state_dict().items()})
        lm.model.norm.load_state_dict({k: v.float() for k, v in src.norm.state_dict().items()})
        lm.model.embed_tokens.weight.copy_(_head_rows(target_model, token_map).float())
    lm.model.embed_tokens.weight.requires_grad_(False)
    device = target_model.get_input_embeddings().weight.device  # train where the target runs (a GPU if it does)
    return SmallDraft(lm, target_model.get_input_embeddings(), token_map).to(device)


def load_small_draft(directory: Path, target_model: nn.Module, dtype: torch.dtype, device: Any) -> SmallDraft:
    """Load a draft saved by :meth:`SmallDraft.save` onto ``target_model``'s embeddings.

    Raises:
        ConfigError: another format, or a draft trained for a target with another hidden size or vocabulary.
    """
    import safetensors.torch
    from transformers import AutoConfig, AutoModelForCausalLM

    meta = json.loads((directory / META).read_text())
    if meta.get("format") != FORMAT:
        raise ConfigError(f"{directory / META}: format {meta.get('format')!r}, this specframe reads format {FORMAT}")
    emb = target_model.get_output_embeddings().weight
    if meta["hidden_size"] != emb.shape[1] or meta["target_vocab_size"] != emb.shape[0]:
        raise ConfigError(
            f"the draft in {directory} was trained for {meta['target']!r} (hidden {meta['hidden_size']}, vocabulary "
            f"{meta['target_vocab_size']}); this target has hidden {emb.shape[1]}, vocabulary {emb.shape[0]}: "
            "train a draft for it with `specframe train draft`"
        )
    cfg = AutoConfig.from_pretrained(directory)
    lm = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    state = safetensors.torch.load_file(str(directory / "model.safetensors"))
    token_map = state.pop(TOKEN_MAP)
    missing, unexpected = lm.load_state_dict(state, strict=False)
    head = {k for k in missing if k.endswith("embed_tokens.weight") or k.endswith("lm_head.weight")}
    if unexpected or set(missing) - head:
        raise ConfigError(f"{directory}/model.safetensors does not match its config.json "
                          f"(missing {sorted(set(missing) - head)[:3]}, unexpected {sorted(unexpected)[:3]})")
    with torch.no_grad():
        lm.model.embed_tokens.weight.copy_(_head_rows(target_model, token_map).to(dtype))
    draft = SmallDraft(lm, target_model.get_input_embeddings(), token_map)
    return draft.to(device).eval()


def export_standalone(directory: Path, target_model: nn.Module, tokenizer: Any, out: Path) -> Path:
    """Write a self-contained transformers model of the draft (the target's full-vocabulary input embedding and
    output head copied in) plus the target's tokenizer into ``out``, e.g. as the ``assistant_model`` of transformers'
    assisted generation. Its head covers the whole vocabulary (the subset rows are the ones it was trained on),
    so it drafts a little differently from the subset draft and costs more per token.

    ``out`` must not exist, be empty, or hold an earlier export (it is replaced); it is written whole or not at all.

    Raises:
        ConfigError: as :func:`load_small_draft`; ``out`` is a file or a folder that is not an earlier export.
    """
    import shutil
    import tempfile

    from transformers import AutoModelForCausalLM

    from ..io.atomic import check_output

    check_output(out, [directory], owned=True)  # (never the draft's own folder or one holding it)
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or (out / "config.json").is_file())):
        raise ConfigError(f"{out} exists and is not an earlier export (a folder with config.json): choose another "
                          "output folder")
    draft = load_small_draft(directory, target_model, torch.float32, "cpu")
    cfg = draft.lm.config.__class__.from_dict(draft.lm.config.to_dict())
    emb = target_model.get_input_embeddings().weight.detach().float()
    head = target_model.get_output_embeddings().weight.detach().float()
    cfg.vocab_size = int(emb.shape[0])
    cfg.tie_word_embeddings = emb.data_ptr() == head.data_ptr() or torch.equal(emb, head)
    lm = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    state = {k: v for k, v in draft.lm.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k}
    missing, unexpected = lm.load_state_dict(state, strict=False)
    if unexpected:
        raise ConfigError(f"cannot export {directory}: unexpected weights {sorted(unexpected)[:3]}")
    with torch.no_grad():
        lm.model.embed_tokens.weight.copy_(emb)
        if not cfg.tie_word_embeddings:
            lm.lm_head.weight.copy_(head)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out.parent))
    try:
        lm.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written is left behind
    return out
