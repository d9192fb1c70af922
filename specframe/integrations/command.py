"""``specframe vllm``: get a model and a specframe config ready for vLLM (docs/vllm.md)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..cli.console import fail
from ..errors import SpecframeError

vllm_app = typer.Typer(no_args_is_help=True, help="Run specframe proposers inside vLLM (docs/vllm.md).")


@vllm_app.command("config")
def config_command(
    config: Path = typer.Option(..., "--config", help="specframe YAML config naming the proposers (and merge/router)."),
    k: int = typer.Option(4, "-k", "--num-speculative-tokens", help="Longest draft per request and step (vLLM's k)."),
) -> None:
    """Check a specframe config for vLLM and print vLLM's --speculative-config JSON (set SPECFRAME_CONFIG to the
    same file for `vllm serve`)."""
    from .vllm import speculative_config

    try:
        spec = speculative_config(config, k)
    except SpecframeError as exc:
        fail(exc)
    typer.echo(json.dumps(spec))


@vllm_app.command("export")
def export_command(
    model: str = typer.Option("smollm2-135m-instruct", "--model", help="Built-in name, model folder or .gguf file."),
    output: Path = typer.Option(..., "--output", help="Folder to write (replaced whole)."),
) -> None:
    """Write a model as a plain transformers folder vLLM loads (float32, tokenizer, chat template)."""
    from .vllm import export_model

    if output.exists() and not output.is_dir():
        fail(f"--output {output} is a file: give a folder")
    try:
        export_model(model, output)
    except SpecframeError as exc:
        fail(exc)
    typer.echo(str(output))
