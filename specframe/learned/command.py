"""``specframe export``: a drafter in a layout vLLM, SGLang, EAGLE or Medusa load (docs/drafters.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..cli.console import fail
from ..errors import SpecframeError

export_app = typer.Typer(no_args_is_help=True, help="Write a drafter in a published layout (docs/drafters.md).")

_OUTPUT = typer.Option(..., "--output", help="Folder to write (replaced whole).")
_MODEL = typer.Option("smollm2-135m-instruct", "--model", help="The target: built-in name, model folder or .gguf.")
_VERIFIER = typer.Option(None, "--verifier", help="The target's name as the exported config records it (vLLM "
                         "loads the verifier from it when serving the drafter folder alone); default: the source's, "
                         "else --model.")


def _check_output(output: Path, src: Path) -> None:
    """Before anything loads: the source is a folder, and ``--output`` neither is nor holds it, nor holds files
    export did not write (it is replaced whole: :func:`specframe.io.atomic.check_output`)."""
    from ..errors import ConfigError
    from ..io.atomic import check_output

    if not src.is_dir():
        fail(f"{src} is not a folder: give the drafter's folder")
    try:
        check_output(output, [src])
    except ConfigError as exc:
        fail(f"--output: {exc}")


@export_app.command("eagle3")
def eagle3(
    src: Path = typer.Argument(..., help="Folder of an EAGLE-3 drafter (speculators or EAGLE-3 native layout; "
                               "`specframe train eagle --arch eagle3` writes one)."),
    fmt: str = typer.Option("speculators", "--format", help="speculators (vLLM) or eagle3 (SafeAILab/EAGLE, SGLang)."),
    output: Path = _OUTPUT, model: str = _MODEL, verifier: Optional[str] = _VERIFIER,
    speculative_tokens: Optional[int] = typer.Option(None, "--speculative-tokens", min=1,
                                                     help="Draft tokens per step the speculators config proposes."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="float32, bfloat16 or float16; default: the source's."),
) -> None:
    """Write an EAGLE-3 drafter as speculators or EAGLE-3 native."""
    from .export import export_eagle3

    _check_output(output, src)
    try:
        export_eagle3(src, fmt, output, model, verifier, speculative_tokens, dtype)
    except SpecframeError as exc:
        fail(exc)
    typer.echo(str(output))


@export_app.command("medusa")
def medusa(
    src: Path = typer.Argument(..., help="Folder of Medusa heads (specframe's medusa.json, or published ones)."),
    fmt: str = typer.Option("medusa", "--format", help="medusa (FasterDecoding) or vllm-medusa (vLLM)."),
    output: Path = _OUTPUT, model: str = _MODEL, verifier: Optional[str] = _VERIFIER,
) -> None:
    """Write Medusa heads as FasterDecoding's or vLLM's layout."""
    from .export import export_medusa

    _check_output(output, src)
    try:
        export_medusa(src, fmt, output, model, verifier)
    except SpecframeError as exc:
        fail(exc)
    typer.echo(str(output))


@export_app.command("dflash")
def dflash(
    src: Path = typer.Argument(..., help="Folder of a DFlash or DFlash2 drafter in z-lab's layout (`specframe train "
                               "dflash` writes one)."),
    output: Path = _OUTPUT, model: str = _MODEL,
    dtype: Optional[str] = typer.Option(None, "--dtype", help="float32, bfloat16 or float16; default: the source's."),
) -> None:
    """Write a DFlash / DFlash2 drafter in z-lab's layout, checked against the target."""
    from .export import export_dflash

    _check_output(output, src)
    try:
        export_dflash(src, output, model, dtype)
    except SpecframeError as exc:
        fail(exc)
    typer.echo(str(output))
