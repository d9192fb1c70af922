"""The training recipes (``specframe.training``) and the learned-proposer formats (``specframe.learned``), on tiny
random models only: prompts, corpus building, the draft and Medusa trainers (loss, resume, refusal), the saved
formats as the ``draft-model`` / ``medusa`` proposers read them (greedy output unchanged), ``run_recipe`` end to
end and the ``specframe train`` error paths.
"""

from __future__ import annotations

import collections
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from typer.testing import CliRunner

from specframe import cli
from specframe.acceptance import GreedyVerifier
from specframe.decode.engine import Engine
from specframe.errors import ConfigError
from specframe.learned.medusa_heads import MedusaHeads
from specframe.learned.small_draft import build_from_target, is_small_draft, load_small_draft
from specframe.target.hf import Target
from specframe.training.common import Checkpoint, cosine_lr, length_batches, token_subset
from specframe.training.corpus import CorpusSettings, build_corpus, read_corpus
from specframe.training.dflash import DFlashSettings
from specframe.training.draft import DraftSettings, finish_draft, train_draft
from specframe.training.eagle import EagleSettings
from specframe.training.medusa import MedusaSettings, collect, finish_medusa, train_medusa
from specframe.training.pard import PardSettings
from specframe.training.prompts import build_prompts, passages
from specframe.training.recipe import EVAL_SEED, RECIPES, run_recipe
from specframe_plugins.draft_model import DraftModelConfig, DraftModelProposer
from specframe_plugins.medusa import MedusaConfig, MedusaProposer

from tests.fakes import ROOT, SPECBENCH, VOCAB, build_model, check_metrics, hf_greedy, plain_generate

KINDS = {"summarize", "passage-qa", "rewrite", "explain", "translate", "write", "question", "math", "list"}
EOS = 33  # ends some of the tiny target's greedy answers to the corpus prompts early (see test_corpus_build)


# --- fixtures ---------------------------------------------------------------------------------------------------


def _word_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the 63 most frequent words of the training prompts (unknown words -> 0), so the
    prompts encode to varied ids and the tiny target answers them differently (tests/fakes' two-letter words
    would turn every prompt into a run of pad ids)."""
    counts = collections.Counter(w for p in build_prompts(90, 0) for w in p["text"].split())
    words = ["<pad>"] + sorted(w for w, _ in counts.most_common(VOCAB - 1))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>")


@pytest.fixture(scope="module")
def tiny() -> Target:
    """A tiny random llama with an EOS; 1024 positions, as passage prompts run to ~300 words."""
    model = build_model("llama", max_position_embeddings=1024)
    model.generation_config.eos_token_id = EOS
    return Target(model, _word_tokenizer(), name="tiny")


@pytest.fixture(scope="module")
def tiny_free() -> Target:
    """The same weights without an EOS: generation always runs to max_new_tokens (longer greedy checks)."""
    return Target(build_model("llama", max_position_embeddings=1024), _word_tokenizer(), name="tiny")


def _succ(t: int) -> int:
    return 10 + (t - 10 + 1) % 30


def pattern_records(n: int = 24, response_len: int = 10) -> list[dict]:
    """Responses that follow a fixed successor rule over ids 10..39 (learnable from the previous token)."""
    out = []
    for i in range(n):
        s = 10 + (i * 7) % 30
        resp = []
        t = s
        for _ in range(response_len):
            t = _succ(t)
            resp.append(t)
        out.append({"kind": "x", "prompt_ids": [1, 2, s], "response_ids": resp})
    return out


def _log(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "train-log.jsonl").read_text().splitlines() if x.strip()]


def _greedy_same_as_target(target: Target, proposer) -> None:
    """Greedy decoding with ``proposer`` gives the target's own greedy output, and the proposer did draft."""
    assert not target.eos_token_ids
    engine = Engine(target, [proposer], GreedyVerifier())
    drafted = 0
    prompts = [target.encode_prompt(p["text"])[:40] for p in build_prompts(3, EVAL_SEED)] + [[1, 2, 14, 15, 16]]
    for ids in prompts:
        ref = plain_generate(target, ids, 40)
        assert ref.token_ids == hf_greedy(target.model, ids, 40)
        res = engine.generate(ids, max_new_tokens=40)
        check_metrics(res)
        assert res.token_ids == ref.token_ids
        drafted += res.metrics.drafted_nodes
    assert drafted > 0


# --- prompts ----------------------------------------------------------------------------------------------------


def test_build_prompts_seeded_and_all_kinds():
    a, b, c = build_prompts(27, seed=0), build_prompts(27, seed=0), build_prompts(27, seed=1)
    assert a == b
    assert a != c
    assert len(a) == 27 and len(c) == 27
    assert {p["kind"] for p in a} == KINDS
    assert collections.Counter(p["kind"] for p in a) == {k: 3 for k in KINDS}
    assert all(set(p) == {"kind", "text"} and p["text"].strip() for p in a)
    assert build_prompts(27, seed=0)[:10] == build_prompts(10, seed=0)


@pytest.mark.parametrize("n", [0, 1, 5, 9, 10])
def test_build_prompts_count(n):
    got = build_prompts(n, seed=3)
    assert len(got) == n
    if n >= 9:
        assert {p["kind"] for p in got} == KINDS


def test_prompts_are_not_specbench_questions():
    if not SPECBENCH.is_file():
        pytest.skip(f"{SPECBENCH} not present")
    turns = set()
    for line in SPECBENCH.read_text().splitlines():
        if line.strip():
            turns.update(t.strip() for t in json.loads(line)["turns"])
    assert len(turns) > 100
    for seed in (0, 1, EVAL_SEED):
        texts = {p["text"].strip() for p in build_prompts(400, seed)}
        assert not texts & turns


def test_passages_word_limits():
    got = passages()
    assert len(got) > 50
    for topic, text in got:
        assert isinstance(topic, str) and topic
        assert 60 <= len(text.split()) <= 260
    short = passages(10, 20)
    assert short and all(10 <= len(t.split()) <= 20 for _, t in short)


# --- common -----------------------------------------------------------------------------------------------------


def test_token_subset_hand_example():
    # counts: 7 x3, 5 x3, 9 x2, 3 x2, 11 x1 (11 tokens)
    records = [{"response_ids": [7, 5, 9, 7, 3]}, {"response_ids": [5, 7, 11, 9, 3, 5]}]
    tmap, cov = token_subset(records, 3, [])
    assert tmap.dtype == torch.int64
    assert tmap.tolist() == [3, 5, 7]  # 5 and 7 first (tie: lower id first), then 3 before 9 (tie)
    assert cov == pytest.approx(8 / 11)
    tmap, cov = token_subset(records, 3, [60])  # `always` counts towards the size, listed ascending
    assert tmap.tolist() == [5, 7, 60]
    assert cov == pytest.approx(6 / 11)
    tmap, cov = token_subset(records, 3, [9])
    assert tmap.tolist() == [5, 7, 9]
    assert cov == pytest.approx(8 / 11)
    tmap, cov = token_subset(records, 100, [60])
    assert tmap.tolist() == [3, 5, 7, 9, 11, 60]
    assert cov == 1.0
    tmap, cov = token_subset([], 10, [2])
    assert tmap.tolist() == [2] and cov == 0.0


def test_length_batches():
    lengths = [(i * 37) % 23 + 1 for i in range(41)]
    b = length_batches(lengths, 4, seed=5, epoch=0)
    flat = [i for batch in b for i in batch]
    assert sorted(flat) == list(range(41))
    assert all(1 <= len(x) <= 4 for x in b) and sum(len(x) == 4 for x in b) == 10
    # similar lengths per batch: batches sorted by their shortest never overlap in length
    spans = sorted((min(lengths[i] for i in x), max(lengths[i] for i in x)) for x in b)
    assert all(hi <= lo2 for (_, hi), (lo2, _) in zip(spans, spans[1:]))
    assert length_batches(lengths, 4, seed=5, epoch=0) == b
    assert length_batches(lengths, 4, seed=5, epoch=1) != b
    assert length_batches(lengths, 4, seed=6, epoch=0) != b
    assert sorted(map(sorted, length_batches(lengths, 4, seed=5, epoch=1))) == sorted(map(sorted, b))


def test_cosine_lr():
    base = 2e-3
    assert cosine_lr(0, 100, base, 10) == pytest.approx(base / 10)
    assert cosine_lr(4, 100, base, 10) == pytest.approx(base / 2)
    assert cosine_lr(9, 100, base, 10) == pytest.approx(base)
    assert cosine_lr(10, 100, base, 10) == pytest.approx(base)
    assert cosine_lr(55, 100, base, 10) == pytest.approx(base * (0.1 + 0.45))  # half way: mid of 1.0 .. 0.1
    assert cosine_lr(100, 100, base, 10) == pytest.approx(0.1 * base)
    assert cosine_lr(500, 100, base, 10) == pytest.approx(0.1 * base)  # floor, never below
    after = [cosine_lr(s, 100, base, 10) for s in range(10, 120)]
    assert all(x >= y for x, y in zip(after, after[1:]))
    assert min(after) == pytest.approx(0.1 * base)
    assert cosine_lr(0, 100, base, 0) == pytest.approx(base)


def test_checkpoint_roundtrip_and_refusal(tmp_path):
    ck = Checkpoint(tmp_path, {"a": 1, "l": [0, 1]})
    assert ck.load() is None
    ck.save(step=7, model={"w": torch.ones(2)})
    state = Checkpoint(tmp_path, {"a": 1, "l": [0, 1]}).load()
    assert state["step"] == 7 and torch.equal(state["model"]["w"], torch.ones(2))
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(ConfigError, match="other settings"):
        Checkpoint(tmp_path, {"a": 2, "l": [0, 1]}).load()


# --- corpus -----------------------------------------------------------------------------------------------------

CS = CorpusSettings(model="tiny", num_prompts=6, max_new_tokens=6, batch_size=4, seed=0, dtype="float32")


def test_corpus_build_resume_and_refusal(tiny, tmp_path, monkeypatch):
    out = tmp_path / "corpus"
    seen = []
    build_corpus(tiny, out, CS, progress=lambda d, n: seen.append((d, n)))
    assert seen == [(1, 2), (2, 2)]
    shards = sorted(p.name for p in out.glob("shard-*"))
    assert shards == ["shard-00000.jsonl.gz", "shard-00001.jsonl.gz"]
    assert json.loads((out / "corpus.json").read_text())["settings"]["num_prompts"] == 6
    records = list(read_corpus(out))
    assert len(records) == 6
    prompts = build_prompts(6, 0)
    assert sorted(r["kind"] for r in records) == sorted(p["kind"] for p in prompts)
    assert sorted(r["prompt_ids"] for r in records) == sorted(tiny.encode_prompt(p["text"]) for p in prompts)
    for r in records:
        assert set(r) == {"id", "kind", "source", "turn", "prompt_ids", "response_ids"}
        assert r["turn"] == 1 and r["source"] == "python-docs"
        resp = r["response_ids"]
        assert 1 <= len(resp) <= 6
        assert EOS not in resp[:-1]
        assert len(resp) == 6 or resp[-1] == EOS  # ended by the EOS, which is kept
        # the target's own greedy answer (left padding inside a batch does not change it for this model)
        assert resp == hf_greedy(tiny.model, r["prompt_ids"], 6, eos=EOS)
    assert any(r["response_ids"][-1] == EOS and len(r["response_ids"]) < 6 for r in records)
    assert len({tuple(r["response_ids"]) for r in records}) > 2

    # resume: a missing shard is regenerated (one batch only), identically
    before = {p.name: p.read_bytes() for p in out.glob("shard-*")}
    (out / "shard-00001.jsonl.gz").unlink()
    calls = []
    generate = tiny.model.generate
    monkeypatch.setattr(tiny.model, "generate", lambda *a, **k: calls.append(1) or generate(*a, **k))
    build_corpus(tiny, out, CS)
    assert len(calls) == 1
    assert {p.name: p.read_bytes() for p in out.glob("shard-*")} == before
    build_corpus(tiny, out, CS)  # complete: nothing to do
    assert len(calls) == 1

    # other settings: refused, nothing changed
    meta = (out / "corpus.json").read_text()
    for other in (replace(CS, max_new_tokens=7), replace(CS, seed=1), replace(CS, dtype="bfloat16")):
        with pytest.raises(ConfigError, match="other settings"):
            build_corpus(tiny, out, other)
    assert (out / "corpus.json").read_text() == meta
    assert {p.name: p.read_bytes() for p in out.glob("shard-*")} == before


def test_a_finished_corpus_needs_no_source_package(tiny, tmp_path, monkeypatch):
    """Issue 39, 5: training from a finished corpus (the committed one) must not ask for the packages that built it."""
    import specframe.training.corpus as corpus_mod

    out = tmp_path / "corpus"
    build_corpus(tiny, out, CS)
    assert json.loads((out / "corpus.json").read_text())["finished"] == {"shards": 2, "turn2": 0}

    def missing(*a, **k):
        raise ConfigError("training source 'wordnet' needs wordnet-base: apt-get install wordnet-base")

    monkeypatch.setattr(corpus_mod, "mix_prompts", missing)
    monkeypatch.setattr(corpus_mod, "sources_record", missing)
    assert build_corpus(tiny, out, CS) == out  # finished: no source read
    (out / "shard-00001.jsonl.gz").unlink()  # unfinished again: now the sources are needed, and said so
    with pytest.raises(ConfigError, match="wordnet-base"):
        build_corpus(tiny, out, CS)


def test_the_committed_corpora_are_marked_finished():
    from specframe.training.corpus import finished_shards

    root = ROOT / "lab" / "data" / "smollm2-135m-instruct"
    assert finished_shards(root / "corpus") == (375, 53)
    assert finished_shards(root / "corpus-long") == (8, 0)


def test_read_corpus_needs_corpus_json(tmp_path):
    (tmp_path / "shard-00000.jsonl").write_text('{"kind": "x", "prompt_ids": [1], "response_ids": [2]}\n')
    with pytest.raises(ConfigError, match="corpus.json"):
        list(read_corpus(tmp_path))


# --- draft ------------------------------------------------------------------------------------------------------

# 24 records, batch 1, 3 epochs: 72 steps, a checkpoint at step 50 and at the end
DS = DraftSettings(layers=[0], vocab_subset=30, epochs=3, batch_size=1, lr=3e-3, warmup=5, seed=0, soft_labels=False)


@pytest.fixture(scope="module")
def trained_draft(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("draft")
    summary = train_draft(tiny, pattern_records(), out, DS)
    return out, summary


def test_draft_learns_and_saves(tiny, tiny_free, trained_draft):
    out, summary = trained_draft
    log = _log(out)
    assert [r["step"] for r in log] == list(range(72))
    assert summary["steps"] == 72
    assert summary["final_loss"] < log[0]["loss"] - 0.2
    assert summary["final_acc"] > 0.5
    assert summary["subset_coverage"] == 1.0
    assert summary["trainable_params"] > 0
    draft = summary["draft"]
    assert draft.token_map.tolist() == list(range(10, 40))

    folder = out  # the draft folder is the training folder (loss.png is plotted from its train-log.jsonl)
    finish_draft(draft, folder, "tiny", tiny.vocab_size)
    assert is_small_draft(folder)
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "specframe-draft.json", "loss.png"} <= names
    loaded = load_small_draft(folder, tiny.model, torch.float32, tiny.device)
    assert torch.equal(loaded.token_map, draft.token_map)
    ids = torch.tensor([[1, 2, 14, 15, 16, 17]])
    with torch.no_grad():
        want, got = draft(ids), loaded(ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # it learnt the successor rule: the next token after 17 is 18 (index 8 of the subset 10..39)
    assert int(got[0, -1].argmax()) == 18 - 10
    # the target's own weights were never trained
    torch.testing.assert_close(tiny.model.model.layers[0].mlp.up_proj.weight,
                               build_model("llama", max_position_embeddings=1024).model.layers[0].mlp.up_proj.weight)

    proposer = DraftModelProposer(DraftModelConfig(model=str(folder)), tiny_free.info)
    _greedy_same_as_target(tiny_free, proposer)


def test_draft_resume_is_exact(tiny, trained_draft, tmp_path):
    full_out, full = trained_draft
    out = tmp_path / "draft"

    class Stop(Exception):
        pass

    def interrupt(step, total, loss):
        assert total == 72
        if step == 60:
            raise Stop

    with pytest.raises(Stop):
        train_draft(tiny, pattern_records(), out, DS, progress=interrupt)
    assert torch.load(out / "ckpt.pt", weights_only=False)["step"] == 50
    assert len(_log(out)) == 60
    steps = []
    resumed = train_draft(tiny, pattern_records(), out, DS, progress=lambda s, n, loss: steps.append(s))
    assert steps == list(range(51, 73))
    assert resumed["steps"] == 72
    a, b = full["draft"].lm.state_dict(), resumed["draft"].lm.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=k)
    assert _log(out) == _log(full_out)  # the log restarts from the checkpoint's step, no duplicates


def test_draft_checkpoint_other_settings_refused(tiny, trained_draft):
    out, _ = trained_draft
    for other, records in ((replace(DS, lr=1e-3), pattern_records()), (replace(DS, layers=[1]), pattern_records()),
                           (DS, pattern_records(20))):
        with pytest.raises(ConfigError, match="other settings"):
            train_draft(tiny, records, out, other)


def test_draft_batch_without_subset_labels_logs_finite_loss(tiny, tmp_path):
    records = pattern_records(12) + [{"kind": "x", "prompt_ids": [1, 2], "response_ids": [61, 62, 63]}]
    s = replace(DS, epochs=1)
    summary = train_draft(tiny, records, tmp_path, s)
    assert 62 not in summary["draft"].token_map.tolist()
    assert all(math.isfinite(r["loss"]) for r in _log(tmp_path))
    assert math.isfinite(summary["final_loss"])


def test_recipes_refuse_a_corpus_without_usable_responses(tiny, tmp_path):
    from specframe.training.medusa import MedusaSettings, train_medusa

    records = [{"kind": "x", "prompt_ids": [1, 2], "response_ids": [5]}]
    with pytest.raises(ConfigError, match="no usable responses"):
        train_draft(tiny, records, tmp_path / "d", DS)
    with pytest.raises(ConfigError, match="no usable responses"):
        train_medusa(tiny, [{"kind": "x", "prompt_ids": [1], "response_ids": []}], tmp_path / "m",
                     MedusaSettings(num_heads=2, epochs=1))


def test_build_from_target_refuses_bad_layers(tiny):
    with pytest.raises(ConfigError, match="layers"):
        build_from_target(tiny.model, [2], torch.arange(10))
    with pytest.raises(ConfigError):
        build_from_target(tiny.model, [], torch.arange(10))


def test_small_draft_for_another_target_refused(tiny, trained_draft, tmp_path):
    _, summary = trained_draft
    summary["draft"].save(tmp_path, "tiny", tiny.vocab_size)
    other = build_model("llama", vocab_size=VOCAB + 8)
    with pytest.raises(ConfigError, match="train a draft"):
        load_small_draft(tmp_path, other, torch.float32, "cpu")


# --- medusa -----------------------------------------------------------------------------------------------------


def test_medusa_collect_labels_and_hidden(tiny):
    records = [
        {"kind": "x", "prompt_ids": [4, 5, 6, 7], "response_ids": [20, 21, 22, 23, 24]},
        {"kind": "x", "prompt_ids": [8, 9], "response_ids": [30, 31, 32]},
        {"kind": "x", "prompt_ids": [11, 12, 13], "response_ids": [40]},
        {"kind": "x", "prompt_ids": [14], "response_ids": [50, 51, 52]},  # t = -1 does not exist: starts at t = 0
    ]
    hidden, labels = collect(tiny, records, num_heads=3, max_len=640)
    assert labels.dtype == torch.int64 and hidden.dtype == tiny.dtype
    want_rows, want_hidden = [], []
    for r in records:
        seq = r["prompt_ids"] + r["response_ids"]
        start = len(r["prompt_ids"])
        first = max(start - 2, 0)
        with torch.no_grad():
            out = tiny.model(input_ids=torch.tensor([seq]), output_hidden_states=True)
        h = out.hidden_states[-1][0]
        # the hidden state is the LM head's input (post final norm)
        torch.testing.assert_close(tiny.model.get_output_embeddings()(h), out.logits[0], rtol=1e-5, atol=1e-5)
        for t in range(first, len(seq) - 2):
            want_rows.append(tuple(seq[t + 2 + i] if t + 2 + i < len(seq) else -1 for i in range(3)))
            want_hidden.append(h[t])
        if start >= 2:
            assert want_rows[len(want_rows) - (len(seq) - 2 - first)][0] == r["response_ids"][0]  # first label
    assert hidden.shape == (len(want_rows), tiny.model.config.hidden_size)
    got_rows = [tuple(x) for x in labels.tolist()]
    assert sorted(got_rows) == sorted(want_rows)
    assert (labels[:, 0] >= 0).all()  # head 0 always has a response token
    response_tokens = {t for r in records for t in r["response_ids"]}
    assert set(labels[:, 0].tolist()) <= response_tokens
    for row, h in zip(got_rows, hidden):  # each row's hidden state is the one at its position
        torch.testing.assert_close(h, want_hidden[want_rows.index(row)], rtol=1e-5, atol=1e-5)


MS = MedusaSettings(num_heads=2, vocab_subset=30, epochs=4, batch_positions=16, lr=1e-2, warmup=3, seed=0)


def test_medusa_trains_saves_and_keeps_greedy_output(tiny, tiny_free, tmp_path):
    phases = collections.Counter()
    out = tmp_path / "heads"
    summary = train_medusa(tiny, pattern_records(), out, MS, progress=lambda ph, d, n, loss: phases.update([ph]))
    log = _log(out)
    assert summary["positions"] == 24 * 10
    assert summary["steps"] == 4 * 15 == len(log)
    assert phases["train"] == 60 and phases["hidden"] >= 1
    assert summary["final_loss_head0"] < log[0]["loss"] - 0.2
    heads = summary["heads"]
    assert any(p.abs().sum() > 0 for p in heads.parameters())  # moved away from the zero initialisation

    with pytest.raises(ConfigError, match=r"other settings: lr 0\.01 \(now 0\.001\)"):  # ckpt.pt of this run
        train_medusa(tiny, pattern_records(), out, replace(MS, lr=1e-3))

    finish_medusa(heads, out, "tiny")
    assert {"medusa.json", "medusa.safetensors", "loss.png"} <= {p.name for p in out.iterdir()}
    loaded = MedusaHeads.load(out, tiny.model.config.hidden_size)
    assert (loaded.num_heads, loaded.num_layers) == (2, 1)
    for k, v in heads.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    with pytest.raises(ConfigError, match="hidden size"):
        MedusaHeads.load(out, 48)
    with pytest.raises(ConfigError):
        MedusaHeads.load(tmp_path, 32)

    for cfg in (MedusaConfig(heads=str(out)), MedusaConfig(heads=str(out), top_k=1)):  # tree and chain drafts
        _greedy_same_as_target(tiny_free, MedusaProposer(cfg, tiny_free.info))


def test_medusa_resume_is_exact(tiny, tmp_path):
    # one position per step: 240 steps, a checkpoint at step 200 and at the end
    s = replace(MS, epochs=1, batch_positions=1)
    full = train_medusa(tiny, pattern_records(), tmp_path / "full", s)
    assert full["steps"] == 240

    class Stop(Exception):
        pass

    def interrupt(phase, done, total, loss):
        if phase == "train" and done == 210:
            raise Stop

    out = tmp_path / "resumed"
    with pytest.raises(Stop):
        train_medusa(tiny, pattern_records(), out, s, progress=interrupt)
    assert torch.load(out / "ckpt.pt", weights_only=False)["step"] == 200
    steps = []
    resumed = train_medusa(tiny, pattern_records(), out, s,
                           progress=lambda ph, d, n, loss: steps.append(d) if ph == "train" else None)
    assert steps == list(range(201, 241))
    a, b = full["heads"].state_dict(), resumed["heads"].state_dict()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=k)
    assert _log(out) == _log(tmp_path / "full")


# --- recipe -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["draft", "medusa", "eagle", "dflash", "pard"])
def test_run_recipe_end_to_end(kind, tiny_free, tmp_path_factory):
    tiny = tiny_free  # no EOS: the held-out evaluation runs the full 96 tokens per prompt
    corpus = tmp_path_factory.getbasetemp() / "recipe-corpus"  # shared by both recipes: built once
    cs = replace(CS, num_prompts=16, batch_size=8)
    settings = {"draft": DraftSettings(layers=[0], vocab_subset=32, epochs=1, batch_size=8, soft_labels=False),
                "medusa": MedusaSettings(num_heads=2, epochs=1, batch_positions=16),
                "eagle": EagleSettings(vocab_subset=32, epochs=1, batch_size=8, autocast=False),
                "dflash": DFlashSettings(draft_layers=1, block_size=4, epochs=1, batch_size=8, autocast=False),
                "pard": PardSettings(lora_rank=2, block_size=3, epochs=1, batch_size=8)}[kind]
    out = tmp_path_factory.mktemp(kind)
    phases = set()
    record = run_recipe(kind, tiny, "tiny", out, corpus, cs, settings, lambda ph, d, n, info: phases.add(ph),
                        eval_prompts=2)
    assert {"corpus", "train", "eval"} <= phases
    names = {p.name for p in out.iterdir()}
    weights = {"draft": {"model.safetensors", "config.json", "specframe-draft.json"},
               "medusa": {"medusa.safetensors", "medusa.json"}, "eagle": {"eagle.safetensors", "eagle.json"},
               "dflash": {"model.safetensors", "config.json"},
               "pard": {"model.safetensors", "config.json", "tokenizer.json"}}[kind]
    assert {"README.md", "recipe.json", "loss.png", "train-log.jsonl"} | weights <= names
    assert "ckpt.pt" not in names
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((out / "recipe.json").read_text())
    assert saved == json.loads(json.dumps(record))
    assert saved["recipe"] == kind and saved["corpus"]["records"] == 16
    assert saved["corpus"]["settings"] == json.loads(json.dumps(cs.__dict__))
    ev = saved["eval"]
    proposer = RECIPES[kind]
    assert ev["prompts"] == 2 and ev["mix"] == "pydoc"
    assert ev[proposer]["tau"] >= 1.0
    assert ev["none"]["tau"] == 1.0
    assert ev[proposer]["tokens"] == ev["none"]["tokens"] == 2 * 96
    card = (out / "README.md").read_text()
    assert card.startswith(f"# specframe {proposer} weights for tiny")
    assert "![loss curve](loss.png)" in card and f"| {proposer} | {ev[proposer]['tau']:.2f} |" in card
    assert len(list(read_corpus(corpus))) == 16


@pytest.mark.parametrize("kind", ["medusa", "draft"])
def test_run_recipe_max_records_and_no_teacher_for_medusa(kind, tiny_free, tmp_path_factory):
    corpus = tmp_path_factory.getbasetemp() / "recipe-corpus"  # the corpus of test_run_recipe_end_to_end
    cs = replace(CS, num_prompts=16, batch_size=8)
    settings = {"medusa": MedusaSettings(num_heads=2, epochs=1, batch_positions=16, max_records=10),
                "draft": DraftSettings(layers=[0], vocab_subset=32, epochs=1, batch_size=8, max_records=10, soft_labels=False)}[kind]
    out = tmp_path_factory.mktemp(f"{kind}-sub")
    record = run_recipe(kind, tiny_free, "tiny", out, corpus, cs, settings, lambda *a: None, eval_prompts=1)
    first10 = list(read_corpus(corpus))[:10]
    assert record["corpus"]["records"] == 10
    assert record["corpus"]["response_tokens"] == sum(len(r["response_ids"]) for r in first10)
    # medusa takes hidden states in its own forward; hard-label drafts need no teacher either
    assert not list(corpus.glob("teacher-*"))


def test_run_recipe_into_a_shipped_weights_folder_keeps_its_log_in_lab_data(tiny_free, tmp_path_factory, tmp_path,
                                                                        monkeypatch):
    """Training straight into ``plugins/weights/<target>/<proposer>`` (of a stand-in checkout) leaves there the
    weights, configs, recipe.json and model card only: the loss log and plot go to ``lab/data/<target>/training/
    <proposer>/``, and the card links the plot there."""
    import specframe_plugins.weights
    from specframe.training.data import log_folder

    monkeypatch.setattr(specframe_plugins.weights, "ROOT", tmp_path / "plugins" / "weights")
    monkeypatch.setattr("specframe.training.data.DATA", tmp_path / "lab" / "data")
    (tmp_path / "lab" / "data").mkdir(parents=True)
    out = tmp_path / "plugins" / "weights" / "tiny" / "medusa"
    logs = tmp_path / "lab" / "data" / "tiny" / "training" / "medusa"
    assert log_folder(out) == logs and log_folder(tmp_path / "runs" / "medusa") == tmp_path / "runs" / "medusa"
    corpus = tmp_path_factory.getbasetemp() / "recipe-corpus"  # the corpus of test_run_recipe_end_to_end
    cs = replace(CS, num_prompts=16, batch_size=8)
    run_recipe("medusa", tiny_free, "tiny", out, corpus, cs, MedusaSettings(num_heads=2, epochs=1, batch_positions=16),
               lambda *a: None, eval_prompts=1)
    assert {p.name for p in out.iterdir()} == {"medusa.safetensors", "medusa.json", "recipe.json", "README.md"}
    assert {p.name for p in logs.iterdir()} == {"train-log.jsonl", "loss.png"}
    card = (out / "README.md").read_text()
    assert "![loss curve](../../../../lab/data/tiny/training/medusa/loss.png)" in card
    assert "not in the wheel: `lab/data/tiny/training/medusa/`" in card


def test_the_committed_corpus_is_the_default_of_a_checkout():
    """``specframe train`` without --corpus: the corpus committed in ``lab/data/<target>/corpus`` (none for others)."""
    from specframe.training.data import shipped_corpus

    folder = shipped_corpus("smollm2-135m-instruct")
    assert folder == ROOT / "lab" / "data" / "smollm2-135m-instruct" / "corpus"
    assert json.loads((folder / "corpus.json").read_text())["settings"]["model"] == "smollm2-135m-instruct"
    assert shipped_corpus("no-such-target") is None


def test_run_recipe_unknown_kind(tiny, tmp_path):
    with pytest.raises(ConfigError, match="unknown recipe"):
        run_recipe("bogus", tiny, "tiny", tmp_path / "o", tmp_path / "c", CS, DS, lambda *a: None)
    assert not (tmp_path / "c").exists()


# --- CLI --------------------------------------------------------------------------------------------------------

runner = CliRunner()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["draft", "--layers", "a,b"], "--layers"),
        (["draft", "--prompts", "3"], "--prompts"),
        (["medusa", "--prompts", "3"], "--prompts"),
        (["draft", "--dtype", "half"], "--dtype"),  # (float16 is a training dtype: GPUs without native bf16)
        (["draft", "--max-new-tokens", "4"], "--max-new-tokens"),
        (["medusa", "--heads", "0"], "--heads"),
        (["medusa", "--batch-positions", "0"], "--batch-positions"),
        (["medusa", "--max-records", "-1"], "--max-records"),
        (["draft", "--max-records", "-1"], "--max-records"),
        (["draft", "--model", "nosuch"], "nosuch"),
        (["medusa", "--model", "nosuch"], "nosuch"),
        (["eagle", "--max-minutes", "-1"], "--max-minutes"),
        (["eagle", "--skip-records", "-1"], "--skip-records"),
        (["eagle", "--init", "no/such/folder"], "--init no/such/folder"),
        (["eagle", "--device", "tpu"], "tpu"),
        (["corpus", "--device", "tpu"], "tpu"),
        (["dflash", "--block-size", "1"], "--block-size"),
        (["dflash", "--target-layers", "a"], "--target-layers"),
        (["dflash", "--mask-token", "-2"], "--mask-token"),
        (["pard", "--init", "nope"], "--init"),
        (["pard", "--lora-rank", "0"], "--lora-rank"),
        (["pard", "--cod-ratio", "0"], "--cod-ratio"),
    ],
)
def test_train_cli_errors(args, needle, tmp_path, no_model_load):
    out = tmp_path / "out"
    result = runner.invoke(cli.app, ["train", *args, "--output", str(out)])
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.stdout == ""
    lines = result.stderr.strip("\n").splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and needle in lines[0]
    assert "Traceback" not in result.output
    assert not out.exists()


# --- the teacher pass and soft labels -------------------------------------------------------------------------------


def test_teacher_pass_matches_a_fresh_forward_and_resumes(tiny, tmp_path):
    from specframe.training.medusa import from_teacher
    from specframe.training.teacher import teacher_pass

    records = pattern_records(10)
    teach = teacher_pass(tiny, tmp_path, records, top_k=4)
    assert len(teach) == len(records)
    for r, t in zip(records, teach):
        seq = r["prompt_ids"] + r["response_ids"]
        assert t["ids"] == seq and t["start"] == len(r["prompt_ids"])
        with torch.no_grad():
            out = tiny.model(input_ids=torch.tensor([seq]), output_hidden_states=True)
        logp = torch.log_softmax(out.logits[0, :-1].float(), -1)
        top = logp.topk(4, -1)
        assert torch.equal(t["top_ids"].long(), top.indices)
        torch.testing.assert_close(t["top_logp"].float(), top.values, atol=2e-3, rtol=1e-3)
        torch.testing.assert_close(t["hidden"], out.hidden_states[-1][0, t["h0"]:], atol=1e-5, rtol=1e-5)
    # the Medusa rows built from the teacher equal collect()'s
    h1, l1 = from_teacher(teach, 3)
    h2, l2 = collect(tiny, records, num_heads=3, max_len=640)
    assert sorted(map(tuple, l1.tolist())) == sorted(map(tuple, l2.tolist()))
    assert h1.shape == h2.shape
    # resume: a deleted part is recomputed, the others are read back unchanged
    parts = sorted((tmp_path / "teacher-float32-k4").glob("part-*.pt"))
    assert len(parts) == 2
    parts[0].unlink()
    again = teacher_pass(tiny, tmp_path, records, top_k=4)
    for a, b in zip(teach, again):
        assert torch.equal(a["top_ids"], b["top_ids"]) and torch.equal(a["hidden"], b["hidden"])


def test_soft_label_draft_learns_and_needs_the_teacher(tiny, tmp_path):
    from specframe.training.teacher import teacher_pass

    records = pattern_records()
    s = replace(DS, soft_labels=True)
    with pytest.raises(ConfigError, match="teacher"):
        train_draft(tiny, records, tmp_path / "no", s)
    teach = teacher_pass(tiny, tmp_path / "corpus", records, top_k=8)
    summary = train_draft(tiny, records, tmp_path / "soft", s, teacher=teach)
    log = _log(tmp_path / "soft")
    # cross-entropy against the (near-uniform) random target's distributions falls towards their entropy
    assert summary["steps"] == len(log) and summary["final_loss"] < log[0]["loss"] - 0.1
    assert all(math.isfinite(r["loss"]) for r in log)


@pytest.mark.parametrize("kind", ["medusa", "draft", "eagle", "dflash", "pard"])
def test_model_card_reproduce_line_names_real_flags(kind) -> None:
    """Every flag of the reproduce line exists on `specframe train KIND`, and non-default settings are named."""
    from typer.testing import CliRunner

    from specframe.cli import app
    from specframe.training.recipe import reproduce_flags

    settings = {"num_heads": 3, "layers": [0, 2], "epochs": 1, "lr": 0.002, "batch_positions": 512, "batch_size": 4,
                "max_len": 256, "ttt_steps": 2, "vocab_subset": 4096, "max_records": 13000, "seed": 7,
                "feature_layers": None, "soft_labels": False}
    line = reproduce_flags(kind, settings)
    assert " --epochs 1" in line and " --max-records 13000" in line and " --seed 7" in line
    helptext = CliRunner().invoke(app, ["train", kind, "--help"], env={"COLUMNS": "200"}).output
    flags = [w for w in line.split() if w.startswith("--")]
    assert flags and all(f in helptext for f in flags), (flags, helptext)
    assert ("--hard-labels" in line) == (kind == "draft")
    assert reproduce_flags(kind, {**settings, "max_records": 0}).count("--max-records") == 0
    warm = reproduce_flags(kind, {**settings, "skip_records": 13000, "init": "old/eagle"})
    assert (" --skip-records 13000" in warm and " --init old/eagle" in warm) == (kind in ("eagle", "pard"))
    assert "--skip-records" not in reproduce_flags(kind, {**settings, "skip_records": 0, "init": ""})


def test_run_recipe_with_an_extra_corpus(tiny_free, tmp_path_factory, tmp_path):
    """--extra-corpus: its records follow the main corpus's; the recipe and the model card name it; an unfinished
    one, or one of another target, is refused before training."""
    corpus = tmp_path_factory.getbasetemp() / "recipe-corpus"  # the corpus of test_run_recipe_end_to_end
    cs = replace(CS, num_prompts=16, batch_size=8)
    extra_cs = replace(CS, num_prompts=8, batch_size=8, seed=5)
    extra = tmp_path / "extra"
    from specframe.training.corpus import build_corpus

    build_corpus(tiny_free, corpus, cs)
    build_corpus(tiny_free, extra, extra_cs)
    s = EagleSettings(vocab_subset=32, epochs=1, batch_size=8, autocast=False)
    out = tmp_path / "eagle"
    record = run_recipe("eagle", tiny_free, "tiny", out, corpus, cs, s, lambda *a: None, eval_prompts=1,
                        extra_corpora=[extra])
    assert record["corpus"]["records"] == 16
    assert record["corpus"]["extra"] == [{"path": str(extra), "settings": json.loads(json.dumps(extra_cs.__dict__)),
                                          "records": 8}]
    assert record["result"]["steps"] == 3  # 24 records, 8 a batch
    card = (out / "README.md").read_text()
    assert "then 8 of the `pydoc` mix (seed 5)" in card and f"--extra-corpus {extra}" in card
    # a warm start on a slice of the corpus (records 5-12), the extra corpus still whole after it
    warm = replace(s, max_records=12, skip_records=4, init=str(out))
    record = run_recipe("eagle", tiny_free, "tiny", tmp_path / "warm", corpus, cs, warm, lambda *a: None,
                        eval_prompts=1, extra_corpora=[extra])
    assert record["corpus"]["records"] == 8 and record["result"]["steps"] == 2  # 8 + 8 records, 8 a batch
    card = (tmp_path / "warm" / "README.md").read_text()
    assert "(records 5–12 of the corpus)" in card and f"Warm start: training went on from the drafter in `{out}`" in card
    assert f"--skip-records 4 --init {out}" in card
    with pytest.raises(ConfigError, match="leaves no record"):
        run_recipe("eagle", tiny_free, "tiny", tmp_path / "none", corpus, cs, replace(s, skip_records=16),
                   lambda *a: None, eval_prompts=1)
    (extra / "shard-00000.jsonl.gz").unlink()
    with pytest.raises(ConfigError, match="not finished"):
        run_recipe("eagle", tiny_free, "tiny", tmp_path / "e2", corpus, cs, s, lambda *a: None, extra_corpora=[extra])
    with pytest.raises(ConfigError, match="not of 'other'"):
        run_recipe("eagle", tiny_free, "other", tmp_path / "e3", corpus, cs, s, lambda *a: None, extra_corpora=[corpus])
    with pytest.raises(ConfigError, match="no corpus.json"):
        run_recipe("eagle", tiny_free, "tiny", tmp_path / "e4", corpus, cs, s, lambda *a: None,
                   extra_corpora=[tmp_path / "nothing"])


def test_progress_lines_on_a_non_terminal_stderr(monkeypatch):
    """Where stderr is a log file, long work prints a line at its start, each 5 % of its total (or minute), and at
    its end; on a terminal nothing (the bar shows it)."""
    from specframe.cli import console

    printed: list[str] = []
    monkeypatch.setattr(console.err, "print", lambda s, **kw: printed.append(s))
    clock = iter(range(0, 10_000)).__next__  # one second per call
    lines = console.ProgressLines(step=0.25, every_s=1e9)
    lines.on, lines.clock = True, clock
    for done in range(0, 101):
        lines("train", done, 100, "loss 2.5")
    assert printed == [f"train {d}/100 loss 2.5" for d in (0, 25, 50, 75, 100)]
    printed.clear()
    timed = console.ProgressLines(step=1.0, every_s=30)
    timed.on, timed.clock = True, clock
    for done in range(0, 90):
        timed("corpus", done, 1000)
    assert printed == ["corpus 0/1000", "corpus 30/1000", "corpus 60/1000"]  # every 30 s when the share is small
    monkeypatch.setattr(type(console.err), "is_terminal", property(lambda self: True))
    printed.clear()
    console.ProgressLines()("x", 1, 1)
    assert printed == []  # a terminal: the bar shows it


# --- one settings model per recipe feeds its command line -------------------------------------------------------------


@pytest.mark.parametrize("kind, settings", [
    ("draft", DraftSettings(layers=[0, 2], vocab_subset=4096, epochs=1, lr=0.002, soft_labels=False, max_records=13,
                            seed=7)),
    ("draft", DraftSettings()),
    ("medusa", MedusaSettings(num_heads=3, epochs=1, batch_positions=64, lr=0.004, max_records=9, seed=3)),
    ("eagle", EagleSettings(vocab_subset=2048, epochs=2, batch_size=4, max_len=256, lr=1e-3, ttt_steps=2,
                            feature_layers=(1, 3), max_records=20, skip_records=5, arch="eagle3", seed=1)),
    ("eagle", EagleSettings()),
    ("dflash", DFlashSettings(draft_layers=1, target_layers=(4, 20), block_size=16, anchors=32, gamma=3.5, epochs=2,
                              batch_size=4, max_len=512, lr=1e-3, mask_token=16, max_records=30, skip_records=3,
                              seed=2)),
    ("dflash", DFlashSettings()),
    ("pard", PardSettings(init="draft", lora_rank=4, block_size=5, cod_ratio=0.5, epochs=2, batch_size=2, max_len=128,
                          lr=1e-3, mask_token=7, max_records=10, skip_records=2, seed=3)),
    ("pard", PardSettings()),
])
def test_the_reproduce_flags_give_back_the_settings(kind, settings, tmp_path, monkeypatch):
    """`specframe train KIND` + the model card's reproduce flags of ``settings`` builds exactly ``settings``, and with
    no flags the command's settings are the dataclass defaults (one place for each default)."""
    from dataclasses import asdict

    from specframe.training import command
    from specframe.training.recipe import reproduce_flags

    got = []
    monkeypatch.setattr(command, "_run", lambda kind, *a: got.append(a[8]))
    flags = reproduce_flags(kind, asdict(settings)).split()
    res = runner.invoke(cli.app, ["train", kind, "--output", str(tmp_path / "o"), *flags])
    assert res.exit_code == 0, res.output
    assert got == [settings], (flags, got)
    res = runner.invoke(cli.app, ["train", kind, "--output", str(tmp_path / "o")])
    assert res.exit_code == 0 and got[-1] == type(settings)(), res.output


# --- from issue 39's fourth round of reports (each failed on the code before its fix) ---------------------------------


def test_a_train_resume_with_a_changed_setting_is_refused_before_any_stage_and_names_it(tmp_path, monkeypatch):
    from dataclasses import asdict

    from specframe.training import recipe

    out = tmp_path / "td"
    out.mkdir()
    before = DraftSettings()
    torch.save({"settings": {"draft": asdict(before), "records": 5}, "step": 3}, out / "ckpt.pt")
    monkeypatch.setattr(recipe, "build_corpus", lambda *a, **k: pytest.fail("the corpus stage ran"))
    monkeypatch.setattr(recipe, "teacher_pass", lambda *a, **k: pytest.fail("the teacher stage ran"))
    with pytest.raises(ConfigError, match=rf"other settings: lr {before.lr!r} \(now 0\.123\): run the same command"):
        recipe.run_recipe("draft", None, "t", out, tmp_path / "corpus", None, replace(before, lr=0.123),
                          lambda *a: None)
