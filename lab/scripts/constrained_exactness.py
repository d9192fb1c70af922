"""Structured output is exact under speculation (issue 54 a): greedy output of each strategy under each question's
JSON schema, token for token against constrained decoding without speculation by a reference outside specframe —
transformers' own ``generate`` with a logits processor that masks by llguidance directly (one ``LLMatcher`` fed the
tokens as they come) — on the default model in float32; and every finished answer parses and validates.

    python lab/scripts/constrained_exactness.py --questions lab/data/specbench-json/question.jsonl \
        --out lab/results/constrained-exactness-fp32 [--tokens 128] [--strategies none ngram ...]

``grammar`` is the grammar proposer with ``branch: 0`` (the forced run only), ``grammar-branch`` with ``branch: 4``
(its default: a token tree where the grammar allows a few words).

Resumable: ``rows.jsonl`` keeps one row per (question, strategy) finished; a rerun skips them. ``README.md`` is
written at the end from every row.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jsonschema
import torch
from transformers import LogitsProcessor, LogitsProcessorList

import specframe
from specframe.contracts.constraint import ConstraintSpec
from specframe.io.prompts import read_prompts

FORCED = {"name": "grammar", "branch": 0}  # the grammar proposer drafting the forced run only
BRANCH = {"name": "grammar", "branch": 4}  # ... and branching where a few words are allowed (its default)
STRATEGIES = {"none": ["none"], "ngram": ["ngram"], "grammar": [FORCED], "grammar+ngram": [FORCED, "ngram"],
              "ngram+medusa": ["ngram", "medusa"], "grammar-branch": [BRANCH], "grammar-branch+ngram": [BRANCH, "ngram"]}


class LLGuidanceMask(LogitsProcessor):
    """Constrained decoding one token at a time: llguidance's matcher and bitmask, nothing of specframe's."""

    def __init__(self, llg_tokenizer, grammar: str, prompt_len: int, vocab: int) -> None:
        import llguidance

        self.matcher = llguidance.LLMatcher(llg_tokenizer, grammar, log_level=0)
        self.prompt_len, self.vocab = prompt_len, vocab

    def __call__(self, input_ids, scores):
        generated = input_ids[0, self.prompt_len:].tolist()
        if generated and not self.matcher.consume_token(generated[-1]):
            raise RuntimeError(f"reference: token {generated[-1]} refused by the grammar")
        words = torch.zeros((1, (self.vocab + 31) // 32), dtype=torch.int32)
        self.matcher.unsafe_compute_mask_ptr(words[0].data_ptr(), words.shape[1] * 4)
        bits = ((words.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).reshape(1, -1)[:, :self.vocab]
        return scores.masked_fill(bits == 0, float("-inf"))


def reference(sf, spec: ConstraintSpec, ids: list[int], tokens: int) -> list[int]:
    engine = sf._constraint_engine
    model = sf.target.model
    proc = LLGuidanceMask(engine.tokenizer, engine.grammar(spec), len(ids), int(sf.target.vocab_size))
    eos = sorted(sf.target.eos_token_ids)
    out = model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False, eos_token_id=eos,
                         pad_token_id=eos[0], logits_processor=LogitsProcessorList([proc]))
    return out[0, len(ids):].tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "rows.jsonl"
    done = {(r["question_id"], r["strategy"]) for r in map(json.loads, rows_path.read_text().splitlines())} \
        if rows_path.exists() else set()
    sf = specframe.load(dtype="float32", threads=2, max_new_tokens=a.tokens)
    questions = read_prompts(a.questions)
    for n, q in enumerate(questions):
        if all((q.question_id, s) in done for s in ["reference", *a.strategies]):
            continue
        spec = ConstraintSpec.model_validate(q.constraint)
        sf.constraint(spec)  # (makes the engine the reference reads the tokenizer and grammar from)
        ids = sf.encode(q.text)
        t0 = time.perf_counter()
        want = reference(sf, spec, ids, a.tokens)
        ref_s = time.perf_counter() - t0
        rows = []
        for name in a.strategies:
            if (q.question_id, name) in done:
                continue
            proposers = [p if isinstance(p, dict) else {"name": p} for p in STRATEGIES[name]]
            res = sf.generate_result(ids, proposers=proposers, constraint=spec, max_new_tokens=a.tokens,
                                     **({"merge": "priority"} if len(proposers) > 1 else {}))
            text = sf.target.decode([t for t in res.token_ids if t not in sf.target.eos_token_ids])
            valid = None
            if res.finish_reason == "stop":
                try:
                    jsonschema.validate(json.loads(text), spec.json_schema)
                    valid = True
                except (json.JSONDecodeError, jsonschema.ValidationError):
                    valid = False
            m = res.metrics
            rows.append({"question_id": q.question_id, "category": q.category, "strategy": name,
                         "identical": res.token_ids == want, "tokens": len(res.token_ids),
                         "finish_reason": res.finish_reason, "valid": valid, "tau": round(m.tau, 3),
                         "first_difference": next((i for i, (x, y) in enumerate(zip(res.token_ids, want)) if x != y),
                                                  None if res.token_ids == want else min(len(want), len(res.token_ids))),
                         "text": text})
        if (q.question_id, "reference") not in done:
            rows.append({"question_id": q.question_id, "category": q.category, "strategy": "reference",
                         "tokens": len(want), "seconds": round(ref_s, 2)})
        with rows_path.open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        print(f"[{n + 1}/{len(questions)}] q{q.question_id} {q.category}: " + ", ".join(
            f"{r['strategy']} {'=' if r.get('identical') else '!='} valid={r.get('valid')} tau={r.get('tau')}"
            for r in rows if r["strategy"] != "reference"), file=sys.stderr, flush=True)
    write_readme(out, a)


def write_readme(out: Path, a: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    runs = [r for r in rows if r["strategy"] != "reference"]
    names = [s for s in STRATEGIES if any(r["strategy"] == s for r in runs)]
    lines = ["# Structured output is exact under speculation (issue 54 a)", "",
             f"`python lab/scripts/constrained_exactness.py --questions {a.questions} --out {a.out} --tokens "
             f"{a.tokens}`: the default model (SmolLM2-135M-Instruct) in float32 on transformers, greedy, each question's "
             "JSON schema (lab/scripts/constrained_questions.py), against transformers `generate` with a logits "
             "processor masking by llguidance directly. No timing.", "",
             "| strategy | questions | token-identical | finished | finished and valid | mean τ |",
             "|---|---:|---:|---:|---:|---:|"]
    for s in names:
        rs = [r for r in runs if r["strategy"] == s]
        fin = [r for r in rs if r["finish_reason"] == "stop"]
        lines.append(f"| {s} | {len(rs)} | {sum(r['identical'] for r in rs)} | {len(fin)} | "
                     f"{sum(bool(r['valid']) for r in fin)} | {sum(r['tau'] for r in rs) / len(rs):.2f} |")
    bad = [r for r in runs if not r["identical"]]
    lines += ["", f"Not identical: {len(bad)}" + ("" if not bad else ": " + ", ".join(
        f"q{r['question_id']} {r['strategy']} at token {r['first_difference']}" for r in bad)), ""]
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    main()
