"""The plugin registry: a pluggy manager that finds plugins through entry points and collects the proposer
and verifier classes they register.

Plugins are found in the entry-point group ``specframe``; built-in plugins (``specframe_plugins.*``) are
declared there too. ``SPECFRAME_PLUGINS=ngram,my-plugin`` loads only the named entry points (the core
verifiers always load).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pluggy

from . import hookspecs, verifiers
from .errors import DuplicateRegistrationError, UnknownProposerError

ALLOW_ENV = "SPECFRAME_PLUGINS"


@dataclass
class Registry:
    """Proposer and verifier classes by name, and where each came from."""

    plugin_manager: pluggy.PluginManager
    proposers: dict[str, type] = field(default_factory=dict)
    verifiers: dict[str, type] = field(default_factory=dict)
    origin: dict[tuple[str, str], str] = field(default_factory=dict)  # (kind, name) -> plugin description

    def proposer(self, name: str) -> type:
        try:
            return self.proposers[name]
        except KeyError:
            raise UnknownProposerError(
                f"unknown proposer {name!r}; installed: {', '.join(sorted(self.proposers)) or '(none)'}"
            ) from None

    def verifier(self, name: str) -> type:
        try:
            return self.verifiers[name]
        except KeyError:
            raise UnknownProposerError(
                f"unknown verifier {name!r}; installed: {', '.join(sorted(self.verifiers)) or '(none)'}"
            ) from None


def _describe(pm: pluggy.PluginManager, plugin: object) -> str:
    for p, dist in pm.list_plugin_distinfo():
        if p is plugin:
            return f"{pm.get_name(plugin)} ({dist.project_name} {dist.version})"
    return str(pm.get_name(plugin))


def _collect(pm: pluggy.PluginManager, hook_name: str, kind: str, table: dict, origin: dict) -> None:
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        where = _describe(pm, impl.plugin)

        def register(cls: type, _where: str = where) -> None:
            name = getattr(cls, "name", "")
            if not isinstance(name, str) or not name:
                raise DuplicateRegistrationError(f"{kind} class {cls!r} from {_where} has no `name`")
            if name in table and table[name] is not cls:
                raise DuplicateRegistrationError(
                    f"{kind} {name!r} is registered by both {origin[(kind, name)]} and {_where}; "
                    f"uninstall one or restrict loading with {ALLOW_ENV}"
                )
            table[name] = cls
            origin[(kind, name)] = _where

        impl.function(register=register)


def build_registry(*, entry_points: bool = True, extra_plugins: tuple[object, ...] = ()) -> Registry:
    """Build a fresh registry.

    Args:
        entry_points: load plugins from the ``specframe`` entry-point group (filtered by ``SPECFRAME_PLUGINS``).
        extra_plugins: plugin modules or objects to register directly (tests, embedding applications).

    Raises:
        DuplicateRegistrationError: two plugins register the same name.
        pluggy.PluginValidationError: a hook implementation does not match any hook spec (a misspelt hook).
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(verifiers, name="specframe.verifiers")
    if entry_points:
        allow = os.environ.get(ALLOW_ENV)
        if allow is None:
            pm.load_setuptools_entrypoints(hookspecs.PROJECT)
        else:
            for name in filter(None, (n.strip() for n in allow.split(","))):
                pm.load_setuptools_entrypoints(hookspecs.PROJECT, name=name)
    for plugin in extra_plugins:
        pm.register(plugin)
    pm.check_pending()
    reg = Registry(pm)
    _collect(pm, "specframe_register_proposers", "proposer", reg.proposers, reg.origin)
    _collect(pm, "specframe_register_verifiers", "verifier", reg.verifiers, reg.origin)
    return reg
