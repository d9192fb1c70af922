"""Can OpenVINO's CPU plugin serve as an exact speculative-decoding target? Rows and KV rollback (docs/openvino.md).

The default model's GGUF is turned into an OpenVINO stateful model by OpenVINO GenAI's own GGUF reader
(``LLMPipeline(gguf, "CPU", enable_save_ov_model=True)`` writes ``openvino_model.xml`` beside the GGUF it is given;
that model keeps every position's logits: LLMPipeline slices to the last position only after it is built). This
script compiles that model with ``openvino`` itself and, for each plugin setting and context length c:
prefill c random tokens, decode the next 16 one at a time (the reference rows), cut the KV state back to c, then
decode them as one k-token forward for each k and compare every row with its reference, bit for bit; again after a
second cut (the block decoded twice, so the cut itself is checked). The KV state is cut the way OpenVINO GenAI's
stateful pipelines do it after rejected tokens (src/cpp/src/utils.cpp ``trim_kv_cache``): for every state,
``get_state()``, a region-of-interest tensor over the kept positions, copied into a fresh tensor, ``set_state()``.

    python lab/scripts/openvino_rows.py --output rows.json            # every setting in SETTINGS
    python lab/scripts/openvino_rows.py --settings default --contexts 100

Prints, per setting, a table (context x k: rows equal / rows, largest |logit difference|) and the greedy argmax
flips (rows whose argmax differs from the reference's, with the reference's top-2 logit gap), and whether each
k-token block's rows equal the first k rows of the widest block (do multi-row forwards agree among themselves?).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

# plugin settings tried: name -> compile properties (CPU plugin; INFERENCE_PRECISION_HINT f32 is the only
# precision this AVX2 CPU runs: bf16 / f16 need AVX-512 BF16 / AMX)
SETTINGS = {
    "default": {},
    "dynq-off": {"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0},
    "kv-f32": {"KV_CACHE_PRECISION": "f32"},
    "dynq-off+kv-f32": {"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0, "KV_CACHE_PRECISION": "f32"},
    "dynq-off+kv-f32+1-thread": {"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0, "KV_CACHE_PRECISION": "f32",
                                 "INFERENCE_NUM_THREADS": 1},
}


def export_model(gguf: Path, workdir: Path) -> Path:
    """``workdir/openvino_model.xml`` made from ``gguf`` by OpenVINO GenAI's GGUF reader (once; ~10 s)."""
    xml = workdir / "openvino_model.xml"
    if not xml.exists():
        import openvino_genai

        workdir.mkdir(parents=True, exist_ok=True)
        link = workdir / "model.gguf"
        if not link.exists():
            link.symlink_to(gguf.resolve())
        openvino_genai.LLMPipeline(str(link), "CPU", enable_save_ov_model=True)
    return xml


def default_workdir() -> Path:
    return Path(os.environ.get("SPECFRAME_CACHE", Path.home() / ".cache" / "specframe")) / "openvino" / "smollm2-q4_1"


class OVStateful:
    """One infer request of OpenVINO GenAI's stateful model from a GGUF: a forward over n new tokens returns n logits
    rows, and ``cut(length)`` keeps the first ``length`` positions of every KV state (GenAI's trim_kv_cache)."""

    def __init__(self, xml: Path, properties: dict, threads: int = 2) -> None:
        import openvino as ov

        self.ov = ov
        core = ov.Core()
        props = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY", **properties}
        self.compiled = core.compile_model(core.read_model(str(xml)), "CPU", props)
        self.request = self.compiled.create_infer_request()
        self.length = 0
        self.beam = np.zeros(1, np.int32)

    def effective(self) -> dict:
        keys = ("INFERENCE_PRECISION_HINT", "DYNAMIC_QUANTIZATION_GROUP_SIZE", "KEY_CACHE_PRECISION",
                "VALUE_CACHE_PRECISION", "INFERENCE_NUM_THREADS")
        return {k: str(self.compiled.get_property(k)) for k in keys}

    def forward(self, ids: list[int]) -> np.ndarray:
        """Logits (n, vocab) float32 of ``ids`` at the next n positions; the KV state grows by n."""
        n = len(ids)
        self.request.infer({
            "input_ids": np.array([ids], np.int64),
            "attention_mask": np.ones((1, self.length + n), np.int64),
            "position_ids": np.arange(self.length, self.length + n, dtype=np.int64)[None],
            "beam_idx": self.beam,
        })
        self.length += n
        return self.request.get_tensor("logits").data[0].copy()

    def cut(self, length: int) -> None:
        """Keep the first ``length`` positions of every KV state ([batch, kv_heads, seq, head_dim], seq axis 2)."""
        if length >= self.length:
            return
        ov = self.ov
        for state in self.request.query_state():
            old = state.state
            shape = list(old.shape)
            shape[2] = length
            roi = ov.Tensor(old, ov.Coordinate([0, 0, 0, 0]), ov.Coordinate(shape))
            new = ov.Tensor(old.element_type, ov.Shape(shape))
            roi.copy_to(new)
            state.state = new
        self.length = length

    def reset(self) -> None:
        self.request.reset_state()
        self.length = 0


def compare(rows: np.ndarray, ref: np.ndarray) -> tuple[int, float, list[dict]]:
    """(rows bit-identical, largest |difference|, argmax flips with the reference's top-2 gap)."""
    equal = sum(bool(np.array_equal(rows[i], ref[i])) for i in range(rows.shape[0]))
    flips = []
    for i in range(rows.shape[0]):
        if int(rows[i].argmax()) != int(ref[i].argmax()):
            top = np.sort(ref[i])[-2:]
            flips.append({"row": i, "ref_top2_gap": float(top[1] - top[0])})
    return equal, float(np.abs(rows - ref).max()), flips


def measure_setting(xml: Path, name: str, ks: list[int], contexts: list[int], vocab: int, seed: int = 0) -> dict:
    props = SETTINGS[name]
    m = OVStateful(xml, props, threads=props.get("INFERENCE_NUM_THREADS", 2))
    rng = random.Random(seed)
    table = []
    print(f"\n== {name}: {m.effective()}")
    print(f"{'context':>7} {'k':>3} {'batch':>9} {'after cut':>9} {'max |diff|':>11} {'=widest':>9} flips")
    for c in contexts:
        ids = [rng.randrange(vocab) for _ in range(c + max(ks))]
        m.reset()
        m.forward(ids[:c])
        ref = np.concatenate([m.forward([ids[c + i]]) for i in range(max(ks))])
        m.cut(c)
        wide = m.forward(ids[c:c + max(ks)])  # the widest block: do narrower multi-row blocks round as it does?
        m.cut(c)
        for k in ks:
            block = ids[c:c + k]
            first = m.forward(block)
            m.cut(c)
            again = m.forward(block)
            m.cut(c)
            eq1, d1, f1 = compare(first, ref[:k])
            eq2, d2, f2 = compare(again, ref[:k])
            eqw, dw, _ = compare(first, wide[:k])
            table.append({"context": c, "k": k, "rows": k, "batch_equal": eq1, "after_cut_equal": eq2,
                          "max_abs_diff": max(d1, d2), "argmax_flips": f1, "argmax_flips_after_cut": f2,
                          "equal_to_widest_block": eqw, "max_abs_diff_to_widest_block": dw})
            print(f"{c:>7} {k:>3} {eq1:>4}/{k:<4} {eq2:>4}/{k:<4} {max(d1, d2):>11.4g} {eqw:>4}/{k:<4} {f1 or ''}")
    return {"setting": name, "properties": props, "effective": m.effective(), "table": table}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or .gguf file")
    ap.add_argument("--workdir", type=Path, default=None, help="where the OpenVINO model is written (default: "
                    "$SPECFRAME_CACHE/openvino/smollm2-q4_1)")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated names from SETTINGS")
    ap.add_argument("--ks", default="1,2,4,8,16")
    ap.add_argument("--contexts", default="100,500,1500")
    ap.add_argument("--output", default=None, help="write the tables as JSON here")
    a = ap.parse_args()
    import openvino

    from specframe.target.machine import fingerprint
    from specframe.target.models import resolve_model

    xml = export_model(resolve_model(a.model).gguf, a.workdir or default_workdir())
    fp = fingerprint()
    print(f"openvino {openvino.__version__}\nmachine: {fp.get('cpu')} {fp.get('isa')}")
    ks = [int(x) for x in a.ks.split(",")]
    contexts = [int(x) for x in a.contexts.split(",")]
    t0 = time.time()
    out = {"openvino": openvino.__version__, "machine": {"cpu": fp.get("cpu"), "isa": fp.get("isa")},
           "model_xml": str(xml), "ks": ks, "contexts": contexts,
           "settings": [measure_setting(xml, s, ks, contexts, vocab=49152) for s in a.settings.split(",")]}
    out["wall_s"] = round(time.time() - t0, 1)
    if a.output:
        Path(a.output).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
