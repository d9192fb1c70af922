"""PARD parallel drafting (``draft-model`` with a draft whose config declares a mask token, or ``parallel: true`` with
``mask_token_id``): one forward over ``[unseen tokens..., mask x (k - 1)]`` drafts ``k`` tokens, and the draft's KV
cache keeps the real tokens only (plugins/draft_model.py; the layout: specframe.learned.pard).

- greedy output token-identical to plain decoding (transformers' greedy) with random PARD drafts in both published
  vocabulary styles (the mask a token of the vocabulary, as Llama 3's reserved ids; the mask the first padding row
  past the tokenizer's tokens, as Qwen2.5's) and a specframe small draft, on llama / qwen2 / qwen2 with a sliding
  window; every step's draft equals a cache-free forward over the same tokens and masks;
- alone, with ngram and batched four at a time: each request decodes what it decodes alone (greedy and sampled);
- the conformance kit (greedy, sampling, draft_probs, rollback, ...) in parallel mode;
- a **scripted** PARD draft on a scripted successor target (every block known in advance): it drafts exactly its
  block in one forward per step, all of it accepted; scripted a position off, none of it;
- checkpoints written as AMD publishes them (random weights, the published config fields, bf16) load and decode
  exactly; what does not fit is one line naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from transformers import LlamaConfig, LlamaForCausalLM

from specframe import DecodeState
from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from specframe.decode.batch import BatchRequest, decode_batch
from specframe.decode.engine import Engine
from specframe.errors import ConfigError
from specframe.learned.pard import convert_to_pard, drop_rows, pard_batch, write_pard
from specframe.learned.small_draft import build_from_target
from specframe.sampling import SamplingParams, probs_from_logits
from specframe.target.hf import Target
from specframe.target.kv_cache import cache_length
from specframe.testing import Kit
from specframe_plugins.draft_model import DraftModelConfig, DraftModelProposer
from specframe_plugins.ngram import NgramConfig, NgramProposer

from tests.fakes import (
    ARCHS,
    NAME,
    PROMPT,
    PROMPT_2,
    SV,
    VOCAB,
    build_model,
    build_tokenizer,
    check_metrics,
    hf_greedy,
    policy_of,
    run,
    successor,
    successor_chain,
)

N_NEW = 32


def pard(target: Target, folder: Path, **options) -> DraftModelProposer:
    return DraftModelProposer(DraftModelConfig(model=str(folder), **options), target.info)


def save_pard(model, folder: Path, mask: int, tokenizer=None) -> Path:
    """``model`` saved as a PARD draft: its config carries ``pard_token`` and ``spd_type`` (AMD's fields)."""
    model.config.pard_token = mask
    model.config.spd_type = "pard"
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def padded_draft(arch: str, seed: int, vocab: int = VOCAB + 8):
    """A random draft whose embedding has rows past the target's tokens (Qwen2.5's layout: 151936 rows for 151665
    tokens); its mask token is the first of them."""
    return build_model(arch, seed=seed, vocab_size=vocab)


class Env:
    """One architecture: the target, its references and PARD drafts in the published styles."""

    def __init__(self, arch: str, root: Path) -> None:
        model = build_model(arch)
        self.target = Target(model, build_tokenizer(), name=NAME)
        self.refs = {i: hf_greedy(model, p, N_NEW) for i, p in enumerate((PROMPT, PROMPT_2))}
        tok = build_tokenizer()
        small = build_from_target(model, [1], torch.arange(0, VOCAB, 2))  # even token ids only
        small.lm.config.pard_token = 63  # a target token: the small draft embeds with the target's own rows
        small.save(root / "small", NAME, VOCAB)
        self.drafts = {
            "in-vocab": save_pard(build_model(arch, seed=1), root / "in-vocab", 63, tok),  # Llama 3's style
            "padded": save_pard(padded_draft(arch, 2), root / "padded", VOCAB),  # Qwen2.5's style
            "small": root / "small",
        }


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    return {arch: Env(arch, tmp_path_factory.mktemp(arch)) for arch in ARCHS}


@pytest.fixture(params=ARCHS)
def env(request, envs) -> Env:
    return envs[request.param]


class count_forwards:
    """Counts the draft model's forwards (a hook on the draft's transformers model) and what each step drafted."""

    def __init__(self, proposer: DraftModelProposer) -> None:
        self.proposer, self.forwards, self.steps = proposer, 0, []
        self._hook = proposer.draft.model.register_forward_hook(self._count)
        propose = proposer.propose

        def spy(state, budget):
            before = self.forwards
            tree = propose(state, budget)
            tokens = state.tokens[0].tolist()
            self.steps.append((tokens, tree.token_ids[0].tolist(), self.forwards - before, budget,
                               cache_length(proposer._cache)))
            return tree

        proposer.propose = spy

    def _count(self, *_):
        self.forwards += 1

    def close(self) -> None:
        self._hook.remove()


@torch.inference_mode()
def fresh_block(proposer: DraftModelProposer, tokens: list[int], k: int) -> torch.Tensor:
    """The draft's logits ``[k, V]`` over the target's vocabulary at the last ``k`` positions of ``tokens`` followed
    by ``k - 1`` mask tokens, from one forward without a cache."""
    d = proposer.draft
    ids = torch.tensor([tokens + [proposer.mask_token] * (k - 1)])
    logits = d.model(ids)[0, -k:] if d.token_map is not None else d.model(input_ids=ids).logits[0, -k:]
    return torch.stack([proposer._to_target_logits(row) for row in logits])


# --- greedy exactness ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("draft", ["in-vocab", "padded", "small"])
@pytest.mark.parametrize("options", [{"k": 4}, {"k": 7, "max_k": 7}, {"k": 2, "schedule": "heuristic"}],
                         ids=["k4", "k7", "heuristic"])
def test_greedy_output_equals_plain_decoding_and_each_step_is_one_forward(env, draft, options):
    prop = pard(env.target, env.drafts[draft], **options)
    assert prop.mask_token == (VOCAB if draft == "padded" else 63)
    seen = count_forwards(prop)
    try:
        for i, prompt in enumerate((PROMPT, PROMPT_2)):
            res = run(env.target, [prop], prompt=prompt, n=N_NEW)
            assert res.token_ids == env.refs[i]
            check_metrics(res)
            assert res.metrics.drafted_nodes > 0
    finally:
        seen.close()
    # one forward per step, the first (the whole context, then the masks) included
    assert [f for *_, f, _, _ in seen.steps] == [1] * len(seen.steps)
    for tokens, drafted, _, budget, cached in seen.steps:
        assert cached == len(tokens)  # the masks' keys and values were dropped: only real tokens stay
        assert 1 <= len(drafted) <= min(prop.config.max_k, budget)
        want = fresh_block(prop, tokens, len(drafted)).argmax(-1).tolist()
        assert drafted == want  # what a cache-free forward over the same tokens and masks drafts
        if draft == "small":
            assert all(t % 2 == 0 for t in drafted)  # its head holds the even ids only


def test_parallel_false_drafts_one_token_per_forward_with_the_same_checkpoint(envs):
    env = envs["llama"]
    prop = pard(env.target, env.drafts["in-vocab"], parallel=False, k=4)
    assert prop.mask_token is None
    seen = count_forwards(prop)
    try:
        res = run(env.target, [prop], n=N_NEW)
    finally:
        seen.close()
    assert res.token_ids == env.refs[0]
    assert any(f == len(d) > 1 for _, d, f, _, _ in seen.steps)  # a chain: one forward per drafted token


def test_mask_token_id_turns_a_plain_draft_parallel(envs, tmp_path):
    env = envs["qwen2"]
    build_model("qwen2", seed=5).save_pretrained(tmp_path / "plain")
    assert pard(env.target, tmp_path / "plain").mask_token is None  # no pard_token: a chain draft, as before
    prop = pard(env.target, tmp_path / "plain", mask_token_id=0, k=5)
    assert prop.mask_token == 0
    assert run(env.target, [prop], prompt=PROMPT_2, n=N_NEW).token_ids == env.refs[1]
    over = pard(env.target, env.drafts["padded"], mask_token_id=3)  # the option overrides the checkpoint's
    assert over.mask_token == 3


# --- combined, batched, sampled -----------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["pard", "pard+ngram"])
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, top_p=0.95)],
                         ids=["greedy", "sampled"])
def test_batched_at_4_and_with_ngram_every_request_equals_it_decoded_alone(envs, strategy, sampling):
    """Combined with ngram (one merged tree per step) and batched four at a time, each request decodes what it
    decodes alone (same seed, same tokens), and alone greedy is transformers' greedy."""
    env = envs["llama"]
    t = env.target

    def engine() -> Engine:
        proposers = [pard(t, env.drafts["padded"], k=5)]
        if "ngram" in strategy:
            proposers.append(NgramProposer(NgramConfig(k=4), t.info))
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


def test_draft_probs_are_each_positions_warped_distribution(envs):
    """Sampling: row ``i`` of ``draft_probs`` is the warped distribution of block position ``i`` (a cache-free
    forward over the same tokens and masks), and the drafted token is one it gives mass to."""
    env = envs["qwen2-sliding"]
    sampling = SamplingParams(temperature=0.7, top_k=12, top_p=0.8)
    prop = pard(env.target, env.drafts["padded"], k=6, max_k=6)
    tokens = PROMPT + env.refs[0][:3]
    state = DecodeState(torch.tensor([tokens]), len(PROMPT), sampling, torch.Generator().manual_seed(5))
    prop.start(state)
    for step in range(3):  # a fresh cache, then cached context: the same distributions
        tree = prop.propose(state, 8)
        want = probs_from_logits(fresh_block(prop, tokens, 6), sampling)
        assert tree.num_nodes == 6 and tree.is_chain()
        torch.testing.assert_close(tree.draft_probs[0], want, atol=1e-5, rtol=1e-4)
        drafted = tree.token_ids[0]
        assert bool((want[torch.arange(6), drafted] > 0).all())
        assert cache_length(prop._cache) == len(tokens)
        tokens = tokens + env.refs[0][3 + step: 4 + step]
        state = DecodeState(torch.tensor([tokens]), len(PROMPT), sampling, torch.Generator().manual_seed(step))


@pytest.mark.parametrize("style", ["in-vocab", "padded"])
def test_conformance_kit(tmp_path, specframe_tiny_target, style):
    """Every check of the kit (greedy and sampling exactness, constrained too, draft_probs, rollback, determinism,
    feedback) in parallel mode, on the kit's target (V = 16, no tokenizer)."""
    from specframe.testing.tiny import tiny_target

    vocab = 16 if style == "in-vocab" else 17
    draft = tiny_target(seed=1, vocab_size=vocab).model
    folder = save_pard(draft, tmp_path / "kit", 15 if style == "in-vocab" else 16)
    kit = Kit(DraftModelProposer, {"model": str(folder), "k": 3, "max_k": 3}, samples=300,
              target=specframe_tiny_target)
    assert kit.make().inner.mask_token == (15 if style == "in-vocab" else 16)
    kit.check_all()  # raises ConformanceError on failure
    _, results = kit.greedy_battery
    assert sum(r.metrics.drafted_nodes for r in results) > 0


# --- a scripted PARD draft: known blocks ----------------------------------------------------------------------------
DH = 128  # the scripted draft's hidden size: 0..63 the token's one-hot, 64 a constant, 65 the mask's marker
CONST, MARK = 64, 65
MASK = SV  # the draft's mask token: the row past the target's 64 tokens
BACK = 63  # how far back a row reads: on the 64-cycle, the token 63 positions back is the one after the row's


@pytest.fixture(scope="module")
def scripted_target() -> Target:
    """A Llama whose layers add nothing, with one-hot embeddings and an LM head mapping ``x`` to ``succ(x)``: its
    greedy continuation of ``x`` is ``succ(x), succ(succ(x)), ...`` (one cycle through all 64 tokens)."""
    cfg = LlamaConfig(vocab_size=SV, hidden_size=SV, intermediate_size=16, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        m.model.embed_tokens.weight.copy_(torch.eye(SV))
        m.model.layers[0].self_attn.o_proj.weight.zero_()
        m.model.layers[0].mlp.down_proj.weight.zero_()
        head = torch.zeros(SV, SV)
        head[successor(), range(SV)] = 1.0
        m.lm_head.weight.copy_(head)
    m.generation_config.eos_token_id = None
    m.generation_config.pad_token_id = 0
    return Target(m, build_tokenizer(), name=NAME)


def write_scripted_pard(folder: Path, back: int = BACK) -> Path:
    """A one-layer PARD draft whose row at position ``p`` (a real token or a mask) attends to the row at
    ``p - back`` and drafts that row's token. Keys: a constant pattern from channel 64 (every row has it); queries:
    the pattern rotated back by ``back`` positions at every RoPE frequency, so the score
    ``sum_f cos(theta_f (delta - back))`` peaks at ``delta = back`` (by 1.9 over any other delta, times 45 here);
    values: the token's one-hot (zero for the mask, whose embedding is the constant and channel 65 instead);
    ``o_proj`` writes it back at 4x the row's own one-hot; the LM head reads channels 0..63. On a context that
    follows the 64-cycle, the token ``back = 63`` positions before ``p`` is the token at ``p + 1``: the block is the
    cycle's next ``k`` tokens."""
    cfg = LlamaConfig(vocab_size=SV + 1, hidden_size=DH, intermediate_size=8, num_hidden_layers=1,
                      num_attention_heads=1, num_key_value_heads=1, head_dim=DH, max_position_embeddings=512,
                      tie_word_embeddings=False, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).float().eval()
    theta = m.model.rotary_emb.inv_freq.double()  # [DH / 2]
    kpat = torch.cat([torch.ones(DH // 2), torch.zeros(DH // 2)])
    qpat = torch.cat([torch.cos(theta * back), -torch.sin(theta * back)]).float()
    eye = torch.zeros(DH, DH)
    eye[range(SV), range(SV)] = 1.0
    emb = torch.zeros(SV + 1, DH)
    emb[range(SV), range(SV)] = 1.0
    emb[MASK, MARK] = 1.0
    emb[:, CONST] = 1.0
    head = torch.zeros(SV + 1, DH)
    head[range(SV), range(SV)] = 1.0
    q, k = torch.zeros(DH, DH), torch.zeros(DH, DH)
    q[:, CONST], k[:, CONST] = 4 * qpat, kpat
    with torch.no_grad():
        layer = m.model.layers[0]
        m.model.embed_tokens.weight.copy_(emb)
        layer.self_attn.q_proj.weight.copy_(q)
        layer.self_attn.k_proj.weight.copy_(k)
        layer.self_attn.v_proj.weight.copy_(eye)
        layer.self_attn.o_proj.weight.copy_(0.5 * eye)  # (the normed rows are 8x the embedding)
        layer.mlp.down_proj.weight.zero_()
        m.lm_head.weight.copy_(head)
    return save_pard(m, folder, MASK)


def scripted_prompt() -> list[int]:
    """70 tokens the scripted target would write itself (each the successor of the one before)."""
    return [PROMPT[-1], *successor_chain(PROMPT[-1], 69)]


@pytest.mark.parametrize("k", [3, 7])
def test_a_scripted_draft_drafts_exactly_its_block_in_one_forward(scripted_target, tmp_path, k):
    t = scripted_target
    prop = pard(t, write_scripted_pard(tmp_path / "scripted"), k=k, max_k=k)
    prompt, n = scripted_prompt(), 40
    seen = count_forwards(prop)
    accepted: list[int] = []
    verified = prop.on_verified
    prop.on_verified = lambda outcome: (accepted.append(len(outcome.accepted_nodes[0])), verified(outcome))[1]
    try:
        res = run(t, [prop], prompt=prompt, n=n)
    finally:
        seen.close()
    assert res.token_ids == successor_chain(prompt[-1], n) == hf_greedy(t.model, prompt, n)
    for tokens, drafted, forwards, budget, cached in seen.steps:
        assert forwards == 1  # the whole block from one forward
        assert drafted == successor_chain(tokens[-1], min(k, budget))  # exactly the scripted block
        assert cached == len(tokens)
    assert accepted == [len(d) for _, d, *_ in seen.steps]  # all of every block accepted
    assert len(seen.steps) == -(-n // (k + 1))  # k drafted + 1 from the target per step
    assert res.metrics.accepted_nodes == res.metrics.drafted_nodes == n - len(seen.steps)


def test_a_draft_scripted_one_position_off_has_every_block_rejected(scripted_target, tmp_path):
    t = scripted_target
    prop = pard(t, write_scripted_pard(tmp_path / "off", back=BACK - 1), k=5, max_k=5)
    seen = count_forwards(prop)
    try:
        res = run(t, [prop], prompt=scripted_prompt(), n=16)
    finally:
        seen.close()
    assert res.token_ids == successor_chain(scripted_prompt()[-1], 16)
    for tokens, drafted, *_ in seen.steps:  # each row drafts the token after the one it should
        assert drafted == successor_chain(tokens[-1], len(drafted) + 1)[1:]
    assert res.metrics.accepted_nodes == 0 and res.metrics.drafted_nodes > 0


# --- AMD's published layout ---------------------------------------------------------------------------------------
# config.json fields of the published checkpoints' families, scaled down (sizes, vocabulary and ids to the tests'
# tiny target); pard_token and spd_type are the two fields PARD adds to the base model's config.
PUBLISHED = {
    "llama3": {  # amd/PARD-Llama-3.2-1B: the mask a reserved token of the vocabulary (128020)
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": [2, 3], "head_dim": 8, "hidden_act": "silu",
        "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 64, "max_position_embeddings": 512,
        "mlp_bias": False, "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 64, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": VOCAB, "pard_token": 60, "spd_type": "pard"},
    "qwen2.5": {  # amd/PARD-Qwen2.5-0.5B: the mask the first embedding row past the tokenizer's (151665)
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_dropout": 0.0, "bos_token_id": 1,
        "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
        "intermediate_size": 64, "max_position_embeddings": 512, "max_window_layers": 2,
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 512, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "use_cache": True, "use_sliding_window": False, "vocab_size": VOCAB + 8, "pard_token": VOCAB,
        "spd_type": "pard"},
    "qwen3": {  # amd/PARD-Qwen3-0.6B
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "head_dim": 16, "hidden_act": "silu",
        "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 64, "max_position_embeddings": 512,
        "max_window_layers": 2, "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
        "vocab_size": VOCAB + 8, "pard_token": VOCAB, "spd_type": "pard"},
}


def write_published(folder: Path, family: str, seed: int = 3) -> Path:
    """Random weights (bf16, as published) under a config.json holding exactly the published fields, and the target's
    tokenizer files."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = PUBLISHED[family]
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(fields, indent=2))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).to(torch.bfloat16)
    model.save_pretrained(folder / "weights")
    (folder / "weights" / "model.safetensors").rename(folder / "model.safetensors")
    build_tokenizer().save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text()) == fields  # (the file is the published one)
    return folder


@pytest.mark.parametrize("family", list(PUBLISHED))
def test_a_checkpoint_in_amds_published_layout_loads_and_decodes_exactly(envs, tmp_path, family):
    env = envs["llama"]
    folder = write_published(tmp_path / family, family)
    prop = pard(env.target, folder, k=6, max_k=6)
    assert prop.mask_token == PUBLISHED[family]["pard_token"]
    seen = count_forwards(prop)
    try:
        for i, prompt in enumerate((PROMPT, PROMPT_2)):
            res = run(env.target, [prop], prompt=prompt, n=N_NEW)
            assert res.token_ids == env.refs[i]
            assert res.metrics.drafted_nodes > 0
    finally:
        seen.close()
    assert {f for *_, f, _, _ in seen.steps} == {1}


# --- what does not fit: one line naming the field -------------------------------------------------------------------


def test_what_does_not_fit_is_one_line_naming_the_field(envs, tmp_path):
    env = envs["llama"]
    t = env.target
    build_model("llama", seed=4).save_pretrained(tmp_path / "plain")
    with pytest.raises(ConfigError, match="parallel: true needs a mask token.*pard_token") as e:
        pard(t, tmp_path / "plain", parallel=True)
    assert "\n" not in str(e.value)
    cases = [
        (save_pard(build_model("llama", seed=4), tmp_path / "outside", VOCAB + 5), {},
         rf"config.json field pard_token is {VOCAB + 5}, outside the draft's {VOCAB} embedding rows"),
        (tmp_path / "plain", {"mask_token_id": VOCAB}, rf"mask_token_id is {VOCAB}, outside"),
        (save_pard(build_model("llama", seed=4, vocab_size=48), tmp_path / "small-vocab", 40), {},
         rf"does not fit the target: its vocab_size is 48, the target has {VOCAB} tokens"),
        (save_pard(build_model("llama", seed=4), tmp_path / "not-an-id", "7"), {},
         "config.json field pard_token must be a token id"),
    ]
    for folder, options, message in cases:
        with pytest.raises(ConfigError, match=message) as e:
            pard(t, folder, **options)
        assert "\n" not in str(e.value), message
    with pytest.raises(ValidationError, match="mask_token_id is for parallel drafting"):
        DraftModelConfig(model="x", parallel=False, mask_token_id=3)


# --- converting a draft to PARD's layout, and PARD's training layout ------------------------------------------------


def test_write_pard_adds_a_mask_row_when_the_embedding_has_none_and_what_it_writes_loads_as_a_pard_draft(envs,
                                                                                                          tmp_path):
    env = envs["llama"]
    model = build_model("llama", seed=6)
    assert write_pard(model, tmp_path / "out", tokenizer=build_tokenizer()) == VOCAB  # a row added: id 64
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (cfg["pard_token"], cfg["spd_type"], cfg["vocab_size"]) == (VOCAB, "pard", VOCAB + 1)
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    prop = pard(env.target, tmp_path / "out", k=5)
    assert prop.mask_token == VOCAB and prop.draft.embed_rows == VOCAB + 1
    assert run(env.target, [prop], prompt=PROMPT_2, n=N_NEW).token_ids == env.refs[1]


def test_write_pard_takes_the_first_padding_row_or_the_token_given(envs, tmp_path):
    env = envs["qwen2"]
    padded = padded_draft("qwen2", 7)
    assert write_pard(padded, tmp_path / "padded", tokenizer=build_tokenizer()) == VOCAB  # Qwen2.5's choice
    assert json.loads((tmp_path / "padded" / "config.json").read_text())["vocab_size"] == VOCAB + 8  # no row added
    assert write_pard(build_model("qwen2", seed=7), tmp_path / "given", mask_token_id=62) == 62
    for folder, mask in (("padded", VOCAB), ("given", 62)):
        prop = pard(env.target, tmp_path / folder, k=4)
        assert prop.mask_token == mask
        assert run(env.target, [prop], n=N_NEW).token_ids == env.refs[0]
    with pytest.raises(ConfigError, match=f"mask_token_id {VOCAB} is outside the model's {VOCAB} embedding rows"):
        write_pard(build_model("qwen2", seed=7), tmp_path / "bad", mask_token_id=VOCAB)
    assert not (tmp_path / "bad").exists()


def test_convert_to_pard_from_a_model_folder_and_from_a_small_draft(envs, tmp_path):
    env = envs["qwen2"]
    build_model("qwen2", seed=8).save_pretrained(tmp_path / "plain")
    build_tokenizer().save_pretrained(tmp_path / "plain")
    assert convert_to_pard(tmp_path / "plain", tmp_path / "plain-pard") == VOCAB
    small = build_from_target(env.target.model, [0], torch.arange(VOCAB))
    small.save(tmp_path / "small", NAME, VOCAB)
    with pytest.raises(ConfigError, match="small draft.*no mask_token_id is given.*name a target token in"):
        convert_to_pard(tmp_path / "small", tmp_path / "small-pard")
    with pytest.raises(ConfigError, match=f"mask_token_id {VOCAB} is given"):
        convert_to_pard(tmp_path / "small", tmp_path / "small-pard", mask_token_id=VOCAB)
    assert convert_to_pard(tmp_path / "small", tmp_path / "small-pard", mask_token_id=61) == 61
    with pytest.raises(ConfigError, match="is the source"):
        convert_to_pard(tmp_path / "plain", tmp_path / "plain")
    for folder, mask in (("plain-pard", VOCAB), ("small-pard", 61)):
        prop = pard(env.target, tmp_path / folder, k=4)
        assert prop.mask_token == mask
        assert run(env.target, [prop], prompt=PROMPT_2, n=N_NEW).token_ids == env.refs[1]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("drop", [False, True], ids=["whole", "cod"])
def test_the_training_layout_gives_each_row_what_inference_gives_it(arch, drop):
    """Every row of PARD's training layout (``pard_batch``; after conditional drop too) has the logits the same
    draft gives at inference to the mask (or token) that row stands for: one forward over the real tokens it sees
    followed by its masks, without a cache; and its label is the token it must draft."""
    k, n, mask = 4, 12, VOCAB - 1
    model = build_model(arch, seed=9)
    ids = torch.randint(1, VOCAB - 1, (2, n), generator=torch.Generator().manual_seed(3))
    batch = pard_batch(ids, k, mask)
    assert batch["input_ids"].shape == batch["labels"].shape == (2, k * n)
    if drop:
        batch = drop_rows(batch, k, 0.7, 0.2, torch.Generator().manual_seed(1))
        assert k * n > batch["input_ids"].shape[1] > n
    with torch.inference_mode():
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                       attention_mask=batch["attention_mask"]).logits
        checked = 0
        for r in range(batch["input_ids"].shape[1]):
            t = int(batch["position_ids"][0, r])
            i = masks_seen(batch, r, mask)  # the row's group: mask i sees i masks, itself included
            if t - i < 0:
                assert (batch["labels"][:, r] == -100).all()
                continue
            for b in range(2):
                seq = ids[b, : t - i + 1].tolist() + [mask] * i
                want = model(input_ids=torch.tensor([seq])).logits[0, -1]
                torch.testing.assert_close(logits[b, r], want, atol=2e-5, rtol=1e-4)
                assert int(batch["labels"][b, r]) == (int(ids[b, t + 1]) if t + 1 < n else -100)
                checked += 1
    assert checked > 2 * n


def masks_seen(batch, r: int, mask: int) -> int:
    """How many mask rows layout row ``r`` attends to (read from the attention mask)."""
    seen = batch["attention_mask"][0, 0, r] == 0
    return int(((batch["input_ids"][0] == mask) & seen).sum())
