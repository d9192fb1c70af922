"""Grammar engines for constrained speculation (issue 54 1): xgrammar against llguidance on the default model's
tokenizer — compile time, mask time per token along a valid output, and what a speculative verifier needs beyond
plain constrained decoding: stepping along a k-token draft (a mask per node), rolling back the rejected tail, and
forking the grammar state for a tree branch.

    PYTHONPATH=<dir with xgrammar, apache-tvm-ffi, llguidance> python lab/scripts/grammar_engines.py [--out F.json]

Each figure is the median over the steps of a few JSON-schema outputs (the schemas and instances below, tokenized as
the model would write them). Run it alone: it times microseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

SCHEMAS = [
    ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                       "tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["name", "age", "tags"], "additionalProperties": False},
     {"name": "Ada Lovelace", "age": 36, "tags": ["mathematician", "writer", "analyst"]}),
    ({"type": "object", "properties": {"summary": {"type": "string"}, "points": {"type": "array", "items": {
        "type": "object", "properties": {"title": {"type": "string"}, "score": {"type": "number"}},
        "required": ["title", "score"], "additionalProperties": False}}},
      "required": ["summary", "points"], "additionalProperties": False},
     {"summary": "The report finds three causes of the delay.",
      "points": [{"title": "staffing", "score": 0.7}, {"title": "supply chain", "score": 0.2},
                 {"title": "weather", "score": 0.1}]}),
]
K = 4  # draft length stepped, rolled back and forked


def _us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 1)


def xgrammar_costs(tok, vocab: int, schema: dict, ids: list[int]) -> dict:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    t0 = time.perf_counter()
    compiled = xgr.GrammarCompiler(info, cache_enabled=False).compile_json_schema(json.dumps(schema))
    compile_s = time.perf_counter() - t0
    m = xgr.GrammarMatcher(compiled, max_rollback_tokens=K + 1)
    mask = xgr.allocate_token_bitmask(1, vocab)
    fill, step, rollback, fork = [], [], [], []
    for i, t in enumerate(ids):
        t0 = time.perf_counter()
        m.fill_next_token_bitmask(mask)
        fill.append(time.perf_counter() - t0)
        if i + K < len(ids) and i % 3 == 0:  # a K-token draft: accept, then roll back (a full rejection)
            t0 = time.perf_counter()
            for d in ids[i:i + K]:
                assert m.accept_token(d)
            step.append((time.perf_counter() - t0) / K)
            t0 = time.perf_counter()
            m.rollback(K)
            rollback.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            copy = m.fork() if hasattr(m, "fork") else None
            fork.append(time.perf_counter() - t0)
            del copy
        assert m.accept_token(t), (i, t)
    return {"compile_ms": round(compile_s * 1e3, 1), "mask_us": _us(fill), "mask_max_us": round(max(fill) * 1e6, 1),
            "accept_us": _us(step), "rollback_k_us": _us(rollback), "fork_us": _us(fork) if hasattr(m, "fork") else None,
            "terminates": bool(m.is_terminated() or m.accept_token(info.stop_token_ids[0]))}


def llguidance_costs(tok, vocab: int, schema: dict, ids: list[int]) -> dict:
    import llguidance
    import llguidance.hf
    from llguidance.torch import allocate_token_bitmask, fill_next_token_bitmask

    lt = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    t0 = time.perf_counter()
    m = llguidance.LLMatcher(lt, grammar)
    compile_s = time.perf_counter() - t0
    assert not m.is_error(), m.get_error()
    mask = allocate_token_bitmask(1, vocab)
    fill, step, rollback, fork = [], [], [], []
    for i, t in enumerate(ids):
        t0 = time.perf_counter()
        fill_next_token_bitmask(m, mask, 0)
        fill.append(time.perf_counter() - t0)
        if i + K < len(ids) and i % 3 == 0:
            t0 = time.perf_counter()
            for d in ids[i:i + K]:
                assert m.consume_token(d), m.get_error()
            step.append((time.perf_counter() - t0) / K)
            t0 = time.perf_counter()
            m.rollback(K)
            rollback.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            copy = m.deep_copy()
            fork.append(time.perf_counter() - t0)
            del copy
        assert m.consume_token(t), (i, t, m.get_error())
    return {"compile_ms": round(compile_s * 1e3, 1), "mask_us": _us(fill), "mask_max_us": round(max(fill) * 1e6, 1),
            "accept_us": _us(step), "rollback_k_us": _us(rollback), "fork_us": _us(fork),
            "terminates": bool(m.is_accepting())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    from transformers import AutoTokenizer

    from specframe.target.machine import fingerprint
    from specframe.target.models import resolve_model, tokenizer_directory

    tok = AutoTokenizer.from_pretrained(tokenizer_directory(resolve_model("smollm2-135m-instruct").gguf))
    vocab = len(tok)
    out = {"machine": {k: fingerprint().get(k) for k in ("cpu", "isa")}, "vocab": vocab, "draft_k": K, "schemas": []}
    for schema, instance in SCHEMAS:
        ids = tok.encode(json.dumps(instance), add_special_tokens=False)
        row = {"tokens": len(ids), "xgrammar": xgrammar_costs(tok, vocab, schema, ids),
               "llguidance": llguidance_costs(tok, vocab, schema, ids)}
        out["schemas"].append(row)
        print(json.dumps(row))
    if a.out:
        a.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
