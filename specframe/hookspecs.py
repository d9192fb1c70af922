"""pluggy hook specifications: plugins *register* proposers and verifiers here; the decode loop never calls a
hook (it calls the registered classes' methods directly).

A plugin is a module or object with functions marked ``@specframe.hookimpl``; it is found through the package
entry-point group ``specframe`` (built-in plugins use the same group).
"""

from __future__ import annotations

from typing import Callable

import pluggy

PROJECT = "specframe"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def specframe_register_proposers(register: Callable[[type], None]) -> None:
    """Register the proposer classes this plugin provides.

    :param register: call ``register(cls)`` once per class. ``cls.name`` is the name used in config and on
        the command line, ``cls.Config`` its pydantic config model (a :class:`specframe.ProposerConfig`).

    Dispatch: every implementation is called (not firstresult); return values are ignored.
    When called: once, when a :class:`specframe.registry.Registry` is built. A name registered twice raises
    :class:`specframe.errors.DuplicateRegistrationError` naming both plugins.
    """


@hookspec
def specframe_register_verifiers(register: Callable[[type], None]) -> None:
    """Register the verifier classes this plugin provides.

    :param register: call ``register(cls)`` once per class; ``cls.name`` selects it (``--verifier`` / config).

    Dispatch: every implementation is called; return values are ignored.
    When called: once, when a registry is built. Duplicate names raise ``DuplicateRegistrationError``.
    """
