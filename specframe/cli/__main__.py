"""``python -m specframe.cli``: the same command line as ``specframe``."""

from .commands import main

main()
