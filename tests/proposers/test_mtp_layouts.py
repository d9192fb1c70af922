"""The MTP layers Qwen3-Next / Qwen3.5 (``mtp.*``) and MiMo (``model.mtp_layers.*``) ship, read by ``mtp`` (issue 52
d): tiny checkpoints written here in each published layout (transformers drops those tensors on load, as it does for
the real checkpoints). Random modules: greedy output token-identical to transformers. Constructed modules (one-hot
embeddings, a block that adds nothing, a projection that passes the token through, an LM head that maps each token
to its scripted successor): every draft is exactly the successor chain of the last committed token."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import safetensors.torch
import torch

from specframe import ConfigError
from specframe.target.hf import Target

from tests.fakes import PROMPT, PROMPT_2, SV, drafts_seen, hf_greedy, mtp, run, successor, successor_chain

N_NEW = 12


def _config(kind: str, vocab: int, hidden: int):
    import transformers as tf

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
    if kind == "mimo":  # MiMo is a Qwen2 with MTP layers
        return tf.Qwen2Config(**common, num_nextn_predict_layers=1), tf.Qwen2ForCausalLM
    linear = dict(head_dim=16, layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
                  linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16, mtp_num_hidden_layers=1)
    if kind == "qwen3_next":
        return (tf.Qwen3NextConfig(**common, **linear, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                   shared_expert_intermediate_size=16), tf.Qwen3NextForCausalLM)
    return tf.Qwen3_5TextConfig(**common, **linear), tf.Qwen3_5ForCausalLM


def write_with_mtp(folder: Path, kind: str, known: bool = False, seed: int = 0) -> Target:
    """A tiny ``kind`` target saved with one MTP module in its published layout, loaded back by transformers."""
    torch.manual_seed(seed)
    cfg, cls = _config(kind, SV if known else 64, SV if known else 32)
    model = cls(cfg).float().eval()
    h, n = cfg.hidden_size, cfg.num_hidden_layers
    block_cfg = copy.deepcopy(cfg)
    if getattr(cfg, "layer_types", None):
        block_cfg.layer_types = list(cfg.layer_types) + ["full_attention"]
    block = type(model.model.layers[0])(block_cfg, n)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.2) if p.dim() >= 2 else p.fill_(1.0)
        if known:
            model.model.embed_tokens.weight.copy_(torch.eye(SV))
            head = torch.zeros(SV, SV)
            head[successor(), range(SV)] = 1.0
            model.lm_head.weight.copy_(head)  # these layouts read the target's own LM head
    layer = {k: v.detach().clone() for k, v in block.state_dict().items()}
    if known:  # the block adds nothing: no attention output, no MLP output
        layer = {k: torch.zeros_like(v) if k.endswith(("o_proj.weight", "down_proj.weight", "down_proj"))
                 else v for k, v in layer.items()}
    proj = torch.randn(h, 2 * h) / (2 * h) ** 0.5
    if known:  # pass the token's embedding through: its half of the concatenation
        proj = torch.zeros(h, 2 * h)
        proj[:, h:] = torch.eye(h) if kind == "mimo" else 0
        proj[:, :h] = 0 if kind == "mimo" else torch.eye(h)
    ones = torch.ones(h)
    if kind == "mimo":
        pre = "model.mtp_layers.0."
        extra = {pre + k: v for k, v in layer.items()}
        extra.update({pre + "input_proj.weight": proj, pre + "token_layernorm.weight": ones,
                      pre + "hidden_layernorm.weight": ones.clone(), pre + "final_layernorm.weight": ones.clone()})
    else:
        extra = {"mtp.layers.0." + k: v for k, v in layer.items()}
        extra.update({"mtp.fc.weight": proj, "mtp.pre_fc_norm_embedding.weight": ones,
                      "mtp.pre_fc_norm_hidden.weight": ones.clone(), "mtp.norm.weight": ones.clone()})
    model.save_pretrained(folder)
    w = safetensors.torch.load_file(str(folder / "model.safetensors"))
    w.update({k: v.contiguous() for k, v in extra.items()})
    safetensors.torch.save_file(w, str(folder / "model.safetensors"), metadata={"format": "pt"})
    loaded = cls.from_pretrained(folder, dtype=torch.float32).eval()
    assert not any("mtp" in k for k in loaded.state_dict())  # transformers dropped them, as for the real ones
    loaded.generation_config.eos_token_id = None
    loaded.generation_config.pad_token_id = 0
    return Target(loaded, None, name=f"{kind}-mtp")


KINDS = ("qwen3_next", "qwen3_5_text", "mimo")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("depth", [1, 3])
def test_mtp_layout_greedy_output_equals_transformers(kind, depth, tmp_path):
    target = write_with_mtp(tmp_path / kind, kind)
    for prompt in (PROMPT, PROMPT_2):
        r = run(target, [mtp(target, depth=depth)], prompt=prompt, n=N_NEW)
        assert r.token_ids == hf_greedy(target.model, prompt, N_NEW)
        assert r.metrics.drafted_nodes > 0 and r.metrics.proposer_faults == 0


@pytest.mark.parametrize("kind", KINDS)
def test_mtp_layout_drafts_the_scripted_successors(kind, tmp_path):
    target = write_with_mtp(tmp_path / kind, kind, known=True)
    prompt = [t % SV for t in PROMPT]
    seen, r = drafts_seen(target, mtp(target, depth=3), prompt)
    assert seen and len(seen[0][1]) == 3
    for tokens, ids, _ in seen:
        assert ids == successor_chain(tokens[-1], len(ids))
    assert r.token_ids == hf_greedy(target.model, prompt, 8)


def test_mtp_layout_missing_its_projection_is_one_error(tmp_path):
    target = write_with_mtp(tmp_path / "q", "qwen3_next")
    folder = Path(target.model.config._name_or_path)
    w = safetensors.torch.load_file(str(folder / "model.safetensors"))
    del w["mtp.pre_fc_norm_hidden.weight"]
    safetensors.torch.save_file(w, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="lacks hnorm"):
        mtp(target)
