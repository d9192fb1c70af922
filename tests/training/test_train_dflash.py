"""``specframe train dflash`` (issue 66, 4): the training forward over many blocks against the decoding forward, the
recipe on a tiny target (the loss falls, a run stopped by its time limit or interrupted resumes to the same state),
and the saved drafter read by the ``dflash`` proposer decoding exactly as the target alone."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest
import torch

from specframe.learned import dflash as df
from specframe.target.hf import Target
from specframe.training.common import PieceDone
from specframe.training.dflash import (
    DFlashSettings,
    block_labels,
    draw_blocks,
    finish_dflash,
    loss_weights,
    mask_token_for,
    train_dflash,
)
from specframe_plugins.dflash import DFlashConfig, DFlashProposer

from tests.fakes import build_model
from tests.proposers.test_dflash import VARIANTS, tiny_qwen3_config
from tests.training.test_training import _greedy_same_as_target, _log, _word_tokenizer, pattern_records


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_forward_blocks_gives_each_block_what_the_decoding_forward_gives_it(variant):
    """Every block of the training forward equals the decoding forward over the context rows before its anchor and
    the block alone: DFlash and DFlash2 (its convolutions stay inside a block), a sliding-window layer, causal
    attention with the output scalings."""
    kind, fields = VARIANTS[variant]
    d = df.DFlashDrafter.new(tiny_qwen3_config(), kind, num_layers=2, block_size=5, seed=3, **fields)
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randn((2, 12, 32), generator=gen)
    embeds = torch.randn((5, 5, 32), generator=gen)
    seq, anchors = torch.tensor([0, 0, 1, 1, 1]), torch.tensor([0, 7, 3, 11, 4])
    with torch.no_grad():
        got = d.forward_blocks(ctx, embeds, seq, anchors)
        for j in range(len(seq)):
            want = d(ctx[seq[j], : anchors[j]][None], embeds[j][None])[0]
            torch.testing.assert_close(got[j], want, rtol=1e-5, atol=1e-5, msg=f"block {j}")


def test_blocks_labels_and_loss_weights():
    rows = [([1, 2, 3, 10, 11, 12, 13], 3), ([4, 5, 20, 21], 2), ([6, 7], 2)]  # the last has no answer token
    seq, anchors = draw_blocks(rows, anchors=3, seed=0, step=0)
    assert seq.tolist().count(0) == 3 and seq.tolist().count(1) == 2 and 2 not in seq.tolist()
    for j, a in zip(seq.tolist(), anchors.tolist()):
        ids, start = rows[j]
        assert start - 1 <= a <= len(ids) - 2  # token a committed, a + 1 an answer token
    assert torch.equal(draw_blocks(rows, 3, 0, 0)[1], anchors)  # seeded by (seed, step): a resumed run draws the same
    assert not torch.equal(torch.cat(draw_blocks(rows, 3, 0, 1)), torch.cat((seq, anchors)))
    ids = torch.tensor([[1, 2, 3, 10, 11, 12, 13], [4, 5, 20, 21, 0, 0, 0]])
    lab = block_labels(ids, torch.tensor([7, 4]), torch.tensor([0, 1]), torch.tensor([4, 1]), 4)
    assert lab.tolist() == [[12, 13, -100], [20, 21, -100]]
    w = loss_weights(DFlashSettings(block_size=8))
    torch.testing.assert_close(w, torch.exp(-torch.arange(7.0) / 4))  # the paper's gamma 4 for blocks of 8
    assert loss_weights(DFlashSettings(block_size=16))[1] == pytest.approx(math.exp(-1 / 7))
    assert loss_weights(DFlashSettings(block_size=4, gamma=2.0)).tolist() == pytest.approx([1, math.exp(-0.5), math.exp(-1)])
    recs = [{"prompt_ids": [0, 1, 2], "response_ids": [4]}]
    assert mask_token_for(recs, -1, 10) == 3 and mask_token_for(recs, 7, 10) == 7


# 24 records, batch 4, 12 epochs: 72 steps, a checkpoint at step 50 and at the end
S = DFlashSettings(draft_layers=1, target_layers=(1,), block_size=4, anchors=6, epochs=12, batch_size=4, max_len=64,
                   lr=3e-3, warmup=5, autocast=False)


@pytest.fixture(scope="module")
def tiny():
    return Target(build_model("llama", max_position_embeddings=1024), _word_tokenizer(), name="tiny")


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("dflash")
    return out, train_dflash(tiny, pattern_records(), out, S)


def test_the_drafter_learns_saves_and_decodes_exactly(tiny, trained):
    out, summary = trained
    log = _log(out)
    assert [r["step"] for r in log] == list(range(72)) and summary["steps"] == 72
    first, last = sum(r["loss"] for r in log[:5]) / 5, sum(r["loss"] for r in log[-5:]) / 5
    # (the tiny target's random LM head over a final RMSNorm keeps the logits small: the loss falls slowly, argmax fast)
    assert last < first - 0.3, (first, last)
    # the successor rule is learnt: most blocks are right from row 1 on (teacher-forced acceptance)
    assert summary["final_acc"] > 0.8 and summary["final_block_tau"] > 2.0, summary
    assert summary["init_from_target_layers"] and summary["target_layer_ids"] == [1]
    assert summary["mask_token_id"] == 0  # no record holds id 0
    # only the drafter trained: the target's embeddings, head and layers are the same as a fresh build
    fresh = build_model("llama", max_position_embeddings=1024)
    for name, p in tiny.model.named_parameters():
        assert torch.equal(p, dict(fresh.named_parameters())[name]), name
    drafter = summary["drafter"]
    finish_dflash(drafter, out)
    assert {"config.json", "model.safetensors", "loss.png"} <= {p.name for p in out.iterdir()}
    loaded = df.load_dflash(out, 32, 64, 2)
    assert loaded.spec.block_size == 4 and loaded.mask_token_id == 0
    for k, v in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    # no embedding or LM head of its own was saved
    import safetensors.torch

    assert not [k for k in safetensors.torch.load_file(str(out / "model.safetensors")) if "embed" in k or "head" in k]
    proposer = DFlashProposer(DFlashConfig(checkpoint=str(out)), tiny.info)
    _greedy_same_as_target(tiny, proposer)


def test_a_run_stopped_at_its_time_limit_or_interrupted_resumes_to_the_same_state(tiny, trained, tmp_path):
    full_out, full = trained
    out = tmp_path / "piece"
    with pytest.raises(PieceDone):  # --max-minutes: the first step after the deadline checkpoints and stops
        train_dflash(tiny, pattern_records(), out, S, deadline=time.monotonic() - 1)
    assert torch.load(out / "ckpt.pt", weights_only=False)["step"] == 1

    class Stop(Exception):
        pass

    def interrupt(step, total, loss):
        if step == 60:
            raise Stop

    with pytest.raises(Stop):
        train_dflash(tiny, pattern_records(), out, S, progress=interrupt)
    assert torch.load(out / "ckpt.pt", weights_only=False)["step"] == 50
    steps = []
    resumed = train_dflash(tiny, pattern_records(), out, S, progress=lambda s, n, loss: steps.append(s))
    assert steps == list(range(51, 73)) and resumed["steps"] == 72 and resumed["pieces"] == 3
    a, b = full["drafter"].state_dict(), resumed["drafter"].state_dict()
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=k)
    assert _log(out) == _log(full_out)
    # resumed after its last step (the recipe's evaluation failed, say): nothing trains, the summary is the same
    again = train_dflash(tiny, pattern_records(), out, S, progress=lambda s, n, loss: steps.append(s))
    assert steps == list(range(51, 73)) and again["steps"] == 72
    assert again["final_block_tau"] == pytest.approx(resumed["final_block_tau"]) and resumed["final_block_tau"] > 2.0
    assert again["final_acc_by_row"] == pytest.approx(resumed["final_acc_by_row"]) and len(again["final_acc_by_row"]) == 3
    from specframe.errors import ConfigError

    with pytest.raises(ConfigError, match="other settings: block_size 4 \\(now 5\\)"):
        train_dflash(tiny, pattern_records(), out, replace(S, block_size=5))


def test_target_layers_the_target_lacks_are_refused(tiny, tmp_path):
    from specframe.errors import ConfigError

    with pytest.raises(ConfigError, match="--target-layers 5"):
        train_dflash(tiny, pattern_records(), tmp_path, replace(S, target_layers=(5,)))
    with pytest.raises(ConfigError, match="give --target-layers"):  # 2 draft layers: z-lab's spread needs 4+ layers
        train_dflash(tiny, pattern_records(), tmp_path, replace(S, draft_layers=2, target_layers=None))
