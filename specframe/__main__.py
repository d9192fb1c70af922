"""``python -m specframe``: the same command line as ``specframe``."""

from .cli import main

main()
