"""Hybrid and recurrent targets (issue 52 b): Mamba / Mamba-2 scans and gated-delta linear attention beside full
attention, tiny random float32 models of each family, decode token-identically to transformers' greedy ``generate``
under ngram, lookahead and draft-model (a tiny hybrid draft, whose own recurrent cache is rolled back too), batched
equal to alone; the recurrent state after a rollback is the one-token decoding's state. RWKV, whose state is an
argument of its own, rolls back by replay (:mod:`specframe.target.state_target`) and passes the same checks."""

from __future__ import annotations

import pytest
import torch

from specframe import ConfigError
from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from specframe.decode.batch import BatchRequest, decode_batch
from specframe.decode.engine import Engine
from specframe.sampling import SamplingParams
from specframe.target.kv_cache import new_cache, recurrent_layers, rollback
from specframe.target.state_target import ModelState, StateTarget, make_target
from specframe.testing.decoder_sweep import PROMPT, _proposer
from specframe.testing.decoder_types import build_tiny, reference_greedy
from specframe_plugins.draft_model import DraftModelConfig, DraftModelProposer

from tests.fakes import test_device

pytestmark = pytest.mark.device_subset

DEV = test_device()  # the targets are built on the CPU (build_tiny) and moved here; their inputs are put here too
HYBRIDS = ("qwen3_next", "qwen3_5_text", "nemotron_h", "jamba", "falcon_h1", "granitemoehybrid", "mamba2", "rwkv")
TOKENS = 24


@pytest.fixture(scope="module", params=HYBRIDS)
def hybrid(request):
    model = build_tiny(request.param, seed=0).to(DEV)
    return request.param, model, make_target(model, None, name=request.param), reference_greedy(model, PROMPT, TOKENS)


def _draft_folder(model_type, tmp_path):
    # another random model of the same shape and vocabulary (a draft model needs a KV cache: RWKV's is a Mamba-2)
    draft = build_tiny("mamba2" if model_type == "rwkv" else model_type, seed=1)
    draft.save_pretrained(tmp_path / "draft")
    return tmp_path / "draft"


@pytest.mark.parametrize("name", ["ngram", "lookahead", "draft-model"])
def test_hybrid_greedy_is_token_identical(hybrid, name, tmp_path):
    model_type, _, target, reference = hybrid
    assert not target.supports_trees
    assert isinstance(target, StateTarget) if model_type == "rwkv" else recurrent_layers(target.new_cache())
    if name == "draft-model":
        proposer = DraftModelProposer(DraftModelConfig(model=str(_draft_folder(model_type, tmp_path)), k=3,
                                                       min_confidence=0.0), target.info)
    else:
        proposer = _proposer(name, target.info)
    result = Engine(target, [proposer], GreedyVerifier()).generate(PROMPT, max_new_tokens=TOKENS)
    assert result.token_ids == reference
    assert result.metrics.proposer_faults == 0
    assert result.metrics.drafted_nodes > 0  # drafts were verified, so rollbacks happened


def test_hybrid_batched_equals_alone(hybrid):
    _, _, target, reference = hybrid
    prompts = [PROMPT, PROMPT[3:], PROMPT[::-1], PROMPT + PROMPT[:5]]
    alone = [Engine(target, [_proposer("ngram", target.info)], GreedyVerifier())
             .generate(p, max_new_tokens=12).token_ids for p in prompts]
    requests = [BatchRequest(Engine(target, [_proposer("ngram", target.info)], GreedyVerifier()), p, 12)
                for p in prompts]
    batched = dict(decode_batch(target, requests, batch_size=4))
    assert [batched[i].token_ids for i in range(4)] == alone
    assert alone[0] == reference[:12]


def test_hybrid_sampling_matches_plain_sampling_of_the_same_seed(hybrid):
    """Under sampling, a step that accepts every draft must leave the same distribution: with ``none`` and with
    ``ngram`` the first sampled token's frequencies over 200 seeds agree with the target's probabilities."""
    _, model, target, _ = hybrid
    sampling = SamplingParams(temperature=1.0)
    with torch.inference_mode():
        p = torch.softmax(model(input_ids=torch.tensor([PROMPT], device=DEV)).logits[0, -1].double(), -1)
    engine = Engine(target, [_proposer("ngram", target.info)], SpeculativeSamplingVerifier())
    counts = torch.zeros_like(p)
    for seed in range(200):
        first = engine.generate(PROMPT, max_new_tokens=2, sampling=sampling, seed=seed).token_ids[0]
        counts[first] += 1
    tv = 0.5 * float((counts / counts.sum() - p).abs().sum())
    assert tv < 0.25, tv  # 200 samples of a 64-way distribution: TV ~ 0.1-0.2 by chance, ~0.5+ when broken


def test_rollback_restores_the_one_token_state(hybrid):
    """After a 4-token forward and a rollback of 2, the recurrent state is the one reached by decoding the 2 kept
    tokens one at a time (states compared directly, not through outputs)."""
    model_type, model, target, _ = hybrid
    ids = torch.tensor([PROMPT], device=DEV)
    if model_type == "rwkv":
        return _check_replayed_state(target, ids)
    with torch.inference_mode():
        wide, one = new_cache(model.config), new_cache(model.config)
        model(input_ids=ids[:, :10], cache=wide, use_cache=True)
        model(input_ids=ids[:, :10], cache=one, use_cache=True)
        model(input_ids=ids[:, 10:14], cache=wide, use_cache=True)
        rollback(wide, 12)
        for i in (10, 11):
            model(input_ids=ids[:, i:i + 1], cache=one, use_cache=True)
        rollback(one, 12)  # (trims the convolution windows as the wide cache's rollback did)
    for a, b in zip(recurrent_layers(wide), recurrent_layers(one)):
        for i, state in a.recurrent_states.items():
            if state is not None:
                torch.testing.assert_close(state, b.recurrent_states[i], rtol=1e-5, atol=1e-5)
        for i, conv in a.conv_states.items():
            if conv is not None:
                torch.testing.assert_close(conv, b.conv_states[i], rtol=1e-5, atol=1e-5)


def test_rolling_back_past_what_a_recurrent_layer_kept_raises():
    model = build_tiny("mamba2").to(DEV)
    cache = new_cache(model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([PROMPT], device=DEV), cache=cache, use_cache=True)  # a prefill keeps no states
    with pytest.raises(ValueError, match="kept the states of the last 0"):
        rollback(cache, len(PROMPT) - 2)


def _check_replayed_state(target, ids):
    """RWKV: after a 4-token forward and a rollback of 2 (restore + replay), its five state tensors are those of
    decoding the 2 kept tokens one at a time."""
    wide, one = ModelState(), ModelState()
    with torch.inference_mode():
        for cache in (wide, one):
            target.forward(ids[:, :10], cache)
        target.forward(ids[:, 10:14], wide)
        target.rollback(wide, 12)
        for i in (10, 11):
            target.forward(ids[:, i:i + 1], one)
    assert wide.length == one.length == 12
    for a, b in zip(wide.state, one.state):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_state_target_rolls_back_its_last_forward_only():
    target = make_target(build_tiny("rwkv").to(DEV), None)
    cache = target.new_cache()
    with torch.inference_mode():
        target.forward(torch.tensor([PROMPT[:8]], device=DEV), cache)
        target.forward(torch.tensor([PROMPT[8:12]], device=DEV), cache)
        with pytest.raises(ValueError, match="only its last forward"):
            target.rollback(cache, 7)
        with pytest.raises(ValueError, match="roll the state forward"):
            target.rollback(cache, 13)
        target.rollback(cache, 10)
        with pytest.raises(ValueError, match="only its last forward"):  # (the replay is not undoable)
            target.rollback(cache, 9)
    assert cache.get_seq_length() == 10


def test_a_draft_model_without_a_kv_cache_is_refused_in_one_line(tmp_path):
    build_tiny("rwkv", seed=1).save_pretrained(tmp_path / "rwkv")
    target = make_target(build_tiny("mamba2").to(DEV), None)
    with pytest.raises(ConfigError, match="takes no KV cache") as info:
        DraftModelProposer(DraftModelConfig(model=str(tmp_path / "rwkv")), target.info)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("model_type", ["qwen3_next", "mamba2", "rwkv"])
@pytest.mark.parametrize("name", ["ngram", "draft-model"])
def test_conformance_kit_on_hybrid_targets(model_type, name, tmp_path):
    """The kit's exactness checks (greedy and sampling lossless, draft probabilities, rollback after a partial
    acceptance) with a hybrid target in place of its tiny Llama."""
    from specframe.testing import Kit
    from specframe_plugins.ngram import NgramProposer

    target = make_target(build_tiny(model_type, seed=0).to(DEV), None, name=model_type)
    if name == "ngram":
        kit = Kit(NgramProposer, {}, samples=200, target=target)
    else:
        folder = _draft_folder(model_type, tmp_path)
        kit = Kit(DraftModelProposer, {"model": str(folder), "k": 2, "min_confidence": 0.0}, samples=200,
                  target=target)
    checks = ["check_greedy_lossless", "check_sampling_lossless", "check_rollback_after_partial_acceptance"]
    if name == "draft-model":  # (ngram's drafts are deterministic: no draft probabilities to check)
        checks.append("check_draft_probs_match_samples")
    for check in checks:
        getattr(kit, check)()  # raises ConformanceError on failure
    _, results = kit.greedy_battery
    assert sum(r.metrics.drafted_nodes for r in results) > 0  # the checks ran over verified drafts


@pytest.mark.parametrize("model_type", [h for h in HYBRIDS if h not in ("mamba2", "rwkv")])
def test_a_block_drafter_on_a_hybrid_target_is_token_identical(model_type, tmp_path):
    """A DFlash block drafter (issue 66, 5) reading the first and last layers' hidden states of a hybrid target
    (attention beside recurrent layers): blocks verified as chains (no tree masks here), rolled back like any
    draft; greedy output equal to transformers'. (Pure recurrent models have no attention heads for a Qwen3-style
    drafter built from their config.)"""
    from specframe.learned import dflash as df
    from specframe_plugins.dflash import DFlashConfig, DFlashProposer

    model = build_tiny(model_type, seed=0).to(DEV)
    target = make_target(model, None, name=model_type)
    cfg = model.config.get_text_config()
    layers = int(cfg.num_hidden_layers)
    df.save_dflash(df.DFlashDrafter.new(cfg, df.DFLASH, num_layers=1, target_layer_ids=(0, layers - 1), block_size=5,
                                        mask_token_id=3, seed=1), tmp_path / "d")
    proposer = DFlashProposer(DFlashConfig(checkpoint=str(tmp_path / "d"), candidates=2), target.info)
    assert proposer.others == 0  # no tree masks on a hybrid target: the chain
    result = Engine(target, [proposer], GreedyVerifier()).generate(PROMPT, max_new_tokens=TOKENS)
    assert result.token_ids == reference_greedy(model, PROMPT, TOKENS)
    assert result.metrics.proposer_faults == 0 and result.metrics.drafted_nodes > 0
