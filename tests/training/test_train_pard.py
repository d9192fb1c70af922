"""``specframe train pard`` (issue 66, 3-4): LoRA adapters that change nothing until trained and merge back into the
same outputs; the recipe on a tiny target, from the target with LoRA (self-drafting) and from a draft, the mask
groups learning the successor rule, a run resumed to the same state, and the written PARD folder read by
``draft-model``'s parallel mode decoding exactly as the target alone."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
import torch

from specframe.errors import ConfigError
from specframe.learned.lora import DECODER_LINEARS, LoRALinear, add_lora, merge_lora, trainable
from specframe.learned.pard import pard_mask_token
from specframe.target.hf import Target
from specframe.training.common import PieceDone
from specframe.training.pard import PardSettings, finish_pard, train_pard
from specframe_plugins.draft_model import DraftModelConfig, DraftModelProposer

from tests.fakes import build_model
from tests.training.test_training import _greedy_same_as_target, _log, _word_tokenizer, pattern_records


def test_lora_starts_as_the_model_and_merges_back_into_the_same_outputs():
    model = build_model("llama").float().eval()
    ids = torch.tensor([[3, 9, 14, 2, 7, 30]])
    with torch.no_grad():
        before = model(ids).logits
    adapters = add_lora(model, rank=4, seed=1)
    wrapped = [m for m in model.modules() if isinstance(m, LoRALinear)]
    assert len(wrapped) == 7 * model.config.num_hidden_layers
    assert trainable(model) == [] or all(any(p is q for q in adapters.parameters()) for p in trainable(model))
    assert {id(p) for p in trainable(adapters)} == {id(p) for p in adapters.parameters()}
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before)  # B = 0: a fresh adapter changes nothing
        for b in adapters.b.values():
            b.normal_(0, 0.05)
        adapted = model(ids).logits
    assert (adapted - before).abs().max() > 1e-3
    assert merge_lora(model) == len(wrapped) and not any(isinstance(m, LoRALinear) for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, adapted, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="rank"):
        add_lora(model, 0)
    with pytest.raises(ValueError, match="no linear layer"):
        add_lora(model, 2, names=("nothing",))


# 24 records, batch 4, 20 epochs: 120 steps, checkpoints at steps 50, 100 and at the end
S = PardSettings(init="target", lora_rank=8, block_size=3, epochs=20, batch_size=4, max_len=64, lr=1e-2, warmup=5)


@pytest.fixture(scope="module")
def tiny():
    return Target(build_model("llama", max_position_embeddings=1024), _word_tokenizer(), name="tiny")


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("pard")
    return out, train_pard(tiny, "tiny", pattern_records(), out, S)


def test_the_self_drafting_lora_learns_saves_and_decodes_exactly(tiny, trained):
    out, summary = trained
    log = _log(out)
    assert [r["step"] for r in log] == list(range(120)) and summary["steps"] == 120
    first, last = sum(r["loss"] for r in log[:5]) / 5, sum(r["loss"] for r in log[-5:]) / 5
    # (the tiny target's random LM head over a final RMSNorm keeps the logits small: the loss falls slowly, argmax fast)
    assert last < first - 0.3, (first, last)
    # the successor rule two and three places ahead is learnt by the mask groups
    assert summary["final_acc_by_group"][1] > 0.7 and summary["final_acc_by_group"][2] > 0.6, summary
    assert summary["mask_token_id"] == 0  # no record holds id 0
    adapters = sum(8 * (m.in_features + m.out_features) for name, m in tiny.model.named_modules()
                   if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in DECODER_LINEARS)
    assert summary["trainable_params"] == adapters  # rank 8: the adapters only
    fresh = build_model("llama", max_position_embeddings=1024)  # the target itself untouched
    for name, p in tiny.model.named_parameters():
        assert torch.equal(p, dict(fresh.named_parameters())[name]), name
    finish_pard(summary["model"], summary["tokenizer"], summary["mask_token_id"], out)
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "loss.png", "train-log.jsonl", "tokenizer.json"} <= names
    config = json.loads((out / "config.json").read_text())
    assert pard_mask_token(config) == 0 and config["spd_type"] == "pard"
    proposer = DraftModelProposer(DraftModelConfig(model=str(out), k=3, max_k=3, schedule="constant"), tiny.info)
    assert proposer.mask_token == 0 and proposer.block_size == 4
    _greedy_same_as_target(tiny, proposer)


def test_a_run_stopped_at_its_time_limit_or_interrupted_resumes_to_the_same_state(tiny, trained, tmp_path):
    full_out, full = trained
    out = tmp_path / "piece"
    with pytest.raises(PieceDone):
        train_pard(tiny, "tiny", pattern_records(), out, S, deadline=time.monotonic() - 1)
    ckpt = torch.load(out / "ckpt.pt", weights_only=False)
    assert ckpt["step"] == 1 and all(k.startswith(("a.", "b.")) for k in ckpt["model"])  # the adapters only

    class Stop(Exception):
        pass

    def interrupt(step, total, loss):
        if step == 110:
            raise Stop

    with pytest.raises(Stop):
        train_pard(tiny, "tiny", pattern_records(), out, S, progress=interrupt)
    steps = []
    resumed = train_pard(tiny, "tiny", pattern_records(), out, S, progress=lambda s, n, loss: steps.append(s))
    assert steps == list(range(101, 121)) and resumed["pieces"] == 3
    merge_lora(full["model"]), merge_lora(resumed["model"])  # (either may be merged already: then a no-op)
    merged_full, merged_resumed = full["model"].state_dict(), resumed["model"].state_dict()
    assert merged_full.keys() == merged_resumed.keys()
    for k in merged_resumed:
        torch.testing.assert_close(merged_resumed[k], merged_full[k], rtol=0, atol=1e-5, msg=k)
    assert _log(out) == _log(full_out)
    with pytest.raises(ConfigError, match="other settings"):
        train_pard(tiny, "tiny", pattern_records(), out, replace(S, block_size=4))


def test_init_draft_needs_a_shipped_draft(tiny, tmp_path):
    with pytest.raises(ConfigError, match="--init draft: no draft is shipped for 'tiny'"):
        train_pard(tiny, "tiny", pattern_records(), tmp_path, replace(S, init="draft"))
