"""The ``specframe`` command line: :mod:`.commands` (the commands), :mod:`.console` (what every command shares)."""

from .commands import app, main

__all__ = ["app", "main"]
