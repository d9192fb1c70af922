"""What each request has to itself: its plugin instances, from a pool.

A :class:`~specframe.api.Specframe` serves requests one after another or from several threads at once. Each request
gets its own plugin instances (proposers, merge policy, router, verifier: they keep per-request state between
``start`` and the last step), taken from an :class:`InstancePool` and given back when the request ends, so a
request never sees another's state and serial requests reuse instances instead of rebuilding them. The pool keeps
a bounded number of idle instances: memory follows the requests running now, not every option set ever asked for.
What requests share, their loaded weights, is :mod:`specframe.shared_weights`.

:class:`PluginSets` makes a request's set (its classes from the config and the request's overrides, instances from
the pool) and lends it as a :class:`Lease` holding the engine over it; releasing the lease gives the instances back.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections import OrderedDict
from typing import Any, Callable, Hashable

log = logging.getLogger("specframe")


class InstancePool:
    """Idle plugin instances by key (kind + class + options), handed out one request at a time.

    Args:
        max_idle: most idle instances kept in all (the least recently returned go first); instances in use are
            not counted (a request always gets one: built when none is idle).
    """

    def __init__(self, max_idle: int = 16) -> None:
        self.max_idle = max_idle
        self._idle: OrderedDict[tuple[Hashable, int], Any] = OrderedDict()
        self._serial = 0
        self._lock = threading.Lock()

    def take(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """An idle instance for ``key`` (removed from the pool), or a new one from ``build()``."""
        with self._lock:
            for k in reversed(self._idle):  # the most recently returned first
                if k[0] == key:
                    return self._idle.pop(k)
        return build()

    def give(self, key: Hashable, obj: Any) -> None:
        """Return ``obj`` (taken for ``key``) for later requests."""
        with self._lock:
            self._serial += 1
            self._idle[(key, self._serial)] = obj
            while len(self._idle) > self.max_idle:
                self._idle.popitem(last=False)

    def __len__(self) -> int:
        return len(self._idle)


class Lease:
    """One request's plugin set on loan: ``engine`` runs on its instances; :meth:`release` gives them back to the
    pool (once; later calls do nothing). A context manager: ``with sf.lease(...) as lease: lease.engine...``.

    Hosts that hand a request to another thread (the batch scheduler) keep the lease and release it when the
    request ends.
    """

    def __init__(self, engine: Any, give_back: Callable[[], None]) -> None:
        self.engine = engine
        self._give_back: Callable[[], None] | None = give_back
        self._lock = threading.Lock()

    def release(self) -> None:
        """Give the instances back (an instance a request broke off from is reset by its next ``start``)."""
        with self._lock:
            give_back, self._give_back = self._give_back, None
        if give_back is not None:
            give_back()

    @property
    def released(self) -> bool:
        return self._give_back is None

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class PluginSets:
    """Makes each request's plugin set (proposers, merge policy, router, verifier) from an :class:`InstancePool`,
    for one loaded model (its typed config, target and plugin registry), and lends it as a :class:`Lease`.

    A plugin whose constructor raises something other than a :class:`~specframe.errors.SpecframeError` is a plugin
    fault: warned about once per option set, remembered (the last ``max_broken``), and left out of every request
    that asks for it (an :class:`~specframe.decode.isolation.UnbuiltProposer`, the fallback merge order, no router):
    output is unaffected. A :class:`~specframe.errors.SpecframeError` is the user's to fix and is raised.

    Args:
        config: the typed config (:func:`~specframe.config.runtime_config`): the plugins, isolation and verifier.
        target: the loaded target the plugins are built for.
        registry: the plugin registry (the verifier classes, the plugins' origins).
        max_idle: idle instances kept, and build failures remembered.
    """

    LEFT_OUT = {  # what a request does without a plugin whose constructor raised
        "proposer": "the other proposers draft; alone, it decodes from the target",
        "merge policy": "combined drafts go in the proposers' order",
        "router": "every combined proposer drafts with the full budget",
    }

    def __init__(self, config: Any, target: Any = None, registry: Any = None, max_idle: int = 16) -> None:
        if target is None and registry is None and hasattr(config, "registry"):  # the old PluginSets(sf)
            from . import MOVED_UNTIL

            warnings.warn("PluginSets(sf) is deprecated: pass PluginSets(sf.config, sf.target, sf.registry) (the old "
                          f"form goes in specframe {MOVED_UNTIL})", DeprecationWarning, stacklevel=2)
            config, target, registry = config.config, config.target, config.registry
        self.config, self.target, self.registry = config, target, registry
        self.pool = InstancePool(max_idle=max_idle)
        self.max_broken = max_idle
        self.broken: OrderedDict[str, BaseException] = OrderedDict()  # key -> what its constructor raised
        self._lock = threading.Lock()

    def lease(self, proposers: Any = None, merge: Any = None, router: Any = None, sampling: Any = None,
              verifier: Any = None) -> Lease:
        """One request's plugin set and the engine over it (arguments as in ``Specframe.generate_result``; None:
        the config's; ``verifier`` replaces the configured acceptance rule).

        Raises:
            ConfigError: a bad proposer, merge or router option; a verifier that cannot decode ``sampling``.
        """
        from .decode.engine import Engine, proposer_labels
        from .decode.isolation import IsolationPolicy
        from .sampling import SamplingParams

        held: list = []
        try:
            active, policy, routed = self._instances(self._resolved(proposers, merge, router), held)
            labels = proposer_labels([p.name for p in active])
            engine = Engine(
                self.target, active, verifier or self._verifier(sampling or SamplingParams(), held), merge=policy,
                router=routed, isolation=IsolationPolicy(**self.config.isolation.model_dump()),
                origins={lab: self.registry.origin.get(("proposer", p.name), "") for lab, p in zip(labels, active)},
                sampling=sampling,
            )
        except BaseException:
            self._give_back(held)
            raise
        return Lease(engine, lambda: self._give_back(held))

    # --- the pieces -------------------------------------------------------------------------------------------
    def _build(self, kind: str, key: str, cls: type, cfg: Any) -> Any:
        """A new instance of a plugin class; None when its constructor raised a plugin fault (see the class)."""
        from .errors import SpecframeError, first_line

        with self._lock:
            if key in self.broken:
                return None
        try:
            return cls(cfg, self.target.info)
        except SpecframeError:
            raise  # the user's to fix (missing weights, a bad folder, ...): one error line
        except Exception as exc:  # noqa: BLE001 - a plugin must never crash generation
            with self._lock:
                self.broken[key] = exc
                while len(self.broken) > self.max_broken:
                    self.broken.popitem(last=False)
            origin = self.registry.origin.get((kind, cls.name), "")
            log.warning(
                "%s %r%s raised %s while it was built: %s; it is left out of every request that asks for it (%s), "
                "output is unaffected", kind, cls.name, f" (plugin {origin})" if origin else "", type(exc).__name__,
                first_line(exc), self.LEFT_OUT[kind])
            return None

    def _take(self, kind: str, cls: type, cfg: Any, held: list) -> Any:
        """An instance for this request (recorded in ``held`` to be given back), or None (see :meth:`_build`)."""
        key = f"{kind}:{cls.name}:{cfg.model_dump_json()}"
        with self._lock:
            broken = self.broken.get(key)
        obj = None if broken is not None else self.pool.take(key, lambda: self._build(kind, key, cls, cfg))
        if obj is not None:
            held.append((key, obj))
        return obj

    def _give_back(self, held: list) -> None:
        for key, obj in held:
            self.pool.give(key, obj)
        held.clear()

    def _resolved(self, proposers: Any, merge: Any, router: Any) -> Any:
        """This request's plugin classes: the typed config's, with the request's overrides applied to it
        (:func:`~specframe.config.resolve_plugins`; None: the config's; ``"ngram"`` is short for
        ``[{"name": "ngram"}]``). A lone proposer is routed (its draft trimmed to what pays) when the router is set
        explicitly, or when the target carries this machine's measured cost curve."""
        from .config import resolve_plugins

        return resolve_plugins(self.config, self.registry, proposers=proposers, merge=merge, router=router,
                               lone_router=self.target.info.cost is not None)

    def _instances(self, plugins: Any, held: list) -> tuple[list[Any], Any, Any]:
        """``(proposers, merge policy, router)`` instances for one request (from the pool; recorded in ``held``). A
        plugin whose constructor raised is left out (see the class)."""
        from .decode.drafting import FallbackPolicy
        from .decode.isolation import UnbuiltProposer

        active = []
        for cls, pcfg in plugins.proposers:
            obj = self._take("proposer", cls, pcfg, held)
            active.append(obj if obj is not None else UnbuiltProposer(cls.name, self._broken_error("proposer", cls, pcfg)))
        policy = None
        if len(active) > 1:
            cls, mcfg = plugins.merge
            policy = self._take("merge policy", cls, mcfg, held) or FallbackPolicy(mcfg.max_nodes)
        routed = self._take("router", *plugins.router, held) if plugins.router is not None else None
        return active, policy, routed

    def _broken_error(self, kind: str, cls: type, cfg: Any) -> BaseException:
        with self._lock:
            return self.broken.get(f"{kind}:{cls.name}:{cfg.model_dump_json()}", RuntimeError("not built"))

    def _verifier(self, sampling: Any, held: list) -> Any:
        from .errors import ConfigError

        name = self.config.verifier
        if name == "auto":
            name = "greedy" if sampling.is_greedy else "speculative-sampling"
        elif name == "greedy" and not sampling.is_greedy:
            raise ConfigError(
                f"verifier greedy decodes at temperature 0, got temperature {sampling.temperature}: "
                "use verifier auto or speculative-sampling to sample"
            )
        key = f"verifier:{name}"
        verifier = self.pool.take(key, self.registry.verifier(name))
        held.append((key, verifier))
        return verifier
