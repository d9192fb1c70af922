"""The two recipes end to end: corpus (resumable) -> training (resumable) -> weights + model card with τ measured
on held-out prompts (built from the same source with another seed; never Spec-Bench).

``run_recipe("draft" | "medusa", ...)`` is what ``specframe train draft|medusa`` calls.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..errors import ConfigError
from .common import check_resume
from .corpus import CorpusSettings, build_corpus, mix_prompts, read_corpus
from .data import log_folder, repo_path
from .dflash import DFlashSettings, finish_dflash, train_dflash
from .draft import DraftSettings, finish_draft, train_draft
from .eagle import EagleSettings, finish_eagle, train_eagle
from .medusa import MedusaSettings, finish_medusa, train_medusa
from .pard import PardSettings, finish_pard, train_pard
from .teacher import teacher_pass

RECIPES = {"draft": "draft-model", "medusa": "medusa", "eagle": "eagle", "dflash": "dflash",
           "pard": "draft-model"}  # recipe -> its proposer
EVAL_SEED = 10_001  # held-out prompts: same templates and source, another seed


_SETTINGS = {"draft": DraftSettings, "medusa": MedusaSettings, "eagle": EagleSettings, "dflash": DFlashSettings,
             "pard": PardSettings}


def reproduce_flags(kind: str, settings: dict) -> str:
    """The flags of ``specframe train KIND`` that give ``settings`` (a recipe.json ``settings``), e.g. `` --epochs 1``:
    the recipe's own options (its settings class's ``cli`` fields, :mod:`specframe.training.options`), then ``--seed``."""
    from .options import reproduce_flags as flags_of

    seed = settings.get("seed")
    return flags_of(_SETTINGS[kind], settings) + ("" if seed is None else f" --seed {seed}")


def evaluate_tau(target: Any, proposer_name: str, options: dict, num_prompts: int = 12, max_new_tokens: int = 96,
                 progress: Callable[[int, int], None] | None = None, mix: str = "pydoc") -> dict:
    """Greedy τ (tokens per target forward) and tok/s of a proposer on held-out prompts of the corpus ``mix``
    (another seed), vs ``none``."""
    from ..api import load

    # the one config -> plugins path; no router: the model card's τ is the proposer's own, untrimmed
    sf = load(target=target, proposers=[{"name": proposer_name, **options}], router="none", temperature=0.0)
    held_out = mix_prompts(CorpusSettings("", num_prompts, 8, 1, EVAL_SEED, "", mix))
    prompts = [target.encode_prompt(p["text"]) for p in held_out]
    res = {}
    for name, opts in ((proposer_name, options), ("none", {})):
        toks = fwd = 0
        secs = 0.0
        for i, ids in enumerate(prompts):
            r = sf.generate_result(ids, proposers=[{"name": name, **opts}], max_new_tokens=max_new_tokens)
            toks += r.metrics.new_tokens
            fwd += r.metrics.target_forwards
            secs += r.metrics.wall_s
            if progress:
                progress(i + 1 + (0 if name != "none" else len(prompts)), 2 * len(prompts))
        res[name] = {"tau": toks / max(1, fwd), "tok_s": toks / max(secs, 1e-9), "tokens": toks}
    res["speedup"] = res[proposer_name]["tok_s"] / max(res["none"]["tok_s"], 1e-9)
    res["prompts"], res["max_new_tokens"], res["mix"] = num_prompts, max_new_tokens, mix
    return res


def run_recipe(kind: str, target: Any, target_name: str, output: Path, corpus: Path, corpus_settings: CorpusSettings,
               settings: DraftSettings | MedusaSettings | EagleSettings | DFlashSettings | PardSettings,
               bar: Callable[[str, int, int, str], None],
               eval_prompts: int = 12, deadline: float | None = None, extra_corpora: Sequence[Path] = ()) -> dict:
    """Build the corpus (or finish it), train, save, evaluate, write ``README.md`` (model card) and
    ``recipe.json`` in ``output``. Returns the summary written to ``recipe.json``.

    ``extra_corpora``: finished corpus folders of the same target whose records follow ``corpus``'s (their
    ``max_records`` share is not cut: ``max_records`` counts ``corpus``'s records only).

    Raises:
        ConfigError: an extra corpus is not a finished corpus of this target.
        PieceDone: training reached ``deadline`` (a ``time.monotonic()`` value) and checkpointed; nothing else is
            written, and the same call resumes."""
    if kind not in RECIPES:
        raise ConfigError(f"unknown recipe {kind!r}: use one of {', '.join(RECIPES)}")
    t0 = time.perf_counter()
    check_resume(output, kind, asdict(settings))  # a changed setting is refused before any stage runs
    build_corpus(target, corpus, corpus_settings, progress=lambda d, n: bar("corpus", d, n, ""))
    t_corpus = time.perf_counter() - t0
    records, n_main, extras = _training_records(corpus, settings, extra_corpora, target_name)
    check_resume(output, kind, asdict(settings), len(records))  # before the teacher pass
    teacher = None  # medusa takes its hidden states in its own forward: the teacher's top-K is not needed for it
    if kind == "draft" and settings.soft_labels:
        teacher = teacher_pass(target, corpus, records, progress=lambda d, n: bar("teacher", d, n, ""))
    n_resp = sum(len(r["response_ids"]) for r in records)
    n_prompt = sum(len(r["prompt_ids"]) for r in records)
    summary, proposer, options = _train(kind, target, target_name, records, output, settings, bar, teacher, deadline)
    ev = evaluate_tau(target, proposer, options, eval_prompts, progress=lambda d, n: bar("eval", d, n, ""),
                      mix=corpus_settings.mix)
    record = {
        "recipe": kind, "target": target_name, "target_dtype": str(target.dtype).replace("torch.", ""),
        "corpus": {"settings": asdict(corpus_settings), "sources": _sources(corpus, *extra_corpora),
                   "records": n_main, "extra": [{"path": str(p), "settings": cs, "records": len(recs)}
                                                      for p, (cs, recs) in zip(extra_corpora, extras)],
                   "prompt_tokens": n_prompt, "response_tokens": n_resp, "build_s_this_run": round(t_corpus, 1)},
        "settings": asdict(settings), "result": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in summary.items()},
        "eval": ev, "wall_s": round(time.perf_counter() - t0, 1),
        "machine": _machine(target),
    }
    (output / "recipe.json").write_text(json.dumps(record, indent=1) + "\n")
    logs = log_folder(output)  # beside the weights, or for a shipped weights folder in the repository's lab/data/
    plot = Path(os.path.relpath(logs / "loss.png", output)).as_posix()
    (output / "README.md").write_text(model_card(record, plot, None if logs == output else repo_path(logs)))
    (output / "ckpt.pt").unlink(missing_ok=True)  # done: the optimizer state is not shipped
    return record


def _training_records(corpus: Path, settings: Any, extra_corpora: Sequence[Path],
                      target_name: str) -> tuple[list[dict], int, list]:
    """The records to train on: ``corpus``'s (cut to ``max_records``, less ``skip_records``), then each extra
    corpus's. Returns (records, how many came from ``corpus``, the extra corpora's (settings, records)).

    Raises:
        ConfigError: ``skip_records`` leaves nothing, or an extra corpus is not a finished corpus of this target."""
    records = list(read_corpus(corpus))
    if settings.max_records:  # the first N records: any prefix of the shards covers every prompt kind
        records = records[: settings.max_records]
    records = records[getattr(settings, "skip_records", 0):]
    if not records:
        raise ConfigError(f"--skip-records {settings.skip_records} leaves no record of {corpus} to train on")
    n_main = len(records)
    extras = [_extra_corpus(p, target_name) for p in extra_corpora]
    return records + [r for _, recs in extras for r in recs], n_main, extras


def _train(kind: str, target: Any, target_name: str, records: list[dict], output: Path, settings: Any,
           bar: Callable[[str, int, int, str], None], teacher: Any, deadline: float | None) -> tuple[dict, str, dict]:
    """Train ``kind``'s proposer and save its weights in ``output``. Returns (the training summary, the proposer's
    name, its options for loading what was saved)."""
    if kind == "draft":
        summary = train_draft(target, records, output, settings,
                              progress=lambda s, n, loss: bar("train", s, n, f"loss {loss:.3f}"), teacher=teacher,
                              deadline=deadline)
        finish_draft(summary.pop("draft"), output, target_name, target.vocab_size)
        return summary, "draft-model", {"model": str(output)}
    if kind == "eagle":
        summary = train_eagle(target, records, output, settings,
                              progress=lambda s, n, loss: bar("train", s, n, f"loss {loss:.3f}"), deadline=deadline)
        finish_eagle(summary.pop("drafter"), output, target_name)
        return summary, "eagle", {"weights": str(output)}
    if kind == "dflash":
        summary = train_dflash(target, records, output, settings,
                               progress=lambda s, n, loss: bar("train", s, n, f"loss {loss:.3f}"), deadline=deadline)
        finish_dflash(summary.pop("drafter"), output)
        return summary, "dflash", {"checkpoint": str(output)}
    if kind == "pard":
        summary = train_pard(target, target_name, records, output, settings,
                             progress=lambda s, n, loss: bar("train", s, n, f"loss {loss:.3f}"), deadline=deadline)
        finish_pard(summary.pop("model"), summary.pop("tokenizer"), summary["mask_token_id"], output)
        k = settings.block_size
        return summary, "draft-model", {"model": str(output), "k": k, "max_k": k, "schedule": "constant"}
    summary = train_medusa(target, records, output, settings,
                           progress=lambda ph, s, n, loss: bar(ph, s, n, f"loss {loss:.3f}" if ph == "train" else ""),
                           teacher=teacher, deadline=deadline)
    finish_medusa(summary.pop("heads"), output, target_name)
    return summary, "medusa", {"heads": str(output)}


def _machine(target: Any) -> str:
    """Where training ran, for the model card: the CPU's threads or the GPU's name, and torch's version."""
    from ..target.machine import fingerprint

    dev = getattr(target, "device", torch.device("cpu"))
    if dev.type == "cuda":
        return f"{torch.cuda.get_device_name(dev)} (CUDA), torch {torch.__version__}"
    fp = fingerprint()
    isa = " ".join(fp.get("isa") or []) or "-"
    return (f"{fp.get('cpu') or platform.machine()} (ISA {isa}), {torch.get_num_threads()} threads, "
            f"torch {torch.__version__}")


def _sources(*corpora: Path) -> dict:
    out: dict = {}
    for c in corpora:
        out.update(json.loads((c / "corpus.json").read_text()).get("sources", {}))
    return out


def _extra_corpus(path: Path, target_name: str) -> tuple[dict, list[dict]]:
    """``(settings, records)`` of a finished corpus of ``target_name`` to train on too.

    Raises:
        ConfigError: no corpus there, one of another target, or one not finished (a shard missing).
    """
    from .corpus import CorpusSettings, corpus_batches, finished_shards

    meta = path / "corpus.json"
    if not meta.is_file():
        raise ConfigError(f"--extra-corpus {path} is not a corpus folder (no corpus.json): build it with "
                          "`specframe train corpus`")
    try:
        cs = CorpusSettings(**json.loads(meta.read_text())["settings"])
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{meta} is not a specframe corpus description: rebuild it with `specframe train corpus`") from None
    if cs.model != target_name:
        raise ConfigError(f"--extra-corpus {path} holds answers of {cs.model!r}, not of {target_name!r}")
    first, second = finished_shards(path, cs) or corpus_batches(cs)  # (a finished corpus: no source is read)
    have1, have2 = len(list(path.glob("shard-*.jsonl.gz"))), len(list(path.glob("turn2-*.jsonl.gz")))
    if have1 < first or have2 < second:
        raise ConfigError(f"--extra-corpus {path} is not finished ({have1 + have2} of {first + second} shards): "
                          "finish it with the `specframe train corpus` command that started it")
    return asdict(cs), list(read_corpus(path))


def _what(kind: str, r: dict) -> str:
    """The model card's opening sentence: what was trained, for which target."""
    s, res = r["settings"], r["result"]
    return (
        f"A {len(s['layers'])}-layer draft for `{r['target']}`: the target's own layers {s['layers']} as the "
        f"starting point, the target's embeddings and tokenizer, and an output head over the {s['vocab_subset']} most "
        "frequent tokens of the corpus (rows of the target's output embedding; FR-Spec style)."
        if kind == "draft" else
        f"An EAGLE-3 drafter for `{r['target']}` in the published architecture (speculators layout, loaded by vLLM "
        f"and by `eagle`'s `checkpoint:`): fc over target layers {res.get('feature_layers')}, one decoder layer whose "
        f"q/k/v read the next token's embedding and the fused features, its own LM head over the "
        f"{s['vocab_subset']} most frequent corpus tokens (d2t), trained with a {s['ttt_steps']}-step "
        "training-time test."
        if kind == "eagle" and s.get("arch") == "eagle3" else
        f"An EAGLE-style drafter for `{r['target']}`: one decoder layer over the fused hidden states of target layers "
        f"{res.get('feature_layers')} (EAGLE-3 fusion) and the next token's embedding, trained with a "
        f"{s['ttt_steps']}-step training-time test; output head = the target's LM-head rows of the "
        f"{s['vocab_subset']} most frequent corpus tokens (FR-Spec)."
        if kind == "eagle" else
        f"A DFlash block drafter for `{r['target']}` in z-lab's layout (`config.json` + `model.safetensors`, read by "
        f"the `dflash` proposer and by the serving engines' DFlash support): {s['draft_layers']} Qwen3-style "
        f"decoder layer(s) over the fused hidden states of target layers {res.get('target_layer_ids')} (fc + norm, "
        f"injected as keys and values into every layer), drafting a block of {s['block_size']} rows (the newest "
        f"token, then mask token {res.get('mask_token_id')}) in one forward with the target's own embeddings and "
        "LM head (frozen, not saved here)."
        if kind == "dflash" else
        (f"A PARD parallel draft for `{r['target']}` (the draft-model proposer's parallel mode; PARD's layout: "
         f"`pard_token` {res.get('mask_token_id')}): "
         + (f"the target itself with rank-{s['lora_rank']} LoRA adapters on its decoder's linear layers, merged into "
            "the weights after training (a self-drafting block drafter)" if s["init"] == "target" else
            "the small draft shipped for the target, every weight trained")
         + f", drafting {s['block_size']} tokens per forward over mask tokens.")
        if kind == "pard" else
        f"{s['num_heads']} Medusa-1 heads ({s['num_layers']} residual block each) for `{r['target']}`, feeding the "
        "target's own LM head."
    )


def model_card(r: dict, loss_plot: str = "loss.png", logs_in: str | None = None) -> str:
    """The model card (``README.md``) of the run recorded in ``r`` (a ``recipe.json``); ``loss_plot``: the loss
    curve's path relative to the card; ``logs_in``: the repository folder of the loss log and curve where they are
    not beside the card (a shipped weights folder: :func:`~specframe.training.data.log_folder`)."""
    kind = r["recipe"]
    c, s, res, ev = r["corpus"], r["settings"], r["result"], r["eval"]
    proposer = RECIPES[kind]
    what = _what(kind, r)
    lines = [
        f"# specframe {proposer} weights for {r['target']}", "", what, "",
        ("Use: `{name: eagle, checkpoint: DIR}` in a config (DIR: this folder), or `vllm serve` / vLLM's "
         "`method: eagle3` with this folder (docs/drafters.md)." if s.get("arch") == "eagle3" else
         "Use: `{name: dflash, checkpoint: DIR}` in a config (DIR: this folder; docs/block-drafters.md)."
         if kind == "dflash" else
         f"Use: `{{name: draft-model, model: DIR, k: {s.get('block_size')}, max_k: {s.get('block_size')}}}` in a config "
         "(DIR: this folder; docs/block-drafters.md)." if kind == "pard" else
         f"Use: `specframe generate --proposer {proposer} ...` (these weights are the default for this target)."), "",
        "## Data", "",
        f"- Prompts: {c['records']} records of the `{c['settings'].get('mix', 'pydoc')}` prompt mix (seed "
        f"{c['settings']['seed']}; `specframe train corpus`, docs/training.md)"
        + (f" (records {s['skip_records'] + 1}–{s['skip_records'] + c['records']} of the corpus)"
           if s.get("skip_records") else "")
        + "".join(f", then {e['records']} of the `{e['settings'].get('mix')}` mix (seed {e['settings']['seed']})"
                  for e in c.get("extra", [])) + ". No Spec-Bench text.",
        *([f"- Warm start: training went on from the drafter in `{s['init']}` (its weights, head rows and feature "
           "layers; its own model card says how it trained)."] if s.get("init") else []),
        "- Responses: the target's own greedy answers (self-distillation), "
        f"{c['settings']['max_new_tokens']} new tokens at most, generated in {c['settings']['dtype']}.",
        f"- {c['prompt_tokens']} prompt tokens, {c['response_tokens']} response tokens"
        + (f" (frequent-token subset covers {res['subset_coverage']:.1%} of the response tokens)."
           if "subset_coverage" in res else "."),
        "- Sources and licences (each checked in the package's own licence file; all allow commercial use): "
        + "; ".join(f"{k}: {v.get('package', '')} ({v.get('licence', '?')})" for k, v in c.get("sources", {}).items())
        + ".", "",
        "## Training", "",
        "```", json.dumps(s), "```", "",
        f"{res['steps']} steps; final loss {res.get('final_loss', res.get('final_loss_head0')):.3f}, top-1 accuracy "
        f"{res.get('final_acc', res.get('final_acc_head0')):.3f} (mean of the last 20 steps"
        + {"draft": "", "medusa": ", head 0", "eagle": ", pass 1", "dflash": ", first block row",
           "pard": ", first mask group (2 tokens ahead)"}[kind]
        + ("; accuracy by group " + " ".join(f"{a:.2f}" for a in res.get("final_acc_by_group", []))
           if kind == "pard" else "")
        + (f"; teacher-forced block τ {res['final_block_tau']:.2f}, accuracy by block row "
           + " ".join(f"{a:.2f}" for a in res.get("final_acc_by_row", [])) if kind == "dflash" else "")
        + f"); training {res['train_s'] / 60:.1f} min"
        + (f" in {res['pieces']} pieces" if res.get("pieces", 1) > 1 else "") + " "
        f"on {r['machine']}; whole recipe run {r['wall_s'] / 60:.1f} min.", "",
        f"![loss curve]({loss_plot})", "",
        *([f"The per-step loss log (`train-log.jsonl`) and this curve are kept in the repository, not in the wheel: "
           f"`{logs_in}/`.", ""] if logs_in else []),
        "## Measured τ", "",
        f"Greedy, {ev['prompts']} held-out prompts (the `{ev.get('mix', 'pydoc')}` mix, seed {EVAL_SEED}), "
        f"{ev['max_new_tokens']} new "
        f"tokens, target in {r['target_dtype']}:", "",
        "| proposer | τ | tok/s |", "|---|---|---|",
        f"| {proposer} | {ev[proposer]['tau']:.2f} | {ev[proposer]['tok_s']:.1f} |",
        f"| none | {ev['none']['tau']:.2f} | {ev['none']['tok_s']:.1f} |", "",
        f"Speed-up on this machine: {ev['speedup']:.2f}x. Spec-Bench figures: lab/results/.", "",
        "Reproduce: `specframe train " + kind + reproduce_flags(kind, s)
        + "".join(f" --extra-corpus {e['path']}" for e in c.get("extra", [])) + " --output DIR` (see docs/training.md).",
        "",
    ]
    return "\n".join(lines)
