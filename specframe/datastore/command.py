"""``specframe datastore build``: index a corpus for the ``retrieval`` proposer.

Every user error prints one ``error: ...`` line on stderr, exits with code 2 and writes nothing: inputs are
read and tokenized in memory first, and the datastore folder is written to a temporary sibling and renamed into
place only when complete.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from ..cli.console import err, fail
from ..errors import SpecframeError

datastore_app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Retrieval datastores (suffix arrays over a corpus's token ids) for the retrieval proposer.",
)


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


@datastore_app.command("build")
def build(
    output: Path = typer.Option(..., "--output", help="Datastore folder to write (an existing datastore is replaced)."),
    model: str = typer.Option(
        "smollm2-135m-instruct", "--model", help="Target whose tokenizer to use: built-in name, model folder or .gguf."
    ),
    inputs: Optional[List[Path]] = typer.Option(
        None, "--input", help="A .txt file (one document) or .jsonl file (one document per line); repeatable."
    ),
    preset: Optional[str] = typer.Option(
        None, "--preset", help="Built-in text: pydoc (Python reference manual topics, PSF-2.0)."
    ),
    field: str = typer.Option("text", "--field", help="JSONL field holding each document's text."),
    force: bool = typer.Option(False, "--force", help="Replace --output even if it is not a datastore."),
) -> None:
    """Tokenize text with the target's tokenizer and write a suffix-array datastore."""
    try:
        _build(output, model, list(inputs or []), preset, field, force)
    except SpecframeError as exc:
        fail(exc)


def _build(output: Path, model: str, inputs: list[Path], preset: Optional[str], field: str, force: bool) -> None:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    from .sources import load_tokenizer, read_file, read_preset, tokenize, tokenizer_info
    from .store import DatastoreError, build_datastore, occupied

    if not inputs and preset is None:
        raise DatastoreError("nothing to index: give --input FILE (repeatable) and/or --preset pydoc")
    kind = None if force else occupied(output)  # before any work
    if kind is not None:
        raise DatastoreError(f"--output {output} is {kind}: choose another path or pass --force to replace it")
    t0 = time.perf_counter()
    sources = ([read_preset(preset)] if preset is not None else []) + [read_file(p, field) for p in inputs]
    texts = [t for s in sources for t in s.texts]
    if not texts:
        raise DatastoreError("empty input: the inputs hold no text")
    read_s = time.perf_counter() - t0
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with err.status(f"loading the {model} tokenizer ...", spinner="dots"):
        tokenizer, name = load_tokenizer(model, log=lambda s: err.print(s, markup=False))
    total = sum(s.info["bytes"] for s in sources)
    t1 = time.perf_counter()  # build time = reading + tokenizing + indexing (loading the tokenizer is not counted)
    cols = (TextColumn("tokenizing"), BarColumn(), DownloadColumn(), TimeElapsedColumn())
    with Progress(*cols, console=err, transient=True) as progress:
        task = progress.add_task("tokenizing", total=total)
        ids = tokenize(tokenizer, texts, lambda n: progress.advance(task, n))
    if not any(ids):
        raise DatastoreError("empty input: the text tokenizes to no tokens")
    with err.status("building the suffix array ...", spinner="dots"):
        ds = build_datastore(
            ids, output, vocab_size=len(tokenizer), model=name, tokenizer=tokenizer_info(tokenizer),
            sources=[s.info for s in sources], input_bytes=total, force=force,
            extra_build_s=read_s + time.perf_counter() - t1,
        )
    m = ds.manifest
    sys.stdout.write(
        f"wrote {output}: {m['num_tokens']:,} tokens in {m['num_documents']:,} documents from "
        f"{_size(total)} of text, built in {m['build_s']:.1f} s, {_size(ds.size_bytes())} on disk\n"
    )
