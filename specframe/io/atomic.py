"""Output folders that appear whole or not at all: written into a temporary sibling folder, then swapped in."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable

MARK = ".specframe-output"  # in every folder written here: what a later run may replace whole


def check_output(output: Path, sources: Iterable[Path] = (), owned: bool = False) -> None:
    """Refuse an ``output`` folder whose replacement would delete what specframe did not write: a folder that is (or
    holds) one of ``sources``, a file, or a non-empty folder without specframe's mark (:data:`MARK`; ``owned``: the
    caller has checked that itself, e.g. a datastore's manifest or a user's ``--force``).

    Raises:
        ConfigError: the message names the folder and what to do instead.
    """
    from ..errors import ConfigError

    output = Path(output)
    where = output.resolve()
    for src in sources:
        s = Path(src).resolve()
        if s == where or where in s.parents:
            what = "is" if s == where else "holds"
            raise ConfigError(f"output folder {output} {what} the source {src}: writing there would delete it; give "
                              "another output folder")
    if owned:
        return
    if output.is_symlink() or (output.exists() and not output.is_dir()):
        raise ConfigError(f"output folder {output} is a file or a link, not a folder: give a new or empty folder")
    if output.is_dir() and not (output / MARK).is_file():
        entries = sorted(p.name for p in output.iterdir())
        if entries:
            raise ConfigError(f"output folder {output} already holds files specframe did not write ({len(entries)}, "
                              f"e.g. {entries[0]}): give a new or empty folder (it would be replaced whole)")


def replace_folder(output: Path, fill: Callable[[Path], None], sources: Iterable[Path] = (),
                   owned: bool = False) -> None:
    """Create (or replace) the folder ``output`` with what ``fill(tmp)`` writes into an empty temporary folder.

    The temporary folder is a hidden sibling (``.<name>.tmp-*``, so on the same file system); an existing ``output``
    is moved aside and removed only once the new one is in place. If ``fill`` raises (or the process is
    interrupted), ``output`` is left as it was and the temporary folder is removed: never half of each. Only a
    folder this function wrote (it leaves :data:`MARK` in it) or an empty one is replaced (:func:`check_output`).

    Raises:
        ConfigError: as :func:`check_output`, before anything is written.
    """
    output = Path(output)
    check_output(output, sources, owned)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; an output folder is as readable as any other
    aside: Path | None = None  # where the replaced folder waits until the new one is in place
    moved = False
    try:
        fill(tmp)
        (tmp / MARK).write_text("written by specframe: the next run writing this folder replaces it whole\n")
        if output.exists() or output.is_symlink():  # move the old one aside, then swap
            aside = Path(tempfile.mkdtemp(prefix=f".{output.name}.old-", dir=output.parent))
            os.replace(output, aside / "old")
            moved = True
        os.replace(tmp, output)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if aside is not None:
            if moved and not output.exists():  # the swap failed: put the old one back
                os.replace(aside / "old", output)
            shutil.rmtree(aside, ignore_errors=True)
