"""Bridges to other serving stacks (each imports its host lazily: specframe never needs them installed)."""
