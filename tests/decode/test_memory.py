"""Memory across requests: learned proposers' weights are loaded once per model and shared by every option set, and
a Specframe keeps a bounded number of per-option objects.

Eight requests that differed only in draft-model ``k`` grew the process by about 475 MiB: a new copy of the draft
weights per option set, all kept for the life of the Specframe. Counted here as loads and live objects (a test
cannot assert RSS reliably); the RSS figures are in the issue's closing note.
"""

from __future__ import annotations

import gc

import pytest
import torch

import specframe
from specframe.instance_pool import InstancePool
from specframe.learned.eagle_drafter import EagleSpec, init_from_target, new_drafter
from specframe.learned.medusa_heads import MedusaHeads
from specframe.registry import build_registry
from specframe.shared_weights import folder_key, shared
from specframe.target.hf import Target

from tests.fakes import NAME, PROMPT, VOCAB, build_model, build_tokenizer


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("memory")
    model = build_model("llama", num_hidden_layers=4)
    target = Target(model, build_tokenizer(), name=NAME)
    build_model("llama", seed=1).save_pretrained(root / "draft")
    build_tokenizer().save_pretrained(root / "draft")
    MedusaHeads(int(model.config.hidden_size), 3, 1, None).save(root / "medusa", NAME)
    spec = EagleSpec.for_target(model.config, NAME, (1, 2, 4))
    drafter = new_drafter(spec, torch.arange(VOCAB), 1)
    init_from_target(drafter, model)
    drafter.save(root / "eagle")
    return specframe.load(target=target, registry=build_registry()), root


def live(cls: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is cls)


# (proposer entry for option i, the loader it calls, the proposer class)
def _draft_model(root, i):
    return {"name": "draft-model", "model": str(root / "draft"), "k": 1 + i % 8, "max_k": 8,
            "min_confidence": (i // 8) / 10}


def _medusa(root, i):
    return {"name": "medusa", "heads": str(root / "medusa"), "top_k": 1 + i % 5, "max_nodes": 2 + i // 5}


def _eagle(root, i):
    return {"name": "eagle", "weights": str(root / "eagle"), "depth": 1 + i % 6, "top_k": 1 + i // 6}


@pytest.mark.parametrize("entry, loader, proposer", [
    (_draft_model, "transformers.AutoModelForCausalLM.from_pretrained", "specframe_plugins.draft_model.DraftModelProposer"),
    (_medusa, "specframe_plugins.medusa.MedusaHeads.load", "specframe_plugins.medusa.MedusaProposer"),
    (_eagle, "specframe_plugins.eagle.EagleDrafter.load", "specframe_plugins.eagle.EagleProposer"),
], ids=["draft-model", "medusa", "eagle"])
def test_option_sets_share_one_copy_of_the_weights_and_per_option_objects_are_bounded(setup, monkeypatch, entry,
                                                                                       loader, proposer):
    import importlib

    from specframe.api import POOL_IDLE

    sf, root = setup
    owner, attr = loader.rsplit(".", 1)
    module_name, _, cls_name = owner.rpartition(".")
    holder = getattr(importlib.import_module(module_name), cls_name)
    real = getattr(holder, attr)
    loads = []

    def counting(*args, **kwargs):
        loads.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(holder, attr, counting)
    mod, _, cls = proposer.rpartition(".")
    proposer_cls = getattr(importlib.import_module(mod), cls)
    first = None
    for i in range(30):  # 30 option sets, each once
        rec = sf.generate(PROMPT, max_new_tokens=4, proposers=[entry(root, i)])
        assert rec["metrics"]["proposer_faults"] == 0
        if first is None:
            first = len(loads)
    assert first == 1 and len(loads) == 1  # loaded for the first option set, shared by the other 29
    assert live(proposer_cls) <= POOL_IDLE  # per-option instances: bounded, not one per option set ever asked for


def test_shared_builds_once_and_lets_go_when_nobody_holds_it():
    built = []

    class Weights:
        pass

    def build():
        built.append(1)
        return Weights()

    a = shared(("test-sharing", 1), build)
    b = shared(("test-sharing", 1), build)
    assert a is b and len(built) == 1
    del a, b
    gc.collect()
    shared(("test-sharing", 1), build)  # no holder was left: built again
    assert len(built) == 2


def test_instance_pool_reuses_and_bounds():
    pool = InstancePool(max_idle=2)
    made = []
    first = pool.take("k", lambda: made.append(1) or object())
    pool.give("k", first)
    assert pool.take("k", lambda: made.append(1) or object()) is first and len(made) == 1  # reused, not rebuilt
    for i in range(5):
        pool.give(f"other-{i}", object())
    assert len(pool) == 2  # the least recently returned went


def test_folder_key_changes_when_the_weights_change(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"12")
    before = folder_key(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"1234")
    assert folder_key(tmp_path) != before and folder_key(tmp_path)[0] == str(tmp_path.resolve())
