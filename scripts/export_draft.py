"""Export a specframe small draft (``specframe train draft`` output, default: the one shipped for the target) as a
self-contained transformers model, e.g. the ``assistant_model`` of transformers' assisted generation (the
``hf-assisted`` peer in ``specframe bench``).

    python scripts/export_draft.py --draft runs/draft --output runs/draft-standalone

The draft shipped for a built-in target needs no export by hand: the model name ``<target>-draft`` (e.g.
``smollm2-135m-instruct-draft``) exports it into the model cache on first use (:mod:`specframe.target.models`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specframe.errors import SpecframeError
from specframe.learned.small_draft import export_standalone
from specframe.target.loader import load_target


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="target model (name or folder)")
    ap.add_argument("--draft", default=None, help="draft folder (default: the draft shipped for the target)")
    ap.add_argument("--output", required=True, help="folder to write (new, empty, or an earlier export, which is replaced)")
    args = ap.parse_args()
    try:
        target = load_target(args.model, dtype="float32")
        if args.draft is None:
            from specframe_plugins.weights import weights_folder

            folder = weights_folder(None, target.name, "draft-model", "A small draft is",
                                    "pass --draft DIR (written by `specframe train draft`)")
        else:
            folder = Path(args.draft)
        out = export_standalone(folder, target.model, target.tokenizer, Path(args.output))
    except SpecframeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
