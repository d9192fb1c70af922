"""Drafters in the field's published layouts, on checkpoints these tests write themselves (tiny configs, random
or constructed weights): EAGLE-3 native and speculators (``eagle`` with ``checkpoint:``), Medusa's and vLLM's
Medusa layout (``medusa`` with ``checkpoint:``).

- the architecture against a reference written from transformers' own Llama layer (speculators' construction);
- greedy output token-identical to transformers (fp32) on Llama and Qwen2 targets; the conformance kit (sampling);
- **known drafts**: on a scripted target whose greedy successor is a fixed permutation ``succ`` (a real Llama whose
  layers add nothing, so every hidden state is the one-hot token), checkpoints built so that they must draft
  ``succ(x), succ(succ(x)), ...``; a loader with a head offset, a dropped ``d2t`` or a wrong concat order fails;
- errors: another target's hidden size or vocabulary, a speculators algorithm that is not eagle3, weights that do
  not match the config; a verifier name that differs only warns.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import safetensors.torch
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specframe.errors import ConfigError
from specframe.learned import eagle3 as e3
from specframe.learned.medusa_published import load_medusa, save_medusa
from specframe.target.hf import Target
from specframe.testing import Kit
from specframe_plugins.eagle import EagleConfig, EagleProposer
from specframe_plugins.medusa import MedusaConfig, MedusaProposer

from tests.fakes import (
    NAME,
    PROMPT,
    PROMPT_2,
    SV,
    VOCAB,
    build_model,
    build_tokenizer,
    check_metrics,
    drafts_seen,
    hf_greedy,
    mtp,
    run,
    successor,
    successor_chain,
)

N_NEW = 24


# --- writing checkpoints in the published layouts ----------------------------------------------------------------
def write_eagle3(folder: Path, target_cfg, fmt: str, seed: int = 0, subset: torch.Tensor | None = None,
                 layer_type: str = "llama", num_layers: int = 1, taps=None, **flags) -> Path:
    """A random EAGLE-3 drafter for ``target_cfg`` in ``fmt`` (``eagle3`` native or ``speculators``)."""
    tm = torch.arange(target_cfg.vocab_size) if subset is None else subset
    d = e3.Eagle3Drafter.new(target_cfg, tm, feature_layers=taps, seed=seed)
    if layer_type != "llama" or num_layers != 1 or flags:
        fields = e3._layer_fields(d)
        fields.update(num_hidden_layers=num_layers)
        cfg = e3._layer_config(layer_type, {**fields, "head_dim": d.layer_cfg.head_dim})
        d2 = e3.Eagle3Drafter(cfg, layer_type, d.feature_layers, int(tm.numel()), target_cfg.vocab_size,
                              target_cfg.hidden_size, **flags)
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for _name, p in d2.named_parameters():
                p.copy_(torch.randn(p.shape, generator=gen) / (p.shape[-1] ** 0.5) if p.dim() == 2
                        else 1 + 0.1 * torch.randn(p.shape, generator=gen))
            d2.d2t.copy_(d.d2t)
            d2.t2d.copy_(d.t2d)
        d = d2
    e3.save_eagle3(d, folder, fmt, "org/" + NAME, "LlamaForCausalLM")
    return folder


@pytest.fixture(scope="module")
def targets() -> dict[str, Target]:
    return {a: Target(build_model(a, num_hidden_layers=8), build_tokenizer(), name=NAME) for a in ("llama", "qwen2")}


def eagle(target: Target, folder: Path, **kw) -> EagleProposer:
    return EagleProposer(EagleConfig(checkpoint=str(folder), **kw), target.info)


# --- the architecture against a reference built from transformers' Llama layer (speculators' construction) -------
def reference_eagle3(folder: Path, feats: torch.Tensor, tokens: torch.Tensor, embed) -> torch.Tensor:
    """Logits of the drafter in ``folder`` over a causal sequence, computed with transformers' LlamaDecoderLayer
    whose q/k/v are widened to 2H (as speculators' Eagle3FirstLayerMixin does). ``feats [1, n, 3H]``."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

    cfg_d = json.loads((folder / "config.json").read_text())
    cfg_d = cfg_d.get("transformer_layer_config", cfg_d)
    w = safetensors.torch.load_file(str(folder / "model.safetensors"))
    w = {k.replace("layers.0.", "midlayer."): v for k, v in w.items()}
    lc = LlamaConfig(**{k: v for k, v in cfg_d.items() if k not in ("architectures",)})
    lc._attn_implementation = "eager"
    h = lc.hidden_size
    layer = LlamaDecoderLayer(lc, 0)
    hd = h // lc.num_attention_heads
    layer.self_attn.q_proj = torch.nn.Linear(2 * h, lc.num_attention_heads * hd, bias=False)
    layer.self_attn.k_proj = torch.nn.Linear(2 * h, lc.num_key_value_heads * hd, bias=False)
    layer.self_attn.v_proj = torch.nn.Linear(2 * h, lc.num_key_value_heads * hd, bias=False)
    hidden_norm = LlamaRMSNorm(h, eps=lc.rms_norm_eps)
    layer.load_state_dict({k[len("midlayer."):]: v for k, v in w.items() if k.startswith("midlayer.")
                           and "hidden_norm" not in k})
    hidden_norm.weight.data.copy_(w["midlayer.hidden_norm.weight"])
    n = tokens.shape[1]
    g = feats @ w["fc.weight"].T
    emb = embed(tokens)
    x = torch.cat([layer.input_layernorm(emb), hidden_norm(g)], -1)
    pos = torch.arange(n)[None]
    cos, sin = LlamaRotaryEmbedding(lc)(x, pos)
    causal = torch.full((n, n), float("-inf")).triu(1)[None, None]
    att, _ = layer.self_attn(hidden_states=x, position_embeddings=(cos, sin), attention_mask=causal)
    out = g + att
    out = out + layer.mlp(layer.post_attention_layernorm(out))
    norm = LlamaRMSNorm(h, eps=lc.rms_norm_eps)
    norm.weight.data.copy_(w["norm.weight"])
    return norm(out) @ w["lm_head.weight"].T


@pytest.mark.parametrize("fmt", ["eagle3", "speculators"])
def test_eagle3_matches_reference_layer(targets, tmp_path, fmt):
    t = targets["llama"]
    cfg = t.model.config
    folder = write_eagle3(tmp_path / fmt, cfg, fmt, seed=3)
    d = e3.load_eagle3(folder, cfg.hidden_size, VOCAB, cfg.num_hidden_layers, NAME)
    d.target_embed = t.model.get_input_embeddings()
    assert d.feature_layers == (2, 4, 5)  # (2, L // 2, L - 3) for L = 8
    torch.manual_seed(0)
    feats = torch.randn(1, 9, 3, cfg.hidden_size)
    tokens = torch.randint(1, VOCAB, (1, 9))
    with torch.no_grad():
        a, _ = d.step(d.fuse(feats), tokens, torch.arange(9)[None], None)
        ours = d.logits(a)
        ref = reference_eagle3(folder, feats.flatten(-2), tokens, t.model.get_input_embeddings())
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


# --- greedy exactness and the conformance kit --------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("variant", [
    {"fmt": "eagle3"},
    {"fmt": "speculators"},
    {"fmt": "speculators", "layer_type": "qwen3"},
    {"fmt": "speculators", "num_layers": 2, "norm_before_residual": True},
    {"fmt": "speculators", "fc_norm": True, "norm_output": True},
    {"fmt": "speculators", "norm_before_fc": True},
])
def test_eagle3_greedy_output_equals_transformers(targets, tmp_path, arch, variant):
    t = targets[arch]
    subset = torch.tensor(sorted(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(5))[:40].tolist()))
    folder = write_eagle3(tmp_path / "d", t.model.config, subset=subset, seed=1, **variant)
    for opts in ({}, {"top_k": 1, "depth": 3}):
        for prompt in (PROMPT, PROMPT_2):
            r = run(t, [eagle(t, folder, **opts)], prompt=prompt)
            assert r.token_ids == hf_greedy(t.model, prompt, N_NEW)
            check_metrics(r)
            assert r.metrics.drafted_nodes > 0


def test_eagle3_conformance_kit(tmp_path, specframe_tiny_target):
    m = specframe_tiny_target.model
    folder = write_eagle3(tmp_path / "kit", m.config, "speculators", seed=4, taps=(0, 1, 1))
    kit = Kit(EagleProposer, {"checkpoint": str(folder), "top_k": 3, "max_nodes": 8}, samples=300,
              target=specframe_tiny_target)
    for check in ("check_contract", "check_greedy_lossless", "check_sampling_lossless",
                  "check_draft_probs_match_samples", "check_rollback_after_partial_acceptance", "check_determinism"):
        getattr(kit, check)()  # raises ConformanceError on failure
    rec, results = kit.greedy_battery
    assert sum(r.metrics.drafted_nodes for r in results) > 0


# --- known drafts on a scripted successor target -----------------------------------------------------------------


@pytest.fixture(scope="module")
def scripted() -> Target:
    """A Llama whose layers add nothing (o_proj, down_proj zero), one-hot embeddings and an LM head that maps token
    ``x`` to ``succ(x)``: its greedy continuation of ``x`` is ``succ(x), succ(succ(x)), ...``."""
    cfg = LlamaConfig(vocab_size=SV, hidden_size=SV, intermediate_size=32, num_hidden_layers=8, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
    m = LlamaForCausalLM(cfg).float().eval()
    succ = successor()
    with torch.no_grad():
        m.model.embed_tokens.weight.copy_(torch.eye(SV))
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = torch.zeros(SV, SV)
        head[succ, range(SV)] = 1.0
        m.lm_head.weight.copy_(head)
    m.generation_config.eos_token_id = None
    m.generation_config.pad_token_id = 0
    return Target(m, build_tokenizer(), name=NAME)


def known_state(subset: torch.Tensor, via: str) -> dict:
    """Weights that make an EAGLE-3 drafter draft ``succ`` over the draft vocabulary ``subset`` (``lm_head`` is
    the identity on draft slots, ``d2t`` maps slot ``i`` to ``subset[i]``).

    ``via="embedding"`` (one attention head of 128 dims): q = k = the token's one-hot in the first 64 dims (RoPE
    pairs dim ``i`` with ``i + 64``, so different tokens never score), so an entry attends to entries of its own
    token, whose values are equal; o maps the one-hot to the draft slot of ``succ(token)``. fc is zero and, with
    ``norm_before_residual`` and a zero ``hidden_norm``, so is the residual: every level drafts ``succ`` of the token
    it is fed. ``via="features"``: attention and MLP add nothing; fc maps the *middle* tapped feature (the one-hot
    of the committed token ``x_t``) to the draft slot of ``succ(succ(x_t))``, the token after ``x_{t+1}``."""
    succ = successor()
    slot = {tok: i for i, tok in enumerate(subset.tolist())}
    h, big = SV, 30.0
    to_slot = torch.zeros(h, h)
    for x in range(SV):
        y = succ[x] if via == "embedding" else succ[succ[x]]
        if y in slot:
            to_slot[slot[y], x] = big
    st = {"lm_head.weight": torch.eye(len(slot), h), "norm.weight": torch.ones(h),
          "layers.0.mlp.down_proj.weight": torch.zeros(h, 32)}
    if via == "embedding":
        qkv = torch.zeros(128, 2 * h)
        qkv[:h, :h] = torch.eye(h)  # the first half of the layer input is input_layernorm(embedding)
        st.update({"embed_tokens.weight": torch.eye(SV, h), "fc.weight": torch.zeros(h, 3 * h),
                   "layers.0.hidden_norm.weight": torch.zeros(h),
                   "layers.0.self_attn.q_proj.weight": big * qkv, "layers.0.self_attn.k_proj.weight": big * qkv,
                   "layers.0.self_attn.v_proj.weight": qkv,
                   "layers.0.self_attn.o_proj.weight": torch.cat([to_slot, torch.zeros(h, 64)], 1)})
    else:
        fc = torch.zeros(h, 3 * h)
        fc[:, h : 2 * h] = to_slot  # the middle tap only
        st.update({"fc.weight": fc, "layers.0.self_attn.o_proj.weight": torch.zeros(h, h)})
    return st


def _write_known(folder: Path, target: Target, subset: torch.Tensor, via: str, fmt: str) -> Path:
    if via == "embedding":
        lc = LlamaConfig(hidden_size=SV, intermediate_size=32, num_attention_heads=1, num_key_value_heads=1,
                         head_dim=128, vocab_size=SV, max_position_embeddings=256, rms_norm_eps=1e-6)
        d = e3.Eagle3Drafter(e3._layer_config("llama", {**lc.to_dict(), "num_hidden_layers": 1}), "llama",
                             e3.default_taps(8), int(subset.numel()), SV, SV, own_embed=True,
                             norm_before_residual=True)
    else:
        d = e3.Eagle3Drafter.new(target.model.config, subset, intermediate_size=32)
    own = d.state_dict()
    own.update(known_state(subset, via))
    own["d2t"] = subset - torch.arange(subset.numel())
    own["t2d"] = torch.zeros(SV, dtype=torch.bool)
    own["t2d"][subset] = True
    d.load_state_dict(own)
    e3.save_eagle3(d, folder, fmt, "org/" + NAME, "LlamaForCausalLM")
    return folder


def known_subset() -> torch.Tensor:
    """56 of the 64 ids (a non-trivial d2t); the prompt's successor chain stays inside it for 8 tokens."""
    holes = set(successor_chain(PROMPT[-1], 40)[12:20])
    return torch.tensor([i for i in range(SV) if i not in holes])


def test_eagle3_known_drafts_through_the_embedding(scripted, tmp_path):
    subset = known_subset()
    folder = _write_known(tmp_path / "emb", scripted, subset, "embedding", "speculators")
    p = eagle(scripted, folder, top_k=1, depth=4)
    seen, r = drafts_seen(scripted, p, PROMPT)
    tokens, ids, parents = seen[0]
    assert ids == successor_chain(tokens[-1], 4) and parents == [-1, 0, 1, 2]
    assert r.token_ids == successor_chain(PROMPT[-1], 8)  # the scripted target's own continuation
    assert r.metrics.accepted_nodes == r.metrics.drafted_nodes  # every known draft is accepted


@pytest.mark.parametrize("fmt", ["eagle3", "speculators"])
def test_eagle3_known_first_draft_through_the_middle_tap(scripted, tmp_path, fmt):
    subset = known_subset()
    folder = _write_known(tmp_path / fmt, scripted, subset, "features", fmt)
    p = eagle(scripted, folder, top_k=1, depth=1)
    prompt = [PROMPT[-1], *successor_chain(PROMPT[-1], 5)]  # what the target itself would write: x_{t+1} = succ(x_t)
    seen, r = drafts_seen(scripted, p, prompt)
    assert len(seen) > 1
    for tokens, ids, _ in seen:
        assert ids == successor_chain(tokens[-1], 1)
    assert r.metrics.accepted_nodes == r.metrics.drafted_nodes > 0


def test_eagle3_known_drafts_fail_with_a_broken_loader(scripted, tmp_path, monkeypatch):
    """The known-draft test is sensitive: dropping d2t (draft id taken as target id) changes the drafts."""
    subset = known_subset()
    folder = _write_known(tmp_path / "emb", scripted, subset, "embedding", "speculators")
    monkeypatch.setattr(e3.Eagle3Drafter, "token_map", property(lambda self: torch.arange(self.d2t.numel())))
    p = eagle(scripted, folder, top_k=1, depth=4)
    seen, _ = drafts_seen(scripted, p, PROMPT)
    tokens, ids, _ = seen[0]
    assert ids != successor_chain(tokens[-1], 4)


# --- Medusa -----------------------------------------------------------------------------------------------------
def write_medusa(folder: Path, hidden: int, vocab: int, heads: int, layers: int, fmt: str, seed: int = 0,
                 head_weights: list[torch.Tensor] | None = None, zero_blocks: bool = False,
                 token_map: torch.Tensor | None = None) -> Path:
    from specframe.learned.medusa_published import PublishedMedusa

    m = PublishedMedusa(hidden, heads, layers, vocab, True, token_map)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.0 if zero_blocks and p.shape[0] == hidden else 0.3))
        if head_weights is not None:
            for h, w in enumerate(head_weights):
                m.lm_heads[h].weight.copy_(w)
    save_medusa(m, folder, fmt, "org/" + NAME)
    return folder


def medusa(target: Target, folder: Path, **kw) -> MedusaProposer:
    return MedusaProposer(MedusaConfig(checkpoint=str(folder), **kw), target.info)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("fmt", ["medusa", "vllm-medusa"])
def test_medusa_checkpoint_greedy_output_equals_transformers(targets, tmp_path, arch, fmt):
    t = targets[arch]
    folder = write_medusa(tmp_path / fmt, 32, VOCAB, 3, 2, fmt, seed=2)
    for opts in ({}, {"top_k": 1}):
        for prompt in (PROMPT, PROMPT_2):
            r = run(t, [medusa(t, folder, **opts)], prompt=prompt)
            assert r.token_ids == hf_greedy(t.model, prompt, N_NEW)
            check_metrics(r)
            assert r.metrics.drafted_nodes > 0


def successor_heads(n: int) -> list[torch.Tensor]:
    """``n`` LM heads ``[SV, SV]``: head ``h`` maps the one-hot of token ``x`` to ``succ^(h + 2)(x)``."""
    succ, heads = successor(), []
    for h in range(n):
        w = torch.zeros(SV, SV)
        for x in range(SV):
            y = x
            for _ in range(h + 2):
                y = succ[y]
            w[y, x] = 1.0
        heads.append(w)
    return heads


@pytest.mark.parametrize("fmt", ["medusa", "vllm-medusa"])
def test_medusa_known_drafts(scripted, tmp_path, fmt):
    """Head ``h``'s own LM head maps the one-hot hidden state of token ``x`` to ``succ^(h + 2)(x)``: the draft after
    a step that committed ``y = succ(x)`` must be ``succ(y), succ(succ(y)), ...``; all of it is accepted."""
    heads = successor_heads(3)
    folder = write_medusa(tmp_path / fmt, SV, SV, 3, 1, fmt, head_weights=heads, zero_blocks=True)
    p = medusa(scripted, folder, top_k=1)
    prompt = [PROMPT[-1], *successor_chain(PROMPT[-1], 5)]  # what the target itself would write: x_{t+1} = succ(x_t)
    seen, r = drafts_seen(scripted, p, prompt)
    for tokens, ids, _ in seen:  # (the last draft is cut by the token limit)
        assert ids == successor_chain(tokens[-1], 3)[: len(ids)] and ids
    assert len(seen[0][1]) == 3
    assert r.token_ids == successor_chain(prompt[-1], 8)
    assert r.metrics.accepted_nodes == r.metrics.drafted_nodes > 0


def test_medusa_round_trip_keeps_a_token_map(tmp_path):
    tm = torch.tensor([1, 4, 9, 16, 25, 36, 49, 63])
    folder = write_medusa(tmp_path / "m", 32, VOCAB, 2, 1, "medusa", seed=3, token_map=tm)
    m = load_medusa(folder, 32, VOCAB, NAME)
    assert m.token_map.tolist() == tm.tolist() and m.lm_heads[0].weight.shape == (8, 32)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["medusa_num_heads"] == 2 and cfg["truncated_vocab_size"] == 8
    w = safetensors.torch.load_file(str(folder / "medusa_lm_head.safetensors"))
    assert w["0.1.weight"].shape == (VOCAB, 32) and "0.0.linear.bias" in w


# --- errors -------------------------------------------------------------------------------------------------------
def test_eagle3_for_another_hidden_size_is_one_error(targets, tmp_path):
    other = build_model("llama", num_hidden_layers=8, hidden_size=48, num_attention_heads=4).config
    folder = write_eagle3(tmp_path / "d", other, "speculators")
    with pytest.raises(ConfigError, match="target hidden size is 48, the target's is 32"):
        eagle(targets["llama"], folder)


def test_eagle3_for_another_vocabulary_is_one_error(targets, tmp_path):
    other = build_model("llama", num_hidden_layers=8, vocab_size=80).config
    folder = write_eagle3(tmp_path / "d", other, "eagle3")
    with pytest.raises(ConfigError, match="target vocabulary is 80, the target's is 64"):
        eagle(targets["llama"], folder)


def test_speculators_other_algorithm_and_bad_weights(targets, tmp_path):
    t = targets["llama"]
    folder = write_eagle3(tmp_path / "d", t.model.config, "speculators")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "speculators_model_type": "mlp"}))
    with pytest.raises(ConfigError, match="speculators 'mlp' checkpoint"):
        eagle(t, folder)
    (folder / "config.json").write_text(json.dumps(cfg))
    w = safetensors.torch.load_file(str(folder / "model.safetensors"))
    w.pop("layers.0.mlp.up_proj.weight")
    safetensors.torch.save_file(w, str(folder / "model.safetensors"))
    with pytest.raises(ConfigError, match="do not match its config.json"):
        eagle(t, folder)
    with pytest.raises(ConfigError, match="holds no EAGLE drafter: it needs eagle.json .* or config.json"):
        eagle(t, tmp_path)


def test_a_verifier_named_otherwise_only_warns(targets, tmp_path, caplog):
    t = targets["llama"]
    folder = write_eagle3(tmp_path / "d", t.model.config, "speculators")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["speculators_config"]["verifier"]["name_or_path"] = "meta-llama/Llama-3.1-8B-Instruct"
    (folder / "config.json").write_text(json.dumps(cfg))
    with caplog.at_level(logging.WARNING, logger="specframe"):
        p = eagle(t, folder)
    assert "made for 'meta-llama/Llama-3.1-8B-Instruct'" in caplog.text
    assert run(t, [p]).token_ids == hf_greedy(t.model, PROMPT, N_NEW)


def test_medusa_for_another_hidden_size_is_one_error(targets, tmp_path):
    folder = write_medusa(tmp_path / "m", 48, VOCAB, 2, 1, "medusa")
    with pytest.raises(ConfigError, match="hidden size is 48, the target's is 32"):
        medusa(targets["llama"], folder)


# --- MTP layers inside a DeepSeek-V3-style target checkpoint -----------------------------------------------------
def deepseek_config(vocab: int = VOCAB, hidden: int = 32):
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, num_nextn_predict_layers=1, max_position_embeddings=256,
        tie_word_embeddings=False, routed_scaling_factor=1.0)


def write_deepseek_with_mtp(folder: Path, seed: int = 0, known: bool = False) -> Target:
    """A tiny DeepSeek-V3 saved with one MTP module (``model.layers.2.*``) appended to its weights, as DeepSeek-V3
    ships; loaded back through transformers (which drops the MTP keys). ``known``: hidden = vocab = 64, one-hot
    embeddings, the MTP block adds nothing and ``eh_proj`` passes the token's embedding through, so the module drafts
    ``succ`` of the token it is fed."""
    from transformers import DeepseekV3ForCausalLM
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

    torch.manual_seed(seed)
    cfg = deepseek_config(SV, SV) if known else deepseek_config()
    model = DeepseekV3ForCausalLM(cfg).float().eval()
    h, n = cfg.hidden_size, cfg.num_hidden_layers
    block = DeepseekV3DecoderLayer(cfg, n)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.2) if p.dim() == 2 else p.fill_(1.0)
        if known:
            model.model.embed_tokens.weight.copy_(torch.eye(SV))
    pre = f"model.layers.{n}."
    extra = {pre + k: v.detach().clone() for k, v in block.state_dict().items()}
    extra.update({pre + "enorm.weight": torch.ones(h), pre + "hnorm.weight": torch.ones(h),
                  pre + "eh_proj.weight": torch.randn(h, 2 * h) / (2 * h) ** 0.5,
                  pre + "shared_head.norm.weight": torch.ones(h),
                  pre + "shared_head.head.weight": torch.randn(cfg.vocab_size, h) / h ** 0.5,
                  pre + "embed_tokens.weight": model.model.embed_tokens.weight.detach().clone()})
    if known:
        succ = successor()
        eh = torch.zeros(h, 2 * h)
        eh[:, :h] = torch.eye(h)
        head = torch.zeros(SV, SV)
        head[succ, range(SV)] = 1.0
        extra.update({pre + "eh_proj.weight": eh, pre + "shared_head.head.weight": head,
                      pre + "self_attn.o_proj.weight": torch.zeros(h, cfg.num_attention_heads * cfg.v_head_dim)})
        for k in list(extra):
            if k.endswith("down_proj.weight"):
                extra[k] = torch.zeros_like(extra[k])
    model.save_pretrained(folder)
    w = safetensors.torch.load_file(str(folder / "model.safetensors"))
    w.update({k: v.contiguous() for k, v in extra.items()})
    safetensors.torch.save_file(w, str(folder / "model.safetensors"), metadata={"format": "pt"})
    loaded = DeepseekV3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    loaded.generation_config.eos_token_id = None
    loaded.generation_config.pad_token_id = 0
    return Target(loaded, build_tokenizer(), name=NAME)


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory) -> Target:
    return write_deepseek_with_mtp(tmp_path_factory.mktemp("deepseek"))


@pytest.mark.parametrize("depth", [None, 3])
def test_mtp_greedy_output_equals_transformers(deepseek, depth):
    for prompt in (PROMPT, PROMPT_2):
        r = run(deepseek, [mtp(deepseek, depth=depth)], prompt=prompt)
        assert r.token_ids == hf_greedy(deepseek.model, prompt, N_NEW)
        check_metrics(r)
        assert r.metrics.drafted_nodes > 0


def test_mtp_matches_its_module_run_whole(deepseek):
    """The cached catch-up (engine steps, then drafting) computes what one causal pass of the module over the
    whole committed sequence computes."""
    p = mtp(deepseek, depth=1)
    seen, r = drafts_seen(deepseek, p, PROMPT)
    tokens = seen[-1][0]
    ids = torch.tensor([tokens])
    with torch.no_grad():
        out = deepseek.model(input_ids=ids[:, :-1], output_hidden_states=True)
        h = out.hidden_states[-1]
        d = p.drafter
        a = d.step(h, ids[:, 1:], torch.arange(len(tokens) - 1)[None], d.new_cache(), 0)
        want = int(d.logits(a[0, -1], 0).argmax())
    assert seen[-1][1] == [want]


def test_mtp_known_drafts(tmp_path):
    t = write_deepseek_with_mtp(tmp_path / "known", known=True)
    seen, r = drafts_seen(t, mtp(t, depth=3), PROMPT)
    for tokens, ids, _ in seen:
        assert ids == successor_chain(tokens[-1], len(ids)) and ids
    assert len(seen[0][1]) == 3
    assert r.token_ids == hf_greedy(t.model, PROMPT, 8)


def test_mtp_conformance_kit(deepseek):
    kit = Kit(MtpProposerCls(), {"depth": 2}, samples=200, target=deepseek)
    for check in ("check_contract", "check_greedy_lossless", "check_sampling_lossless",
                  "check_draft_probs_match_samples", "check_rollback_after_partial_acceptance", "check_determinism"):
        getattr(kit, check)()  # raises ConformanceError on failure
    rec, results = kit.greedy_battery
    assert sum(r.metrics.drafted_nodes for r in results) > 0


def MtpProposerCls():
    from specframe_plugins.mtp import MtpProposer

    return MtpProposer


def test_mtp_on_a_target_without_mtp_layers_is_one_error(targets):
    with pytest.raises(ConfigError, match="carries no MTP layers"):
        mtp(targets["llama"])


# --- training in the EAGLE-3 architecture (specframe train eagle --arch eagle3) ----------------------------------
def test_training_in_the_eagle3_architecture_learns_and_loads(tmp_path):
    import random

    from specframe.training.eagle import EagleSettings, finish_eagle, train_eagle

    model = build_model("llama", num_hidden_layers=8, seed=3)
    t = Target(model, build_tokenizer(), name=NAME)
    records = []
    for i in range(48):
        prompt = [random.Random(i).randrange(1, VOCAB) for _ in range(6)]
        records.append({"kind": "x", "prompt_ids": prompt, "response_ids": hf_greedy(model, prompt, 20)})
    s = EagleSettings(vocab_subset=48, epochs=12, batch_size=8, lr=3e-3, warmup=5, autocast=False, arch="eagle3")
    summary = train_eagle(t, records, tmp_path / "d", s)
    finish_eagle(summary["drafter"], tmp_path / "d", NAME)
    assert summary["init_from_target_layer"] is True and summary["final_acc"] > 0.5
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert cfg["draft_vocab_size"] == 48
    untrained = write_eagle3(tmp_path / "u", model.config, "speculators", seed=9)

    def tau(folder):
        toks = fwd = 0
        for i in range(5):
            prompt = [random.Random(1000 + i).randrange(1, VOCAB) for _ in range(6)]
            r = run(t, [EagleProposer(EagleConfig(weights=str(folder), max_nodes=8), t.info)], prompt=prompt, n=20)
            assert r.token_ids == hf_greedy(model, prompt, 20)
            toks, fwd = toks + len(r.token_ids), fwd + r.metrics.target_forwards
        return toks / fwd

    trained = tau(tmp_path / "d")
    assert trained > 1.5 and trained > tau(untrained) + 0.3


def test_medusa_known_drafts_fail_with_a_head_offset(scripted, tmp_path, monkeypatch):
    """The known-draft test is sensitive: a loader that takes head h for depth h + 2 (one head dropped) drafts other
    tokens."""
    from specframe.learned import medusa_published as mp

    heads = successor_heads(3)
    folder = write_medusa(tmp_path / "m", SV, SV, 3, 1, "medusa", head_weights=heads, zero_blocks=True)
    real = mp.PublishedMedusa.logits
    monkeypatch.setattr(mp.PublishedMedusa, "logits", lambda self, h: real(self, h)[..., 1:, :])
    prompt = [PROMPT[-1], *successor_chain(PROMPT[-1], 5)]
    seen, _ = drafts_seen(scripted, medusa(scripted, folder, top_k=1), prompt)
    tokens, ids, _ = seen[0]
    assert ids != successor_chain(tokens[-1], len(ids))


# --- specframe export ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, targets) -> Path:
    """The llama target saved as a transformers folder (what `--model DIR` reads)."""
    folder = tmp_path_factory.mktemp("llama-folder")
    targets["llama"].model.save_pretrained(folder)
    return folder


def _export(*args: str):
    from typer.testing import CliRunner

    from specframe import cli

    return CliRunner().invoke(cli.app, ["export", *args])


def test_export_eagle3_between_layouts_keeps_the_drafter(targets, model_folder, tmp_path):
    t = targets["llama"]
    src = write_eagle3(tmp_path / "spec", t.model.config, "speculators", seed=6, num_layers=1)
    r = _export("eagle3", str(src), "--format", "eagle3", "--output", str(tmp_path / "native"), "--model",
                str(model_folder), "--dtype", "bfloat16")
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "native" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["torch_dtype"] == "bfloat16"
    assert "midlayer.self_attn.q_proj.weight" in safetensors.torch.load_file(str(tmp_path / "native" / "model.safetensors"))
    assert (tmp_path / "native" / "README.md").is_file()
    back = tmp_path / "back"
    r = _export("eagle3", str(tmp_path / "native"), "--output", str(back), "--model", str(model_folder))
    assert r.exit_code == 0, r.output
    a = e3.load_eagle3(back, 32, VOCAB, 8, NAME)
    b = e3.load_eagle3(tmp_path / "native", 32, VOCAB, 8, NAME)
    for (k, v), (k2, v2) in zip(a.state_dict().items(), b.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    assert json.loads((back / "config.json").read_text())["torch_dtype"] == "bfloat16"  # the source's dtype kept
    r1 = run(t, [eagle(t, tmp_path / "native")])
    r2 = run(t, [eagle(t, back)])
    assert r1.token_ids == r2.token_ids and r1.metrics.accepted_nodes == r2.metrics.accepted_nodes


def test_export_never_deletes_what_it_did_not_write(targets, model_folder, tmp_path):
    """Issue 55 (5): `--output` set to the source's parent exited 0 and replaced the parent whole (the source and its
    siblings gone). A folder that is or holds the source, or holds files export did not write, is refused before
    anything loads; a folder export wrote is replaced on the next export."""
    from tests.fakes import assert_user_error

    t = targets["llama"]
    ex = tmp_path / "ex"
    src = write_eagle3(ex / "src", t.model.config, "speculators", seed=6, num_layers=1)
    (ex / "notes.txt").write_text("mine")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for out, needle in ((ex, "holds the source"), (src, "is the source"), (tmp_path, "holds the source")):
        assert_user_error(_export("eagle3", str(src), "--format", "eagle3", "--output", str(out), "--model",
                                  str(model_folder)), needle)
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.bin").write_bytes(b"x")
    assert_user_error(_export("eagle3", str(src), "--format", "eagle3", "--output", str(other), "--model",
                              str(model_folder)), "did not write")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "other" not in p.parts) == before
    out = tmp_path / "out"
    for _ in range(2):  # the second export replaces the first one's folder
        r = _export("eagle3", str(src), "--format", "eagle3", "--output", str(out), "--model", str(model_folder))
        assert r.exit_code == 0, r.output
    assert (out / "config.json").is_file() and (ex / "notes.txt").read_text() == "mine"


def test_export_refuses_specframes_own_eagle_format_with_one_line(model_folder, tmp_path):
    from specframe.learned.eagle_drafter import EagleSpec, new_drafter

    from tests.fakes import assert_user_error

    cfg = LlamaConfig.from_pretrained(model_folder)
    new_drafter(EagleSpec.for_target(cfg, NAME), torch.arange(VOCAB)).save(tmp_path / "own")
    assert_user_error(_export("eagle3", str(tmp_path / "own"), "--output", str(tmp_path / "o"), "--model",
                              str(model_folder)), "--arch eagle3")
    assert not (tmp_path / "o").exists()
    assert_user_error(_export("eagle3", str(tmp_path / "own"), "--format", "onnx", "--output", str(tmp_path / "o"),
                              "--model", str(model_folder)), "--format 'onnx'")


def test_export_medusa_from_specframes_heads(targets, model_folder, tmp_path):
    from specframe.learned.medusa_heads import MedusaHeads

    t = targets["llama"]
    heads = MedusaHeads(32, 3, 1, torch.tensor(sorted(range(0, VOCAB, 2))))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.3)
    heads.save(tmp_path / "own", NAME)
    for fmt in ("medusa", "vllm-medusa"):
        r = _export("medusa", str(tmp_path / "own"), "--format", fmt, "--output", str(tmp_path / fmt), "--model",
                    str(model_folder))
        assert r.exit_code == 0, r.output
        m = load_medusa(tmp_path / fmt, 32, VOCAB, NAME)
        assert m.token_map is None and m.lm_heads[0].weight.shape == (VOCAB, 32)  # full-vocabulary heads
        torch.testing.assert_close(m.lm_heads[1].weight, t.model.lm_head.weight)
        torch.testing.assert_close(m.blocks[2][0].weight, heads.heads[2][0].linear.weight)
        res = run(t, [medusa(t, tmp_path / fmt)])
        assert res.token_ids == hf_greedy(t.model, PROMPT, N_NEW)
