"""``specframe train corpus|draft|eagle|medusa|dflash|pard``: the training recipes as commands (seeded, resumable, with progress
bars); each recipe's own options come from its settings dataclass (:mod:`specframe.training.options`)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

import typer

from ..cli.console import ProgressLines, err, one_error_line, progress_bar
from ..errors import ConfigError

train_app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Train learned proposers for a target (self-distillation on the CPU or a GPU: --device).",
)

TRAIN_DTYPES = ("bfloat16", "float16", "float32")  # the target's dtype while it answers and gives hidden states

_MODEL = typer.Option("smollm2-135m-instruct", "--model", help="Target: built-in name, model folder or .gguf file.")
_OUTPUT = typer.Option(..., "--output", help="Folder for the weights, model card, loss log (resumes if present).")
_CORPUS = typer.Option(
    None, "--corpus", help="Corpus folder (shared by recipes; default: the corpus committed for the target in the "
    "repository's lab/data/<target>/corpus, else OUTPUT/corpus). An existing corpus is used with the settings it was "
    "built with.")
_PROMPTS = typer.Option(1152, "--prompts", help="Training prompts to answer with the target.")
_NEW = typer.Option(160, "--max-new-tokens", help="Longest target answer per prompt.")
_SEED = typer.Option(0, "--seed", help="Seed of the prompts, initialisation and batch order.")
_DTYPE = typer.Option("bfloat16", "--dtype", help="Target dtype for the corpus and hidden states: bfloat16, float16 "
                      "(a GPU without native bf16: T4, V100) or float32.")
_EVAL = typer.Option(12, "--eval-prompts", help="Held-out prompts for the τ in the model card.")
_MIX = typer.Option("broad", "--mix", help="Prompt mix of a new corpus: broad, pydoc or long.")
_EXTRA = typer.Option(None, "--extra-corpus", help="A finished corpus folder to train on too, after --corpus "
                      "(repeatable; e.g. one built with `specframe train corpus --mix long`).")
_MAX_RECORDS = typer.Option(0, "--max-records", help="Train on the first N corpus records only (0 = all).")
_DEVICE = typer.Option("cpu", "--device", help="Where the target runs and the weights train: cpu, cuda (the current "
                       "GPU) or cuda:N (GPU N of those visible).")
_MINUTES = typer.Option(0.0, "--max-minutes", help="Stop training after this many minutes with a checkpoint (0 = no "
                        "limit); the same command resumes it, so a long run goes in pieces.")


def _corpus_settings(corpus: Path, model: str, prompts: int, max_new_tokens: int, seed: int, dtype: str, mix: str):
    """The settings of an existing corpus folder (it is reused as it is, finished if incomplete), else new ones."""
    import json

    from .corpus import CorpusSettings

    meta = corpus / "corpus.json"
    if not meta.is_file():
        return CorpusSettings(model, prompts, max_new_tokens, 64 if mix == "broad" else 32, seed, dtype, mix)
    try:
        cs = CorpusSettings(**json.loads(meta.read_text())["settings"])
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{meta} is not a specframe corpus description: rebuild it with `specframe train corpus`") from None
    if cs.model != model:
        raise ConfigError(f"the corpus in {corpus} holds answers of {cs.model!r}, not of {model!r}: build one for this "
                          "target with `specframe train corpus --model ...`")
    return cs


def _train_threads() -> int:
    """Every usable core: training is throughput work that runs for minutes to hours, so the load seen at start
    (which ``threads="auto"`` reacts to) is no guide; run it alone."""
    from ..target.machine import usable_cores

    return usable_cores()[0]


def _run(kind: str, model: str, output: Path, corpus: Optional[Path], prompts: int, max_new_tokens: int,
         seed: int, dtype: str, eval_prompts: int, settings, mix: str = "broad", device: str = "cpu",
         max_minutes: float = 0.0, extra: Optional[list[Path]] = None) -> None:

    from ..target.loader import load_target
    from ..target.models import check_device, resolve_model
    from .common import PieceDone
    from .recipe import RECIPES, run_recipe

    _check_run_flags(prompts, max_new_tokens, dtype, output, max_minutes)
    check_device(device)  # (cpu, cuda or cuda:N; a CUDA device that is there: the one-line error otherwise)
    source = resolve_model(model)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with err.status(f"loading {model} ...", spinner="dots"):
        target = load_target(model, dtype=dtype, device=device, log=lambda s: err.print(s, markup=False),
                             threads=_train_threads())
    if corpus is None:  # the corpus committed for this target (a checkout's lab/data/), else a new one in the output
        from .data import shipped_corpus

        corpus = shipped_corpus(source.name) or output / "corpus"
    cs = _corpus_settings(corpus, source.name, prompts, max_new_tokens, seed, dtype, mix)
    with progress_bar("{task.description:>7}", info=True) as progress:
        tasks: dict[str, int] = {}
        lines = ProgressLines()  # (a line per step of progress where stderr is not a terminal)

        def bar(phase: str, done: int, total: int, info: str) -> None:
            if phase not in tasks:
                tasks[phase] = progress.add_task(phase, total=total, info="")
            progress.update(tasks[phase], completed=done, total=total, info=info)
            lines(phase, done, total, info)

        deadline = time.monotonic() + 60 * max_minutes if max_minutes else None
        try:
            record = run_recipe(kind, target, source.name, output, corpus, cs, settings, bar, eval_prompts, deadline,
                                extra or [])
        except PieceDone as piece:
            progress.stop()
            err.print(f"{output}: {piece}; checkpointed in {output / 'ckpt.pt'}. Run the same command again to go on.")
            return
    _report_done(output, record, RECIPES[kind])


def _check_run_flags(prompts: int, max_new_tokens: int, dtype: str, output: Path, max_minutes: float) -> None:
    """Refuse flags out of range before anything loads (one error line each)."""
    if prompts < 16:
        raise ConfigError(f"--prompts must be >= 16, got {prompts}")
    if max_new_tokens < 8:
        raise ConfigError(f"--max-new-tokens must be >= 8, got {max_new_tokens}")
    if dtype not in TRAIN_DTYPES:
        raise ConfigError(f"--dtype must be bfloat16, float16 or float32, got {dtype!r}")
    if output.exists() and not output.is_dir():
        raise ConfigError(f"--output {output} is a file: give a folder")
    if max_minutes < 0:
        raise ConfigError(f"--max-minutes must be >= 0 (0 = no limit), got {max_minutes:g}")


def _report_done(output: Path, record: dict, name: str) -> None:
    """What a finished recipe wrote, and its held-out τ and speed-up (stderr)."""
    from .data import log_folder, repo_path

    ev = record["eval"]
    logs = log_folder(output)
    where = "loss.png" if logs == output else f"loss log and plot in {repo_path(logs)}"
    err.print(f"wrote {output} (weights, README.md model card, {where}, recipe.json) in "
              f"{record['wall_s'] / 60:.1f} min")
    err.print(f"held-out τ {ev[name]['tau']:.2f} ({ev[name]['tok_s']:.1f} tok/s vs none {ev['none']['tok_s']:.1f}: "
              f"{ev['speedup']:.2f}x)")


@train_app.command("corpus")
def corpus(
    output: Path = _OUTPUT, model: str = _MODEL,
    prompts: int = typer.Option(24000, "--prompts", help="First-turn prompts (about 10% also get a second turn)."),
    max_new_tokens: int = typer.Option(144, "--max-new-tokens", help="Longest target answer per turn."),
    batch_size: int = typer.Option(64, "--batch-size", help="Prompts generated together."),
    mix: str = typer.Option("broad", "--mix", help="broad (chat, code, math, writing, ...), pydoc (small, no extra packages) or long (documents to summarise "
                       "or answer from, 330-2 050 tokens)."),
    seed: int = _SEED, dtype: str = _DTYPE, device: str = _DEVICE,
) -> None:
    """Build (or finish) a self-distillation corpus: the target's own greedy answers to a broad prompt mix."""

    from ..target.loader import load_target
    from ..target.models import check_device, resolve_model
    from .corpus import MIXES, CorpusSettings, build_corpus, corpus_stats, mix_prompts
    from .sources import require

    with one_error_line():
        if prompts < 16 or max_new_tokens < 8 or batch_size < 1:
            raise ConfigError("--prompts must be >= 16, --max-new-tokens >= 8 and --batch-size >= 1")
        if mix not in MIXES:
            raise ConfigError(f"--mix must be one of {', '.join(MIXES)}, got {mix!r}")
        if dtype not in TRAIN_DTYPES:
            raise ConfigError(f"--dtype must be bfloat16, float16 or float32, got {dtype!r}")
        if output.exists() and not output.is_dir():
            raise ConfigError(f"--output {output} is a file: give a folder")
        check_device(device)
        source = resolve_model(model)
        cs = CorpusSettings(source.name, prompts, max_new_tokens, batch_size, seed, dtype, mix)
        require(mix)  # every missing source package, named at once with its install command, before the model loads
        mix_prompts(cs)
        logging.getLogger("transformers").setLevel(logging.ERROR)
        with err.status(f"loading {model} ...", spinner="dots"):
            target = load_target(model, dtype=dtype, device=device, log=lambda s: err.print(s, markup=False),
                                 threads=_train_threads())
        import time

        t0 = time.perf_counter()
        lines = ProgressLines()
        with progress_bar("corpus") as progress:
            task = progress.add_task("corpus", total=None)

            def bar(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total)
                lines("corpus", done, total, "batches")

            build_corpus(target, output, cs, progress=bar)
        st = corpus_stats(output)
        err.print(f"wrote {output}: {st['records']} records, {st['prompt_tokens']} prompt + {st['response_tokens']} "
                  f"response tokens, {st['bytes'] / 2**20:.1f} MiB ({(time.perf_counter() - t0) / 60:.1f} min this run)")


def _recipe_command(kind: str, settings_cls: type, doc: str, check=None) -> None:
    """Register ``specframe train KIND``: the options every recipe shares, then the recipe's own, made from the
    ``cli`` fields of ``settings_cls`` (:mod:`specframe.training.options`: one place for a setting's flag, default,
    bounds and help). ``check(settings)`` refuses what the bounds cannot say (ConfigError)."""
    import inspect

    from .options import parameters, settings_from_options

    shared = {"model": (str, _MODEL), "output": (Path, _OUTPUT), "corpus": (Optional[Path], _CORPUS),
              "prompts": (int, _PROMPTS), "max_new_tokens": (int, _NEW), "seed": (int, _SEED), "dtype": (str, _DTYPE),
              "eval_prompts": (int, _EVAL), "mix": (str, _MIX), "device": (str, _DEVICE),
              "max_minutes": (float, _MINUTES), "extra_corpus": (Optional[list[Path]], _EXTRA)}

    def command(**given) -> None:
        with one_error_line():
            s = settings_from_options(settings_cls, given, seed=given["seed"])
            if check is not None:
                check(s)
            _run(kind, given["model"], given["output"], given["corpus"], given["prompts"], given["max_new_tokens"],
                 given["seed"], given["dtype"], given["eval_prompts"], s, given["mix"], given["device"],
                 given["max_minutes"], given["extra_corpus"])

    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=a, default=d) for n, (a, d) in shared.items()]
        + parameters(settings_cls))
    command.__doc__ = doc
    command.__name__ = kind
    train_app.command(kind)(command)


def _check_eagle(s) -> None:
    """An ``--init`` folder must hold a drafter of the ``--arch`` asked for."""
    marker = "eagle.json" if s.arch == "specframe" else "config.json"
    if s.init and not (Path(s.init) / marker).is_file():
        raise ConfigError(f"--init {s.init} is not an {'EAGLE' if s.arch == 'specframe' else 'EAGLE-3'} drafter folder "
                          f"(no {marker}): give one that `specframe train eagle --arch {s.arch}` wrote"
                          + (", e.g. plugins/weights/smollm2-135m-instruct/eagle" if s.arch == "specframe" else ""))


def _register() -> None:
    from .dflash import DFlashSettings
    from .draft import DraftSettings
    from .eagle import EagleSettings
    from .medusa import MedusaSettings
    from .pard import PardSettings

    _recipe_command("draft", DraftSettings,
                    "Distil a small draft model (a few of the target's layers, its embeddings and tokenizer) from the "
                    "target.")
    _recipe_command("eagle", EagleSettings,
                    "Train an EAGLE-style drafter on the target's own features and greedy answers (training-time "
                    "test).", _check_eagle)
    _recipe_command("medusa", MedusaSettings, "Train Medusa-1 heads on the target's own answers (self-distillation).")
    _recipe_command("pard", PardSettings,
                    "Train a PARD parallel draft (the draft-model proposer's parallel mode): the target itself with LoRA "
                    "adapters (self-drafting), or the shipped small draft.")
    _recipe_command("dflash", DFlashSettings,
                    "Train a DFlash block drafter (z-lab's layout, for the dflash proposer) on the target's own hidden "
                    "states and answers: random anchors, blocks of masks, decay-weighted cross-entropy.")


_register()
