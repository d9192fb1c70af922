"""The ``specframe`` command line: :mod:`.app` (the commands), :mod:`.console` (what every command shares)."""

from .app import app, main

__all__ = ["app", "main"]
