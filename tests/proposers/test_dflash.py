"""DFlash and DFlash2 block drafters (``dflash`` with ``checkpoint:``), on checkpoints these tests write themselves in
z-lab's layout (tiny configs, random or constructed weights).

- the drafter module against the reference implementation (the ``dflash`` package, when importable: these tests
  skip without it): the same random weights give the same block logits (fp32), DFlash2's selector the same chain;
- errors: a checkpoint for another target's hidden size, layers or vocabulary is one line naming the field;
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config

from specframe.errors import ConfigError
from specframe.learned import dflash as df

H, V, L = 32, 64, 6  # the module tests' target: hidden size, vocabulary, decoder layers


def tiny_qwen3_config(**kw) -> Qwen3Config:
    return Qwen3Config(**{"vocab_size": V, "hidden_size": H, "intermediate_size": 64, "num_hidden_layers": L,
                          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                          "max_position_embeddings": 256, **kw})


def write_dflash(folder: Path, target_cfg, kind: str = df.DFLASH, seed: int = 1, num_layers: int = 2,
                 block_size: int = 8, mask_token_id: int = 5, **fields) -> Path:
    """A random drafter for ``target_cfg`` written in z-lab's layout."""
    d = df.DFlashDrafter.new(target_cfg, kind, num_layers=num_layers, block_size=block_size,
                             mask_token_id=mask_token_id, seed=seed, **fields)
    df.save_dflash(d, folder)
    return folder


# the variants every architecture check runs: plain DFlash and DFlash2, a sliding-window layer, and DFlash2 with the
# optional output scaling fields and causal attention
VARIANTS = {
    "dflash": (df.DFLASH, {}),
    "dflash2": (df.DFLASH2, {}),
    "dflash-sliding": (df.DFLASH, {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 5,
                                   "use_sliding_window": True}),
    "dflash2-scaled": (df.DFLASH2, {"is_causal": True, "output_multiplier": 0.5, "final_logit_softcapping": 3.0,
                                    "input_embedding_scale": 2.0, "conv_kernel_size": 4, "selector_top_k": 5}),
}


# --- the module against the reference implementation ---------------------------------------------------------------
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_block_logits_match_the_reference(tmp_path, variant):
    ref_model = pytest.importorskip("dflash.model", reason="the reference (pip install --no-deps dflash) is absent")
    kind, fields = VARIANTS[variant]
    folder = write_dflash(tmp_path / variant, tiny_qwen3_config(), kind, **fields)
    cls = ref_model.DFlash2DraftModel if kind == df.DFLASH2 else ref_model.DFlashDraftModel
    ref = cls.from_pretrained(str(folder)).float().eval()
    ours = df.load_dflash(folder, H, V, L)
    assert tuple(ref.target_layer_ids) == ours.spec.target_layer_ids
    g = torch.Generator().manual_seed(0)
    c, b = 11, 8
    feats = torch.randn(1, c, len(ours.feature_layers), H, generator=g)
    block = torch.full((1, b), 5)
    block[0, 0] = 17
    table, head = torch.randn(V, H, generator=g), torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        emb = ours.embed(block, table)
        theirs = ref(target_hidden=feats.flatten(-2), noise_embedding=emb, position_ids=torch.arange(c + b)[None])
        mine = ours(ours.fuse(feats), emb)
        lt, lm = ref.compute_logits(theirs[:, 1:], head), ours.logits(mine[:, 1:], head)
        torch.testing.assert_close(lm, lt, rtol=0, atol=2e-5)
        # the same block with the context cached in two pieces
        kv = ours.new_kv()
        ours(ours.fuse(feats[:, :6]), ours.embed(block[:, :3], table), 0, kv)
        torch.testing.assert_close(ours(ours.fuse(feats[:, 6:]), emb, 6, kv), mine, rtol=0, atol=2e-5)
        if kind == df.DFLASH2:
            chain, _, _ = ref.propose(theirs[:, 1:], block[:, 0], head, 0.0)
            assert ours.draft_greedy(mine[:, 1:], lm, block[:, 0]).tolist() == chain.tolist()


def test_the_reference_reads_specframes_writing_and_specframe_the_references(tmp_path):
    """Both directions of the layout: a checkpoint the reference writes (its save_pretrained: codebooks with
    ``.weight``) loads here with the same weights, and ours (codebooks under their published names) loads there."""
    ref_model = pytest.importorskip("dflash.model", reason="the reference (pip install --no-deps dflash) is absent")
    ours = write_dflash(tmp_path / "ours", tiny_qwen3_config(), df.DFLASH2)
    ref = ref_model.DFlash2DraftModel.from_pretrained(str(ours)).float()
    ref.save_pretrained(str(tmp_path / "theirs"))
    again = df.load_dflash(tmp_path / "theirs", H, V, L)
    first = df.load_dflash(ours, H, V, L)
    for (k, a), (k2, b) in zip(first.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k


# --- the layout's fields -----------------------------------------------------------------------------------------
def test_default_target_layers_spread_over_the_target():
    assert df.default_target_layers(36, 1) == (18,)
    assert df.default_target_layers(36, 5) == (1, 9, 17, 25, 33)  # z-lab/Qwen3-8B-DFlash-b16's layers
    assert df.default_target_layers(L, 2) == (1, 3)


def test_z_labs_published_config_reads(tmp_path):
    """The fields as z-lab's DFlash (``block_size`` at the top level) and DFlash2 (all in ``dflash_config``,
    ``is_causal: false`` with sliding-window layer types) checkpoints spell them."""
    one = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16, "num_target_layers": 36,
           "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
           "hidden_size": 4096, "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8,
           "head_dim": 128, "vocab_size": 151936, "rope_theta": 1000000}
    spec = df.read_spec(tmp_path, one)
    assert (spec.kind, spec.block_size, spec.mask_token_id, spec.feature_layers) == (
        df.DFLASH, 16, 151669, (2, 10, 18, 26, 34))
    two = {"architectures": ["DFlash2DraftModel"], "is_causal": False, "hidden_size": 256, "num_hidden_layers": 2,
           "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128,
           "sliding_window": 2048, "layer_types": ["sliding_attention"] * 2, "rope_parameters": {"rope_theta": 1e6},
           "dflash_config": {"block_size": 8, "conv_kernel_size": 2, "conv_group_size": 16, "mask_token_id": 127,
                             "target_layer_ids": [5, 19], "selector_rank": 32, "selector_top_k": 16}}
    spec = df.read_spec(tmp_path, two)
    assert (spec.kind, spec.block_size, spec.conv_kernel_size, spec.selector_top_k) == (df.DFLASH2, 8, 2, 16)
    assert spec.attention_kind(0)[0] is False  # is_causal: false wins over the sliding layer type


@pytest.mark.parametrize(("change", "field"), [
    ({"dflash_config": {"mask_token_id": 5}}, "target_layer_ids"),
    ({"architectures": ["DFlash2DraftModel"]}, "conv_kernel_size"),
    ({"block_size": 1}, "block_size"),
])
def test_a_config_missing_a_field_is_one_error_naming_it(tmp_path, change, field):
    config = {"model_type": "qwen3", "hidden_size": H, "block_size": 8,
              "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1]}}
    config.update(change)
    with pytest.raises(ConfigError, match=field):
        df.read_spec(tmp_path, config)


@pytest.mark.parametrize(("target", "field"), [
    ((48, V, L), "hidden_size is 32, the target's is 48"),
    ((H, 80, L), "vocab_size is 64, the target's is 80"),
    ((H, V, 3), "target_layer_ids is \\[1, 3\\], the target's is layers 0..2"),
    ((H, V, 5), "num_target_layers is 6, the target's is 5"),
])
def test_a_drafter_for_another_target_is_one_error_naming_the_field(tmp_path, target, field):
    folder = write_dflash(tmp_path / "d", tiny_qwen3_config(), df.DFLASH2)
    with pytest.raises(ConfigError, match=field) as e:
        df.load_dflash(folder, *target)
    assert "\n" not in str(e.value)


def test_weights_that_do_not_match_the_config_are_one_error(tmp_path):
    folder = write_dflash(tmp_path / "d", tiny_qwen3_config())
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 3
    with pytest.raises(ConfigError, match="must be equal to the number of `layer_types`"):  # transformers' check
        df.read_spec(folder, config)
    del config["layer_types"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="do not match its config.json"):
        df.load_dflash(folder, H, V, L)
    config["num_hidden_layers"], config["dflash_config"]["target_layer_ids"] = 2, [1, 2, 3]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="fc.weight is \\[32, 64\\] but dflash_config.target_layer_ids names 3"):
        df.load_dflash(folder, H, V, L)


def test_a_speculators_checkpoint_is_refused_with_one_line(tmp_path):
    with pytest.raises(ConfigError, match="speculators 'dflash' checkpoint"):
        df.read_spec(tmp_path, {"speculators_model_type": "dflash", "block_size": 8})
