"""The wide forward on torch (issue 53, 1.): the default model's T(n), prefill and row invariance for torch paths.

    python lab/scripts/wide_forward_torch.py --out lab/results/wide-forward-torch-avx512bf16 \
        [--paths eager-bf16 compiled-bf16 eager-int8 compiled-int8] [--threads 2]

Paths (the default model, SmolLM2-135M-Instruct, loaded as specframe loads it, transformers):
- ``eager-bf16-dynamic-packed``: specframe's transformers path today: bfloat16, transformers' growing
  ``DynamicCache``, eager, weights prepacked where the machine profile measured it faster (``prepack: auto``);
- ``eager-bf16-dynamic``: the same without prepacking (what the issue's 49 ms was);
- ``eager-bf16``: bfloat16 weights, a static KV cache (transformers ``StaticCache``), eager;
- ``compiled-bf16``: the same forward under ``torch.compile`` (inductor, ``dynamic=False``: one graph per width
  n, as gpt-fast does with fixed width buckets);
- ``eager-int8`` / ``compiled-int8``: every linear layer (and the tied LM head) weight-only int8 (per output
  channel, symmetric, round to nearest), ``torch._weight_int8pack_mm`` on bfloat16 activations.

Per path: T(n) = median ms of one forward over n new tokens after ``--context`` cached ones (n = 1, 2, 4, 8, 16;
widths interleaved in each of ``--repeats`` rounds after two warm rounds),
prefill = one forward over 1 024 tokens, and rows = row j of a k-token forward (k = 2, 4, 8) bit-identical to the
one-token forward at that position, at contexts 100 / 500 / 1 500. Int8 paths also get quality against bf16:
top-1 agreement of the next-token argmax and perplexity, teacher-forced over 128-token bf16 continuations of
``--quality-prompts`` dev questions. Compile time is reported. Writes ``rows.json`` (one entry per path, appended,
so a rerun skips what is done) and ``README.md``. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

WIDTHS = (1, 2, 4, 8, 16)
CONTEXTS = (100, 500, 1500)
ROW_WIDTHS = (2, 4, 8)
MAX_CACHE = 1536


class Int8Linear(torch.nn.Module):
    """A linear layer with weight-only int8 weights: per output channel scale, bfloat16 activations."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        w = weight.detach().float()
        scale = w.abs().amax(1).clamp(min=1e-8) / 127.0
        self.register_buffer("w", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous())
        self.register_buffer("scale", scale.to(torch.bfloat16))
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().to(torch.bfloat16), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch._weight_int8pack_mm(x.reshape(-1, shape[-1]).to(torch.bfloat16), self.w, self.scale)
        y = y.reshape(*shape[:-1], -1)
        return y if self.bias is None else y + self.bias


def to_int8(model: torch.nn.Module) -> None:
    for _name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(mod, child_name, Int8Linear(child.weight, child.bias))


def load(path: str):
    import specframe

    # specframe's own path prepacks the weights where it measured that faster (``-packed``); the others take plain
    # nn.Linear weights (inductor's CPU lowering and the int8 swap need them)
    sf = specframe.load(dtype="bfloat16", threads=torch.get_num_threads(),
                        prepack="auto" if path.endswith("packed") else False)
    model = sf.target.model
    sf.close()
    if "int8" in path:
        model.lm_head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=False,
                                        dtype=torch.bfloat16)
        model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone(), False)
        to_int8(model)
    return model.eval()


class Runner:
    """One model with a static cache; ``forward(ids, start)`` writes positions start.. and returns float32 logits."""

    def __init__(self, model, compiled: bool, dynamic: bool = False) -> None:
        from transformers import DynamicCache, StaticCache

        self.model, self.dynamic = model, dynamic
        self.cache = DynamicCache(config=model.config) if dynamic else StaticCache(config=model.config,
                                                                                    max_cache_len=MAX_CACHE)
        self.fn = model.forward
        if compiled:
            torch._dynamo.config.cache_size_limit = 64
            self.fn = torch.compile(model.forward, dynamic=False)

    def _at(self, start: int) -> None:
        """The next forward writes from position ``start``."""
        if self.dynamic:  # (transformers 5 crops by the number of tokens to drop, given negative)
            extra = self.cache.get_seq_length() - start
            if extra > 0:
                self.cache.crop(-extra)
        else:  # the static cache writes at its running length
            for layer in self.cache.layers:
                layer.cumulative_length.fill_(start)

    @torch.inference_mode()
    def fill(self, ids: torch.Tensor) -> None:
        """Write a context into the cache from position 0 (eagerly: no graph compiled for its width)."""
        self._at(0)
        pos = torch.arange(ids.shape[1])
        self.model.forward(input_ids=ids, cache=self.cache, position_ids=pos[None], use_cache=True)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        n = ids.shape[1]
        self._at(start)
        pos = torch.arange(start, start + n)
        out = self.fn(input_ids=ids, cache=self.cache, position_ids=pos[None], use_cache=True)
        return out.logits.float()


def timing(r: Runner, tokens: torch.Tensor, context: int, repeats: int) -> dict:
    """T(n) per width, widths interleaved in every repeat (no width pays for coming first)."""
    r.fill(tokens[:, :context])
    compile_s, times = {}, {n: [] for n in WIDTHS}
    for n in WIDTHS:
        t0 = time.perf_counter()
        r.forward(tokens[:, context:context + n], context)  # first call: compiles this width on a compiled path
        compile_s[n] = time.perf_counter() - t0
    for _ in range(2):  # warm every width again
        for n in WIDTHS:
            r.forward(tokens[:, context:context + n], context)
    for _ in range(repeats):
        for n in WIDTHS:
            t0 = time.perf_counter()
            r.forward(tokens[:, context:context + n], context)
            times[n].append((time.perf_counter() - t0) * 1e3)
    return {"t_ms": {n: round(statistics.median(v), 2) for n, v in times.items()},
            "first_call_s": {n: round(s, 1) for n, s in compile_s.items()}}


def prefill(r: Runner, tokens: torch.Tensor, repeats: int) -> float:
    r.forward(tokens[:, :1024], 0)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        r.forward(tokens[:, :1024], 0)
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times), 3)


def rows_equal(r: Runner, tokens: torch.Tensor) -> tuple[int, int, float]:
    """(rows bit-identical, rows checked, largest |difference|)."""
    equal = total = 0
    worst = 0.0
    for context in CONTEXTS:
        r.fill(tokens[:, :context])
        ref = torch.cat([r.forward(tokens[:, context + j:context + j + 1], context + j) for j in range(max(ROW_WIDTHS))],
                        1)[0]
        for k in ROW_WIDTHS:
            rows = r.forward(tokens[:, context:context + k], context)[0]
            for j in range(k):
                same = torch.equal(rows[j], ref[j])
                equal += same
                total += 1
                worst = max(worst, float((rows[j] - ref[j]).abs().max()))
    return equal, total, worst


@torch.inference_mode()
def quality(model, reference, prompts: list[list[int]], new: int = 128) -> dict:
    """Top-1 agreement with bf16 and perplexity of bf16's greedy continuations, teacher-forced."""
    agree = total = 0
    nll = 0.0
    for ids in prompts:
        full = reference.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False)[0]
        want = reference(full[None]).logits[0, len(ids) - 1:-1].float()
        got = model(full[None]).logits[0, len(ids) - 1:-1].float()
        target = full[len(ids):]
        agree += int((got.argmax(-1) == want.argmax(-1)).sum())
        total += len(target)
        nll += float(F.cross_entropy(got, target, reduction="sum"))
    return {"top1_agreement": round(agree / total, 3), "perplexity": round(float(torch.exp(torch.tensor(nll / total))), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--paths", nargs="+", default=["eager-bf16-dynamic-packed", "eager-bf16-dynamic", "eager-bf16",
                                                   "compiled-bf16", "eager-int8", "compiled-int8"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--quality-prompts", type=int, default=8)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    a.out.mkdir(parents=True, exist_ok=True)
    rows_path = a.out / "rows.json"
    rows = json.loads(rows_path.read_text()) if rows_path.exists() else []
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(100, 40000, (1, MAX_CACHE), generator=g)
    for path in a.paths:
        if any(r["path"] == path for r in rows):
            continue
        print(f"{path}: loading", file=sys.stderr, flush=True)
        model = load(path)
        r = Runner(model, compiled=path.startswith("compiled"), dynamic="dynamic" in path)
        row = {"path": path, "threads": a.threads, "context": a.context}
        t0 = time.perf_counter()
        row |= timing(r, tokens, a.context, a.repeats)
        print(f"{path}: T(n) {row['t_ms']}", file=sys.stderr, flush=True)
        row["prefill_1024_s"] = prefill(r, tokens, 3)
        row["rows_equal"], row["rows"], row["largest_difference"] = rows_equal(r, tokens)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        if "int8" in path and a.quality_prompts:
            import specframe
            from specframe.io.prompts import read_prompts

            qs = read_prompts(Path(__file__).resolve().parents[3] / "shared" / "specbench" / "question.jsonl")
            sf = specframe.load(dtype="bfloat16", threads=a.threads)
            prompts = [sf.encode(q.text) for q in qs[:: max(1, len(qs) // a.quality_prompts)][: a.quality_prompts]]
            row["quality"] = quality(model, sf.target.model, prompts)
            row["quality"]["prompts"] = len(prompts)
            sf.close()
        print(f"{path}: {row}", file=sys.stderr, flush=True)
        rows.append(row)
        rows_path.write_text(json.dumps(rows, indent=1))
        del r, model
        torch._dynamo.reset()
    write_readme(a.out, rows)
    return 0


def write_readme(out: Path, rows: list[dict]) -> None:
    from specframe.target.machine import fingerprint

    m = fingerprint()
    lines = ["# The wide forward on torch (issue 53, 1.)", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, ISA {' '.join(m['isa'])}; torch {torch.__version__}. "
             "Default model (SmolLM2-135M-Instruct), transformers, static KV cache. T(n): median ms of one forward "
             "over n new tokens after the context below; rows: row j of a 2/4/8-token forward bit-identical to the "
             "one-token forward at that position, contexts 100 / 500 / 1 500. Command: "
             "`python lab/scripts/wide_forward_torch.py --out <this folder>`. Run alone.", "",
             "| path | threads | T(1) | T(2) | T(4) | T(8) | T(16) | T(8)/T(1) | prefill 1 024 | rows equal | "
             "largest row difference | top-1 / ppl vs bf16 | first call per width (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        t = {int(k): v for k, v in r["t_ms"].items()}
        q = r.get("quality")
        quality_cell = f"{q['top1_agreement']} / {q['perplexity']}" if q else "–"
        lines.append(f"| {r['path']} | {r['threads']} | " + " | ".join(f"{t[n]:.1f}" for n in WIDTHS)
                     + f" | {t[8] / t[1]:.2f} | {r['prefill_1024_s']:.2f} s | {r['rows_equal']}/{r['rows']} | "
                     f"{r['largest_difference']:.3g} | {quality_cell} | "
                     + ", ".join(f"{v}" for v in r["first_call_s"].values()) + " |")
    (out / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
