"""The plugin registry: a pluggy manager that finds plugins through entry points and collects the proposer,
verifier, merge policy, router, constraint engine, tool-call parser and reasoning parser classes they register, with
the distribution each came from.

Plugins are found in the entry-point group ``specframe``; built-in plugins (``specframe_plugins.*``) are declared
there too. ``SPECFRAME_PLUGINS=ngram,specframe-recall`` loads only the named entry points or distributions (the
core verifiers always load; an empty value loads none). Every entry point is registered under its own name, so
two distributions that both call their entry point ``ngram`` are both loaded (and then collide on the proposer
name, loudly) instead of one silently shadowing the other.

One broken installed plugin never disables the others: an entry point that fails to import, implements an unknown
hook or registers a class that breaks the contract is left out, listed with its error (``PluginInfo.error``,
``specframe plugins``) and logged once as a warning; a name two plugins register is refused when it is used
(``DuplicateRegistrationError`` naming both), every other name works. Plugins passed in ``extra_plugins`` (code,
not an installation) still raise at once.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from importlib import metadata
from itertools import count
from typing import Any, Literal, get_args, get_origin

import pluggy

from . import __version__, acceptance, hookspecs
from .contracts import ProposerConfig
from .contracts.combining import MergePolicyConfig, RouterConfig
from .contracts.proposer import names_itself
from .decode.observe import Observers
from .errors import (
    DuplicateRegistrationError,
    PluginContractError,
    PluginLoadError,
    UnknownConstraintEngineError,
    UnknownMergePolicyError,
    UnknownNameError,
    UnknownProposerError,
    UnknownReasoningParserError,
    UnknownRouterError,
    UnknownToolParserError,
    UnknownVerifierError,
)
from .grammar import llguidance_engine

log = logging.getLogger("specframe")

ALLOW_ENV = "SPECFRAME_PLUGINS"
OBSERVER_HOOKS = ("specframe_observe_step", "specframe_observe_request")


@dataclass
class PluginInfo:
    """One registered plugin (an entry point, the core verifiers, or an object passed in ``extra_plugins``)."""

    name: str  # entry-point name (pluggy's plugin name)
    distribution: str  # the distribution that declares it ("" when registered directly)
    version: str
    module: str  # the plugin module or object's type
    proposers: list[type] = field(default_factory=list)
    verifiers: list[type] = field(default_factory=list)
    merge_policies: list[type] = field(default_factory=list)
    routers: list[type] = field(default_factory=list)
    constraint_engines: list[type] = field(default_factory=list)
    tool_parsers: list[type] = field(default_factory=list)
    reasoning_parsers: list[type] = field(default_factory=list)
    observes: list[str] = field(default_factory=list)  # observer hooks it implements
    error: str | None = None  # why the plugin is left out (import error, contract break); None = loaded
    conflicts: list[str] = field(default_factory=list)  # names it registers that another plugin registers too

    def describe(self) -> str:
        """E.g. ``recall (specframe-recall 0.1.0)``."""
        return f"{self.name} ({self.distribution} {self.version})" if self.distribution else self.name


@dataclass
class Registry:
    """Proposer, verifier, merge policy and router classes by name, the plugins they came from, and the observer
    implementations."""

    plugin_manager: pluggy.PluginManager
    proposers: dict[str, type] = field(default_factory=dict)
    verifiers: dict[str, type] = field(default_factory=dict)
    merge_policies: dict[str, type] = field(default_factory=dict)
    routers: dict[str, type] = field(default_factory=dict)
    constraint_engines: dict[str, type] = field(default_factory=dict)
    tool_parsers: dict[str, type] = field(default_factory=dict)
    reasoning_parsers: dict[str, type] = field(default_factory=dict)
    origin: dict[tuple[str, str], str] = field(default_factory=dict)  # (kind, name) -> plugin description
    plugins: list[PluginInfo] = field(default_factory=list)
    conflicts: dict[tuple[str, str], str] = field(default_factory=dict)  # (kind, name) -> why it is refused
    _requests: Any = field(default_factory=count, repr=False)

    @property
    def broken(self) -> list[PluginInfo]:
        """Installed plugins left out because they failed to load (each with its ``error``)."""
        return [p for p in self.plugins if p.error]

    def _lookup(self, kind: str, table: dict[str, type], name: str, error: type[UnknownNameError],
                hint: str = "") -> type:
        if (kind, name) in self.conflicts:
            raise DuplicateRegistrationError(self.conflicts[(kind, name)])
        if name in table:
            return table[name]
        broken = ""
        if self.broken:
            broken = ("; left out because they failed to load (see `specframe plugins`): "
                      + ", ".join(p.describe() for p in self.broken))
        raise error(f"unknown {kind} {name!r}; installed: {', '.join(sorted(table)) or '(none)'}{hint}{broken}")

    def proposer(self, name: str) -> type:
        """The proposer class registered as ``name``.

        Raises:
            UnknownProposerError: no loaded plugin provides it (lists the installed ones and any broken plugin).
            DuplicateRegistrationError: two plugins register that name (names both).
        """
        return self._lookup("proposer", self.proposers, name, UnknownProposerError)

    def verifier(self, name: str) -> type:
        """The verifier class registered as ``name`` (raises ``UnknownVerifierError``, else as :meth:`proposer`)."""
        return self._lookup("verifier", self.verifiers, name, UnknownVerifierError)

    def merge_policy(self, name: str) -> type:
        """The merge policy class registered as ``name`` (raises ``UnknownMergePolicyError``, else as
        :meth:`proposer`)."""
        return self._lookup("merge policy", self.merge_policies, name, UnknownMergePolicyError)

    def router(self, name: str) -> type:
        """The router class registered as ``name`` (raises ``UnknownRouterError``, else as :meth:`proposer`)."""
        return self._lookup("router", self.routers, name, UnknownRouterError, " (or `router: none` for no router)")

    def constraint_engine(self, name: str) -> type:
        """The constraint engine class registered as ``name`` (raises ``UnknownConstraintEngineError``, else as
        :meth:`proposer`)."""
        return self._lookup("constraint engine", self.constraint_engines, name, UnknownConstraintEngineError)

    def tool_parser(self, name: str) -> type:
        """The tool-call parser class registered as ``name`` (raises ``UnknownToolParserError``, else as
        :meth:`proposer`)."""
        return self._lookup("tool parser", self.tool_parsers, name, UnknownToolParserError)

    def reasoning_parser(self, name: str) -> type:
        """The reasoning parser class registered as ``name`` (raises ``UnknownReasoningParserError``, else as
        :meth:`proposer`)."""
        return self._lookup("reasoning parser", self.reasoning_parsers, name, UnknownReasoningParserError)

    def tool_parser_for_template(self, chat_template: str | None) -> type | None:
        """The tool-call parser whose ``detect`` accepts ``chat_template``, highest ``priority`` first (ties by
        name); None when none does (no template, or no ``generic`` fallback installed). A name two plugins register
        is skipped."""
        return _detect(self, "tool parser", self.tool_parsers, chat_template)

    def reasoning_parser_for_template(self, chat_template: str | None) -> type | None:
        """The reasoning parser whose ``detect`` accepts ``chat_template`` (as :meth:`tool_parser_for_template`);
        None for a model that does not reason."""
        return _detect(self, "reasoning parser", self.reasoning_parsers, chat_template)

    def observers(self) -> Observers | None:
        """The observer hook implementations for one new request, or None when no plugin implements one.

        Call once per request; the engine skips every event when this is None.
        """
        by_hook = []
        for hook in OBSERVER_HOOKS:
            impls = getattr(self.plugin_manager.hook, hook).get_hookimpls()
            by_hook.append([(self._plugin_label(impl.plugin), impl.function) for impl in impls])
        if not any(by_hook):
            return None
        return Observers(next(self._requests), *by_hook)

    def _plugin_label(self, plugin: object) -> str:
        name = self.plugin_manager.get_name(plugin)
        for info in self.plugins:
            if info.name == name:
                return info.describe()
        return str(name)


# --- loading ----------------------------------------------------------------------------------------------


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _entry_points() -> list[tuple[metadata.EntryPoint, str, str]]:
    """``(entry point, distribution name, version)`` for every entry point in the ``specframe`` group."""
    found, seen = [], set()
    for dist in metadata.distributions():
        dist_name = dist.metadata["Name"] or "?"
        for ep in dist.entry_points:
            key = (_normalize(dist_name), ep.name, ep.value)
            if ep.group == hookspecs.PROJECT and key not in seen:  # a distribution can be on sys.path twice
                seen.add(key)
                found.append((ep, dist_name, dist.version))
    return found


def _allowed(eps: list[tuple[metadata.EntryPoint, str, str]]) -> list[tuple[metadata.EntryPoint, str, str]]:
    allow = os.environ.get(ALLOW_ENV)
    if allow is None:
        return eps
    wanted = {n.strip() for n in allow.split(",") if n.strip()}
    matches = lambda w, ep, dist: w == ep.name or _normalize(w) == _normalize(dist)  # noqa: E731
    unknown = [w for w in sorted(wanted) if not any(matches(w, ep, d) for ep, d, _ in eps)]
    if unknown:
        have = ", ".join(f"{ep.name} ({d})" for ep, d, _ in eps) or "(none)"
        raise PluginLoadError(
            f"{ALLOW_ENV} names {', '.join(map(repr, unknown))}, which no installed plugin provides; "
            f"installed entry points: {have}"
        )
    return [(ep, d, v) for ep, d, v in eps if any(matches(w, ep, d) for w in wanted)]


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _register(pm: pluggy.PluginManager, plugin: object, name: str, where: str) -> bool:
    """Register ``plugin``; False when this very object is already registered (same module, two entry points)."""
    if pm.is_registered(plugin):
        return False
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginContractError(f"plugin {where}: {_one_line(exc)}; fix the @specframe.hookimpl function") from None
    return True


def _unknown_hooks(pm: pluggy.PluginManager, plugin: object) -> list[str]:
    """Hooks ``plugin`` implements that no hook spec declares (a misspelt hook name), as pluggy's check_pending."""
    unknown = []
    for caller in pm.get_hookcallers(plugin) or []:
        if caller.spec is None and any(i.plugin is plugin and not i.optionalhook for i in caller.get_hookimpls()):
            unknown.append(caller.name)
    return sorted(unknown)


def _known_hooks() -> str:
    return ", ".join(sorted(n for n in dir(hookspecs) if n.startswith("specframe_")))


def _load_entry_points(pm: pluggy.PluginManager, plugins: list[PluginInfo]) -> None:
    """Import and register every allowed entry point. One that fails to import, has a hook with wrong arguments or
    implements an unknown hook is left out: appended with its ``error`` set, not registered."""
    for ep, dist, version in _allowed(_entry_points()):
        info = PluginInfo(ep.name, dist, version, ep.value)
        plugins.append(info)
        if pm.get_plugin(ep.name) is not None:  # another distribution uses the same entry-point name
            info.name = f"{dist}:{ep.name}"
        try:
            plugin = ep.load()
        except Exception as exc:  # noqa: BLE001 - any import error of a third-party module
            info.error = (f"failed to import {ep.value!r}: {type(exc).__name__}: {_one_line(exc)}; fix or uninstall "
                          f"{dist}, or leave it out with {ALLOW_ENV}=<plugins to load>")
            continue
        try:
            if not _register(pm, plugin, info.name, info.describe()):
                plugins.remove(info)  # this very module is already registered under another entry point
                continue
        except PluginContractError as exc:
            info.error = str(exc).removeprefix(f"plugin {info.describe()}: ")
            continue
        unknown = _unknown_hooks(pm, plugin)
        if unknown:
            pm.unregister(plugin)
            info.error = (f"unknown hook {', '.join(map(repr, unknown))}; known hooks: {_known_hooks()}; fix the "
                          "@specframe.hookimpl function")


def _check_name(cls: type, kind: str, where: str) -> None:
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name or any(c.isspace() or c == "," for c in name):
        raise PluginContractError(
            f"{kind} class {cls!r} from {where} needs a `name` class attribute: a non-empty string without spaces "
            "or commas"
        )


def _check_config_name(cls: type, kind: str, where: str) -> None:
    """A plugin's ``Config`` types ``name`` as ``Literal[cls.name]`` (a plugin base class's subclass gets that
    itself: :func:`~specframe.contracts.proposer.own_config`), so a typed config holds the plugin's own objects."""
    name, config = cls.name, cls.Config
    if names_itself(config, name):
        return
    field = config.model_fields.get("name")
    annotation = field.annotation if field is not None else None
    args = get_args(annotation) if get_origin(annotation) is Literal else ()
    accepts = f"accepts {list(args)}, not {name!r}" if args else f"must be typed Literal[{name!r}], got {annotation}"
    raise PluginContractError(f"{kind} {name!r} from {where}: {config.__name__}.name {accepts}; "
                              f"declare `name: Literal[{name!r}] = {name!r}`")


def check_proposer_class(cls: type, where: str) -> None:
    """Raise :class:`PluginContractError` when a proposer class breaks the contract (config model, flags, methods)."""
    name = getattr(cls, "name", None)
    _check_name(cls, "proposer", where)
    config = getattr(cls, "Config", None)
    if not (isinstance(config, type) and issubclass(config, ProposerConfig)):
        raise PluginContractError(
            f"proposer {name!r} from {where}: `Config` must be a subclass of specframe.ProposerConfig, got {config!r}"
        )
    if config.model_config.get("extra") != "forbid":
        raise PluginContractError(
            f"proposer {name!r} from {where}: {config.__name__} must forbid unknown options "
            "(keep ProposerConfig's model_config, extra='forbid')"
        )
    _check_config_name(cls, "proposer", where)
    for flag in ("needs_hidden_states", "produces_trees", "provides_draft_probs"):
        if not isinstance(getattr(cls, flag, None), bool):
            raise PluginContractError(
                f"proposer {name!r} from {where}: class attribute `{flag}` must be True or False "
                "(subclass specframe.ProposerBase for the defaults)"
            )
    for method in ("start", "propose", "on_verified"):
        if not callable(getattr(cls, method, None)):
            raise PluginContractError(
                f"proposer {name!r} from {where}: method `{method}` is missing (subclass specframe.ProposerBase)"
            )


def _check_verifier(cls: type, where: str) -> None:
    name = getattr(cls, "name", None)
    if not isinstance(getattr(cls, "supports_trees", None), bool):
        raise PluginContractError(f"verifier {name!r} from {where}: class attribute `supports_trees` must be a bool")
    if not callable(getattr(cls, "verify", None)):
        raise PluginContractError(f"verifier {name!r} from {where}: method `verify` is missing")


def _check_constraint_engine(cls: type, where: str) -> None:
    if not callable(getattr(cls, "compile", None)):
        raise PluginContractError(f"constraint engine {getattr(cls, 'name', None)!r} from {where}: method `compile` "
                                  "is missing")


def _check_text_parser(cls: type, kind: str, methods: tuple[str, ...], where: str) -> None:
    for method in methods:
        if not callable(getattr(cls, method, None)):
            raise PluginContractError(f"{kind} {getattr(cls, 'name', None)!r} from {where}: method `{method}` is "
                                      "missing (subclass the base class in specframe.services)")
    if not isinstance(getattr(cls, "priority", None), int):
        raise PluginContractError(f"{kind} {cls.name!r} from {where}: class attribute `priority` must be an int")


def _check_tool_parser(cls: type, where: str) -> None:
    _check_text_parser(cls, "tool parser", ("detect", "parse", "call_end", "call_grammar", "streaming"), where)
    trigger = getattr(cls, "trigger", "")
    if not (trigger is None or (isinstance(trigger, str) and trigger)):
        raise PluginContractError(f"tool parser {cls.name!r} from {where}: `trigger` must be a non-empty string "
                                  "(the text opening a call) or None (the grammar applies from the first token)")


def _check_reasoning_parser(cls: type, where: str) -> None:
    _check_text_parser(cls, "reasoning parser", ("detect", "split", "streaming"), where)


def _detect(reg: "Registry", kind: str, table: dict[str, type], chat_template: str | None) -> type | None:
    if not chat_template:
        return None
    ranked = sorted(table.items(), key=lambda item: (-item[1].priority, item[0]))
    return next((cls for name, cls in ranked if (kind, name) not in reg.conflicts and cls.detect(chat_template)),
                None)


def _check_component(cls: type, kind: str, base: type, methods: tuple[str, ...], where: str) -> None:
    """Merge policies and routers: a config model deriving from ``base`` that forbids unknown options, methods."""
    name = getattr(cls, "name", None)
    config = getattr(cls, "Config", None)
    if not (isinstance(config, type) and issubclass(config, base)):
        raise PluginContractError(
            f"{kind} {name!r} from {where}: `Config` must be a subclass of specframe.contracts.combining.{base.__name__}, "
            f"got {config!r}"
        )
    if config.model_config.get("extra") != "forbid":
        raise PluginContractError(f"{kind} {name!r} from {where}: {config.__name__} must forbid unknown options")
    for method in methods:
        if not callable(getattr(cls, method, None)):
            raise PluginContractError(f"{kind} {name!r} from {where}: method `{method}` is missing")
    _check_config_name(cls, kind, where)


def _check_merge_policy(cls: type, where: str) -> None:
    _check_component(cls, "merge policy", MergePolicyConfig, ("start", "plan", "on_step"), where)


def _check_router(cls: type, where: str) -> None:
    if cls.name == "none":
        raise PluginContractError(f"router from {where}: the name 'none' is reserved (it means no router)")
    _check_component(cls, "router", RouterConfig, ("start", "route", "revise", "on_step", "on_batch"), where)


def _collect(reg: Registry, info: PluginInfo, plugin: object) -> None:
    """Call ``plugin``'s registration hooks and add what it registers to ``reg``: all of it, or nothing when one
    class breaks the contract (``PluginContractError``). A name another plugin already registered is recorded as a
    conflict in both plugins and in ``reg.conflicts``, and refused when it is looked up."""
    hook = reg.plugin_manager.hook
    where = info.describe()
    staged: list[tuple[str, type, dict[str, type], list[type]]] = []
    for kind, hook_name, table, found, check in (
        ("proposer", "specframe_register_proposers", reg.proposers, info.proposers, check_proposer_class),
        ("verifier", "specframe_register_verifiers", reg.verifiers, info.verifiers, _check_verifier),
        ("merge policy", "specframe_register_merge_policies", reg.merge_policies, info.merge_policies,
         _check_merge_policy),
        ("router", "specframe_register_routers", reg.routers, info.routers, _check_router),
        ("constraint engine", "specframe_register_constraint_engines", reg.constraint_engines,
         info.constraint_engines, _check_constraint_engine),
        ("tool parser", "specframe_register_tool_parsers", reg.tool_parsers, info.tool_parsers, _check_tool_parser),
        ("reasoning parser", "specframe_register_reasoning_parsers", reg.reasoning_parsers, info.reasoning_parsers,
         _check_reasoning_parser),
    ):
        for impl in getattr(hook, hook_name).get_hookimpls():
            if impl.plugin is not plugin:
                continue

            def register(cls: type, _kind=kind, _table=table, _found=found, _check=check) -> None:
                _check_name(cls, _kind, where)
                _check(cls, where)
                staged.append((_kind, cls, _table, _found))

            try:
                impl.function(register=register)
            except PluginContractError:
                raise
            except Exception as exc:  # noqa: BLE001 - a third-party hook that raises is a broken plugin
                raise PluginContractError(
                    f"plugin {where}: its {hook_name} hook raised {type(exc).__name__}: {_one_line(exc)}"
                ) from None
    for kind, cls, table, found in staged:
        name = cls.name
        if name in table and table[name] is not cls:
            first = reg.origin[(kind, name)]
            message = (f"{kind} {name!r} is registered by both {first} and {where}; uninstall one, or load only one "
                       f"with {ALLOW_ENV}")
            reg.conflicts[(kind, name)] = message
            for other in reg.plugins:
                if other.describe() in (first, where) and message not in other.conflicts:
                    other.conflicts.append(message)
        else:
            table[name] = cls
            reg.origin[(kind, name)] = where
        if cls not in found:
            found.append(cls)
    for hook_name in OBSERVER_HOOKS:
        if any(i.plugin is plugin for i in getattr(hook, hook_name).get_hookimpls()):
            info.observes.append(hook_name)


def build_registry(*, entry_points: bool = True, extra_plugins: tuple[object, ...] = ()) -> Registry:
    """Build a fresh registry.

    Args:
        entry_points: load plugins from the ``specframe`` entry-point group (filtered by ``SPECFRAME_PLUGINS``).
        extra_plugins: plugin modules or objects to register directly (tests, embedding applications).

    An installed plugin that fails to import, implements an unknown hook or registers a class that breaks the
    contract is left out: listed in ``registry.plugins`` with its ``error`` (``registry.broken``) and logged once as
    a warning on the ``specframe`` logger. A name registered by two plugins is refused when looked up.

    Raises:
        PluginLoadError: ``SPECFRAME_PLUGINS`` names a plugin that is not installed.
        PluginContractError: a plugin in ``extra_plugins`` implements an unknown hook (a misspelt hook or argument)
            or registers a class that breaks the proposer/verifier/merge policy/router contract.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    plugins = [PluginInfo("specframe.verifiers", "specframe", __version__, acceptance.__name__),
               PluginInfo("specframe.constraints", "specframe", __version__, llguidance_engine.__name__)]
    for info, core in zip(plugins, (acceptance, llguidance_engine)):  # the core plugins always load
        _register(pm, core, info.name, info.describe())
    if entry_points:
        _load_entry_points(pm, plugins)
    installed = {info.name for info in plugins}
    for plugin in extra_plugins:
        name = getattr(plugin, "__name__", None) or f"{type(plugin).__name__}@{id(plugin):x}"
        if pm.get_plugin(name) is not None and pm.get_plugin(name) is not plugin:
            name = f"{name}@{id(plugin):x}"
        info = PluginInfo(name, "", "", getattr(plugin, "__name__", type(plugin).__qualname__))
        if _register(pm, plugin, name, name):
            plugins.append(info)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        owner = next((i.describe() for i in plugins if pm.get_plugin(i.name) is exc.plugin), "a plugin")
        raise PluginContractError(f"plugin {owner}: {_one_line(exc)}; known hooks: {_known_hooks()}") from None
    reg = Registry(pm, plugins=plugins)
    for info in plugins:
        if info.error:
            continue
        plugin = pm.get_plugin(info.name)
        try:
            _collect(reg, info, plugin)
        except PluginContractError as exc:
            if info.name not in installed:
                raise  # code passed in directly: a bug to fix there, not an installation to work around
            pm.unregister(plugin)
            info.error = str(exc)
    for info in reg.broken:
        log.warning("plugin %s is left out: %s", info.describe(), info.error)
    return reg
