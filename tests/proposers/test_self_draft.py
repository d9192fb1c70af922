"""layer-skip and early-exit: the target drafting with part of itself (plugins/self_draft.py,
specframe/target/layer_skip.py, specframe/target/skip_search.py)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch

from specframe import ConfigError
from specframe.target.layer_skip import check_skip, decoder_layers, skipping
from specframe.target.skip_search import cached_skip_choice, chain_speed, search_skip, skip_cache_path
from specframe.testing import conformance_suite
from specframe.testing.tiny import tiny_target
from specframe_plugins.self_draft import EarlyExitConfig, EarlyExitProposer, LayerSkipConfig, LayerSkipProposer

TestLayerSkipConformance = conformance_suite(LayerSkipProposer, config={"skip": [1], "k": 3}, samples=400)
TestEarlyExitConformance = conformance_suite(EarlyExitProposer, config={"exit_layer": 1, "k": 3}, samples=400)


def _llama(layers: int = 4, seed: int = 0, dead: tuple[int, ...] = ()):
    """A tiny random Llama; the layers in ``dead`` add nothing to the residual stream (zero output projections), so
    skipping them leaves every logit as it is."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for i in dead:
            model.model.layers[i].self_attn.o_proj.weight.zero_()
            model.model.layers[i].mlp.down_proj.weight.zero_()
    return model


@torch.inference_mode()
def test_skipping_changes_only_this_threads_forwards_inside_the_block():
    model = _llama()
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    full = model(input_ids=ids).logits
    seen = {}

    def other_thread():
        with torch.inference_mode():
            seen["other"] = model(input_ids=ids).logits

    with skipping(model, frozenset({2, 3})):
        inside = model(input_ids=ids).logits
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    after = model(input_ids=ids).logits
    assert not torch.allclose(inside, full)
    assert torch.equal(seen["other"], full) and torch.equal(after, full)
    # the same as running only the kept layers
    kept = torch.nn.ModuleList([model.model.layers[0], model.model.layers[1]])
    every = model.model.layers
    model.model.layers, model.config.num_hidden_layers = kept, 2
    try:
        assert torch.allclose(model(input_ids=ids).logits, inside, atol=1e-6)
    finally:
        model.model.layers, model.config.num_hidden_layers = every, 4


def test_layers_to_skip_are_checked():
    assert check_skip([3, 1], 4) == frozenset({1, 3})
    with pytest.raises(ConfigError, match=r"1\.\.3 .*layer 0 always runs\), got \[0, 4\]"):
        check_skip([0, 4, 2], 4)
    assert len(decoder_layers(_llama(3))) == 3


def test_early_exit_refuses_an_exit_past_the_last_layer_and_an_engine_without_torch_layers():
    target = tiny_target()
    with pytest.raises(ConfigError, match="exit_layer must be below the model's 2 layers"):
        EarlyExitProposer(EarlyExitConfig(exit_layer=2), target.info)
    with pytest.raises(ConfigError, match="use engine transformers"):
        LayerSkipProposer(LayerSkipConfig(skip=[1]), replace(target.info, model=None, engine="llama.cpp"))
    assert EarlyExitProposer(EarlyExitConfig(), target.info).exit_layer == 1  # default: 3/4 of 2 layers, at least 1


def test_the_search_skips_first_the_layer_that_changes_nothing_and_stops_where_speed_peaks():
    model = _llama(layers=6, dead=(3,))
    torch.manual_seed(1)
    ids = torch.randint(0, 32, (3, 24))
    scored = torch.zeros_like(ids, dtype=torch.bool)
    scored[:, 4:] = True
    choice = search_skip(model, ids, scored, k=4, v=lambda n: 1.0 + 0.05 * (n - 1), max_fraction=0.5)
    assert choice.path[0][0] == (3,) and choice.path[0][1] == 1.0  # the dead layer: every argmax kept
    assert len(choice.path) == 3  # 0.5 x 6 layers
    assert choice.speed == max(s for _, _, s in choice.path) and choice.speed > 1.0
    assert choice.speed == pytest.approx(chain_speed(choice.agreement, choice.k, lambda n: 1.0 + 0.05 * (n - 1),
                                                     _cost(model, choice.skip)))


def _cost(model, skip):
    from specframe.target.skip_search import _draft_cost

    return _draft_cost(model, frozenset(skip))


def test_chain_speed_is_leviathans_expected_tokens_over_the_step_cost():
    assert chain_speed(0.0, 4, lambda n: 1.0, 0.5) == pytest.approx(1.0 / 3.0)
    assert chain_speed(0.5, 2, lambda n: 1.0, 0.0) == pytest.approx(1.75)  # 1 + 0.5 + 0.25


class _Tok:
    chat_template = None

    def __call__(self, text):
        return {"input_ids": [1 + (ord(c) % 30) for c in text[:12]]}


def test_the_searched_choice_is_cached_and_read_back_without_searching(tmp_path, monkeypatch):
    from specframe.target import skip_search

    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path))
    from specframe.target.hf import Target

    target = Target(_llama(layers=4, dead=(2,)), None, name="tiny-skip")
    info = replace(target.info, tokenizer=_Tok())
    first = cached_skip_choice(info, k=3)
    assert first.skip and 2 in first.skip
    files = list((tmp_path / "machine" / "layer-skip").glob("*.json"))
    assert len(files) == 1
    monkeypatch.setattr(skip_search, "search_skip", lambda *a, **k: pytest.fail("searched again"))
    assert cached_skip_choice(info, k=3) == first
    assert skip_cache_path({"a": 1}) != skip_cache_path({"a": 2})


def test_layer_skip_without_a_tokenizer_needs_the_layers_named():
    with pytest.raises(ConfigError, match="name the layers to skip"):
        LayerSkipProposer(LayerSkipConfig(), tiny_target().info)


def test_a_search_that_finds_nothing_worth_skipping_drafts_nothing(monkeypatch):
    from specframe_plugins import self_draft

    target = tiny_target()
    monkeypatch.setattr(self_draft, "cached_skip_choice", lambda *a, **k: replace_choice())
    p = LayerSkipProposer(LayerSkipConfig(), target.info)
    from specframe import DecodeState, SamplingParams

    state = DecodeState(torch.tensor([[1, 2, 3]]), 3, SamplingParams(), torch.Generator())
    p.start(state)
    assert p.propose(state, 4).num_nodes == 0


def replace_choice():
    from specframe.target.skip_search import SkipChoice

    return SkipChoice((), 1.0, 1.0, 2, 4)


@pytest.mark.parametrize("arch", ["llama", "qwen2-sliding"])
def test_self_drafts_alone_combined_and_batched_decode_exactly_the_targets_greedy_tokens(arch):
    import specframe
    from specframe.target.hf import Target

    from tests.fakes import PROMPT, PROMPT_2, build_model, build_tokenizer, hf_greedy

    target = Target(build_model(arch, num_hidden_layers=4), build_tokenizer())
    want = [hf_greedy(target.model, p, 24) for p in (PROMPT, PROMPT_2)]
    sf = specframe.load(target=target, max_new_tokens=24)
    lineups = ([{"name": "layer-skip", "skip": [2]}], [{"name": "early-exit", "exit_layer": 3}],
               ["ngram", {"name": "layer-skip", "skip": [1, 2]}], [{"name": "early-exit", "exit_layer": 2}, "lookahead"])
    for proposers in lineups:
        for prompt, expected in zip((PROMPT, PROMPT_2), want):
            got = sf.generate_result(prompt, proposers=proposers, router="none", chat=False)
            assert got.token_ids == expected, proposers
            assert got.metrics.drafted_nodes > 0
        batched = sf.generate_batch_results([PROMPT, PROMPT_2], batch_size=2, proposers=proposers, router="none",
                                            chat=False)
        assert [r.token_ids for r in batched] == want, proposers
