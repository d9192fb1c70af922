"""Run specframe on this machine with another machine's profile (issue 67, must-show e: "force it if the machine
at hand has none"): a cache folder whose machine profile for ``--model`` is ``FILE``, the rest of the cache shared.

specframe looks a profile up as ``$SPECFRAME_CACHE/machine/<key>.json``, ``<key>`` a hash of this machine's
fingerprint, the model and the device (``specframe.target.profile.profile_path``). This script writes ``FILE`` there
under this machine's key inside ``--cache`` (a folder of its own: the real cache is not touched) and links the real
cache's other entries (``models/``, ``datastores/``, ...) into it, so nothing is downloaded or converted again.
Then every command run with ``SPECFRAME_CACHE=<that folder>`` chooses its settings from ``FILE``:

    python lab/scripts/force_profile.py lab/data/machine-profiles/xeon-2c-split.json --cache /tmp/xeon-cache
    SPECFRAME_CACHE=/tmp/xeon-cache specframe tune
    SPECFRAME_CACHE=/tmp/xeon-cache specframe bench --config docs/bench.machine.yaml --output /tmp/xeon-bench

The choice and the router's cost curve come from ``FILE``; the times are still this machine's. A candidate this
machine cannot run (pre-packed bf16 where oneDNN has no bf16 packing, e.g. AVX2-only CPUs) is never chosen: there
the next one of the profile's ranking is. The profile's ``others_load`` is 0 and its version current, so it is used
as it is, never measured again (unless ``specframe tune --refresh``, which overwrites it in that folder).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from specframe.target.machine import fingerprint_key
from specframe.target.models import cache_root
from specframe.target.profile import PROFILE_VERSION, MachineProfile


def force(source: Path, cache: Path, model: str, device: str = "cpu", real: Path | None = None) -> Path:
    """Write ``source`` (a profile JSON) as this machine's profile of ``model`` on ``device`` in ``cache`` and link
    ``real``'s (default: the current cache root) other entries into ``cache``. Returns the profile's path.

    Raises:
        ValueError: ``source`` is not a profile specframe reads, or ``cache`` is the real cache itself.
        OSError: a file cannot be read or written.
    """
    real = (real or cache_root()).resolve()
    cache = cache.resolve()
    if cache == real:
        raise ValueError(f"--cache {cache} is the cache in use: give a folder of its own")
    doc = json.loads(source.read_text())
    prof = MachineProfile.from_json(doc)  # refuses what specframe would not read
    if prof.version != PROFILE_VERSION:
        raise ValueError(f"{source} is of profile version {prof.version}: specframe would measure it again")
    key = fingerprint_key(model, device)
    doc = {**doc, "key": key, "model": model, "device": device, "others_load": 0.0, "forced_from": str(source)}
    path = cache / "machine" / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    if real.is_dir():
        for entry in real.iterdir():
            link = cache / entry.name
            if entry.name != "machine" and not link.exists() and not link.is_symlink():
                os.symlink(entry, link)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path, help="the profile JSON to force (e.g. lab/data/machine-profiles/...)")
    ap.add_argument("--cache", type=Path, required=True, help="the cache folder to write (not the one in use)")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="the model the profile is for (its name)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    try:
        path = force(args.profile, args.cache, args.model, args.device)
    except (ValueError, KeyError, TypeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{path}\nrun with: SPECFRAME_CACHE={args.cache} specframe ...")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
