#!/usr/bin/env python3
"""A GPU smoke run of the engine: every strategy's exactness, host syncs, synced vs unsynced forward times, the step
split, batching, reduced-precision divergences and structured output, on random models of the default target's shape.

Nothing is downloaded: the target is a seeded random Llama shaped as SmolLM2-135M-Instruct (hidden 576, 30 layers, 9
heads, 3 KV heads, intermediate 1536, vocabulary 49152, tied embeddings), the prompts are token ids (no tokenizer but
the grammar stage's small byte-level BPE, trained here from a few strings). Each stage prints one line as it finishes
and appends one JSON record to ``OUT/smoke.jsonl``; a stage that fails records its error and the next one runs.
``OUT/smoke.md`` sums the run up at the end. docs/gpu.md says how to run it on a lent GPU and what the lines mean::

    .venv/bin/python scripts/gpu_smoke.py --device cpu --quick --out /tmp/smoke-cpu    # a few minutes on 2 cores
    python3 scripts/gpu_smoke.py --device cuda --out "$OUT"                            # under 5 minutes on an H100

``--quick``: 2 layers instead of 30, fewer new tokens and repeats (the output says so on its first line).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("specframe") is None:  # not installed nor on PYTHONPATH: the checkout beside this script
    sys.path.insert(1, str(ROOT))

import torch  # noqa: E402

# the default target's shape (SmolLM2-135M-Instruct's config.json)
SMOLLM2 = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
               intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192,
               rms_norm_eps=1e-5, rope_theta=100000.0, hidden_act="silu", initializer_range=0.02)
TARGET_NAME = "gpu-smoke-random-smollm2-shape"
SEED = 0

# prompts with repeated n-grams (ids < 49152), so that ngram and lookahead draft from the first steps
PROMPTS = [
    [101, 2045, 318, 257, 3290, 101, 2045, 318, 1180, 42, 101, 2045, 318, 257],
    [7, 8, 9, 10, 11, 7, 8, 9, 10, 12, 7, 8, 9, 10, 11, 7, 8, 9],
    [30000, 17, 4444, 30000, 17, 4444, 5, 6, 30000, 17],
]
STRATEGIES = ("none", "ngram", "lookahead", "medusa", "eagle", "draft-model", "ngram+medusa")
T_SIZES = (1, 2, 4, 8, 16, 32, 64)


# --- the run's settings and records --------------------------------------------------------------------------------


class StageFailed(Exception):
    """A stage's check failed; ``data`` is still recorded (the rows that show what differed)."""

    def __init__(self, summary: str, data: dict) -> None:
        super().__init__(summary)
        self.data = data


class Smoke:
    """Stages run one by one; each one's record goes to smoke.jsonl and a line to stdout as it finishes."""

    def __init__(self, out: Path, device: torch.device, quick: bool) -> None:
        self.out, self.device, self.quick = out, device, quick
        out.mkdir(parents=True, exist_ok=True)
        self.jsonl = out / "smoke.jsonl"
        self.jsonl.write_text("")
        self.records: list[dict] = []
        self.layers = 2 if quick else SMOLLM2["num_hidden_layers"]
        self.new_tokens = 20 if quick else 96
        self.prompts = PROMPTS[:2] if quick else PROMPTS
        self.reps = 3 if quick else 10
        self.work = Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
        self.shared: dict[str, Any] = {}  # what later stages reuse (target, references, results)

    def stage(self, name: str, fn: Callable[[], tuple[str, dict]]) -> None:
        t0 = time.perf_counter()
        try:
            summary, data = fn()
            status = "skipped" if summary.startswith("skipped") else "ok"
        except StageFailed as exc:
            status, data, summary = "FAIL", exc.data, str(exc)
        except Exception as exc:  # noqa: BLE001 - one stage's failure is recorded, the next stage runs
            status, data = "FAIL", {"traceback": traceback.format_exc(limit=6)}
            summary = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        seconds = time.perf_counter() - t0
        rec = {"stage": name, "status": status, "summary": summary, "seconds": round(seconds, 2), **data}
        self.records.append(rec)
        with self.jsonl.open("a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
        print(f"[{name}] {status} ({seconds:.1f} s): {summary}", flush=True)

    def write_md(self) -> None:
        lines = ["# GPU smoke", "", f"device `{self.device}`, {'--quick: ' if self.quick else ''}{self.layers} layers, "
                 f"{self.new_tokens} new tokens, {len(self.prompts)} prompts", "",
                 "| stage | status | s | summary |", "|---|---|---|---|"]
        for r in self.records:
            lines.append(f"| {r['stage']} | {r['status']} | {r['seconds']} | {r['summary'].replace('|', '/')} |")
        for r in self.records:
            extra = {k: v for k, v in r.items() if k not in ("stage", "status", "summary", "seconds", "traceback")}
            if extra or r.get("traceback"):
                lines += ["", f"## {r['stage']}", "", "```"]
                lines += [json.dumps(extra, indent=1, default=str)] if extra else []
                lines += [r["traceback"]] if r.get("traceback") else []
                lines += ["```"]
        (self.out / "smoke.md").write_text("\n".join(lines) + "\n")


# --- imports that need the package ----------------------------------------------------------------------------------


def plugins_package() -> str:
    """Make ``specframe_plugins`` importable: the installed package, or else this checkout's ``plugins/`` under that
    name (the registry finds plugins by entry points only, so an uninstalled checkout needs this)."""
    try:
        import specframe_plugins

        return f"installed ({Path(specframe_plugins.__file__).parent})"
    except ImportError:
        spec = importlib.util.spec_from_file_location("specframe_plugins", ROOT / "plugins" / "__init__.py",
                                                      submodule_search_locations=[str(ROOT / "plugins")])
        if spec is None or spec.loader is None:
            raise
        mod = importlib.util.module_from_spec(spec)
        sys.modules["specframe_plugins"] = mod
        spec.loader.exec_module(mod)
        return f"aliased from {ROOT / 'plugins'} (not installed: entry points absent)"


def sync_dev(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- models ---------------------------------------------------------------------------------------------------------


def build_target_model(smoke: Smoke, dtype: torch.dtype = torch.float32, vocab: int | None = None, seed: int = SEED):
    """The random SmolLM2-shaped Llama (weights drawn on the CPU in float32, so a seed is the same model everywhere),
    on the device in ``dtype``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(SMOLLM2, num_hidden_layers=smoke.layers)
    if vocab is not None:
        cfg["vocab_size"] = vocab
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**cfg, bos_token_id=None, eos_token_id=None, pad_token_id=None))
    model = model.float().eval()
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.to(device=smoke.device, dtype=dtype)


def target_of(model, tokenizer=None):
    from specframe.target.hf import Target

    return Target(model, tokenizer, name=TARGET_NAME)


@torch.inference_mode()
def hf_greedy(model, prompt: list[int], n: int, eos: int | None = None, processors=None) -> list[int]:
    ids = torch.tensor([prompt], dtype=torch.int64, device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                         eos_token_id=eos, pad_token_id=0 if eos is None else eos, logits_processor=processors)
    return out[0, len(prompt):].tolist()


def learned_weights(smoke: Smoke, model) -> dict[str, Path]:
    """Random Medusa heads, a random EAGLE drafter and a small random HF draft (same vocabulary), saved once."""
    if "weights" in smoke.shared:
        return smoke.shared["weights"]
    from transformers import LlamaConfig, LlamaForCausalLM

    from specframe.learned.eagle_drafter import EagleSpec, init_from_target, new_drafter
    from specframe.learned.medusa_heads import MedusaHeads

    hidden, vocab = SMOLLM2["hidden_size"], SMOLLM2["vocab_size"]
    out = {k: smoke.work / k for k in ("medusa", "eagle", "draft")}
    heads = MedusaHeads(hidden, 4, 1)
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():  # normal(0.3) weights: zero-init heads would all predict what the LM head predicts
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    heads.save(out["medusa"], TARGET_NAME)
    cpu_model = copy.deepcopy(model).to("cpu", torch.float32)
    spec = EagleSpec.for_target(cpu_model.config, TARGET_NAME)
    drafter = new_drafter(spec, torch.arange(vocab), seed=1)
    init_from_target(drafter, cpu_model)
    drafter.save(out["eagle"])
    del cpu_model
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        draft = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             tie_word_embeddings=True, max_position_embeddings=8192,
                                             bos_token_id=None, eos_token_id=None, pad_token_id=None))
    draft.float().save_pretrained(out["draft"])
    smoke.shared["weights"] = out
    return out


def make_proposers(strategy: str, target, weights: dict[str, Path]) -> tuple[list, Any]:
    """Fresh proposer instances for ``strategy`` and the merge policy (None for one proposer)."""
    from specframe_plugins.autoregressive import NoneConfig, NoProposer
    from specframe_plugins.draft_model import DraftModelConfig, DraftModelProposer
    from specframe_plugins.eagle import EagleConfig, EagleProposer
    from specframe_plugins.lookahead import LookaheadConfig, LookaheadProposer
    from specframe_plugins.medusa import MedusaConfig, MedusaProposer
    from specframe_plugins.merge_policies import PriorityConfig, PriorityPolicy
    from specframe_plugins.ngram import NgramConfig, NgramProposer

    info = target.info
    make = {
        "none": lambda: NoProposer(NoneConfig(), info),
        "ngram": lambda: NgramProposer(NgramConfig(k=6), info),
        "lookahead": lambda: LookaheadProposer(LookaheadConfig(), info),
        "medusa": lambda: MedusaProposer(MedusaConfig(heads=str(weights["medusa"]), top_k=3, max_nodes=8), info),
        "eagle": lambda: EagleProposer(EagleConfig(weights=str(weights["eagle"]), depth=4, top_k=3, max_nodes=12),
                                       info),
        "draft-model": lambda: DraftModelProposer(DraftModelConfig(model=str(weights["draft"]), k=4), info),
    }
    names = strategy.split("+")
    props = [make[n]() for n in names]
    merge = PriorityPolicy(PriorityConfig(max_nodes=16)) if len(props) > 1 else None
    return props, merge


def engine_of(strategy: str, target, weights):
    from specframe.acceptance import GreedyVerifier
    from specframe.decode.engine import Engine

    props, merge = make_proposers(strategy, target, weights)
    return Engine(target, props, GreedyVerifier(), merge=merge)


def fp32_setup(smoke: Smoke):
    """The float32 target, its references (transformers greedy) and the learned weights, built once."""
    if "target" not in smoke.shared:
        model = build_target_model(smoke)
        smoke.shared["target"] = target_of(model)
        smoke.shared["refs"] = [hf_greedy(model, p, smoke.new_tokens) for p in smoke.prompts]
    target = smoke.shared["target"]
    return target, smoke.shared["refs"], learned_weights(smoke, target.model)


# --- stages ---------------------------------------------------------------------------------------------------------


def stage_env(smoke: Smoke) -> tuple[str, dict]:
    import transformers

    import specframe
    from specframe.target.models import resolve_dtype

    plugins = plugins_package()
    dev = smoke.device
    data: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "cuda": torch.version.cuda, "transformers": transformers.__version__,
                            "specframe": getattr(specframe, "__version__", "?"),
                            "specframe_from": str(Path(specframe.__file__).parent), "plugins": plugins,
                            "quick": smoke.quick, "threads": torch.get_num_threads(), "layers": smoke.layers, "new_tokens": smoke.new_tokens}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        data.update(device_name=props.name, capability=".".join(map(str, torch.cuda.get_device_capability(dev))),
                    memory_gib=round(props.total_memory / 2**30, 1), sms=props.multi_processor_count,
                    bf16_native=torch.cuda.is_bf16_supported(),
                    tf32_matmul=torch.backends.cuda.matmul.allow_tf32)  # (True would make "fp32" matmuls inexact)
    else:
        data.update(device_name=platform.processor() or platform.machine(),
                    bf16_native=bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
                                     or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()))
    data["dtype_auto"] = str(resolve_dtype("auto", dev.type)).replace("torch.", "")
    try:
        from specframe.registry import build_registry

        reg = build_registry()
        data["registered_proposers"] = sorted(reg.proposers)
        data["broken_plugins"] = [f"{p.describe()}: {p.error}" for p in reg.broken]
    except Exception as exc:  # noqa: BLE001 - the registry is reported, not needed by the stages
        data["registered_proposers"] = f"unavailable: {type(exc).__name__}: {exc}"
    try:
        import llguidance

        data["llguidance"] = getattr(llguidance, "__version__", "present")
    except ImportError:
        data["llguidance"] = "missing"
    regs = data["registered_proposers"]
    n_reg = len(regs) if isinstance(regs, list) else 0
    quick = "QUICK (2 layers, fewer tokens and repeats) " if smoke.quick else ""
    return (f"{quick}torch {torch.__version__} cuda {torch.version.cuda} transformers {transformers.__version__} on "
            f"{data['device_name']}{' sm_' + data['capability'] if 'capability' in data else ''} bf16 native "
            f"{data['bf16_native']}, dtype auto -> {data['dtype_auto']}; {n_reg} proposers registered; plugins "
            f"{plugins.split(' ')[0]}; llguidance {data['llguidance']}", data)


def stage_exactness(smoke: Smoke) -> tuple[str, dict]:
    target, refs, weights = fp32_setup(smoke)
    rows, results = {}, {}
    for strategy in STRATEGIES:
        try:
            engine = engine_of(strategy, target, weights)
            res = [engine.generate(p, max_new_tokens=smoke.new_tokens) for p in smoke.prompts]
        except Exception as exc:  # noqa: BLE001 - one strategy's failure is its row
            rows[strategy] = {"identical": False, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
            continue
        same = [r.token_ids == ref for r, ref in zip(res, refs)]
        m = [r.metrics for r in res]
        rows[strategy] = {"identical": all(same), "per_prompt": same,
                          "tau": round(sum(x.new_tokens for x in m) / max(1, sum(x.target_forwards for x in m)), 3),
                          "accepted": sum(x.accepted_nodes for x in m), "drafted": sum(x.drafted_nodes for x in m)}
        if not all(same):
            i = same.index(False)
            got, want = res[i].token_ids, refs[i]
            rows[strategy]["first_diff"] = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b),
                                                min(len(got), len(want)))
        results[strategy] = res
    smoke.shared["results"] = results
    bad = [s for s, r in rows.items() if not r["identical"]]
    summary = ", ".join(f"{s} {'yes' if r['identical'] else 'NO'}" + (f" tau {r['tau']}" if "tau" in r else "")
                        for s, r in rows.items())
    if bad:
        raise StageFailed(f"NOT identical to transformers greedy: {', '.join(bad)}; {summary}", {"strategies": rows})
    return f"all {len(rows)} identical to transformers greedy (fp32, {len(smoke.prompts)} prompts): {summary}", \
        {"strategies": rows}


def stage_host_syncs(smoke: Smoke) -> tuple[str, dict]:
    try:
        from specframe.testing.host_syncs import count_host_syncs
    except ImportError as exc:
        return f"skipped: unavailable (specframe.testing.host_syncs: {exc})", {}
    target, _, weights = fp32_setup(smoke)
    rows = {}
    for strategy in STRATEGIES:
        engine = engine_of(strategy, target, weights)
        with count_host_syncs() as syncs:
            res = engine.generate(smoke.prompts[0], max_new_tokens=smoke.new_tokens)
        steps = max(1, res.metrics.target_forwards)
        rows[strategy] = {"steps": steps, "total": syncs.total, "per_step": round(syncs.total / steps, 1),
                          "by_kind_per_step": {k: round(v / steps, 1) for k, v in sorted(syncs.by_kind.items())}}
    return "syncs per step: " + ", ".join(f"{s} {r['per_step']}" for s, r in rows.items()), {"strategies": rows}


@torch.inference_mode()
def stage_forward_times(smoke: Smoke) -> tuple[str, dict]:
    from specframe.target.device_sync import clock
    from specframe.target.kv_cache import new_cache, rollback

    target, _, _ = fp32_setup(smoke)
    model, dev = target.model, target.device
    ctx = 128
    gen = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, SMOLLM2["vocab_size"], (1, ctx), generator=gen).to(dev)
    cache = new_cache(model.config)
    model(input_ids=prefix, cache=cache, use_cache=True)

    def once(ids: torch.Tensor, pos: torch.Tensor) -> None:  # n tokens after the context, as a verification forward
        model(input_ids=ids, cache=cache, use_cache=True, position_ids=pos)
        rollback(cache, ctx)

    rows = {}
    for n in T_SIZES:
        ids = torch.randint(0, SMOLLM2["vocab_size"], (1, n), generator=gen).to(dev)
        pos = torch.arange(ctx, ctx + n, device=dev)[None]
        for _ in range(2):
            once(ids, pos)
        synced, bare = [], []
        for _ in range(smoke.reps):
            t0 = clock(dev)
            once(ids, pos)
            synced.append((clock(dev) - t0) * 1e3)
            sync_dev(dev)  # (the queue is empty before each bare timing: it measures this call's launches alone)
            t0 = time.perf_counter()
            once(ids, pos)
            bare.append((time.perf_counter() - t0) * 1e3)
            sync_dev(dev)
        rows[n] = {"synced_ms": round(statistics.median(synced), 3), "unsynced_ms": round(statistics.median(bare), 3)}
    summary = " ".join(f"{n}:{r['synced_ms']:.2f}/{r['unsynced_ms']:.2f}" for n, r in rows.items())
    return f"T(n) ms synced/unsynced (median of {smoke.reps}) at context {ctx}: {summary}", {"context": ctx, "T": rows}


def stage_step_split(smoke: Smoke) -> tuple[str, dict]:
    results = smoke.shared.get("results")
    if not results:
        raise RuntimeError("no results from the exactness stage (run it in the same call: --stages exactness,step_split)")
    rows = {}
    for strategy, res in results.items():
        steps = max(1, sum(r.metrics.target_forwards for r in res))
        ms = lambda attr: round(sum(getattr(r.metrics, attr) for r in res) * 1e3 / steps, 3)  # noqa: B023, E731
        rows[strategy] = {"steps": steps, "draft_ms": ms("propose_s"), "forward_ms": ms("forward_s"),
                          "verify_ms": ms("verify_s"),
                          "wall_ms_per_step": round(sum(r.metrics.wall_s for r in res) * 1e3 / steps, 3)}
    summary = ", ".join(f"{s} {r['draft_ms']:.2f}/{r['forward_ms']:.2f}/{r['verify_ms']:.2f}" for s, r in rows.items())
    return f"per step ms draft/forward/verify: {summary}", {"strategies": rows}


def stage_batch(smoke: Smoke) -> tuple[str, dict]:
    from specframe.decode.batch import BatchRequest, decode_batch
    from specframe.decode.options import DecodeOptions

    target, refs, weights = fp32_setup(smoke)
    rows = {}
    for strategy in ("none", "ngram", "medusa", "ngram+medusa"):
        items = [BatchRequest(engine=engine_of(strategy, target, weights), prompt_ids=p,
                              options=DecodeOptions(smoke.new_tokens)) for p in smoke.prompts]
        got = dict(decode_batch(target, items, batch_size=len(items), gate=False))
        alone = smoke.shared.get("results", {}).get(strategy)
        want = [r.token_ids for r in alone] if alone else refs
        same = [got[i].token_ids == want[i] for i in range(len(items))]
        rows[strategy] = {"identical": all(same), "per_request": same, "to_reference": [
            got[i].token_ids == refs[i] for i in range(len(items))]}
    bad = [s for s, r in rows.items() if not r["identical"]]
    summary = ", ".join(f"{s} {'yes' if r['identical'] else 'NO'}" for s, r in rows.items())
    if bad:
        raise StageFailed(f"batched output differs from single runs: {summary}", {"strategies": rows})
    return f"{len(smoke.prompts)} requests in one batch equal their single runs: {summary}", {"strategies": rows}


@torch.inference_mode()
def _top2_gap(model, tokens: list[int]) -> tuple[float, list[int]]:
    logits = model(input_ids=torch.tensor([tokens], device=model.device)).logits[0, -1].float()
    top = torch.topk(logits, 2)
    v = top.values.tolist()
    return v[0] - v[1], top.indices.tolist()


def stage_low_precision(smoke: Smoke) -> tuple[str, dict]:
    target, refs, weights = fp32_setup(smoke)
    dtypes = [torch.bfloat16] + ([torch.float16] if smoke.device.type == "cuda" else [])
    rows: dict[str, Any] = {}
    for dt in dtypes:
        name = str(dt).replace("torch.", "")
        low = copy.deepcopy(target.model).to(dt)
        per_prompt = []
        for p, ref in zip(smoke.prompts, refs):
            got = hf_greedy(low, p, smoke.new_tokens)
            pos = next((k for k, (a, b) in enumerate(zip(got, ref)) if a != b), None)
            row: dict[str, Any] = {"first_diverging": pos}
            if pos is not None:
                prefix = p + ref[:pos]
                gap32, top32 = _top2_gap(target.model, prefix)
                gap_low, top_low = _top2_gap(low, prefix)
                row.update(fp32_top2=top32, fp32_gap=round(gap32, 5), low_top2=top_low, low_gap=round(gap_low, 5))
            per_prompt.append(row)
        # speculation in reduced precision: the engine (ngram) against transformers greedy in the same dtype
        try:
            low_target = target_of(low)
            eng = engine_of("ngram", low_target, weights)
            spec_same = [eng.generate(p, max_new_tokens=smoke.new_tokens).token_ids == hf_greedy(low, p,
                                                                                                 smoke.new_tokens)
                         for p in smoke.prompts]
        except Exception as exc:  # noqa: BLE001 - reported in the row
            spec_same = f"{type(exc).__name__}: {exc}"
        rows[name] = {"prompts": per_prompt, "ngram_equals_hf_same_dtype": spec_same}
        del low
    parts = []
    for name, r in rows.items():
        firsts = [x["first_diverging"] for x in r["prompts"]]
        gaps = [x.get("fp32_gap") for x in r["prompts"] if x["first_diverging"] is not None]
        parts.append(f"{name}: first diverging {firsts} (fp32 top-2 gap there {gaps}); ngram==hf in {name} "
                     f"{r['ngram_equals_hf_same_dtype']}")
    return "vs fp32 greedy: " + "; ".join(parts) + " (a small gap = a near-tie)", {"dtypes": rows}


BPE_CORPUS = ['{"name": "Ada", "age": 36, "tags": ["x", "y"], "ok": true}', '{"city": "Paris", "zip": "75001"}',
              'true false null 0123456789 -1.5e3', '[1, 2, 3] {"a": {"b": null}}', "abc-123 xyz_9 a.b@c.de"]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}


def _bpe_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(BPE_CORPUS * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def stage_grammar(smoke: Smoke) -> tuple[str, dict]:
    try:
        import llguidance
        import llguidance.torch
    except ImportError:
        return "skipped: llguidance missing", {}
    from transformers import LogitsProcessor, LogitsProcessorList

    from specframe.contracts.constraint import ConstraintSpec
    from specframe.grammar.llguidance_engine import LLGuidanceEngine

    tok = _bpe_tokenizer()
    eos = 0
    model = build_target_model(smoke, vocab=len(tok), seed=3)
    with torch.no_grad():  # a head that likes to repeat itself: ngram drafts get accepted
        model.lm_head.weight.mul_(4.0)
    model.generation_config.eos_token_id = eos
    target = target_of(model, tok)
    vocab = model.config.vocab_size
    llg = LLGuidanceEngine(tok, vocab, {eos})
    spec = ConstraintSpec.model_validate({"json_schema": PERSON})
    grammar = llg.grammar(spec)

    class Reference(LogitsProcessor):
        def __init__(self, prompt_len: int) -> None:
            self.matcher = llguidance.LLMatcher(llg.tokenizer, grammar, log_level=0)
            self.prompt_len = prompt_len

        def __call__(self, input_ids, scores):
            generated = input_ids[0, self.prompt_len:].tolist()
            if generated:
                assert self.matcher.consume_token(generated[-1])
            bitmask = torch.zeros((1, (vocab + 31) // 32), dtype=torch.int32)
            llguidance.torch.fill_next_token_bitmask(self.matcher, bitmask, 0)
            bits = ((bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).reshape(1, -1)[:, :vocab]
            return scores.masked_fill((bits == 0).to(scores.device), float("-inf"))

    rows = {}
    n = min(48, smoke.new_tokens * 2)
    texts = ['{"name": "Ada", "age": 36} {"name": "Ada", "age"', "abc-123 xyz_9 abc-1"]
    for strategy in ("none", "ngram", "lookahead"):
        same = []
        for text in texts:
            prompt = tok.encode(text)
            want = hf_greedy(model, prompt, n, eos=eos, processors=LogitsProcessorList([Reference(len(prompt))]))
            got = engine_of(strategy, target, {}).generate(prompt, max_new_tokens=n, constraint=llg.compile(spec))
            same.append(got.token_ids == want)
            if strategy == "ngram" and text == texts[0]:
                rows["sample"] = tok.decode([t for t in got.token_ids if t != eos])
        rows[strategy] = {"identical": all(same), "per_prompt": same}
    bad = [s for s in ("none", "ngram", "lookahead") if not rows[s]["identical"]]
    summary = ", ".join(f"{s} {'yes' if rows[s]['identical'] else 'NO'}" for s in ("none", "ngram", "lookahead"))
    if bad:
        raise StageFailed(f"constrained output differs from constrained transformers greedy: {summary}",
                          {"strategies": rows})
    return (f"JSON schema (llguidance {getattr(llguidance, '__version__', '?')}) equal to constrained plain "
            f"decoding: {summary}; sample {rows['sample'][:60]!r}", {"strategies": rows})


# --- main -----------------------------------------------------------------------------------------------------------


STAGES: dict[str, Callable[[Smoke], tuple[str, dict]]] = {
    "env": stage_env, "exactness": stage_exactness, "host_syncs": stage_host_syncs, "forward_T": stage_forward_times,
    "step_split": stage_step_split, "batch": stage_batch, "low_precision": stage_low_precision, "grammar": stage_grammar,
}


def parse_device(text: str | None) -> torch.device:
    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(text)
    if dev.type not in ("cpu", "cuda"):
        raise SystemExit(f"--device must be cpu, cuda or cuda:N, got {text!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available here (use --device cpu)")
    if dev.type == "cuda" and dev.index is None:  # (torch.cuda.set_device wants an index)
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available, else cpu)")
    ap.add_argument("--out", type=Path, default=Path("smoke-out"), help="folder for smoke.jsonl and smoke.md")
    ap.add_argument("--quick", action="store_true", help="2 layers, fewer tokens and repeats (minutes on a CPU)")
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset of: " + ", ".join(STAGES))
    args = ap.parse_args(argv)
    unknown = set(args.stages.split(",")) - set(STAGES)
    if unknown:
        raise SystemExit(f"--stages: unknown {', '.join(sorted(unknown))}; known: {', '.join(STAGES)}")
    device = parse_device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif (os.cpu_count() or 1) <= 4:
        torch.set_num_threads(1)  # small models on a few cores: one thread is faster (and steadier) than several
    torch.manual_seed(SEED)
    warnings.filterwarnings("ignore", category=FutureWarning)
    with contextlib.suppress(ImportError, AttributeError):
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
    smoke = Smoke(args.out, device, args.quick)
    print(f"gpu_smoke: device {device}, {'QUICK: ' if args.quick else ''}{smoke.layers} layers, "
          f"{smoke.new_tokens} new tokens, {len(smoke.prompts)} prompts -> {args.out}", flush=True)
    t0 = time.perf_counter()
    for name, fn in STAGES.items():
        if name in args.stages.split(","):
            smoke.stage(name, lambda fn=fn: fn(smoke))
    smoke.write_md()
    failed = [r["stage"] for r in smoke.records if r["status"] == "FAIL"]
    print(f"gpu_smoke: done in {time.perf_counter() - t0:.0f} s; {len(smoke.records) - len(failed)} of "
          f"{len(smoke.records)} stages ok or skipped{'; FAILED: ' + ', '.join(failed) if failed else ''}; "
          f"{args.out / 'smoke.jsonl'}, {args.out / 'smoke.md'}", flush=True)
    with contextlib.suppress(OSError):
        import shutil

        shutil.rmtree(smoke.work)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
