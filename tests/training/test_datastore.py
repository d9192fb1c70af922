"""The retrieval datastore (specframe/datastore): suffix array and search against brute force, retrieval
(longest suffix first, evenly spread occurrences, document boundaries), the folder format (manifest, dtypes,
memory-mapping, atomic writes, nothing half-written), the default pydoc datastore in the cache, and the
``specframe datastore build`` command with its errors."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from specframe import cli
from specframe.datastore import SEPARATOR, Datastore, DatastoreError, build_datastore, is_datastore
from specframe.datastore import store as store_module
from specframe.datastore.default import default_datastore
from specframe.datastore.sources import PRESETS, fingerprint, read_preset
from specframe.datastore.store import suffix_array
from specframe.io import atomic as atomic_module

from tests.fakes import WORDS, build_tokenizer, tiny_config

runner = CliRunner()


# --- references --------------------------------------------------------------------------------------------------


def flat(docs: list[list[int]]) -> list[int]:
    """The token array a datastore stores for ``docs``: each document followed by the separator."""
    return [t for d in docs if d for t in d + [SEPARATOR]]


def brute_positions(tokens: list[int], pattern: list[int]) -> list[int]:
    n = len(pattern)
    return [i for i in range(len(tokens) - n + 1) if tokens[i : i + n] == pattern]


def brute_continuation(tokens: list[int], end: int, depth: int) -> list[int]:
    out = []
    for t in tokens[end : end + depth]:
        if t == SEPARATOR:
            break
        out.append(t)
    return out


def brute_retrieve(tokens: list[int], context: list[int], max_suffix: int, min_suffix: int, depth: int):
    """``(n, positions, continuations)`` for the longest suffix with a non-empty continuation."""
    for n in range(min(max_suffix, len(context)), min_suffix - 1, -1):
        pos = brute_positions(tokens, context[len(context) - n :])
        conts = [c for p in pos if (c := brute_continuation(tokens, p + n, depth))]
        if conts:
            return n, pos, conts
    return 0, [], []


def random_docs(rng: random.Random, vocab: int, num_docs: int, length: int) -> list[list[int]]:
    return [[rng.randrange(vocab) for _ in range(rng.randint(1, length))] for _ in range(num_docs)]


# --- index correctness -----------------------------------------------------------------------------------------


def test_docstring_example(tmp_path):
    ds = build_datastore([[1, 2, 3, 1, 2, 4]], tmp_path / "ds", vocab_size=8)
    r = ds.retrieve([9, 1, 2], max_suffix=3, min_suffix=1)
    assert (r.suffix_len, r.occurrences, r.continuations) == (2, 2, [[3, 1, 2, 4], [4]])


@pytest.mark.parametrize("vocab, seed", [(2, 0), (3, 1), (5, 2), (64, 3)])
def test_suffix_array_is_the_sorted_suffixes(vocab, seed):
    rng = random.Random(seed)
    tokens = flat(random_docs(rng, vocab, 6, 40))
    sa = suffix_array(np.array(tokens, dtype=np.int32))
    assert sa.dtype == np.int32
    assert sa.tolist() == sorted(range(len(tokens)), key=lambda i: tokens[i:])


@pytest.mark.parametrize("vocab, seed", [(2, 0), (3, 1), (6, 2), (64, 3)])
def test_occurrences_match_brute_force(tmp_path, vocab, seed):
    rng = random.Random(seed)
    docs = random_docs(rng, vocab, 8, 60)
    tokens = flat(docs)
    ds = build_datastore(docs, tmp_path / "ds", vocab_size=vocab)
    assert ds.tokens.tolist() == tokens
    patterns = [[rng.randrange(vocab) for _ in range(rng.randint(1, 6))] for _ in range(60)]
    for _ in range(60):  # patterns that certainly occur, some running up to a document's end
        d = rng.choice(docs)
        i = rng.randrange(len(d))
        patterns.append(d[i : i + rng.randint(1, 6)])
    for pat in patterns:
        assert sorted(ds.occurrences(pat).tolist()) == brute_positions(tokens, pat), pat
        lo, hi = ds.find_range(pat)
        assert hi - lo == len(brute_positions(tokens, pat))


@pytest.mark.parametrize("vocab, seed", [(3, 0), (5, 1), (64, 2)])
def test_retrieve_matches_brute_force(tmp_path, vocab, seed):
    rng = random.Random(seed)
    docs = random_docs(rng, vocab, 10, 50)
    tokens = flat(docs)
    ds = build_datastore(docs, tmp_path / "ds", vocab_size=vocab)
    for _ in range(80):
        context = [rng.randrange(vocab) for _ in range(rng.randint(1, 10))]
        max_suffix, min_suffix, depth = rng.randint(1, 8), 1, rng.randint(1, 6)
        min_suffix = rng.randint(1, max_suffix)
        r = ds.retrieve(context, max_suffix=max_suffix, min_suffix=min_suffix, max_occurrences=10_000,
                        max_depth=depth)
        n, pos, conts = brute_retrieve(tokens, context, max_suffix, min_suffix, depth)
        assert r.suffix_len == n
        assert r.occurrences == len(pos)
        assert Counter(map(tuple, r.continuations)) == Counter(map(tuple, conts))  # all of them when uncapped
        assert all(1 <= len(c) <= depth for c in r.continuations)


def test_continuations_stop_at_the_end_of_a_document(tmp_path):
    ds = build_datastore([[1, 2, 3], [2, 4, 5, 6]], tmp_path / "ds", vocab_size=8)
    r = ds.retrieve([2], max_suffix=1, min_suffix=1, max_depth=8)
    assert sorted(r.continuations) == [[3], [4, 5, 6]]
    # a suffix found only at a document's end has no continuation: a shorter one is tried
    r = ds.retrieve([5, 6], max_suffix=2, min_suffix=1)
    assert r.suffix_len == 0 and r.continuations == []
    # a match never spans two documents
    assert ds.find_range([3, 2]) == (ds.find_range([3, 2])[0],) * 2


def test_capped_occurrences_are_spread_by_frequency(tmp_path):
    """The suffix [7] is followed by 1 three times out of four: a cap of 8 keeps that proportion."""
    docs = [[7, 1, 9]] * 30 + [[7, 2, 9]] * 10
    ds = build_datastore(docs, tmp_path / "ds", vocab_size=10)
    r = ds.retrieve([7], max_suffix=1, min_suffix=1, max_occurrences=8, max_depth=2)
    assert r.occurrences == 40 and len(r.continuations) == 8
    assert Counter(map(tuple, r.continuations)) == {(1, 9): 6, (2, 9): 2}
    assert ds.retrieve([7], max_suffix=1, max_occurrences=8) == r  # deterministic


def test_longest_suffix_wins(tmp_path):
    ds = build_datastore([[1, 2, 3, 10], [9, 2, 3, 11], [5, 3, 12]], tmp_path / "ds", vocab_size=16)
    assert ds.retrieve([1, 2, 3], max_suffix=3).continuations == [[10]]
    assert ds.retrieve([8, 2, 3], max_suffix=3).continuations == [[10], [11]]
    assert ds.retrieve([8, 8, 3], max_suffix=3, min_suffix=1).suffix_len == 1
    assert ds.retrieve([8, 8, 3], max_suffix=3, min_suffix=2).suffix_len == 0


# --- format -------------------------------------------------------------------------------------------------------


def test_folder_format(tmp_path):
    docs = [[1, 2, 3], [], [4, 5]]
    build_datastore(docs, tmp_path / "ds", vocab_size=8, model="m", sources=[{"path": "x"}], input_bytes=11)
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == [".specframe-output", "manifest.json", "suffixes.npy",
                                                               "tokens.npy"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no temporary folder left
    m = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert m["format"] == "specframe-datastore" and m["version"] == 1
    assert (m["num_tokens"], m["num_documents"], m["vocab_size"], m["max_token_id"]) == (5, 2, 8, 5)
    assert m["tokens"] == {"file": "tokens.npy", "dtype": "int32", "length": 7, "separator": -1}
    assert m["suffixes"]["dtype"] == "int32" and m["sources"] == [{"path": "x"}] and m["input_bytes"] == 11
    assert m["model"] == "m" and m["build_s"] >= 0 and m["built_at"]
    again = Datastore.open(tmp_path / "ds")
    assert again.tokens.dtype == np.int32 and again.tokens.tolist() == [1, 2, 3, -1, 4, 5, -1]
    assert again.suffixes.dtype == np.int32
    assert isinstance(again.tokens.base, np.memmap) and isinstance(again.suffixes.base, np.memmap)
    assert is_datastore(tmp_path / "ds") and not is_datastore(tmp_path)
    assert again.size_bytes() == sum(p.stat().st_size for p in (tmp_path / "ds").iterdir())


def test_bad_input_writes_nothing(tmp_path):
    with pytest.raises(DatastoreError, match="outside"):
        build_datastore([[1, 2], [3, 9]], tmp_path / "ds", vocab_size=8)
    with pytest.raises(DatastoreError, match="every document is empty"):
        build_datastore([[], []], tmp_path / "ds", vocab_size=8)
    assert list(tmp_path.iterdir()) == []


def test_replace_rules(tmp_path):
    out = tmp_path / "ds"
    build_datastore([[1, 2]], out, vocab_size=8)
    build_datastore([[3, 4, 5]], out, vocab_size=8)  # a datastore is replaced
    assert Datastore.open(out).num_tokens == 3
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(DatastoreError, match=r"not a datastore: choose another output, or replace it \(force=True\)"):
        build_datastore([[1]], other, vocab_size=8)
    assert (other / "notes.txt").read_text() == "mine"
    build_datastore([[1]], other, vocab_size=8, force=True)
    assert not (other / "notes.txt").exists() and Datastore.open(other).num_tokens == 1
    (tmp_path / "empty").mkdir()
    build_datastore([[1]], tmp_path / "empty", vocab_size=8)  # an empty folder is fine
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "empty", "other"]


def test_a_failed_write_leaves_the_old_datastore_and_no_temporary_files(tmp_path, monkeypatch):
    out = tmp_path / "ds"
    build_datastore([[1, 2, 3]], out, vocab_size=8)
    real_save, calls = np.save, []

    def failing_save(path, arr, **kw):
        calls.append(path)
        if len(calls) % 2 == 0:  # the suffix array, after the tokens were written
            raise OSError("disk full")
        real_save(path, arr, **kw)

    monkeypatch.setattr(store_module.np, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        build_datastore([[4, 5]], out, vocab_size=8)
    with pytest.raises(OSError, match="disk full"):
        build_datastore([[4, 5]], tmp_path / "new", vocab_size=8)
    monkeypatch.setattr(store_module.np, "save", real_save)
    monkeypatch.setattr(atomic_module.os, "replace", _failing_second_replace(atomic_module.os.replace))
    with pytest.raises(OSError, match="rename failed"):
        build_datastore([[6, 7]], out, vocab_size=8)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]
    assert Datastore.open(out).tokens.tolist() == [1, 2, 3, -1]


def _failing_second_replace(real):
    """os.replace that fails on its second call (the swap), after the old datastore was moved aside."""
    calls = []

    def replace(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise OSError("rename failed")
        return real(src, dst)

    return replace


def test_open_errors(tmp_path):
    with pytest.raises(DatastoreError, match="does not exist"):
        Datastore.open(tmp_path / "nope")
    with pytest.raises(DatastoreError, match="not a datastore"):
        Datastore.open(tmp_path)
    build_datastore([[1, 2, 3]], tmp_path / "ds", vocab_size=8)
    manifest = tmp_path / "ds" / "manifest.json"
    m = json.loads(manifest.read_text())
    manifest.write_text(json.dumps(dict(m, version=99)))
    with pytest.raises(DatastoreError, match="version 99.*rebuild"):
        Datastore.open(tmp_path / "ds")
    manifest.write_text(json.dumps(dict(m, tokens=dict(m["tokens"], length=5))))
    with pytest.raises(DatastoreError, match="damaged"):
        Datastore.open(tmp_path / "ds")
    manifest.write_text(json.dumps({k: v for k, v in m.items() if k != "num_tokens"}))
    with pytest.raises(DatastoreError, match="damaged \\(KeyError"):
        Datastore.open(tmp_path / "ds")
    manifest.write_text(json.dumps(m))
    (tmp_path / "ds" / "suffixes.npy").write_bytes(b"")
    with pytest.raises(DatastoreError, match="damaged"):
        Datastore.open(tmp_path / "ds")


# --- the default datastore -------------------------------------------------------------------------------------


def test_pydoc_preset():
    src = read_preset("pydoc")
    assert len(src.texts) > 50 and src.info["license"] == "PSF-2.0" and src.info["bytes"] > 100_000
    assert "pydoc_data.topics" in PRESETS["pydoc"].description
    with pytest.raises(DatastoreError, match="unknown preset 'nope': use one of pydoc"):
        read_preset("nope")


def test_default_datastore_is_built_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path))
    tok = build_tokenizer()
    ds = default_datastore(tok, model="tiny")
    assert ds.path.parent == tmp_path / "datastores" and ds.path.name.startswith("pydoc-")
    assert ds.tokenizer_fingerprint == fingerprint(tok) and ds.manifest["sources"][0]["preset"] == "pydoc"
    assert ds.num_tokens > 10_000  # the pydoc text in two-letter "words": mostly unknown tokens (id 0)
    stamp = (ds.path / "manifest.json").stat().st_mtime_ns
    monkeypatch.setattr(store_module, "suffix_array", lambda t: pytest.fail("rebuilt a cached datastore"))
    assert default_datastore(tok).path == ds.path
    assert (ds.path / "manifest.json").stat().st_mtime_ns == stamp


# --- the build command ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A model folder with only config.json and the word tokenizer (no weights: build reads the tokenizer)."""
    d = tmp_path_factory.mktemp("tiny-model")
    build_tokenizer().save_pretrained(d)
    tiny_config("llama").save_pretrained(d)
    return d


def build_cli(*args: str):
    return runner.invoke(cli.app, ["datastore", "build", *args])


def test_build_command(model_dir, tmp_path):
    (tmp_path / "a.txt").write_text(" ".join(WORDS[1:20]) + "\n" + " ".join(WORDS[5:9]))
    lines = [{"text": " ".join(WORDS[10:15]), "id": 1}, {"text": " ".join(WORDS[30:33])}]
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    (tmp_path / "c.jsonl").write_text(json.dumps({"body": "aa ab ac"}) + "\n")
    out = tmp_path / "ds"
    result = build_cli("--model", str(model_dir), "--input", str(tmp_path / "a.txt"), "--input",
                       str(tmp_path / "b.jsonl"), "--output", str(out))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {out}: 31 tokens in 3 documents") and "on disk" in result.stdout
    ds = Datastore.open(out)
    tok = build_tokenizer()
    assert ds.tokens.tolist() == (tok.encode(" ".join(WORDS[1:20] + WORDS[5:9])) + [-1]
                                  + list(range(10, 15)) + [-1] + [30, 31, 32, -1])
    m = ds.manifest
    assert m["model"] == model_dir.name and m["tokenizer"]["fingerprint"] == fingerprint(tok)
    assert [s["documents"] for s in m["sources"]] == [1, 2] and m["sources"][1]["field"] == "text"
    assert m["input_bytes"] == (tmp_path / "a.txt").stat().st_size + len(" ".join(WORDS[10:15])) + 8
    result = build_cli("--model", str(model_dir), "--input", str(tmp_path / "c.jsonl"), "--field", "body",
                       "--output", str(out))  # replaces the datastore
    assert result.exit_code == 0, result.output
    assert Datastore.open(out).tokens.tolist() == [1, 2, 3, -1]


def test_build_command_preset(model_dir, tmp_path):
    result = build_cli("--model", str(model_dir), "--preset", "pydoc", "--output", str(tmp_path / "ds"))
    assert result.exit_code == 0, result.output
    assert Datastore.open(tmp_path / "ds").manifest["sources"][0]["license"] == "PSF-2.0"


@pytest.mark.parametrize(
    "files, args, needle",
    [
        ({}, ["--input", "{d}/missing.txt"], "missing.txt does not exist"),
        ({}, [], "nothing to index"),
        ({"e.txt": " \n"}, ["--input", "{d}/e.txt"], "empty input"),
        ({"e.jsonl": "\n"}, ["--input", "{d}/e.jsonl"], "empty input"),
        ({"a.csv": "aa"}, ["--input", "{d}/a.csv"], "use .txt or .jsonl"),
        ({"b.jsonl": '{"text": "aa"}\n{"body": "ab"}\n'}, ["--input", "{d}/b.jsonl"],
         "b.jsonl:2: no field 'text' (it has: body); choose the field that holds the text"),
        ({"b.jsonl": '{"text": 3}\n'}, ["--input", "{d}/b.jsonl"], "b.jsonl:1: field 'text' is a int"),
        ({"b.jsonl": "[1]\n"}, ["--input", "{d}/b.jsonl"], "b.jsonl:1: expected a JSON object"),
        ({"b.jsonl": "{oops\n"}, ["--input", "{d}/b.jsonl"], "b.jsonl:1: not valid JSON"),
        ({"a.txt": "aa"}, ["--input", "{d}/a.txt", "--preset", "nope"], "unknown preset 'nope'"),
        ({"a.txt": "aa"}, ["--input", "{d}/a.txt", "--model", "nosuch"], "nosuch"),
    ],
)
def test_build_command_errors(model_dir, tmp_path, files, args, needle):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    before = sorted(p.name for p in tmp_path.iterdir())
    argv = [a.format(d=tmp_path) for a in args]
    if "--model" not in argv:
        argv += ["--model", str(model_dir)]
    result = build_cli(*argv, "--output", str(tmp_path / "out" / "ds"))
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.stdout == ""
    lines = result.stderr.strip("\n").splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_build_command_refuses_to_replace_what_is_not_a_datastore(model_dir, tmp_path):
    (tmp_path / "a.txt").write_text("aa ab")
    target = tmp_path / "mine"
    target.mkdir()
    (target / "keep.txt").write_text("keep")
    args = ["--model", str(model_dir), "--input", str(tmp_path / "a.txt"), "--output", str(target)]
    result = build_cli(*args)
    assert result.exit_code == 2 and "is a folder that is not a datastore" in result.stderr
    assert "--force" in result.stderr and (target / "keep.txt").read_text() == "keep"
    (tmp_path / "file").write_text("x")
    result = build_cli(*args[:-1], str(tmp_path / "file"))
    assert result.exit_code == 2 and "is a file" in result.stderr and (tmp_path / "file").read_text() == "x"
    result = build_cli(*args, "--force")
    assert result.exit_code == 0, result.output
    assert Datastore.open(target).tokens.tolist() == [1, 2, -1] and not (target / "keep.txt").exists()
