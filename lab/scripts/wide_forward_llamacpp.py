"""The wide forward on llama.cpp, one build and one GGUF at a time (issue 53 1): T(n), a 1 024-token prefill, and row
invariance with the one-token step padded to ``--pad`` rows.

    PYTHONPATH=/path/to/build/site python lab/scripts/wide_forward_llamacpp.py --gguf F.gguf [--pad 2] [--flash]
        [--out result.json]

- ``T(n)``: median ms of one ``llama_decode`` over n new tokens after a 500-token context (rolled back after each),
  n = 1, 2, 4, 8, 16; with ``--pad P`` the one-token step decodes P rows (the token, then P-1 copies at the next
  positions, removed afterwards), as an engine that pads it would, and ``T(1)`` is that padded step.
- prefill: seconds for 1 024 random tokens in chunks of 512.
- rows: for contexts 100 / 500 / 1 500, the reference is 16 padded one-token steps; then each k-token batch
  (k = 2, 4, 8, 16; k < P is padded too) must give the same logits bit for bit, row by row.

Whichever llama-cpp-python comes first on the path is measured (``build`` in the output says what it was built with).
Run it alone: another process on the machine changes the times more than the builds do.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--pad", type=int, default=1, help="rows of the one-token step (1: no padding)")
    ap.add_argument("--flash", action="store_true", help="llama.cpp's fused (flash) attention")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--contexts", default="100,500,1500")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from specframe.target.llamacpp.binding import LlamaContext, LlamaModel, build_info
    from specframe.target.machine import fingerprint

    model = LlamaModel(Path(a.gguf))
    ctx = LlamaContext(model, 2048, 512, a.threads, flash_attention=a.flash)
    rng = random.Random(0)
    vocab = model.n_vocab

    def step(tokens: list[int], start: int) -> torch.Tensor:
        """Rows for ``tokens`` at ``start``..; padded to ``a.pad`` rows (padding removed from the cache)."""
        k = len(tokens)
        rows = tokens + [tokens[-1]] * max(0, a.pad - k)
        out = ctx.decode(rows, list(range(start, start + len(rows))))
        if len(rows) > k:
            ctx.remove(0, start + k)
        return out[:k]

    def prefill(ids: list[int]) -> None:
        ctx.clear()
        for i in range(0, len(ids), 512):
            chunk = ids[i:i + 512]
            ctx.decode(chunk, list(range(i, i + len(chunk))), logits="last")

    # T(n) after 500 tokens
    ids = [rng.randrange(vocab) for _ in range(520)]
    prefill(ids[:500])
    t_ms = {}
    for n in (1, 2, 4, 8, 16):
        times = []
        for r in range(a.repeats + 1):
            t0 = time.perf_counter()
            step(ids[500:500 + n], 500)
            if r:
                times.append((time.perf_counter() - t0) * 1e3)
            ctx.remove(0, 500)
        t_ms[n] = round(statistics.median(times), 2)
    # prefill of 1 024 tokens
    long = [rng.randrange(vocab) for _ in range(1024)]
    pre = []
    for _ in range(3):
        t0 = time.perf_counter()
        prefill(long)
        pre.append(time.perf_counter() - t0)
    prefill_s = round(min(pre), 3)
    # rows
    rows = []
    for c in (int(x) for x in a.contexts.split(",")):
        ids = [rng.randrange(vocab) for _ in range(c + 16)]
        prefill(ids[:c])
        ref = torch.cat([step([ids[c + i]], c + i) for i in range(16)])
        ctx.remove(0, c)
        for k in (2, 4, 8, 16):
            got = step(ids[c:c + k], c)
            ctx.remove(0, c)
            equal = sum(bool(torch.equal(got[i], ref[i])) for i in range(k))
            rows.append({"context": c, "k": k, "equal": equal, "max_abs_diff": float((got - ref[:k]).abs().max())})
    out = {"gguf": Path(a.gguf).name, "pad": a.pad, "flash": a.flash, "threads": a.threads,
           "build": build_info().to_dict(), "isa": fingerprint().get("isa"), "t_ms": t_ms,
           "t8_over_t1": round(t_ms[8] / t_ms[1], 2), "prefill_1024_s": prefill_s,
           "rows_equal": sum(r["equal"] for r in rows), "rows": sum(r["k"] for r in rows), "row_detail": rows}
    print(json.dumps({k: v for k, v in out.items() if k != "row_detail"}))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
