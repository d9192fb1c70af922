"""Reading drafter checkpoints published in other projects' layouts: a folder with ``config.json`` and weights as
``model.safetensors``, sharded ``model-*.safetensors`` (with ``model.safetensors.index.json``), ``pytorch_model.bin``
or a named file (Medusa's ``medusa_lm_head.safetensors`` / ``.pt``); and checking the target they were made for.

No network: a checkpoint is always a local folder (a download made beforehand, e.g. ``hf download REPO --local-dir
DIR``)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError

log = logging.getLogger("specframe")


def read_config(folder: Path) -> dict:
    """``folder/config.json`` as a dict.

    Raises:
        ConfigError: the folder or its ``config.json`` is missing or not JSON."""
    if not folder.is_dir():
        raise ConfigError(f"drafter checkpoint {folder} is not a folder: point `checkpoint:` at the folder of a "
                          f"downloaded drafter (the one with config.json)")
    path = folder / "config.json"
    if not path.is_file():
        raise ConfigError(f"{folder} has no config.json: it holds no drafter checkpoint this specframe reads")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is not readable JSON ({e})") from None


def weight_files(folder: Path, names: tuple[str, ...] = ()) -> list[Path]:
    """The weight files of a checkpoint folder: ``names`` first (the first that exists), then
    ``model.safetensors``, the shards listed by ``model.safetensors.index.json``, ``model-*.safetensors``,
    ``pytorch_model.bin``.

    Raises:
        ConfigError: none is there."""
    for name in (*names, "model.safetensors"):
        if (folder / name).is_file():
            return [folder / name]
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        return [folder / s for s in shards]
    shards = sorted(folder.glob("model-*.safetensors"))
    if shards:
        return shards
    if (folder / "pytorch_model.bin").is_file():
        return [folder / "pytorch_model.bin"]
    want = ", ".join((*names, "model.safetensors", "pytorch_model.bin"))
    raise ConfigError(f"{folder} holds no weights (looked for {want})")


def read_weights(files: list[Path], keep: Any = None) -> dict[str, Tensor]:
    """Tensors of ``files`` (safetensors, or a torch pickle read with ``weights_only``), those whose name passes
    ``keep(name)`` when given.

    Raises:
        ConfigError: a file that cannot be read as either."""
    import safetensors

    out: dict[str, Tensor] = {}
    for f in files:
        try:
            if f.suffix == ".safetensors":
                with safetensors.safe_open(str(f), framework="pt") as fh:
                    for k in fh.keys():
                        if keep is None or keep(k):
                            out[k] = fh.get_tensor(k)
            else:
                state = torch.load(str(f), map_location="cpu", weights_only=True)
                out.update({k: v for k, v in state.items() if keep is None or keep(k)})
        except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
            raise ConfigError(f"cannot read weights from {f}: {type(e).__name__}: {e}") from None
    return out


def _plain(name: str) -> str:
    """A model name without its organisation and case: ``HuggingFaceTB/SmolLM2-135M-Instruct`` ->
    ``smollm2-135m-instruct``."""
    return re.sub(r"[^a-z0-9.]+", "-", Path(str(name).rstrip("/")).name.lower()).strip("-")


def check_target_name(kind: str, folder: Path, named: str | None, target_name: str, extra: tuple[str, ...] = ()) -> None:
    """Warn when the checkpoint names a target model (``named``) other than the loaded one (``target_name`` or one
    of ``extra``, e.g. its folder); shapes are checked separately, so a mismatch here is only a name."""
    if not named:
        return
    have = {_plain(n) for n in (target_name, *extra) if n}
    if _plain(named) not in have:
        log.warning("%s checkpoint %s was made for %r, the target is %r: the shapes match, so it loads; its drafts "
                    "may be poor", kind, folder, named, target_name)


def mismatch(kind: str, folder: Path, what: str, theirs: Any, ours: Any, named: str | None) -> ConfigError:
    """The one error for a checkpoint made for another target's shapes."""
    made = f" (made for {named})" if named else ""
    return ConfigError(f"{kind} checkpoint {folder}{made} does not fit this target: its {what} is {theirs}, the "
                       f"target's is {ours}; use a drafter made for this model")
