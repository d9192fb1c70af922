"""Pre-packed oneDNN weights (:mod:`specframe.target.packed`): every linear replaced and the logits kept (float32,
bfloat16), float16 refused, and speculative decoding on a packed model equal to plain decoding."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import specframe
from specframe.target.hf import Target
from specframe.target.packed import PackedLinear, is_packed, pack_linears, packing_available

from tests.fakes import PROMPT, build_model, build_tokenizer

needs_packing = pytest.mark.skipif(not packing_available(torch.float32, "cpu"),
                                   reason="oneDNN pre-packing is not available in this torch build")


def test_packing_available():
    assert not packing_available(torch.float16, "cpu")
    assert not packing_available(torch.float32, "meta")


@needs_packing
@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2 has biases on q, k, v
def test_pack_linears_replaces_every_linear_and_keeps_the_logits(arch):
    ref = build_model(arch)
    model = build_model(arch)
    linears = [name for name, m in model.named_modules() if type(m) is nn.Linear]
    head, up = model.lm_head.weight, model.model.layers[0].mlp.up_proj.weight
    keys, n_params = list(model.state_dict()), sum(p.numel() for p in model.parameters())
    assert not is_packed(model)
    assert pack_linears(model) == len(linears) == 2 * 7 + 1
    assert is_packed(model) and not any(type(m) is nn.Linear for m in model.modules())
    assert all(isinstance(model.get_submodule(name), PackedLinear) for name in linears)
    assert model.lm_head.weight is head and model.model.layers[0].mlp.up_proj.weight is up  # shared, not copied
    assert list(model.state_dict()) == keys and sum(p.numel() for p in model.parameters()) == n_params
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        want, got = ref(input_ids=ids).logits, model(input_ids=ids).logits
    assert got.shape == want.shape == (1, len(PROMPT), 64)
    assert (got - want).abs().max().item() < 1e-5


@pytest.mark.skipif(not packing_available(torch.bfloat16, "cpu"), reason="no oneDNN bf16 pre-packing here")
def test_pack_linears_in_bfloat16():
    ref = build_model("llama").to(torch.bfloat16)
    model = build_model("llama").to(torch.bfloat16)
    pack_linears(model)
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        want, got = ref(input_ids=ids).logits.float(), model(input_ids=ids).logits
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).abs().max().item() < 0.05


def test_pack_linears_refuses_float16():
    model = build_model("llama").half()
    with pytest.raises(ValueError, match="float16"):
        pack_linears(model)
    assert not is_packed(model)


@needs_packing
def test_speculative_decoding_on_a_packed_model_equals_plain_decoding():
    model = build_model("llama")
    pack_linears(model)
    sf = specframe.load(target=Target(model, build_tokenizer()), proposers=[{"name": "ngram", "k": 4}],
                        max_new_tokens=24)
    spec = sf.generate_result(PROMPT)
    plain = sf.generate_result(PROMPT, proposers=[{"name": "none"}])
    assert spec.token_ids == plain.token_ids and len(spec.token_ids) == 24
    assert spec.metrics.drafted_nodes > 0 and plain.metrics.target_forwards == 24
