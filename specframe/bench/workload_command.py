"""``specframe workload build``: write the SPEED-Bench-shaped workload (:mod:`specframe.bench.workload`).

Every user error prints one ``error: ...`` line on stderr, exits with code 2 and writes nothing: the workload is
built in memory first, and its folder is written to a temporary sibling and renamed into place only when complete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..cli.console import err, fail
from ..errors import ConfigError, ModelNotInstalledError, SpecframeError, UnknownModelError

workload_app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Benchmark workloads: a SPEED-Bench-shaped set of prompts built from text that may be shipped.",
)
DEFAULT_TOKENIZER = "smollm2-135m-instruct"


def _lengths(text: str) -> tuple[int, ...]:
    """``"1024,2048,8192"`` -> ``(1024, 2048, 8192)``; ``""`` or ``"none"`` -> ``()``.

    Raises:
        ConfigError: a part that is not a whole number.
    """
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(f"--long {text!r}: give token counts separated by commas, e.g. 1024,2048,8192, or none"
                          ) from None


@workload_app.command("build")
def build(
    output: Path = typer.Option(..., "--output", help="Folder to write questions.jsonl, sources.json and SOURCES.md "
                                                      "into (a folder this command wrote is replaced)."),
    per_category: int = typer.Option(6, "--per-category", help="Qualitative prompts per category, spread over the "
                                                               "low / mixed / high entropy tiers."),
    long: str = typer.Option("1000,2000,8000", "--long", help="Input lengths (tokens, at most) of the throughput "
                                                              "splits, comma-separated; none for no long inputs."),
    long_per_tier: int = typer.Option(1, "--long-per-tier", help="Long prompts per length and entropy tier."),
    seed: int = typer.Option(0, "--seed", help="Seed of every random choice: the same seed gives the same files."),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", help=f"Model whose tokenizer counts tokens, or 'approx' (no tokenizer). Default: "
                                  f"{DEFAULT_TOKENIZER}, else approx when it is not installed."),
    specbench: Optional[Path] = typer.Option(
        None, "--specbench", help="Spec-Bench question.jsonl whose MT-bench and GSM8K questions join the mixed tier "
                                  "(default: ../shared/specbench/question.jsonl when it exists)."),
    no_specbench: bool = typer.Option(False, "--no-specbench", help="Use no Spec-Bench questions."),
) -> None:
    """Write a SPEED-Bench-shaped workload (11 categories x low / mixed / high entropy, and long inputs) built from the
    standard library, installed packages' READMEs, Spec-Bench's MT-bench and GSM8K questions and specframe's own
    templates, each licence checked and listed in SOURCES.md."""
    try:
        _build(output, per_category, _lengths(long), long_per_tier, seed, tokenizer, specbench, no_specbench)
    except SpecframeError as exc:
        fail(exc)


def _counter(tokenizer: str | None):
    from .workload import APPROX, TokenCounter, approx_tokens, model_counter

    if tokenizer == APPROX:
        return TokenCounter(APPROX, approx_tokens)
    try:
        with err.status(f"loading the {tokenizer or DEFAULT_TOKENIZER} tokenizer ...", spinner="dots"):
            return model_counter(tokenizer or DEFAULT_TOKENIZER)
    except ModelNotInstalledError as exc:
        if tokenizer is not None:
            raise ConfigError(f"--tokenizer {tokenizer}: {exc}") from None
        err.print(f"warning: {exc}; counting tokens approximately (--tokenizer approx)", markup=False, soft_wrap=True)
        return TokenCounter(APPROX, approx_tokens)
    except UnknownModelError as exc:
        raise ConfigError(f"--tokenizer {tokenizer}: {exc} (or approx: no tokenizer)") from None


def _build(output: Path, per_category: int, long: tuple[int, ...], long_per_tier: int, seed: int,
           tokenizer: str | None, specbench: Path | None, no_specbench: bool) -> None:
    from ..io.atomic import check_output
    from .workload import CATEGORIES, TIERS, build_workload, write_workload
    from .workload_sources import default_specbench

    if specbench is not None and no_specbench:
        raise ConfigError("--specbench and --no-specbench: give one of them")
    if specbench is not None and not specbench.is_file():
        raise ConfigError(f"--specbench {specbench}: no such file")
    check_output(output)  # before any work
    questions = None if no_specbench else (specbench or default_specbench())
    w = build_workload(per_category, long, long_per_tier, seed, _counter(tokenizer), questions)
    names = write_workload(w, output)
    counts = w.counts()
    err.print(f"wrote {output}: {', '.join(names)} — {len(w.records)} prompts, tokens counted with "
              f"{w.settings['tokenizer']}", markup=False, soft_wrap=True)
    for split, table in counts.items():
        per_tier = {t: sum(row[t] for row in table.values()) for t in TIERS}
        tokens = [r["context_tokens"] for r in w.records if r["split"] == split]
        what = (f"{len([c for c in CATEGORIES if c in table])} categories" if split == "qualitative"
                else f"{min(tokens)}-{max(tokens)} tokens")
        err.print(f"  {split}: {sum(per_tier.values())} prompts, {what}, "
                  + " / ".join(f"{per_tier[t]} {t}" for t in TIERS), markup=False)
    err.print("  sources: " + ", ".join(f"{s.name} ({s.licence})" for s in w.sources), markup=False, soft_wrap=True)
