"""``python -m specframe.cli``: the same command line as ``specframe``."""

from .app import main

main()
