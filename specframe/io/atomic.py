"""Output folders that appear whole or not at all: written into a temporary sibling folder, then swapped in."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def replace_folder(output: Path, fill: Callable[[Path], None]) -> None:
    """Create (or replace) the folder ``output`` with what ``fill(tmp)`` writes into an empty temporary folder.

    The temporary folder is a hidden sibling (``.<name>.tmp-*``, so on the same file system); an existing ``output``
    is moved aside and removed only once the new one is in place. If ``fill`` raises (or the process is
    interrupted), ``output`` is left as it was and the temporary folder is removed: never half of each.
    """
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; an output folder is as readable as any other
    aside: Path | None = None  # where the replaced folder waits until the new one is in place
    moved = False
    try:
        fill(tmp)
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
