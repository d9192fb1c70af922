"""The Python API: wiring config -> plugin registry -> target -> engine.

    sf = specframe.load(model="smollm2-135m-instruct", dtype="float32", proposers=[{"name": "ngram", "k": 8}])
    rec = sf.generate("Summarize ...", max_new_tokens=64)        # dict, the same record as `--json`
    rec = sf.generate("...", proposers=[{"name": "none"}])        # per-request proposer override
    rec = sf.generate("...", proposers=[{"name": "ngram"}, {"name": "draft-model"}],      # combined proposers
                      merge={"name": "priority", "max_nodes": 24}, router="adaptive")
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import logging
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from pydantic import BaseModel, ValidationError

from .config import (
    RequestSettings,
    SamplingConfig,
    SpecframeConfig,
    load_config,
    runtime_config,
    settings_error,
    validation_line,
)
from .contracts.constraint import Constraint, ConstraintSpec
from .contracts.optional import optional
from .decode.batch import BatchRequest
from .decode.engine import Engine, GenerationResult
from .errors import ConfigError, ConstraintError
from .instance_pool import Lease, PluginSets
from .registry import Registry, build_registry
from .request_job import RequestJob
from .request_options import BATCH_KEYWORDS, REQUEST_KEYWORDS, BatchKeywords, RequestKeywords, RequestOptions
from .sampling import SamplingParams, check_logprobs

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("specframe")

POOL_IDLE = 16  # idle plugin instances a Specframe keeps for later requests (and build failures it remembers)
_LOAD_KEYWORDS = tuple(SpecframeConfig.model_fields) + tuple(SamplingConfig.model_fields)


def _check_chat(chat: Any) -> None:
    """``chat`` must be True, False or None (the config's): a string or number is refused, not read as truthy."""
    if chat is not None and not isinstance(chat, bool):
        raise ConfigError(f"chat must be True or False (or None for the config's), got {chat!r}")


def _check_keywords(function: str, given: dict[str, Any], known: Sequence[str]) -> None:
    """Raise TypeError naming ``function`` (as the caller called it) for an unknown keyword, with the closest one."""
    for name in given:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}{hint}; it takes: "
                            f"{', '.join(known)}")


def _batch_inputs(prompts: Any, batch_size: Any, question_ids: Any, on_result: Any) -> list:
    """``prompts`` read into a list, after checking the batch-level arguments of ``generate_batch_results``.

    Raises:
        ConfigError: a bad ``batch_size``, no prompts or not a list, ``question_ids`` not one per prompt,
            ``on_result`` not callable.
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if isinstance(prompts, (str, bytes, dict)) or not isinstance(prompts, Iterable):
        raise ConfigError(f"prompts must be a non-empty list of prompts (text or token-id lists), got "
                          f"{type(prompts).__name__}")
    prompts = list(prompts)  # (an iterator or generator is read once, here)
    if not prompts:
        raise ConfigError("prompts must be a non-empty list of prompts (text or token-id lists)")
    if question_ids is not None and (isinstance(question_ids, (str, bytes, dict))
                                     or not isinstance(question_ids, Sequence)):
        raise ConfigError(f"question_ids must be a list (one id per prompt), got {type(question_ids).__name__}")
    if on_result is not None and not callable(on_result):
        raise ConfigError(f"on_result must be a function taking (index, result), got {on_result!r}")
    if question_ids is not None and len(question_ids) != len(prompts):
        raise ConfigError(f"question_ids has {len(question_ids)} entries for {len(prompts)} prompts")
    return prompts


class Specframe:
    """A loaded target plus the installed plugins. Create it with :func:`load`.

    Threads: one ``Specframe`` may serve requests from several threads at once. Each request gets its own proposer,
    merge policy, router and verifier instances (from a bounded pool, reused by later requests; see
    :mod:`specframe.instance_pool`), its own KV cache and generator; the target model, the tokenizer and loaded proposer
    weights are shared read-only. Each request's output and metrics are what it gives alone. Shared across the
    process: torch's thread count (the thread governor may change it during a run) and observer plugins, whose
    hooks are called from each request's own thread.

    With ``batch_size`` > 1 (config), concurrent requests share each target forward instead: one loop thread decodes
    them together (:mod:`specframe.decode.scheduler`), each still with its own proposers, draft and output; their
    ``on_text`` callbacks and observer hooks then run on that thread. :meth:`close` stops it.
    """

    def __init__(self, config: BaseModel, target: Any, registry: Registry) -> None:
        # the typed config (load_config): proposers, merge policy and router as their plugins' own config objects
        self.config = runtime_config(config, registry) if isinstance(config, SpecframeConfig) else config
        self.target = target
        self.registry = registry
        self._plugins = PluginSets(self, max_idle=POOL_IDLE)  # each request's plugin instances, on loan
        self._lock = threading.Lock()
        self._scheduler: Any = None  # the batch loop thread, made on the first submit (generate_result: batch_size > 1)
        self._constraint_engine: Any = None  # compiles constraints for this target's tokenizer (made when first used)

    def validate_proposers(self, proposers: Any = None) -> None:
        """Build the proposers (and, when they are combined, the merge policy and router) now, so that a bad name
        or option fails before any generation; a plugin whose constructor raises is warned about now. The instances
        go to the pool for the first requests."""
        self.lease(proposers).release()

    def constraint(self, spec: ConstraintSpec | dict[str, Any] | None = None) -> Constraint | None:
        """One request's compiled constraint for ``spec`` (None: the config's ``constraint``; None when neither sets
        one), by the config's ``constraint_engine``, made once per loaded model.

        Raises:
            ConstraintError: ``spec`` is malformed (not exactly one of json_schema / json_object / regex / grammar),
                invalid or unsupported by the engine, or the model's tokenizer cannot be used for constraints.
            UnknownConstraintEngineError: ``constraint_engine`` names no installed engine.
        """
        spec = self._constraint_spec(spec)
        if spec is None:
            return None
        with self._lock:
            engine = self._constraint_engine
            if engine is None:
                cls = self.registry.constraint_engine(self.config.constraint_engine)
                engine = self._constraint_engine = cls(self.target.tokenizer, int(self.target.vocab_size),
                                                       frozenset(self.target.eos_token_ids))
        return engine.compile(spec)

    def _constraint_spec(self, spec: ConstraintSpec | dict[str, Any] | None) -> ConstraintSpec | None:
        """``spec`` parsed (None: the config's ``constraint``; None when neither sets one).

        Raises:
            ConstraintError: not exactly one of json_schema / json_object / regex / grammar, or not a mapping.
        """
        if spec is None:
            spec = self.config.constraint
            if spec is None:
                return None
        if isinstance(spec, dict):
            try:
                spec = ConstraintSpec.model_validate(spec)
            except ValidationError as exc:
                raise ConstraintError(validation_line(exc, "constraint")) from None
        if not isinstance(spec, ConstraintSpec):
            raise ConstraintError(f"constraint must be a mapping such as {{'json_schema': {{...}}}} or "
                                  f"{{'regex': '...'}}, got {type(spec).__name__}")
        return spec

    def encode(self, prompt: str, chat: bool | None = None) -> list[int]:
        """Token ids of ``prompt``, in the chat template when ``chat`` (None: the config's ``chat``).

        Raises:
            ConfigError: ``chat`` is not a bool or None (``"false"`` would otherwise read as true).
        """
        _check_chat(chat)
        return self.target.encode_prompt(prompt, self.config.chat if chat is None else chat)

    def lease(self, proposers: Any = None, merge: Any = None, router: Any = None,
              sampling: SamplingParams = SamplingParams(), verifier: Any = None) -> Lease:
        """One request's plugin set on loan (:class:`~specframe.instance_pool.Lease`: ``.engine``, ``.release()``, a
        context manager): this request's own proposer, merge-policy, router and verifier instances (from the pool,
        given back on release), the config's isolation policy and the plugins' origins. Arguments as in
        :meth:`generate_result` (None: the config's); ``verifier`` replaces the configured acceptance rule (replay
        verifies against a recorded trace).

        Raises:
            ConfigError: a bad proposer, merge or router option; a verifier that cannot decode ``sampling``.
        """
        return self._plugins.lease(proposers, merge, router, sampling, verifier)

    @contextlib.contextmanager
    def engine(self, proposers: Any = None, merge: Any = None, router: Any = None,
               sampling: SamplingParams = SamplingParams(), verifier: Any = None) -> Iterator[Engine]:
        """The engine of :meth:`lease`, as a context manager that releases the lease on exit."""
        with self.lease(proposers, merge, router, sampling, verifier) as lease:
            yield lease.engine

    def generate_result(self, prompt: str | list[int], **keywords: Unpack[RequestKeywords]) -> GenerationResult:
        """Generate for one prompt (text, or token ids used as they are). Keywords (each None or left out: the
        config's) are :class:`~specframe.request_options.RequestKeywords`: ``proposers``, ``max_new_tokens``,
        ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ``chat``, ``merge``, ``router``, ``constraint``
        (structured output: the output matches it and equals constrained decoding without speculation),
        ``logprobs``, ``question_id``, ``on_text``. Safe to call from several threads at once (see the class
        docstring).

        Raises:
            ConfigError: a value out of range or of the wrong type (the message names the keyword).
            ConstraintError: an invalid or unsupported schema, regex or grammar.
            TypeError: an unknown keyword (the message lists the known ones); a prompt that is neither text nor a
                list of token ids.
        """
        opts = self._options("generate_result", keywords, REQUEST_KEYWORDS)
        ids = self.prompt_ids(prompt, opts.chat)
        if self.config.batch_size > 1:  # decoded together with other threads' requests (one forward per step)
            return self._submit(ids, opts, cancel=None).result()
        return RequestJob(self, ids, opts).run()  # this thread's own forwards

    def submit(self, prompt: str | list[int], *, cancel: Any = None, **keywords: Unpack[RequestKeywords]) -> Future:
        """Queue one request for the batch loop thread (continuous batching with every other submitted request,
        ``batch_size`` of the config at most per forward) and return at once: a
        :class:`concurrent.futures.Future` of its :class:`GenerationResult`. ``cancel`` (a ``threading.Event``): set
        it and the request leaves the batch before the next step (its future then raises ``CancelledError``).
        ``on_text`` runs on the loop thread. Keywords as in :meth:`generate_result`.

        Raises (at once, before anything is queued):
            ConfigError: a bad value or plugin option, an empty prompt.
            PromptTooLongError: the prompt leaves no room in the model's context.
            TypeError: an unknown keyword.
        """
        if cancel is not None and not callable(getattr(cancel, "is_set", None)):
            raise ConfigError(f"cancel must be a threading.Event (an object with is_set()), got {cancel!r}")
        opts = self._options("submit", keywords, REQUEST_KEYWORDS)
        return self._submit(self.prompt_ids(prompt, opts.chat), opts, cancel)

    def _submit(self, ids: list[int], opts: RequestOptions, cancel: Any) -> Future:
        """Queue a checked request (see :meth:`submit`)."""
        job = RequestJob(self, ids, opts)  # a bad plugin option raises here
        try:
            inner = self._batch_scheduler().submit(job.batch_request(cancel))
        except BaseException:
            job.lease.release()
            raise
        outer: Future = Future()

        def done(f: Future) -> None:
            try:
                outer.set_result(job.finish(f.result()))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                outer.set_exception(exc)

        inner.add_done_callback(done)
        return outer

    @property
    def pending(self) -> int:
        """Submitted requests not finished yet (queued or decoding)."""
        return self._scheduler.pending if self._scheduler is not None else 0

    def _batch_scheduler(self) -> Any:
        """The loop thread that decodes submitted requests together: every :meth:`submit` (``specframe serve``), and
        :meth:`generate_result` calls when ``batch_size`` > 1."""
        from .decode.scheduler import BatchScheduler

        with self._lock:
            if self._scheduler is None:
                governor = optional(self.target, "governor")
                self._scheduler = BatchScheduler(self.target, self.config.batch_size,
                                                 governor.check if governor is not None else None)
            return self._scheduler

    def close(self) -> None:
        """Finish the requests in flight and stop the batch loop thread (``batch_size`` > 1); safe to call twice."""
        with self._lock:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.close()

    def generate_batch_results(
        self,
        prompts: Iterable[str | list[int]],
        *,
        batch_size: int = 8,
        question_ids: Sequence[Any] | None = None,
        on_result: Callable[[int, GenerationResult], None] | None = None,
        **keywords: Unpack[BatchKeywords],
    ) -> list[GenerationResult]:
        """Generate for several prompts, up to ``batch_size`` of them in each target forward (continuous batching:
        :mod:`specframe.decode.batch`). Each request has its own proposers, draft, acceptance and generator (seeded
        with ``seed``, as :meth:`generate_result` would), so each result equals that prompt generated alone.

        Returns the results in prompt order; ``on_result(index, result)`` is called as each request finishes.
        Keywords (:class:`~specframe.request_options.BatchKeywords`) as in :meth:`generate_result`, but for
        ``question_id`` / ``on_text``: ``question_ids`` gives one per prompt.

        Raises:
            ConfigError: ``batch_size < 1``, ``prompts`` empty or not a list (any iterable is read into one), or a
                value out of range; every prompt is
                checked before any is generated.
            PromptTooLongError: a prompt that leaves no room in the model's context (the message gives its index).
        """
        from .decode.batch import decode_batch

        prompts = _batch_inputs(prompts, batch_size, question_ids, on_result)
        opts = self._options("generate_batch_results", keywords, BATCH_KEYWORDS)
        encoded = [self.prompt_ids(p, opts.chat, index=i) for i, p in enumerate(prompts)]
        self.lease(opts.proposers, opts.merge, opts.router, opts.sampling).release()  # a bad option fails now
        if opts.constraint is not None:
            self.constraint(opts.constraint)  # and a bad constraint (each request compiles its own below)
        jobs: dict[int, RequestJob] = {}

        def requests() -> Iterator[BatchRequest]:
            for i, ids in enumerate(encoded):  # each request's plugin set is leased as it joins
                qid = None if question_ids is None else question_ids[i]
                jobs[i] = RequestJob(self, ids, dataclasses.replace(opts, question_id=qid), measure_load=False)
                yield jobs[i].batch_request()

        governor = optional(self.target, "governor")
        results: list[GenerationResult | None] = [None] * len(encoded)
        for i, result in decode_batch(self.target, requests(), batch_size,
                                      between_steps=governor.check if governor is not None else None):
            results[i] = jobs.pop(i).finish(result)
            if on_result is not None:
                on_result(i, results[i])
        return [r for r in results if r is not None]

    def generate_batch(self, prompts: Sequence[str | list[int]], **kwargs: Any) -> list[dict]:
        """Like :meth:`generate_batch_results` (same keyword arguments), returning the ``--json`` records."""
        return [r.to_dict() for r in self.generate_batch_results(prompts, **kwargs)]

    def options(self, **keywords: Unpack[RequestKeywords]) -> RequestOptions:
        """A request's options, checked once (:class:`~specframe.request_options.RequestOptions`): the given values
        (named as spelled in :meth:`generate_result` in any error), else the config's (valid already).

        Raises:
            TypeError: an unknown keyword.
            ConfigError: a value out of range or of the wrong type; a stop string holding a special token and other
                text; a malformed constraint.
        """
        return self._options("options", keywords, REQUEST_KEYWORDS)

    def _options(self, function: str, keywords: dict[str, Any], known: Sequence[str]) -> RequestOptions:
        """:meth:`options` of ``keywords`` for the entry point ``function`` (named in an unknown keyword's error)."""
        _check_keywords(function, keywords, known)
        from .decode.stopping import special_stop_ids

        get = keywords.get
        on_text, chat, logprobs = get("on_text"), get("chat"), get("logprobs")
        if on_text is not None and not callable(on_text):
            raise ConfigError(f"on_text must be a function taking each new piece of text, got {on_text!r}")
        _check_chat(chat)
        c, s = self.config, self.config.sampling
        config = {"max_new_tokens": c.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p,
                  "top_k": s.top_k, "seed": s.seed, "stop": c.stop}
        try:
            req = RequestSettings.model_validate({name: value if get(name) is None else get(name)
                                                  for name, value in config.items()})
        except ValidationError as exc:
            raise ConfigError(settings_error(exc)) from None
        special_stop_ids(tuple(req.stop), self.target.tokenizer)  # a stop string that cannot match fails now
        check_logprobs(logprobs)
        return RequestOptions(
            max_new_tokens=req.max_new_tokens, seed=req.seed, stop=tuple(req.stop),
            sampling=SamplingParams(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p),
            proposers=get("proposers"), merge=get("merge"), router=get("router"),
            constraint=self._constraint_spec(get("constraint")), logprobs=logprobs, chat=chat, on_text=on_text,
            question_id=get("question_id"))

    def prompt_ids(self, prompt: str | list[int], chat: bool | None = None, index: int | None = None) -> list[int]:
        """The token ids of one prompt: text is encoded (with the chat template unless ``chat`` is False); token ids
        are checked and used as they are. ``index``: the prompt's place in a batch (named in errors).

        Raises:
            ConfigError: lone UTF-16 surrogates, an id outside the vocabulary, an empty prompt.
            PromptTooLongError: the prompt leaves no room in the model's context.
            TypeError: neither text nor a list of token ids.
        """
        from .errors import PromptTooLongError

        name = "the prompt" if index is None else f"prompt {index}"
        if isinstance(prompt, str):
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ConfigError(f"{name} holds a lone UTF-16 surrogate (\\u{ord(prompt[exc.start]):04x} at "
                                  f"character {exc.start}), which is not text: pass valid Unicode") from None
            ids = self.encode(prompt, chat)  # (checks chat)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            _check_chat(chat)
            bad = next((t for t in prompt if not 0 <= t < self.target.vocab_size), None)
            if bad is not None:
                raise ConfigError(f"{'prompt' if index is None else name}: token id {bad} is outside the model's "
                                  f"vocabulary [0, {self.target.vocab_size})")
            ids = list(prompt)
        else:
            raise TypeError("prompt must be a str or a list of token ids (one prompt per call)")
        if not ids:
            raise ConfigError(f"{name} is empty: give at least one token")
        if len(ids) >= self.target.max_context:
            raise PromptTooLongError(f"{name} has {len(ids)} tokens; the model's context is "
                                     f"{self.target.max_context}: shorten it")
        return ids

    def machine_info(self) -> dict[str, Any]:
        """How the target runs here: CPU, ISA flags, usable cores, dtype / threads / prepack and why, the profile."""
        from .target.machine import fingerprint

        settings = optional(self.target, "settings")
        out: dict[str, Any] = fingerprint()
        describe = optional(self.target, "describe")  # the engine and its build (llama.cpp)
        out.update(describe() if describe is not None else {"engine": optional(self.target, "engine")})
        if settings is not None:
            out.update(settings.to_dict())
        return out

    def generate(self, prompt: str | list[int], **kwargs: Any) -> dict:
        """Like :meth:`generate_result` (same keyword arguments), returning the ``--json`` record (a dict).

        Raises:
            TypeError: an unknown keyword argument (the message lists the known ones).
        """
        _check_keywords("generate", kwargs, REQUEST_KEYWORDS)
        return self.generate_result(prompt, **kwargs).to_dict()


def load(
    config: BaseModel | str | Path | None = None,
    *,
    target: Any = None,
    registry: Registry | None = None,
    log: Callable[[str], None] = lambda s: None,
    progress: Any = None,
    **overrides: Any,
) -> Specframe:
    """Load plugins and the target model.

    Args:
        config: a typed config (:func:`~specframe.config.load_config`, or a loaded one's ``sf.config``), a
            :class:`~specframe.config.SpecframeConfig`, a YAML path, or None for defaults.
        target: an already-built :class:`specframe.target.hf.Target` (skips model loading; tests use this).
        registry: a prebuilt plugin registry (default: entry points).
        progress: a ``rich.progress.Progress`` for the bar of a first machine profile (None: no bar).
        overrides: config fields (``model``, ``dtype``, ``proposers``, ``temperature``, ...).

    Raises:
        SpecframeError subclasses for bad config, unknown model/proposer, missing model package.
    """
    _check_keywords("load", overrides, _LOAD_KEYWORDS)
    reg = registry or build_registry()
    # an unknown plugin or bad option fails here, before a model loads
    if isinstance(config, BaseModel):  # a typed config (load_config, sf.config) or a SpecframeConfig
        cfg = load_config(None, base=config.model_dump(exclude_unset=True), registry=reg, **overrides)
    else:
        cfg = load_config(config, registry=reg, **overrides)
    if cfg.verifier != "auto":
        reg.verifier(cfg.verifier)
    reg.constraint_engine(cfg.constraint_engine)
    if target is None:
        from .target.loader import load_target

        target = load_target(cfg.model, cfg.dtype, cfg.device, log=log, threads=cfg.threads, prepack=cfg.prepack,
                             speculative=any(p.name != "none" for p in cfg.proposers), progress=progress,
                             engine=cfg.engine, engine_options=cfg.llamacpp.model_dump())
    sf = Specframe(cfg, target, reg)
    sf.validate_proposers()
    if cfg.constraint is not None:
        sf.constraint()  # a constraint the engine refuses fails at load, not at the first request
    return sf
