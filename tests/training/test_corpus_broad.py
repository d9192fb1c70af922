"""The broad self-distillation corpus: the prompt mix (specframe.training.broad) over stand-in sources, the
licence checks and install hints of the real sources (specframe.training.sources), and the two-stage corpus
build with second turns on a tiny target (specframe.training.corpus). The real sources are read by one test
that is skipped, with the install command as its reason, where they are not installed."""

from __future__ import annotations

import collections
import json

import pytest

from specframe.errors import ConfigError
from specframe.target.hf import Target
from specframe.training import broad
from specframe.training import sources as S
from specframe.training.corpus import (
    CorpusSettings,
    build_corpus,
    corpus_batches,
    corpus_stats,
    mix_prompts,
    read_corpus,
)

from tests.fakes import SPECBENCH, build_model, build_tokenizer


@pytest.fixture
def fake_sources(monkeypatch):
    """Small stand-ins for the four packaged sources (no package needed)."""
    convs = [[f"hello number {i} how are you", f"fine thanks {i} and you", f"what do you do on day {i} then"]
             for i in range(50)]
    nouns = {cat: [f"{cat}{i}" for i in range(30)] for cat in
             set(broad._FIELDS) | {"person", "object", "animal", "food", "plant", "feeling", "location", "event",
                                   "artifact", "act", "communication", "group", "possession", "state", "cognition",
                                   "attribute"}}
    passages = [(f"topic{i}", " ".join(f"w{i}x{j}" for j in range(80))) for i in range(40)]
    code = [f"x = {i}\ny = x + 1\nprint(y * {i})" for i in range(20)]
    monkeypatch.setattr(S, "conversations", lambda: convs)
    monkeypatch.setattr(S, "nouns", lambda: nouns)
    monkeypatch.setattr(S, "doc_passages", lambda: passages)
    monkeypatch.setattr(S, "doc_code", lambda: code)

    class FakeFaker:
        def __init__(self, seed):
            self.n = seed % 1000

        def __getattr__(self, name):
            return lambda *a, **k: f"{name}-{self.n}"

    monkeypatch.setattr(broad, "_faker", FakeFaker)


# --- the prompt mix -----------------------------------------------------------------------------------------------


def test_mix_follows_the_shares_per_block_of_100(fake_sources):
    got = broad.build_broad_prompts(300, seed=0)
    assert len(got) == 300
    counts = collections.Counter(p["kind"] for p in got[:100])
    assert counts == {k: round(v * 100) for k, v in broad.SHARES.items()}
    assert sum(round(v * 100) for v in broad.SHARES.values()) == 100
    assert all(p["source"] == broad.SOURCE_OF[p["kind"]] and p["text"].strip() for p in got)


def test_mix_is_seeded_and_prefix_stable(fake_sources):
    a, b, c = broad.build_broad_prompts(250, 0), broad.build_broad_prompts(250, 0), broad.build_broad_prompts(250, 1)
    assert a == b and a != c
    assert broad.build_broad_prompts(70, 0) == a[:70]


def test_mix_redraws_repeated_prompts_and_adds_second_turns(fake_sources):
    got = broad.build_broad_prompts(400, 0)
    assert len({p["text"] for p in got}) >= 395
    follow = [p for p in got if "followup" in p]
    assert 0.05 * 400 < len(follow) < 0.25 * 400  # ~10 % generic follow-ups plus chat's own next turns
    assert {p["kind"] for p in follow} > {"chat"}
    assert all(p["followup"].strip() for p in follow)


def test_every_kind_uses_its_source(fake_sources):
    got = broad.build_broad_prompts(200, 3)
    by = {p["kind"]: p["text"] for p in got}
    assert "x79" in by["summarize"] and "Passage: w" in by["passage-qa"]
    assert "```python" in "".join(p["text"] for p in got if p["kind"] == "code")
    assert any("-" in p["text"] and "name-" in p["text"] for p in got if p["kind"] == "extraction")
    assert any(w in by["explain"] for w in ("phenomenon", "process", "substance", "body", "plant", "animal",
                                             "cognition", "communication", "act", "event", "attribute", "state",
                                             "group", "possession", "feeling", "time", "artifact", "location",
                                             "object", "food"))


def test_mix_prompts_dispatch():
    with pytest.raises(ConfigError, match="unknown corpus mix 'nope'"):
        mix_prompts(CorpusSettings("m", 16, 8, 4, 0, "float32", "nope"))
    pydoc = mix_prompts(CorpusSettings("m", 16, 8, 4, 0, "float32", "pydoc"))
    assert len(pydoc) == 16 and all(p["source"] == "python-docs" and "followup" not in p for p in pydoc)


# --- sources: install hints and licence checks --------------------------------------------------------------------


def test_missing_source_names_the_install_command(monkeypatch):
    monkeypatch.setitem(S._licence_paths, "chitchat", lambda: None)
    with pytest.raises(ConfigError, match=r"needs PyPI chitchat-dataset .*: pip install chitchat-dataset==0.9.0"):
        S.SOURCES["chitchat"].describe()


def test_licence_phrase_is_checked(monkeypatch, tmp_path):
    lic = tmp_path / "LICENSE"
    lic.write_text("All rights reserved.")
    monkeypatch.setitem(S._licence_paths, "faker", lambda: lic)
    with pytest.raises(ConfigError, match="no longer contains"):
        S.SOURCES["faker"].describe()
    lic.write_text("MIT License\n\nPermission is hereby granted, free of charge, to any person")
    rec = S.SOURCES["faker"].describe()
    assert rec["licence"] == "MIT" and rec["licence_file"] == str(lic) and len(rec["licence_sha256"]) == 16


def test_rst_cleaning():
    raw = "Use :func:`len` or :class:`~collections.Counter` with ``x``; see `the docs <https://x>`_ and **this**."
    assert S._clean_rst(raw) == "Use len or collections.Counter with x; see the docs and this."


def _installed() -> str | None:
    """None when every real source is installed, else the install command of the first missing one."""
    for s in S.SOURCES.values():
        try:
            s.licence_file()
        except ConfigError:
            return s.install
    return None


@pytest.mark.skipif(_installed() is not None, reason=f"a training source is not installed: {_installed()}")
def test_real_sources_give_a_broad_mix_without_specbench_text():
    for s in S.SOURCES.values():
        assert s.describe()["licence_sha256"]
    assert len(S.conversations()) > 3000
    assert sum(len(v) for v in S.nouns().values()) > 5000
    assert len(S.doc_passages()) > 1000 and len(S.doc_code()) > 500
    got = broad.build_broad_prompts(2400, 0)
    assert len({p["text"] for p in got}) > 2390
    questions = {t.strip() for line in SPECBENCH.read_text().splitlines() if line.strip()
                 for t in json.loads(line)["turns"]}
    texts = {p["text"].strip() for p in got} | {p.get("followup", "").strip() for p in got}
    assert not texts & questions


# --- the two-stage corpus build -------------------------------------------------------------------------------------

CS = CorpusSettings("tiny", 40, 5, 8, 0, "float32", "broad")


@pytest.fixture(scope="module")
def tiny() -> Target:
    model = build_model("llama", max_position_embeddings=2048)
    model.generation_config.eos_token_id = 33
    return Target(model, build_tokenizer(), name="tiny")


def test_corpus_with_second_turns_builds_resumes_and_counts(tiny, tmp_path, fake_sources, monkeypatch):
    monkeypatch.setattr("specframe.training.corpus.sources_record", lambda mix: {"fake": {"licence": "MIT"}})
    items = mix_prompts(CS)
    second = [i for i, p in enumerate(items) if "followup" in p]
    assert second  # the fake mix has second turns
    n1, n2 = corpus_batches(CS)
    assert (n1, n2) == (5, (len(second) + 7) // 8)
    out = tmp_path / "c"
    seen = []
    build_corpus(tiny, out, CS, progress=lambda d, n: seen.append((d, n)))
    assert seen == [(i + 1, n1 + n2) for i in range(n1 + n2)]
    meta = json.loads((out / "corpus.json").read_text())
    assert meta["format"] == 2 and meta["settings"]["mix"] == "broad" and meta["sources"] == {"fake": {"licence": "MIT"}}
    records = list(read_corpus(out))
    firsts = {r["id"]: r for r in records if r["turn"] == 1}
    seconds = [r for r in records if r["turn"] == 2]
    assert sorted(firsts) == list(range(40))
    assert sorted(r["id"] for r in seconds) == second
    for r in seconds:  # no chat template: user turn, the target's own first answer, then the follow-up
        f = firsts[r["id"]]
        follow = list(tiny.tokenizer(items[r["id"]]["followup"])["input_ids"])
        assert r["prompt_ids"] == f["prompt_ids"] + f["response_ids"] + follow
        assert r["kind"] == items[r["id"]]["kind"] and 1 <= len(r["response_ids"]) <= 5
    # resume: a missing second-turn shard is regenerated identically, nothing else is
    before = {p.name: p.read_bytes() for p in out.glob("*.jsonl.gz")}
    (out / "turn2-00000.jsonl.gz").unlink()
    calls = []
    generate = tiny.model.generate
    monkeypatch.setattr(tiny.model, "generate", lambda *a, **k: calls.append(1) or generate(*a, **k))
    build_corpus(tiny, out, CS)
    assert len(calls) == 1
    assert {p.name: p.read_bytes() for p in out.glob("*.jsonl.gz")} == before
    st = corpus_stats(out)
    assert st["records"] == 40 + len(second)
    assert st["response_tokens"] == sum(len(r["response_ids"]) for r in records)
    assert sum(v["records"] for v in st["by_kind"].values()) == st["records"]
    assert st["bytes"] == sum(len(b) for b in before.values())


def test_corpus_refuses_other_settings_and_missing_sources(tiny, tmp_path, fake_sources, monkeypatch):
    monkeypatch.setattr("specframe.training.corpus.sources_record", lambda mix: {})
    out = tmp_path / "c"
    small = CorpusSettings("tiny", 16, 3, 8, 0, "float32", "broad")
    build_corpus(tiny, out, small)
    with pytest.raises(ConfigError, match="other settings"):
        build_corpus(tiny, out, CorpusSettings("tiny", 16, 3, 8, 1, "float32", "broad"))
    monkeypatch.setattr(S, "nouns", lambda: (_ for _ in ()).throw(ConfigError("training source 'wordnet' needs X")))
    with pytest.raises(ConfigError, match="wordnet"):
        build_corpus(tiny, tmp_path / "d", small)
    assert not (tmp_path / "d").exists()  # nothing half-written


# --- the long mix ---------------------------------------------------------------------------------------------------


def test_long_mix_shares_lengths_and_prefix(fake_sources):
    from specframe.training import long

    got = long.build_long_prompts(60, seed=0)
    assert len(got) == 60 and got[:25] == long.build_long_prompts(25, seed=0)
    assert got != long.build_long_prompts(60, seed=1)
    assert collections.Counter(p["kind"] for p in got[:20]) == {k: round(v * 20) for k, v in long.SHARES.items()}
    for p in got:
        assert p["source"] == "python-docs"
        words = len(p["text"].split())
        if p["kind"] == "summarize-long":  # fake passages are 80 words: 400 words at least means 5+ of them
            assert long.MIN_WORDS <= words <= long.MAX_WORDS + 100
        elif p["kind"] == "documents-qa":
            n_docs = p["text"].count("Document ")
            assert 3 <= n_docs <= 6 and "Question: " in p["text"]
    assert mix_prompts(CorpusSettings("m", 7, 8, 1, 0, "float32", "long")) == long.build_long_prompts(7, 0)


def _docs_missing() -> str | None:
    try:
        S.SOURCES["python-docs"].licence_file()
    except ConfigError:
        return S.SOURCES["python-docs"].install
    return None


@pytest.mark.skipif(_docs_missing() is not None, reason=f"a training source is not installed: {_docs_missing()}")
def test_real_sources_give_long_prompts_without_specbench_text():
    from specframe.training import long

    got = long.build_long_prompts(200, 0)
    words = sorted(len(p["text"].split()) for p in got)
    assert words[len(words) // 10] >= 250 and words[-1] <= 2000  # long (SmolLM2: 470-2 050 tokens), not runaway
    questions = {t.strip() for line in SPECBENCH.read_text().splitlines() if line.strip()
                 for t in json.loads(line)["turns"]}
    assert not {p["text"].strip() for p in got} & questions
