"""The vLLM adapter (specframe.integrations.vllm) driven as vLLM drives a custom_class proposer, without vLLM.

A fake step loop plays vLLM's part: a deterministic greedy "target" (a function of the context), rows that move
between steps, chain verification (the draft's longest prefix equal to the target's tokens, plus one more token).
The end-to-end run inside real vLLM is scripts/vllm_check.py (and test_vllm_live below, when vLLM is installed).
"""

from __future__ import annotations

import random
from importlib import metadata
from types import SimpleNamespace

import numpy as np
import pytest

from specframe.errors import ConfigError
from specframe.integrations import vllm as adapter
from specframe.integrations.vllm import SpecframeProposer, VllmIntegrationError, spec_decode_report

VOCAB = 64
MAX_LEN = 256


def target_next(context: list[int]) -> int:
    """A greedy 'target' with repeats that lookup can predict: a cycle of 7 tokens picked by the prompt's first."""
    base = context[0] % 5
    return 10 + (base + len(context)) % 7


def fake_config(specframe: dict | None, k: int = 4) -> SimpleNamespace:
    model = SimpleNamespace(get_vocab_size=lambda: VOCAB, max_model_len=MAX_LEN, tokenizer="/nonexistent/tokenizer",
                            hf_config=SimpleNamespace(eos_token_id=2), dtype="float32", model="fake")
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k), model_config=model,
                           additional_config={"specframe": specframe} if specframe is not None else {})


def run_vllm_like(prop: SpecframeProposer, prompts: list[list[int]], steps: int, shuffle: int | None,
                  k: int = 4) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Decode ``prompts`` together for ``steps`` steps as vLLM would; rows are shuffled each step when ``shuffle``
    is a seed. Returns each request's tokens and the drafts the adapter gave it, step by step."""
    contexts = [list(p) for p in prompts]
    sampled = [[target_next(c)] for c in contexts]  # the prefill's token
    for c, s in zip(contexts, sampled):
        c.extend(s)
    drafts_of: list[list[list[int]]] = [[] for _ in prompts]
    order = list(range(len(prompts)))
    rng = random.Random(shuffle)
    for _ in range(steps):
        if shuffle is not None:
            rng.shuffle(order)
        table = np.zeros((len(order), MAX_LEN), dtype=np.int32)
        for row, r in enumerate(order):
            table[row, : len(contexts[r])] = contexts[r]
        lengths = np.array([len(contexts[r]) for r in order], dtype=np.int32)
        drafts = prop.propose([sampled[r] for r in order], lengths, table)
        assert len(drafts) == len(order)
        for row, r in enumerate(order):
            d = drafts[row]
            assert len(d) <= k
            drafts_of[r].append(list(d))
            committed = []  # verification: accept the draft's prefix the target agrees with, then one target token
            for tok in d:
                want = target_next(contexts[r] + committed)
                if tok != want:
                    break
                committed.append(tok)
            committed.append(target_next(contexts[r] + committed))
            contexts[r].extend(committed)
            sampled[r] = committed
    return contexts, drafts_of


PROMPTS = [[3, 11, 12, 13, 14, 15, 16, 17, 10, 11], [4, 12, 13, 14, 15, 16, 17, 10, 11, 12],
           [3, 11, 12, 13, 14, 15, 16, 17, 10, 11], [7, 20, 21, 22]]  # rows 0 and 2: the same prompt


def test_rows_that_move_never_mix_requests() -> None:
    """Each request gets the drafts it gets alone, however vLLM orders the rows (identical prompts included)."""
    cfg = fake_config({"proposers": [{"name": "ngram"}]})
    together = run_vllm_like(SpecframeProposer(cfg), PROMPTS, 12, shuffle=1)
    for r, p in enumerate(PROMPTS):
        alone = run_vllm_like(SpecframeProposer(cfg), [p], 12, shuffle=None)
        assert together[0][r] == alone[0][0]
        assert together[1][r] == alone[1][0]
    # lookup predicts this target: the drafts were used (the test would pass vacuously on empty drafts)
    assert sum(len(d) for d in together[1][0]) > 10


def test_output_equals_plain_decoding_and_acceptance_is_counted() -> None:
    prop = SpecframeProposer(fake_config({"proposers": [{"name": "ngram"}]}))
    contexts, drafts = run_vllm_like(prop, PROMPTS[:2], 10, shuffle=3)
    for p, c in zip(PROMPTS[:2], contexts):
        plain = list(p)
        while len(plain) < len(c):
            plain.append(target_next(plain))
        assert c == plain
    stats = prop.stats()
    assert stats["drafts"] > 0 and 0 < stats["alpha"] <= 1.0
    assert stats["accepted_tokens"] <= stats["draft_tokens"]
    assert stats["drafted_by_position"][0] >= stats["accepted_by_position"][0]


def test_combination_gives_one_chain_no_longer_than_k() -> None:
    prop = SpecframeProposer(fake_config({"proposers": [{"name": "ngram"}, {"name": "ngram", "k": 2}]}, k=3))
    contexts, drafts = run_vllm_like(prop, PROMPTS[:2], 8, shuffle=5, k=3)
    assert all(len(d) <= 3 for per in drafts for d in per)
    assert any(len(d) == 3 for per in drafts for d in per)


def test_prefill_rows_and_full_context_get_empty_drafts() -> None:
    prop = SpecframeProposer(fake_config({"proposers": [{"name": "ngram"}]}))
    table = np.zeros((2, MAX_LEN), dtype=np.int32)
    table[0, :MAX_LEN] = 5
    table[1, :4] = [1, 2, 3, 4]
    out = prop.propose([[5], []], np.array([MAX_LEN, 4]), table)
    assert out == [[], []]


def test_finished_requests_are_closed_and_their_instances_reused() -> None:
    prop = SpecframeProposer(fake_config({"proposers": [{"name": "ngram"}]}))
    run_vllm_like(prop, PROMPTS[:2], 3, shuffle=None)
    assert prop.stats()["open_requests"] == 2
    for _ in range(adapter.EXPIRE_STEPS + 1):  # the requests are gone from the batch
        prop.propose([], np.zeros(0, dtype=np.int32), np.zeros((0, MAX_LEN), dtype=np.int32))
    assert prop.stats()["open_requests"] == 0
    assert prop.stats()["proposers"]["ngram"]["drafted_nodes"] > 0


def test_hidden_state_proposers_are_refused_with_one_line() -> None:
    for name in ("medusa", "eagle"):
        with pytest.raises(VllmIntegrationError, match=f"proposer '{name}' reads the target's hidden states") as e:
            SpecframeProposer(fake_config({"proposers": [{"name": name}]}))
        assert "\n" not in str(e.value)


def test_config_from_environment_and_missing_config(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(adapter.ENV_CONFIG, raising=False)
    with pytest.raises(VllmIntegrationError, match="SPECFRAME_CONFIG"):
        SpecframeProposer(fake_config(None))
    path = tmp_path / "sf.yaml"
    path.write_text("proposers: [{name: ngram, k: 3}]\n")
    monkeypatch.setenv(adapter.ENV_CONFIG, str(path))
    assert SpecframeProposer(fake_config(None)).names == ["ngram"]
    path.write_text("proposers: [{name: ngram, k: 0}]\n")
    with pytest.raises(ConfigError):
        SpecframeProposer(fake_config(None))


def test_a_proposer_that_raises_never_crashes_vllm(monkeypatch) -> None:
    prop = SpecframeProposer(fake_config({"proposers": [{"name": "ngram"}]}))
    monkeypatch.setattr(prop, "_propose", lambda *a: 1 / 0)
    assert prop.propose([[1], [2]], np.array([3, 3]), np.ones((2, MAX_LEN), dtype=np.int32)) == [[], []]


def test_missing_or_old_vllm_is_one_clear_line(monkeypatch) -> None:
    def missing(dist):
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(adapter.metadata, "version", missing)
    with pytest.raises(VllmIntegrationError, match=r"vLLM is not installed: pip install 'specframe\[vllm\]'"):
        adapter.speculative_config(None, 4)
    monkeypatch.setattr(adapter.metadata, "version", lambda dist: "0.21.3")
    with pytest.raises(VllmIntegrationError, match="vLLM 0.21.3 has no custom_class speculative method"):
        adapter.speculative_config(None, 4)
    monkeypatch.setattr(adapter.metadata, "version", lambda dist: "0.32.0")
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        adapter.speculative_config(None, 0)


def test_speculative_config_checks_here_and_exports_the_path(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(adapter.metadata, "version", lambda dist: "0.32.0")
    monkeypatch.delenv(adapter.ENV_CONFIG, raising=False)
    good = tmp_path / "good.yaml"
    good.write_text("proposers: [{name: ngram}]\n")
    spec = adapter.speculative_config(good, 5)
    assert spec == {"method": "custom_class", "model": adapter.CLASS_PATH, "num_speculative_tokens": 5}
    assert adapter.os.environ[adapter.ENV_CONFIG] == str(good.resolve())
    bad = tmp_path / "bad.yaml"
    bad.write_text("proposers: [{name: medusa}]\n")
    with pytest.raises(VllmIntegrationError, match="medusa"):
        adapter.speculative_config(bad, 5)


def test_spec_decode_report_from_vllm_counters() -> None:
    m = [SimpleNamespace(name="vllm:spec_decode_num_drafts", value=10),
         SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", value=40),
         SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=12),
         SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=[6, 4, 2, 0]),
         SimpleNamespace(name="vllm:generation_tokens", value=44),
         SimpleNamespace(name="vllm:request_success", value=1),  # two finish reasons: summed
         SimpleNamespace(name="vllm:request_success", value=1),
         SimpleNamespace(name="vllm:num_requests_running", value=1)]
    r = spec_decode_report(m)
    # 44 tokens, 2 from the prefills: 42 committed by 42 - 12 = 30 forwards
    assert r["decode_forwards"] == 30 and r["tau"] == pytest.approx(42 / 30)
    assert r["tau_per_draft"] == pytest.approx(2.2) and r["alpha"] == pytest.approx(0.3)
    assert r["accepted_by_position"] == [6, 4, 2, 0]
    assert spec_decode_report(m[:4])["tau"] == pytest.approx(2.2)  # no token counters: vLLM's per-draft figure
    assert spec_decode_report([])["tau"] == 1.0


def test_vllm_live_is_skipped_with_its_reason_without_vllm() -> None:
    """Inside real vLLM the check is scripts/vllm_check.py (several minutes per setting; not in CI)."""
    try:
        adapter.vllm_version()
    except VllmIntegrationError as exc:
        pytest.skip(f"vLLM not installed ({exc}); run scripts/vllm_check.py in an environment with vLLM")
    import importlib

    import vllm  # noqa: F401 - installed: at least importable with the adapter's class path

    cls = getattr(importlib.import_module(adapter.CLASS_PATH.rsplit(".", 1)[0]), adapter.CLASS_PATH.rsplit(".", 1)[1])
    assert cls is SpecframeProposer


# --- the device: a proposer's own model runs where vLLM runs the target -----------------------------------------------


def with_device(cfg: SimpleNamespace, device, device_type: str | None = None) -> SimpleNamespace:
    """``cfg`` with vLLM's ``device_config`` (its ``device`` is ``torch.device("cuda")`` without an index on a GPU
    worker, None on a CPU build, whose ``device_type`` is then ``cpu``)."""
    cfg.device_config = SimpleNamespace(device=device, device_type=device_type or getattr(device, "type", device))
    return cfg


@pytest.mark.parametrize("device, device_type, current, want", [
    ("absent", None, 0, "cpu"),  # an older vLLM without device_config: the host, as before
    (None, "cpu", 0, "cpu"),  # vLLM's CPU build
    ("cuda", "cuda", 1, "cuda:1"),  # a GPU worker: the GPU it made current
    ("cuda", "cuda", 0, "cuda:0"),
    ("cuda:2", "cuda", 0, "cuda:2"),  # an index given: kept
    ("tpu", "tpu", 0, "cpu"),  # no torch device to place a model on from here: the host
])
def test_vllm_device_follows_the_worker(monkeypatch, device, device_type, current, want) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    cfg = fake_config({"proposers": [{"name": "ngram"}]})
    if device != "absent":
        with_device(cfg, torch.device(device) if device in ("cuda", "cuda:2") else device, device_type)
    assert adapter.vllm_device(cfg) == torch.device(want)
    assert adapter._target_info(cfg).device == torch.device(want)


def test_the_draft_model_proposer_runs_its_draft_on_vllms_gpu(tmp_path, monkeypatch) -> None:
    """vLLM on GPU 1: the draft-model proposer is asked to place its draft on cuda:1 in vLLM's dtype (it used to be
    the host whatever vLLM ran on). No GPU here: the draft is loaded on the CPU, the placement asked for recorded."""
    import dataclasses

    import torch

    from specframe_plugins import draft_model

    from tests.fakes import draft_dir

    asked = []
    real = draft_model._HFDraft

    def placing(directory, target):
        asked.append((target.device, target.dtype))
        return real(directory, dataclasses.replace(target, device=torch.device("cpu")))

    monkeypatch.setattr(draft_model, "_HFDraft", placing)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    cfg = fake_config({"proposers": [{"name": "draft-model", "model": str(draft_dir(tmp_path, "llama"))}]})
    cfg.model_config.dtype = torch.bfloat16
    SpecframeProposer(with_device(cfg, torch.device("cuda")))
    assert asked == [(torch.device("cuda:1"), torch.bfloat16)]
