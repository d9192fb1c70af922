"""The ``adaptive`` router (see :mod:`.adaptive`)."""

from .adaptive import AdaptiveConfig, AdaptiveRouter, specframe_register_routers

__all__ = ["AdaptiveConfig", "AdaptiveRouter", "specframe_register_routers"]
