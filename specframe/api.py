"""The Python API: wiring config -> plugin registry -> target -> engine.

    sf = specframe.load(model="smollm2-135m-instruct", dtype="float32", proposers=[{"name": "ngram", "k": 8}])
    rec = sf.generate("Summarize ...", max_new_tokens=64)        # dict, the same record as `--json`
    rec = sf.generate("...", proposers=[{"name": "none"}])        # per-request proposer override
    rec = sf.generate("...", proposers=[{"name": "ngram"}, {"name": "draft-model"}],      # combined proposers
                      merge={"policy": "priority", "max_nodes": 24}, router="adaptive")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from pydantic import ValidationError

from .config import SpecframeConfig, _one_line, load_config, resolve_merge, resolve_proposers, resolve_router
from .errors import ConfigError, UnknownRouterError
from .engine import Engine, GenerationResult, proposer_labels
from .isolation import IsolationPolicy
from .registry import Registry, build_registry
from .sampling import SamplingParams


class Specframe:
    """A loaded target plus the installed plugins. Create it with :func:`load`."""

    def __init__(self, config: SpecframeConfig, target: Any, registry: Registry) -> None:
        self.config = config
        self.target = target
        self.registry = registry
        self._proposers: dict[str, Any] = {}
        self._verifiers: dict[str, Any] = {}
        self._components: dict[tuple[str, str], Any] = {}

    def _active(self, entries: Sequence[dict[str, Any]]) -> list[Any]:
        """Proposer instances for these entries (cached by name and options)."""
        try:
            cfg = SpecframeConfig.model_validate({"proposers": list(entries)})
        except ValidationError as exc:
            raise ConfigError(f"proposers: {exc.errors()[0]['msg']}") from None
        out = []
        for cls, pcfg in resolve_proposers(cfg, self.registry):
            key = f"{cls.name}:{pcfg.model_dump_json()}"
            if key not in self._proposers:
                self._proposers[key] = cls(pcfg, self.target.info)
            out.append(self._proposers[key])
        return out

    def _combining(self, merge: Any, router: Any) -> tuple[Any, Any]:
        """The merge policy and router instances for a combined request (``None`` arguments: the config's)."""
        base = self.config
        settings = {"merge": base.merge if merge is None else merge, "router": base.router if router is None else router}
        try:
            cfg = SpecframeConfig.model_validate(settings)
        except ValidationError as exc:
            raise ConfigError(_one_line(exc, "merge/router")) from None
        cls, mcfg = resolve_merge(cfg.merge, self.registry)
        policy = self._component("merge", cls, mcfg)
        return policy, self._router(router)

    def _lone_router(self, router: Any) -> Any:
        """A lone proposer is routed (its draft trimmed to what pays) when the router is set explicitly, or when the
        target carries this machine's measured cost curve (a target loaded with a machine profile); otherwise its
        draft is verified whole. A router plugin that is not installed then just means no routing."""
        explicit = router is not None or "router" in self.config.model_fields_set
        if not explicit and not getattr(self.target.info, "cost", None):
            return None
        try:
            return self._router(router)
        except UnknownRouterError:
            if explicit:
                raise
            return None

    def _router(self, router: Any) -> Any:
        """The router instance (``None`` argument: the config's); None for ``router: none``. A lone proposer is routed
        too: the router trims its draft to what pays on this machine's cost curve."""
        try:
            cfg = SpecframeConfig.model_validate({"router": self.config.router if router is None else router})
        except ValidationError as exc:
            raise ConfigError(_one_line(exc, "router")) from None
        resolved = resolve_router(cfg.router, self.registry)
        return None if resolved is None else self._component("router", *resolved)

    def _component(self, kind: str, cls: type, cfg: Any) -> Any:
        key = (kind, f"{cls.name}:{cfg.model_dump_json()}")
        if key not in self._components:
            self._components[key] = cls(cfg, self.target.info)
        return self._components[key]

    def _verifier(self, sampling: SamplingParams) -> Any:
        name = self.config.verifier
        if name == "auto":
            name = "greedy" if sampling.is_greedy else "speculative-sampling"
        elif name == "greedy" and not sampling.is_greedy:
            raise ConfigError(
                f"verifier greedy decodes at temperature 0, got temperature {sampling.temperature}: "
                "use verifier auto or speculative-sampling to sample"
            )
        if name not in self._verifiers:
            self._verifiers[name] = self.registry.verifier(name)()
        return self._verifiers[name]

    def validate_proposers(self, proposers: Sequence[dict[str, Any]] | None = None) -> None:
        """Build the proposers (and, when they are combined, the merge policy and router) now, so that a bad name
        or option fails before any generation."""
        active = self._active(proposers or self.config.proposers)
        if len(active) > 1:
            self._combining(None, None)
        else:
            self._lone_router(None)

    def encode(self, prompt: str, chat: bool | None = None) -> list[int]:
        return self.target.encode_prompt(prompt, self.config.chat if chat is None else chat)

    def generate_result(
        self,
        prompt: str | list[int],
        *,
        proposers: Sequence[dict[str, Any]] | None = None,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
        chat: bool | None = None,
        question_id: Any = None,
        on_text: Callable[[str], None] | None = None,
        merge: dict[str, Any] | str | None = None,
        router: dict[str, Any] | str | None = None,
    ) -> GenerationResult:
        """Generate for one prompt (text, or token ids used as they are). Arguments override the config.

        ``merge`` and ``router`` (as in the config file) apply when two or more proposers are combined.
        """
        c, s = self.config, self.config.sampling
        sampling = SamplingParams(
            temperature=s.temperature if temperature is None else temperature,
            top_k=s.top_k if top_k is None else top_k,
            top_p=s.top_p if top_p is None else top_p,
        )
        if isinstance(prompt, str):
            ids = self.encode(prompt, chat)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
        else:
            raise TypeError("prompt must be a str or a list of token ids (one prompt per call)")
        if isinstance(stop, str):
            stop = [stop]
        active = self._active(proposers or c.proposers)
        policy, routed = self._combining(merge, router) if len(active) > 1 else (None, self._lone_router(router))
        governor = getattr(self.target, "governor", None)
        load = governor.check() if governor is not None else None  # threads within the free cores
        labels = proposer_labels([p.name for p in active])
        engine = Engine(
            self.target, active, self._verifier(sampling), merge=policy, router=routed,
            isolation=IsolationPolicy(**c.isolation.model_dump()),
            origins={lab: self.registry.origin.get(("proposer", p.name), "") for lab, p in zip(labels, active)},
        )
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
        """Like :meth:`generate_result`, returning the ``--json`` record (a dict)."""
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
        from .models import load_target

        target = load_target(cfg.model, cfg.dtype, cfg.device, log=log, threads=cfg.threads, prepack=cfg.prepack,
                             speculative=any(p["name"] != "none" for p in cfg.proposers), progress=progress)
    sf = Specframe(cfg, target, reg)
    sf.validate_proposers()
    return sf
