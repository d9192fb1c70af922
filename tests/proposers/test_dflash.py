"""DFlash and DFlash2 block drafters (``dflash`` with ``checkpoint:``), on checkpoints these tests write themselves in
z-lab's layout (tiny configs, random or constructed weights).

- the drafter module against the reference implementation (the ``dflash`` package, when importable: these tests
  skip without it): the same random weights give the same block logits (fp32), DFlash2's selector the same chain;
- errors: a checkpoint for another target's hidden size, layers or vocabulary is one line naming the field;
- the ``dflash`` proposer: fp32 greedy output token-identical to transformers on Llama and Qwen2 targets with random
  drafters (whole blocks, clipped blocks, no first-step draft), the conformance kit (sampling included);
- against the reference decoding loop (``dflash_generate``, when the ``dflash`` package is importable): fp32 greedy,
  the same output and the same acceptance length at every step, with random drafters on a tiny Qwen3 target and
  the scripted drafters below (with tokens they miss, so acceptance lengths vary) on the scripted target;
- **known blocks**: on a scripted target whose greedy successor is a fixed permutation ``succ`` (layers that add
  nothing; every hidden state is its token's one-hot plus a constant channel), a DFlash drafter built so that block
  row ``i`` attends (through RoPE alone) to the context row 65 positions back, whose successor is the token ``i``
  places ahead on the 64-cycle; and a DFlash2 drafter whose selector chains ``succ`` from the newest token. Each
  drafts exactly its scripted block at every step; the engine accepts all of it, none of it (a drafter scripted
  one position off) or the prefix before a token the selector was built to miss.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config

from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from specframe.decode.batch import BatchRequest, decode_batch
from specframe.decode.engine import Engine
from specframe.errors import ConfigError
from specframe.learned import dflash as df
from specframe.sampling import SamplingParams
from specframe.target.hf import Target
from specframe.testing import Kit
from specframe_plugins.dflash import DFlashConfig, DFlashProposer
from specframe_plugins.ngram import NgramConfig, NgramProposer

from tests.fakes import (
    NAME,
    PROMPT,
    PROMPT_2,
    SV,
    build_model,
    build_tokenizer,
    check_metrics,
    hf_greedy,
    policy_of,
    run,
    successor,
    successor_chain,
)

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


# --- the proposer: greedy exactness and the conformance kit ---------------------------------------------------------
N_NEW = 24


def dflash(target: Target, folder: Path, **kw) -> DFlashProposer:
    return DFlashProposer(DFlashConfig(checkpoint=str(folder), **kw), target.info)


@pytest.fixture(scope="module")
def targets() -> dict[str, Target]:
    return {a: Target(build_model(a, num_hidden_layers=L), build_tokenizer(), name=NAME) for a in ("llama", "qwen2")}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_output_equals_transformers(targets, tmp_path, arch, variant):
    t = targets[arch]
    kind, fields = VARIANTS[variant]
    folder = write_dflash(tmp_path / "d", t.model.config, kind, mask_token_id=3, **fields)
    for opts, prompt in (({}, PROMPT), ({}, PROMPT_2), ({"k": 3}, PROMPT_2), ({"first_step": False}, PROMPT)):
        r = run(t, [dflash(t, folder, **opts)], prompt=prompt, n=N_NEW)
        assert r.token_ids == hf_greedy(t.model, prompt, N_NEW)
        check_metrics(r)
        assert r.metrics.drafted_nodes > 0


@pytest.mark.parametrize("strategy", ["dflash", "dflash+ngram"])
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, top_p=0.95)],
                         ids=["greedy", "sampled"])
def test_batched_at_4_and_with_ngram_every_request_equals_it_decoded_alone(targets, tmp_path, strategy, sampling):
    """Combined with ngram (one merged tree per step) and batched four at a time, each request decodes what it
    decodes alone (same seed, same tokens), and alone greedy is transformers' greedy."""
    t = targets["llama"]
    folder = write_dflash(tmp_path / "d", t.model.config, df.DFLASH2)

    def engine() -> Engine:
        proposers = [dflash(t, folder)] + ([NgramProposer(NgramConfig(k=4), t.info)] if "ngram" in strategy else [])
        verifier = GreedyVerifier() if sampling.is_greedy else SpeculativeSamplingVerifier()
        return Engine(t, proposers, verifier, merge=policy_of("priority") if len(proposers) > 1 else None)

    prompts, budgets = [PROMPT, PROMPT_2, [7], PROMPT_2 * 3, PROMPT[::-1], PROMPT[:3]], [12, 19, 26, 33, 12, 19]
    alone = [engine().generate(p, max_new_tokens=b, sampling=sampling, seed=i)
             for i, (p, b) in enumerate(zip(prompts, budgets))]
    items = [BatchRequest(engine(), p, b, sampling, seed=i) for i, (p, b) in enumerate(zip(prompts, budgets))]
    got = dict(decode_batch(t, items, batch_size=4, gate=False))
    for i, (p, b) in enumerate(zip(prompts, budgets)):
        assert got[i].token_ids == alone[i].token_ids, f"request {i}"
        if sampling.is_greedy:
            assert alone[i].token_ids == hf_greedy(t.model, p, b)
        check_metrics(got[i])
    assert sum(r.metrics.drafted_nodes for r in alone) > 0


@pytest.mark.parametrize("kind", [df.DFLASH, df.DFLASH2])
def test_conformance_kit(tmp_path, specframe_tiny_target, kind):
    m = specframe_tiny_target.model
    folder = write_dflash(tmp_path / "kit", m.config, kind, seed=4, num_layers=2, block_size=6, mask_token_id=15,
                          target_layer_ids=[0, 1])
    kit = Kit(DFlashProposer, {"checkpoint": str(folder)}, samples=300, target=specframe_tiny_target)
    kit.check_all()  # raises ConformanceError on failure
    _, results = kit.greedy_battery
    assert sum(r.metrics.drafted_nodes for r in results) > 0


@pytest.mark.parametrize("kind", [df.DFLASH, df.DFLASH2])
def test_a_bfloat16_target_drafts_greedy_and_sampled_without_a_fault(tmp_path, kind):
    """The drafter runs in the target's dtype (the kit's target is float32): bf16 features, embeddings, convolutions
    and selector scores, greedy and sampled."""
    t = Target(build_model("llama", num_hidden_layers=L).to(torch.bfloat16), build_tokenizer(), name=NAME)
    folder = write_dflash(tmp_path / "d", t.model.config, kind, mask_token_id=3)
    df.save_dflash(df.load_dflash(folder, H, V, L), folder, dtype=torch.bfloat16)  # stored in bf16 as published
    for sampling in (SamplingParams(), SamplingParams(temperature=0.8, top_k=10)):
        verifier = GreedyVerifier() if sampling.is_greedy else SpeculativeSamplingVerifier()
        r = Engine(t, [dflash(t, folder)], verifier).generate(PROMPT, max_new_tokens=16, sampling=sampling, seed=1)
        assert len(r.token_ids) == 16 and r.metrics.proposer_faults == 0 and r.metrics.drafted_nodes > 0


def test_the_block_is_clipped_by_k_and_by_the_steps_budget(targets, tmp_path):
    t = targets["llama"]
    folder = write_dflash(tmp_path / "d", t.model.config, block_size=8)
    for opts, most in (({}, 7), ({"k": 3}, 3), ({"k": 40}, 7)):
        steps = record_steps(dflash(t, folder, **opts))
        r = run(t, [steps.proposer], prompt=PROMPT, n=11)
        assert r.token_ids == hf_greedy(t.model, PROMPT, 11)
        for (tokens, ids, _), left in zip(steps.seen, steps.left):
            assert len(ids) == min(most, left - 1), (opts, len(tokens))  # each step commits a target token too


class record_steps:
    """Wraps a proposer: what each step saw and drafted, and what the engine accepted of it."""

    def __init__(self, proposer) -> None:
        self.proposer, self.seen, self.accepted, self.left, self.committed = proposer, [], [], [], []
        propose, verified = proposer.propose, proposer.on_verified

        def spy(state, budget):
            tree = propose(state, budget)
            self.seen.append((state.tokens[0].tolist(), tree.token_ids[0].tolist(), tree.parent[0].tolist()))
            self.left.append(budget + 1)
            return tree

        def seen_verified(outcome):
            self.accepted.append(len(outcome.accepted_nodes[0]))
            self.committed.append(len(outcome.committed[0]))
            return verified(outcome)

        proposer.propose, proposer.on_verified = spy, seen_verified


# --- known blocks on a scripted successor target ---------------------------------------------------------------------
SH = 128  # the scripted target's hidden size: channels 0..63 the token's one-hot, channel 64 a constant
CONST = 64
OFFSET = 65  # the context row a DFlash row reads back: succ of it is the token one 64-cycle ahead of it, plus one


@pytest.fixture(scope="module")
def scripted() -> Target:
    """A Llama whose layers add nothing (o_proj, down_proj zero), with embedding rows ``e_x + e_64`` and an LM head
    that maps channel ``x`` to ``succ(x)``: its greedy continuation of ``x`` is ``succ(x), succ(succ(x)), ...``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=SV, hidden_size=SH, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).float().eval()
    succ = successor()
    with torch.no_grad():
        emb = torch.zeros(SV, SH)
        emb[range(SV), range(SV)] = 1.0
        emb[:, CONST] = 1.0
        m.model.embed_tokens.weight.copy_(emb)
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = torch.zeros(SV, SH)
        head[succ, range(SV)] = 1.0
        m.lm_head.weight.copy_(head)
    m.generation_config.eos_token_id = None
    m.generation_config.pad_token_id = 0
    return Target(m, build_tokenizer(), name=NAME)


def scripted_prompt() -> list[int]:
    """70 tokens the scripted target would write itself (each the successor of the one before)."""
    return [PROMPT[-1], *successor_chain(PROMPT[-1], 69)]


def _scripted_drafter(target: Target, kind: str, **fields) -> df.DFlashDrafter:
    return df.DFlashDrafter.new(target.model.config, kind, num_layers=1, target_layer_ids=[0], block_size=8,
                                mask_token_id=0, num_attention_heads=1, num_key_value_heads=1, head_dim=SH,
                                intermediate_size=32, **fields)


def write_reading_back(folder: Path, target: Target, offset: int = OFFSET, miss: tuple[int, ...] = (),
                       weak: float = 0.0) -> Path:
    """A DFlash drafter whose block row at position ``p`` attends to the context row at ``p - offset`` and drafts the
    successor of its token. Keys: a constant pattern from channel 64 (the same for every row); queries: that pattern
    rotated back by ``offset`` positions at every RoPE frequency, so the score ``sum_f cos(theta_f (delta - offset))``
    peaks at ``delta = offset`` (by 1.9 over any other delta; times the norms' scale, a 30-logit margin). Values: the
    token's one-hot; ``o_proj`` writes it back, 4x the row's own embedding; the target's LM head does the rest.
    ``miss``: tokens it never drafts right (the value of their predecessor is ``weak``, 0 by default: that row drafts
    ``succ(mask)``; with ``weak`` 0.02 the right token is that row's second best: the context rows are normalised to
    about 8 per channel, so it scores 4 * 8 * 0.02 = 0.64 against the mask's own 1)."""
    d = _scripted_drafter(target, df.DFLASH)
    head_dim = SH
    theta = d.rotary.inv_freq.double()  # [head_dim / 2], the drafter's RoPE frequencies
    kpat = torch.cat([torch.ones(head_dim // 2), torch.zeros(head_dim // 2)])
    qpat = torch.cat([torch.cos(theta * offset), -torch.sin(theta * offset)]).float()
    eye = torch.zeros(SH, SH)
    eye[range(SV), range(SV)] = 1.0
    values = eye.clone()
    pred = {c: x for x, c in enumerate(successor())}
    for c in miss:
        values[pred[c], pred[c]] = weak
    st = d.state_dict()
    for k in st:
        if k.endswith("norm.weight"):
            st[k] = torch.ones_like(st[k])
    q, k_ = torch.zeros(SH, SH), torch.zeros(SH, SH)
    q[:, CONST], k_[:, CONST] = qpat, kpat
    st.update({"fc.weight": torch.eye(SH), "layers.0.self_attn.q_proj.weight": q, "layers.0.self_attn.k_proj.weight": k_,
               "layers.0.self_attn.v_proj.weight": values, "layers.0.self_attn.o_proj.weight": 4 * eye,
               "layers.0.self_attn.q_norm.weight": torch.full((head_dim,), 10.0),
               "layers.0.self_attn.k_norm.weight": torch.full((head_dim,), 10.0),
               "layers.0.mlp.down_proj.weight": torch.zeros(SH, 32)})
    d.load_state_dict(st)
    df.save_dflash(d, folder)
    return folder


def write_chaining_selector(folder: Path, target: Target, miss: tuple[int, ...] = ()) -> Path:
    """A DFlash2 drafter whose layers add nothing (``o_proj``, ``down_proj`` zero, identity convolutions) and whose
    selector scores candidate ``c`` by 32 when ``prev = succ^-1(c)`` (codebooks: P the identity, S[c] the one-hot of
    ``succ^-1(c)``, ``hidden_projection`` reading the constant channel) against LM-head logits of at most 8: it
    drafts ``succ`` of the newest token, then of each token it drafted. ``miss``: tokens whose S rows are zero, so
    the selector never picks them."""
    d = _scripted_drafter(target, df.DFLASH2, selector_rank=SV, selector_top_k=SV, conv_kernel_size=2,
                          conv_group_size=8)
    succ = successor()
    st = d.state_dict()
    for k in st:
        if k.endswith("norm.weight"):
            st[k] = torch.ones_like(st[k])
        if k.endswith("base_kernel"):
            st[k] = torch.zeros_like(st[k])
            st[k][:, 0] = 1.0
        if k.endswith("kernel_projection.weight") or k.endswith("o_proj.weight") or k.endswith("down_proj.weight"):
            st[k] = torch.zeros_like(st[k])
    s_rows = torch.zeros(SV, SV)
    s_rows[succ, range(SV)] = 1.0  # row succ(x) is the one-hot of x
    s_rows[list(miss)] = 0.0
    proj = torch.zeros(SV, SH)
    proj[:, CONST] = 4.0
    st.update({"candidate_selector.predecessor_codebook.weight": torch.eye(SV),
               "candidate_selector.successor_codebook.weight": s_rows,
               "candidate_selector.hidden_projection.weight": proj})
    d.load_state_dict(st)
    df.save_dflash(d, folder)
    return folder


@pytest.mark.parametrize("write", [write_reading_back, write_chaining_selector])
def test_a_scripted_drafter_drafts_its_block_and_all_of_it_is_accepted(scripted, tmp_path, write):
    folder = write(tmp_path / "d", scripted)
    steps = record_steps(dflash(scripted, folder))
    prompt = scripted_prompt()
    r = run(scripted, [steps.proposer], prompt=prompt, n=N_NEW)
    assert r.token_ids == successor_chain(prompt[-1], N_NEW)  # the scripted target's own continuation
    for tokens, ids, parents in steps.seen:
        assert ids == successor_chain(tokens[-1], len(ids)) and parents == list(range(-1, len(ids) - 1))
    assert [len(ids) for _, ids, _ in steps.seen] == [7, 7, 7]  # 3 steps: 8 + 8 + 8 tokens
    assert steps.accepted == [7, 7, 7] and r.metrics.accepted_nodes == r.metrics.drafted_nodes == 21


def test_a_drafter_scripted_one_position_off_has_every_draft_rejected(scripted, tmp_path):
    """The known-block test is sensitive to the block's positions: reading 64 rows back instead of 65 drafts, at each
    row, the token one place further on, so every block is rejected from its first row; the output stays the
    target's."""
    folder = write_reading_back(tmp_path / "d", scripted, offset=OFFSET - 1)
    steps = record_steps(dflash(scripted, folder))
    prompt = scripted_prompt()
    r = run(scripted, [steps.proposer], prompt=prompt, n=8)
    assert r.token_ids == successor_chain(prompt[-1], 8)
    for tokens, ids, _ in steps.seen:
        assert ids == successor_chain(tokens[-1], len(ids) + 1)[1:]
    assert set(steps.accepted) == {0} and r.metrics.drafted_nodes > 0


def test_the_engine_accepts_the_block_up_to_the_token_the_selector_misses(scripted, tmp_path):
    prompt = scripted_prompt()
    miss = successor_chain(prompt[-1], 11)[-1]  # the 11th token to come: inside the second block
    folder = write_chaining_selector(tmp_path / "d", scripted, miss=(miss,))
    steps = record_steps(dflash(scripted, folder))
    r = run(scripted, [steps.proposer], prompt=prompt, n=N_NEW)
    assert r.token_ids == successor_chain(prompt[-1], N_NEW)
    for (tokens, ids, _), accepted in zip(steps.seen, steps.accepted):
        want = successor_chain(tokens[-1], len(ids))
        right = want.index(miss) if miss in want else len(want)
        assert ids[:right] == want[:right] and accepted == right
    assert steps.accepted[:2] == [7, 2]  # tokens 1-7 from the first block; 9, 10 from the second, then 11 missed


# --- per-row candidates in the tree (issue 66, 1) ------------------------------------------------------------------
def test_a_row_candidate_recovers_the_token_the_chain_misses(scripted, tmp_path):
    """The reading-back drafter made weak on one token: that row's best is succ(mask) and the right token its second
    best. As a chain (candidates 1) the block is accepted up to that row; with candidates 2 the right token is a leaf
    beside the row's best, so the target accepts it too: one more token in that step, output the same."""
    prompt = scripted_prompt()
    miss = successor_chain(prompt[-1], 11)[-1]  # the 11th token to come: row 3 of the second block
    folder = write_reading_back(tmp_path / "d", scripted, miss=(miss,), weak=0.02)
    runs = {}
    for c in (1, 2):
        steps = record_steps(dflash(scripted, folder, candidates=c))
        r = run(scripted, [steps.proposer], prompt=prompt, n=N_NEW)
        assert r.token_ids == successor_chain(prompt[-1], N_NEW)
        runs[c] = steps
    assert runs[1].accepted[:2] == [7, 2]
    assert runs[2].accepted[:2] == [7, 3]
    tokens, ids, parents = runs[2].seen[1]
    want = successor_chain(tokens[-1], 7)
    assert runs[1].seen[1][1][:3] == [*want[:2], successor()[0]]  # the chain: row 3 drafts succ(mask)
    leaf = ids.index(miss)
    assert parents[leaf] == ids.index(want[1]) and leaf not in parents  # beside row 3's best, a leaf
    assert len(ids) == 14  # 7 rows, each its best and one candidate


@pytest.mark.parametrize("kind", [df.DFLASH, df.DFLASH2])
def test_candidates_keep_greedy_output_exact_within_the_verify_budget(targets, tmp_path, kind):
    t = targets["qwen2"]
    folder = write_dflash(tmp_path / "d", t.model.config, kind, mask_token_id=3)
    for opts in ({"candidates": 2}, {"candidates": 4}, {"candidates": 3, "verify_budget": 5}, {"verify_budget": 2}):
        steps = record_steps(dflash(t, folder, **opts))
        r = run(t, [steps.proposer], prompt=PROMPT_2, n=N_NEW)
        assert r.token_ids == hf_greedy(t.model, PROMPT_2, N_NEW), opts
        check_metrics(r)
        most = min(opts.get("verify_budget", 7 * opts.get("candidates", 1)), N_NEW - 1)  # (the first step's budget)
        sizes = [len(ids) for _, ids, _ in steps.seen]
        assert max(sizes) == most and all(len(set(zip(ids, p))) == len(ids) for _, ids, p in steps.seen), opts
        if opts.get("candidates", 1) > 1:
            assert any(len(set(p)) < len(p) for _, _, p in steps.seen)  # a real tree: siblings somewhere


def test_sampling_and_a_target_without_tree_masks_draft_a_chain(targets, tmp_path):
    t = targets["llama"]
    folder = write_dflash(tmp_path / "d", t.model.config, mask_token_id=3)
    steps = record_steps(dflash(t, folder, candidates=3))
    Engine(t, [steps.proposer], SpeculativeSamplingVerifier()).generate(
        PROMPT, max_new_tokens=12, sampling=SamplingParams(temperature=0.8), seed=2)
    assert all(p == list(range(-1, len(p) - 1)) for _, _, p in steps.seen)
    from dataclasses import replace

    chains_only = replace(t.info, supports_trees=False)
    assert DFlashProposer(DFlashConfig(checkpoint=str(folder), candidates=3), chains_only).others == 0


def test_conformance_kit_with_candidates(tmp_path, specframe_tiny_target):
    m = specframe_tiny_target.model
    folder = write_dflash(tmp_path / "kit", m.config, df.DFLASH, seed=4, num_layers=2, block_size=6, mask_token_id=15,
                          target_layer_ids=[0, 1])
    kit = Kit(DFlashProposer, {"checkpoint": str(folder), "candidates": 3}, samples=300, target=specframe_tiny_target)
    kit.check_all()
    _, results = kit.greedy_battery
    assert sum(r.metrics.drafted_nodes for r in results) > 0


# --- against the reference decoding loop -----------------------------------------------------------------------------
def reference_generate(folder: Path, model, prompt: list[int], n: int, block_size: int | None = None):
    """The reference's ``dflash_generate`` (fp32 greedy) with the drafter in ``folder``: ``(new tokens, tokens
    committed per step)``; its timing helper synchronizes CUDA, so it is replaced by ``perf_counter`` on CPU."""
    import time

    ref = pytest.importorskip("dflash.model", reason="the reference (pip install --no-deps dflash) is absent")
    config = json.loads((folder / "config.json").read_text())
    cls = ref.DFlash2DraftModel if "DFlash2" in config["architectures"][0] else ref.DFlashDraftModel
    drafter = cls.from_pretrained(str(folder)).float().eval()
    saved, ref._cuda_time = ref._cuda_time, time.perf_counter
    try:
        out = ref.dflash_generate(drafter, model, torch.tensor([prompt]), n, None, block_size=block_size,
                                  return_stats=True)
    finally:
        ref._cuda_time = saved
    return out.output_ids[0, len(prompt):].tolist(), list(out.acceptance_lengths)


@pytest.fixture(scope="module")
def qwen3_target() -> Target:
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    m = Qwen3ForCausalLM(tiny_qwen3_config(initializer_range=0.2)).float().eval()
    m.generation_config.eos_token_id = None
    return Target(m, None, name=NAME)


def _same_as_reference(target: Target, folder: Path, prompt: list[int], n: int, k: int | None = None) -> list[int]:
    """Decode with ``dflash`` (first step left to the target, as the reference's prefill) and the reference; assert
    the same tokens and committed counts per step. Returns the counts."""
    steps = record_steps(dflash(target, folder, first_step=False, **({"k": k} if k else {})))
    r = run(target, [steps.proposer], prompt=prompt, n=n)
    tokens, lengths = reference_generate(folder, target.model, prompt, n, None if k is None else k + 1)
    assert r.token_ids == tokens
    assert steps.committed[0] == 1 and steps.seen[0][1] == []  # the reference's prefill token
    assert steps.committed[1:] == lengths
    return lengths


@pytest.mark.parametrize("kind", [df.DFLASH, df.DFLASH2])
def test_random_drafters_decode_as_the_reference_step_by_step(qwen3_target, tmp_path, kind):
    folder = write_dflash(tmp_path / "d", qwen3_target.model.config, kind, seed=2, mask_token_id=3)
    for prompt, k in ((PROMPT, None), (PROMPT_2, None), (PROMPT, 3)):
        lengths = _same_as_reference(qwen3_target, folder, prompt, 40, k)  # (it asserts tokens and steps equal)
        assert sum(lengths) + 1 == 40  # every step after the prefill token compared


@pytest.mark.parametrize("write", [write_reading_back, write_chaining_selector])
def test_scripted_drafters_decode_as_the_reference_step_by_step(scripted, tmp_path, write):
    prompt = scripted_prompt()
    ahead = successor_chain(prompt[-1], 60)
    folder = write(tmp_path / "d", scripted, miss=(ahead[4], ahead[17], ahead[19], ahead[35]))
    lengths = _same_as_reference(scripted, folder, prompt, 48)
    assert len(set(lengths)) > 2  # full blocks, blocks cut at a missed token, a last clipped block


# --- specframe export dflash -----------------------------------------------------------------------------------------
def _export(*args: str):
    from typer.testing import CliRunner

    from specframe import cli

    return CliRunner().invoke(cli.app, ["export", "dflash", *args])


@pytest.mark.parametrize("kind", [df.DFLASH, df.DFLASH2])
def test_export_writes_z_labs_layout_checked_against_the_target(targets, tmp_path, kind):
    from tests.fakes import assert_user_error

    t = targets["llama"]
    model_folder = tmp_path / "target"
    t.model.save_pretrained(model_folder)
    src = write_dflash(tmp_path / "src", t.model.config, kind, mask_token_id=3)
    r = _export(str(src), "--output", str(tmp_path / "bf16"), "--model", str(model_folder), "--dtype", "bfloat16")
    assert r.exit_code == 0, r.output
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and config["dflash_config"]["mask_token_id"] == 3
    assert "| block size (newest token + drafts) | 8 |" in (tmp_path / "bf16" / "README.md").read_text()
    a, b = df.load_dflash(src, H, V, L), df.load_dflash(tmp_path / "bf16", H, V, L)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(y.float(), x.to(torch.bfloat16).float(), msg=name)
    r = _export(str(src), "--output", str(tmp_path / "same"), "--model", str(model_folder))
    assert r.exit_code == 0, r.output  # the source's dtype (float32): the same drafter, the same greedy output
    out = run(t, [dflash(t, tmp_path / "same")], prompt=PROMPT, n=N_NEW)
    assert out.token_ids == run(t, [dflash(t, src)], prompt=PROMPT, n=N_NEW).token_ids == hf_greedy(t.model, PROMPT, N_NEW)
    other = Target(build_model("llama", num_hidden_layers=L, hidden_size=48), build_tokenizer(), name=NAME)
    other.model.save_pretrained(tmp_path / "other")
    assert_user_error(_export(str(src), "--output", str(tmp_path / "o"), "--model", str(tmp_path / "other")),
                      "hidden_size")
    assert not (tmp_path / "o").exists()
    assert_user_error(_export(str(src), "--output", str(tmp_path / "o"), "--model", str(model_folder), "--dtype",
                              "int8"), "--dtype")
