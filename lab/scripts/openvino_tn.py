"""T(n): ms of one forward over n new tokens with a logits row each, after c cached tokens, for OpenVINO's CPU plugin
(several settings), specframe's llama.cpp build and transformers bf16 -- interleaved in one run so that the engines
share the machine's state, at 2 threads each (docs/openvino.md).

For each context c: every engine prefills the same c random tokens; then, for ``--rounds`` rounds (plus one warm-up),
each engine in turn times one forward over n tokens for each n and cuts its KV cache back to c (OpenVINO: GenAI's
trim_kv_cache method, lab/scripts/openvino_rows.py; llama.cpp: ``llama_memory_seq_rm``; transformers: specframe's
``rollback``). Reports the median forward ms right after a cut (the speculative step's case), the median ms of
the cut itself, and the median ms of forwards made one after another with no cut before them (plain decoding's
case; the context grows by n with each, at most 32 tokens past c). Engines sleep 50 ms between
turns (OpenVINO's TBB and llama.cpp's workers spin for a while after their work).

    python lab/scripts/openvino_tn.py --output tn.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openvino_rows import SETTINGS, OVStateful, default_workdir, export_model

OV_SETTINGS = ("default", "kv-f32", "dynq-off+kv-f32")


class LlamaEngine:
    def __init__(self, gguf: Path, threads: int) -> None:
        from specframe.target.llamacpp.binding import LlamaContext, LlamaModel

        self.model = LlamaModel(gguf)
        self.ctx = LlamaContext(self.model, 2048, 512, threads)
        self.length = 0

    def prefill(self, ids: list[int]) -> None:
        self.ctx.clear()
        for i in range(0, len(ids), 512):
            chunk = ids[i:i + 512]
            self.ctx.decode(chunk, list(range(i, i + len(chunk))), logits="last")
        self.length = len(ids)

    def forward(self, ids: list[int]) -> None:
        self.ctx.decode(ids, list(range(self.length, self.length + len(ids))))
        self.length += len(ids)

    def cut(self, length: int) -> None:
        self.ctx.remove(0, length)
        self.length = length


class OVEngine:
    def __init__(self, xml: Path, setting: str, threads: int) -> None:
        self.m = OVStateful(xml, SETTINGS[setting], threads)

    def prefill(self, ids: list[int]) -> None:
        self.m.reset()
        self.m.forward(ids)

    def forward(self, ids: list[int]) -> None:
        self.m.forward(ids)

    def cut(self, length: int) -> None:
        self.m.cut(length)


class TorchEngine:
    def __init__(self, gguf_source, threads: int) -> None:
        import torch

        from specframe.target.models import load_model, model_directory

        torch.set_num_threads(threads)
        self.torch = torch
        self.model, _ = load_model(model_directory(gguf_source), torch.bfloat16, "cpu", tokenizer=False)

    def prefill(self, ids: list[int]) -> None:
        from specframe.target.kv_cache import new_cache

        self.cache = new_cache(self.model.config)
        with self.torch.inference_mode():
            self.model(input_ids=self.torch.tensor([ids]), cache=self.cache, use_cache=True, logits_to_keep=1)
        self.length = len(ids)

    def forward(self, ids: list[int]) -> None:
        with self.torch.inference_mode():
            self.model(input_ids=self.torch.tensor([ids]), cache=self.cache, use_cache=True)

    def cut(self, length: int) -> None:
        from specframe.target.kv_cache import rollback

        rollback(self.cache, length)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="1,2,4,8,16")
    ap.add_argument("--contexts", default="100,500,1500")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per point (median), after one warm-up")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engines", default="llama.cpp," + ",".join(f"openvino:{s}" for s in OV_SETTINGS)
                    + ",transformers-bf16")
    ap.add_argument("--output", default=None)
    a = ap.parse_args()
    import openvino

    from specframe.target.llamacpp.binding import build_info
    from specframe.target.machine import fingerprint
    from specframe.target.models import resolve_model

    source = resolve_model("smollm2-135m-instruct")
    xml = export_model(source.gguf, default_workdir())
    engines = {}
    for name in a.engines.split(","):
        if name == "llama.cpp":
            engines[name] = LlamaEngine(source.gguf, a.threads)
        elif name.startswith("openvino:"):
            engines[name] = OVEngine(xml, name.split(":", 1)[1], a.threads)
        elif name == "transformers-bf16":
            engines[name] = TorchEngine(source, a.threads)
    ns = [int(x) for x in a.ns.split(",")]
    rng = random.Random(0)
    t_ms = {e: {} for e in engines}
    cut_ms = {e: {} for e in engines}
    steady_ms = {e: {} for e in engines}
    t_start = time.time()
    for c in [int(x) for x in a.contexts.split(",")]:
        ids = [rng.randrange(49152) for _ in range(c + max(ns))]
        for e in engines.values():
            e.prefill(ids[:c])
        fw = {e: {n: [] for n in ns} for e in engines}
        ct = {e: {n: [] for n in ns} for e in engines}
        st = {e: {n: [] for n in ns} for e in engines}
        for r in range(a.rounds + 1):
            for name, e in engines.items():
                time.sleep(0.05)
                for n in ns:
                    t0 = time.perf_counter()
                    e.forward(ids[c:c + n])
                    t1 = time.perf_counter()
                    e.cut(c)
                    t2 = time.perf_counter()
                    if r:
                        fw[name][n].append((t1 - t0) * 1e3)
                        ct[name][n].append((t2 - t1) * 1e3)
                # steady: forwards one after another with no cut before them (the context grows by n each)
                e.forward(ids[c:c + 1])  # (untimed: the first forward after a cut absorbs the new state)
                for n in ns:
                    t0 = time.perf_counter()
                    e.forward(ids[c:c + n])
                    if r:
                        st[name][n].append((time.perf_counter() - t0) * 1e3)
                e.cut(c)
        for name in engines:
            t_ms[name][c] = [round(float(np.median(fw[name][n])), 2) for n in ns]
            cut_ms[name][c] = [round(float(np.median(ct[name][n])), 3) for n in ns]
            steady_ms[name][c] = [round(float(np.median(st[name][n])), 2) for n in ns]
            print(f"context {c:>5} {name:>28}: T(n) after a cut {t_ms[name][c]}  cut {cut_ms[name][c]}  "
                  f"T(n) with no cut before {steady_ms[name][c]}", flush=True)
    fp = fingerprint()
    out = {"openvino": openvino.__version__, "llama_cpp_build": build_info().to_dict(),
           "machine": {"cpu": fp.get("cpu"), "isa": fp.get("isa")}, "threads": a.threads, "ns": ns,
           "rounds": a.rounds, "t_ms_after_cut": t_ms, "cut_ms": cut_ms, "t_ms_no_cut_before": steady_ms, "wall_s": round(time.time() - t_start, 1),
           "ov_settings": {s: SETTINGS[s] for s in OV_SETTINGS}}
    if a.output:
        Path(a.output).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
