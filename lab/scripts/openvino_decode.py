"""Plain greedy decoding tok/s on 10 Spec-Bench prompts: OpenVINO GenAI's LLMPipeline (plain and its prompt lookup),
a one-token-per-forward loop over OpenVINO's stateful model (what a specframe OpenVINO target would run with no
proposer), and llama.cpp decoding alone (specframe's ``llamacpp-greedy`` bench peer), interleaved prompt by prompt
(docs/openvino.md).

Prompts: the first 2 questions of summarization, qa, rag, translation and math_reasoning in question.jsonl, first
turn, wrapped in the chat template by the GGUF's tokenizer (specframe's encoding, so every peer gets the same ids);
128 new tokens at most, stopping at EOS; token counts are the generated ids themselves. tok/s = new tokens / wall s
of the whole generation (prefill included), summed over prompts.

    python lab/scripts/openvino_decode.py --questions ../shared/specbench/question.jsonl --output decode.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openvino_rows import SETTINGS, OVStateful, default_workdir, export_model

CATEGORIES = ("summarization", "qa", "rag", "translation", "math_reasoning")


def prompts(path: Path, per_category: int) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = []
    for cat in CATEGORIES:
        out += [r for r in rows if r["category"] == cat][:per_category]
    return out


def ov_loop(m: OVStateful, ids: list[int], max_new: int, eos: set[int]) -> tuple[list[int], list[float]]:
    """Greedy decoding, one token per forward; returns the tokens and each step's top-2 logit gap."""
    m.reset()
    logits = m.forward(ids)[-1]
    out, gaps = [], []
    while True:
        top = np.partition(logits, -2)[-2:]
        gaps.append(float(abs(top[1] - top[0])))
        tok = int(logits.argmax())
        out.append(tok)
        if tok in eos or len(out) >= max_new:
            return out, gaps
        logits = m.forward([tok])[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=Path, default=Path("../shared/specbench/question.jsonl"))
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--output", default=None)
    a = ap.parse_args()
    import openvino
    import openvino_genai as ovg
    from transformers import AutoTokenizer

    from specframe.target.hf import TextSide
    from specframe.target.llamacpp.peers import run_llamacpp_peer
    from specframe.target.machine import fingerprint
    from specframe.target.models import resolve_model, tokenizer_directory

    source = resolve_model("smollm2-135m-instruct")
    text = TextSide()
    text.tokenizer = AutoTokenizer.from_pretrained(tokenizer_directory(source.gguf, lambda s: None))
    eos = {int(text.tokenizer.eos_token_id)}
    xml = export_model(source.gguf, default_workdir())
    t0 = time.perf_counter()
    plain = ovg.LLMPipeline(str(source.gguf), "CPU")
    load_s = time.perf_counter() - t0
    lookup = ovg.LLMPipeline(str(source.gguf), "CPU", prompt_lookup=True)
    loops = {s: OVStateful(xml, SETTINGS[s], a.threads) for s in ("default", "dynq-off+kv-f32")}
    llama = SimpleNamespace(gguf=source.gguf, n_ctx=4096, threads=a.threads, eos_token_ids=sorted(eos))

    def genai(pipe, ids, assistant: bool):
        cfg = ovg.GenerationConfig()
        cfg.max_new_tokens, cfg.do_sample = a.max_new_tokens, False
        cfg.eos_token_id = next(iter(eos))
        if assistant:
            cfg.num_assistant_tokens, cfg.max_ngram_size = 5, 3
        arr = np.array([ids], np.int64)
        res = pipe.generate(ovg.TokenizedInputs(openvino.Tensor(arr), openvino.Tensor(np.ones_like(arr))), cfg)
        return [int(t) for t in res.tokens[0]]

    peers = {
        "ovgenai-greedy": lambda ids: (genai(plain, ids, False), None),
        "ovgenai-prompt-lookup": lambda ids: (genai(lookup, ids, True), None),
        "llamacpp-greedy": lambda ids: (run_llamacpp_peer(llama, "llamacpp-greedy", {}, ids,
                                        max_new_tokens=a.max_new_tokens, temperature=0.0, top_p=1.0, top_k=0,
                                        seed=0)["token_ids"], None),
        **{f"ov-loop:{s}": (lambda ids, m=m: ov_loop(m, ids, a.max_new_tokens, eos)) for s, m in loops.items()},
    }
    warm = text.encode_prompt("Say hello.")
    for fn in peers.values():  # warm-up
        fn(warm)
    qs = prompts(a.questions, a.per_category)
    records = []
    for q in qs:
        ids = text.encode_prompt(q["turns"][0])
        rec = {"question_id": q["question_id"], "category": q["category"], "prompt_tokens": len(ids), "peers": {}}
        for name, fn in peers.items():
            time.sleep(0.05)
            t0 = time.perf_counter()
            toks, gaps = fn(ids)
            wall = time.perf_counter() - t0
            rec["peers"][name] = {"token_ids": toks, "new_tokens": len(toks), "wall_s": round(wall, 3)}
            if gaps is not None:
                rec["peers"][name]["gaps"] = [round(g, 6) for g in gaps]
        print(q["question_id"], q["category"], len(ids), {n: (p["new_tokens"], p["wall_s"]) for n, p in
                                                          rec["peers"].items()}, flush=True)
        records.append(rec)
    summary = {}
    for name in peers:
        toks = sum(r["peers"][name]["new_tokens"] for r in records)
        wall = sum(r["peers"][name]["wall_s"] for r in records)
        same = {ref: sum(r["peers"][name]["token_ids"] == r["peers"][ref]["token_ids"] for r in records)
                for ref in ("llamacpp-greedy", "ovgenai-greedy")}
        summary[name] = {"new_tokens": toks, "wall_s": round(wall, 2), "tokens_per_s": round(toks / wall, 2),
                         "identical_to": same}
    # where an OpenVINO loop differs from GenAI's plain decoding: the loop's top-2 gap at the first differing token
    for s in loops:
        div = []
        for r in records:
            mine, ref = r["peers"][f"ov-loop:{s}"]["token_ids"], r["peers"]["ovgenai-greedy"]["token_ids"]
            if mine != ref:
                i = next((j for j, (x, y) in enumerate(zip(mine, ref)) if x != y), min(len(mine), len(ref)))
                gaps = r["peers"][f"ov-loop:{s}"]["gaps"]
                div.append({"question_id": r["question_id"], "first_diff": i,
                            "loop_top2_gap": gaps[i] if i < len(gaps) else None})
        summary[f"ov-loop:{s}"]["divergences_from_ovgenai_greedy"] = div
    for name, s in summary.items():
        print(f"{name:>26}: {s}")
    fp = fingerprint()
    out = {"openvino": openvino.__version__, "openvino_genai": ovg.get_version(), "llmpipeline_load_s":
           round(load_s, 2), "machine": {"cpu": fp.get("cpu"), "isa": fp.get("isa")}, "threads": a.threads,
           "max_new_tokens": a.max_new_tokens, "summary": summary, "records": records}
    if a.output:
        Path(a.output).write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
