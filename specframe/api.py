"""The Python API: wiring config -> plugin registry -> target -> engine.

    sf = specframe.load(model="smollm2-135m-instruct", dtype="float32", proposers=[{"name": "ngram", "k": 8}])
    rec = sf.generate("Summarize ...", max_new_tokens=64)        # dict, the same record as `--json`
    rec = sf.generate("...", proposers=[{"name": "none"}])        # per-request proposer override
    rec = sf.generate("...", proposers=[{"name": "ngram"}, {"name": "draft-model"}],      # combined proposers
                      merge={"policy": "priority", "max_nodes": 24}, router="adaptive")
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from pydantic import ValidationError

from .config import (
    SamplingConfig,
    SpecframeConfig,
    _one_line,
    load_config,
    proposer_shorthand,
    resolve_merge,
    resolve_proposers,
    resolve_router,
)
from .drafting import FallbackPolicy
from .engine import Engine, GenerationResult, proposer_labels
from .errors import ConfigError, SpecframeError, UnknownRouterError
from .isolation import IsolationPolicy, UnbuiltProposer
from .registry import Registry, build_registry
from .sampling import SamplingParams
from .sharing import InstancePool

log = logging.getLogger("specframe")

POOL_IDLE = 16  # idle plugin instances a Specframe keeps for later requests (and build failures it remembers)
LEFT_OUT = {  # what a request does without a plugin whose constructor raised
    "proposer": "the other proposers draft; alone, it decodes from the target",
    "merge policy": "combined drafts go in the proposers' order",
    "router": "every combined proposer drafts with the full budget",
}
_LOAD_KEYWORDS = tuple(SpecframeConfig.model_fields) + tuple(SamplingConfig.model_fields)
_GENERATE_KEYWORDS = ("proposers", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop", "chat",
                      "question_id", "on_text", "merge", "router")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


def _check_keywords(function: str, given: dict[str, Any], known: Sequence[str]) -> None:
    """Raise TypeError naming ``function`` (as the caller called it) for an unknown keyword, with the closest one."""
    for name in given:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}{hint}; it takes: "
                            f"{', '.join(known)}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_request(max_new_tokens: Any, temperature: Any, top_p: Any, top_k: Any, seed: Any, stop: Any,
                   on_text: Any) -> None:
    """Types and ranges of :meth:`Specframe.generate_result`'s arguments, named as the caller spelled them (the
    sampling ranges are checked by :class:`SamplingParams`, whose messages use the same names)."""
    if max_new_tokens is not None and not (_is_int(max_new_tokens) and max_new_tokens >= 1):
        raise ConfigError(f"max_new_tokens must be a whole number >= 1, got {max_new_tokens!r}")
    if seed is not None and not (_is_int(seed) and 0 <= seed < 2**63):
        raise ConfigError(f"seed must be a whole number in [0, 2**63), got {seed!r}")
    if top_k is not None and not _is_int(top_k):
        raise ConfigError(f"top_k must be a whole number >= 0 (0 = off), got {top_k!r}")
    for name, v in (("temperature", temperature), ("top_p", top_p)):
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool)):
            raise ConfigError(f"{name} must be a number, got {v!r}")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, (list, tuple)) or not all(isinstance(x, str) and x for x in stops):
            raise ConfigError(f"stop must be a non-empty string or a list of them, got {stop!r}")
    if on_text is not None and not callable(on_text):
        raise ConfigError(f"on_text must be a function taking each new piece of text, got {on_text!r}")


class Specframe:
    """A loaded target plus the installed plugins. Create it with :func:`load`.

    Threads: one ``Specframe`` may serve requests from several threads at once. Each request gets its own proposer,
    merge policy, router and verifier instances (from a bounded pool, reused by later requests; see
    :mod:`specframe.sharing`), its own KV cache and generator; the target model, the tokenizer and loaded proposer
    weights are shared read-only. Each request's output and metrics are what it gives alone. Shared across the
    process: torch's thread count (the thread governor may change it during a run) and observer plugins, whose
    hooks are called from each request's own thread.
    """

    def __init__(self, config: SpecframeConfig, target: Any, registry: Registry) -> None:
        self.config = config
        self.target = target
        self.registry = registry
        self._pool = InstancePool(max_idle=POOL_IDLE)
        self._broken: OrderedDict[str, BaseException] = OrderedDict()  # key -> what its constructor raised
        self._lock = threading.Lock()

    # --- plugin instances, one set per request ---------------------------------------------------------------
    def _build(self, kind: str, key: str, cls: type, cfg: Any) -> Any:
        """A new instance of a plugin class; None when its constructor raised something other than a
        :class:`SpecframeError` (a plugin fault: warned about once per option set, then left out)."""
        with self._lock:
            if key in self._broken:
                return None
        try:
            return cls(cfg, self.target.info)
        except SpecframeError:
            raise  # the user's to fix (missing weights, a bad folder, ...): one error line
        except Exception as exc:  # noqa: BLE001 - a plugin must never crash generation
            with self._lock:
                self._broken[key] = exc
                while len(self._broken) > POOL_IDLE:
                    self._broken.popitem(last=False)
            origin = self.registry.origin.get((kind, cls.name), "")
            log.warning(
                "%s %r%s raised %s while it was built: %s; it is left out of every request that asks for it (%s), "
                "output is unaffected", kind, cls.name, f" (plugin {origin})" if origin else "", type(exc).__name__,
                _first_line(exc), LEFT_OUT[kind])
            return None

    def _take(self, kind: str, cls: type, cfg: Any, held: list) -> Any:
        """An instance for this request (recorded in ``held`` to be given back), or None (see :meth:`_build`)."""
        key = f"{kind}:{cls.name}:{cfg.model_dump_json()}"
        with self._lock:
            broken = self._broken.get(key)
        obj = None if broken is not None else self._pool.take(key, lambda: self._build(kind, key, cls, cfg))
        if obj is not None:
            held.append((key, obj))
        return obj

    def _give_back(self, held: list) -> None:
        for key, obj in held:
            self._pool.give(key, obj)
        held.clear()

    def _active(self, entries: Any, held: list) -> list[Any]:
        """Proposer instances for these entries (``"ngram"`` is short for ``[{"name": "ngram"}]``); a proposer whose
        constructor raised is an :class:`UnbuiltProposer` (disabled for the request)."""
        try:
            cfg = SpecframeConfig.model_validate({"proposers": proposer_shorthand(entries)})
        except ValidationError as exc:
            raise ConfigError(f"proposers: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
        out = []
        for cls, pcfg in resolve_proposers(cfg, self.registry):
            obj = self._take("proposer", cls, pcfg, held)
            out.append(obj if obj is not None else UnbuiltProposer(cls.name, self._broken_error("proposer", cls, pcfg)))
        return out

    def _broken_error(self, kind: str, cls: type, cfg: Any) -> BaseException:
        with self._lock:
            return self._broken.get(f"{kind}:{cls.name}:{cfg.model_dump_json()}", RuntimeError("not built"))

    def _combining(self, merge: Any, router: Any, held: list) -> tuple[Any, Any]:
        """The merge policy and router instances for a combined request (``None`` arguments: the config's)."""
        base = self.config
        settings = {"merge": base.merge if merge is None else merge, "router": base.router if router is None else router}
        try:
            cfg = SpecframeConfig.model_validate(settings)
        except ValidationError as exc:
            raise ConfigError(_one_line(exc, "merge/router")) from None
        cls, mcfg = resolve_merge(cfg.merge, self.registry)
        policy = self._take("merge policy", cls, mcfg, held)
        if policy is None:  # its constructor raised: proposers in order, each draft whole
            policy = FallbackPolicy(mcfg.max_nodes)
        return policy, self._router(router, held)

    def _lone_router(self, router: Any, held: list) -> Any:
        """A lone proposer is routed (its draft trimmed to what pays) when the router is set explicitly, or when the
        target carries this machine's measured cost curve (a target loaded with a machine profile); otherwise its
        draft is verified whole. A router plugin that is not installed then just means no routing."""
        explicit = router is not None or "router" in self.config.model_fields_set
        if not explicit and not getattr(self.target.info, "cost", None):
            return None
        try:
            return self._router(router, held)
        except UnknownRouterError:
            if explicit:
                raise
            return None

    def _router(self, router: Any, held: list) -> Any:
        """The router instance (``None`` argument: the config's); None for ``router: none`` (or a router whose
        constructor raised). A lone proposer is routed too: the router trims its draft to what pays on this
        machine's cost curve."""
        try:
            cfg = SpecframeConfig.model_validate({"router": self.config.router if router is None else router})
        except ValidationError as exc:
            raise ConfigError(_one_line(exc, "router")) from None
        resolved = resolve_router(cfg.router, self.registry)
        return None if resolved is None else self._take("router", *resolved, held)

    def _verifier(self, sampling: SamplingParams, held: list) -> Any:
        name = self.config.verifier
        if name == "auto":
            name = "greedy" if sampling.is_greedy else "speculative-sampling"
        elif name == "greedy" and not sampling.is_greedy:
            raise ConfigError(
                f"verifier greedy decodes at temperature 0, got temperature {sampling.temperature}: "
                "use verifier auto or speculative-sampling to sample"
            )
        key = f"verifier:{name}"
        verifier = self._pool.take(key, self.registry.verifier(name))
        held.append((key, verifier))
        return verifier

    def validate_proposers(self, proposers: Any = None) -> None:
        """Build the proposers (and, when they are combined, the merge policy and router) now, so that a bad name
        or option fails before any generation; a plugin whose constructor raises is warned about now. The instances
        go to the pool for the first requests."""
        held: list = []
        try:
            active = self._active(self.config.proposers if proposers is None else proposers, held)
            if len(active) > 1:
                self._combining(None, None, held)
            else:
                self._lone_router(None, held)
        finally:
            self._give_back(held)

    def encode(self, prompt: str, chat: bool | None = None) -> list[int]:
        return self.target.encode_prompt(prompt, self.config.chat if chat is None else chat)

    @contextlib.contextmanager
    def engine(self, proposers: Any = None, merge: Any = None, router: Any = None,
               sampling: SamplingParams = SamplingParams(), verifier: Any = None) -> Iterator[Engine]:
        """The engine one request runs on, built as :meth:`generate_result` builds it: this request's own proposer,
        merge-policy, router and verifier instances (from the pool; given back on exit), the config's isolation
        policy and the plugins' origins. Arguments as in :meth:`generate_result` (None: the config's);
        ``verifier`` replaces the configured acceptance rule (replay verifies against a recorded trace).

        Raises:
            ConfigError: a bad proposer, merge or router option; a verifier that cannot decode ``sampling``.
        """
        held: list = []
        try:
            active = self._active(self.config.proposers if proposers is None else proposers, held)
            policy, routed = (self._combining(merge, router, held) if len(active) > 1
                              else (None, self._lone_router(router, held)))
            labels = proposer_labels([p.name for p in active])
            yield Engine(
                self.target, active, verifier or self._verifier(sampling, held), merge=policy, router=routed,
                isolation=IsolationPolicy(**self.config.isolation.model_dump()),
                origins={lab: self.registry.origin.get(("proposer", p.name), "") for lab, p in zip(labels, active)},
            )
        finally:
            self._give_back(held)  # (an instance a request broke off from is reset by its next start)

    def generate_result(
        self,
        prompt: str | list[int],
        *,
        proposers: Sequence[dict[str, Any] | str] | str | None = None,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        stop: Sequence[str] | str | None = None,
        chat: bool | None = None,
        question_id: Any = None,
        on_text: Callable[[str], None] | None = None,
        merge: dict[str, Any] | str | None = None,
        router: dict[str, Any] | str | None = None,
    ) -> GenerationResult:
        """Generate for one prompt (text, or token ids used as they are). Arguments override the config.

        ``proposers`` is a list of proposer configs or names (``"ngram"`` alone is short for ``[{"name": "ngram"}]``).
        ``merge`` and ``router`` (as in the config file) apply when two or more proposers are combined. Safe to call
        from several threads at once (see the class docstring).

        Raises:
            ConfigError: a value out of range or of the wrong type (the message names the parameter as spelled here).
            TypeError: a prompt that is neither text nor a list of token ids.
        """
        c, s = self.config, self.config.sampling
        _check_request(max_new_tokens, temperature, top_p, top_k, seed, stop, on_text)
        sampling = SamplingParams(
            temperature=s.temperature if temperature is None else temperature,
            top_k=s.top_k if top_k is None else top_k,
            top_p=s.top_p if top_p is None else top_p,
        )
        if isinstance(prompt, str):
            ids = self.encode(prompt, chat)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
            bad = next((t for t in ids if not 0 <= t < self.target.vocab_size), None)
            if bad is not None:
                raise ConfigError(f"prompt: token id {bad} is outside the model's vocabulary [0, {self.target.vocab_size})")
        else:
            raise TypeError("prompt must be a str or a list of token ids (one prompt per call)")
        if isinstance(stop, str):
            stop = [stop]
        with self.engine(proposers, merge, router, sampling) as engine:
            governor = getattr(self.target, "governor", None)
            load = governor.check() if governor is not None else None  # threads within the free cores
            observer = self.registry.observers()  # None when no plugin observes: the loop then skips events
            result = engine.generate(
                ids,
                max_new_tokens=c.max_new_tokens if max_new_tokens is None else max_new_tokens,
                sampling=sampling,
                seed=s.seed if seed is None else seed,
                stop_strings=tuple(c.stop if stop is None else stop),
                on_text=on_text,
                observer=observer,
                between_steps=governor.check if governor is not None else None,  # a neighbour may start mid-request
            )
        labels = engine.labels
        if observer is not None:
            observer.request(tuple(labels), len(ids), tuple(result.token_ids), result.finish_reason,
                             result.metrics.to_dict())
        result.question_id = question_id
        settings = getattr(self.target, "settings", None)
        if settings is not None:
            result.machine = {**self.machine_info(), "others_load": round(load or 0.0, 2)}
        return result

    def machine_info(self) -> dict[str, Any]:
        """How the target runs here: CPU, ISA flags, usable cores, dtype / threads / prepack and why, the profile."""
        from .machine import fingerprint

        settings = getattr(self.target, "settings", None)
        out: dict[str, Any] = fingerprint()
        if settings is not None:
            out.update(settings.to_dict())
        return out

    def generate(self, prompt: str | list[int], **kwargs: Any) -> dict:
        """Like :meth:`generate_result` (same keyword arguments), returning the ``--json`` record (a dict).

        Raises:
            TypeError: an unknown keyword argument (the message lists the known ones).
        """
        _check_keywords("generate", kwargs, _GENERATE_KEYWORDS)
        return self.generate_result(prompt, **kwargs).to_dict()


def load(
    config: SpecframeConfig | str | Path | None = None,
    *,
    target: Any = None,
    registry: Registry | None = None,
    log: Callable[[str], None] = lambda s: None,
    progress: Any = None,
    **overrides: Any,
) -> Specframe:
    """Load plugins and the target model.

    Args:
        config: a :class:`SpecframeConfig`, a YAML path, or None for defaults.
        target: an already-built :class:`specframe.target.Target` (skips model loading; tests use this).
        registry: a prebuilt plugin registry (default: entry points).
        progress: a ``rich.progress.Progress`` for the bar of a first machine profile (None: no bar).
        overrides: config fields (``model``, ``dtype``, ``proposers``, ``temperature``, ...).

    Raises:
        SpecframeError subclasses for bad config, unknown model/proposer, missing model package.
    """
    _check_keywords("load", overrides, _LOAD_KEYWORDS)
    if isinstance(config, SpecframeConfig):
        cfg = load_config(None, base=config.model_dump(exclude_unset=True), **overrides)
    else:
        cfg = load_config(config, **overrides)
    reg = registry or build_registry()
    resolve_proposers(cfg, reg)  # fail on an unknown proposer or bad option before loading a model
    # merge and router only act when proposers are combined; set explicitly, a typo in them fails now, not on the
    # day a second proposer is added (left at their defaults, one proposer needs neither plugin installed)
    combined = len(cfg.proposers) > 1
    if combined or "merge" in cfg.model_fields_set:
        resolve_merge(cfg.merge, reg)
    if combined or "router" in cfg.model_fields_set:
        resolve_router(cfg.router, reg)
    if cfg.verifier != "auto":
        reg.verifier(cfg.verifier)
    if target is None:
        from .loader import load_target

        target = load_target(cfg.model, cfg.dtype, cfg.device, log=log, threads=cfg.threads, prepack=cfg.prepack,
                             speculative=any(p["name"] != "none" for p in cfg.proposers), progress=progress)
    sf = Specframe(cfg, target, reg)
    sf.validate_proposers()
    return sf
