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
import logging
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from pydantic import BaseModel

from .config import SamplingConfig, SpecframeConfig, load_config, runtime_config
from .contracts.constraint import Constraint, ConstraintSpec
from .decode.engine import Engine, GenerationResult
from .errors import ConfigError
from .instance_pool import Lease, PluginSets
from .registry import Registry, build_registry
from .request_job import RequestJob, SubmitQueue, decode_jobs, machine_info
from .request_options import (
    BATCH_KEYWORDS,
    REQUEST_KEYWORDS,
    BatchKeywords,
    ConstraintCompiler,
    RequestKeywords,
    RequestOptions,
    check_batch,
    check_chat,
    check_keywords,
    check_options,
    check_prompt,
)
from .sampling import SamplingParams

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("specframe")

POOL_IDLE = 16  # idle plugin instances a Specframe keeps for later requests (and build failures it remembers)
_LOAD_KEYWORDS = tuple(SpecframeConfig.model_fields) + tuple(SamplingConfig.model_fields)


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
        # each request's plugin instances, on loan; its constraint compiled by the config's engine (made once)
        self._plugins = PluginSets(self.config, target, registry, max_idle=POOL_IDLE)
        self._constraints = ConstraintCompiler(target, self.config, registry)
        self._queue = SubmitQueue(target, self.config.batch_size)  # the batch loop thread, made on the first submit

    @property
    def _constraint_engine(self) -> Any:
        """The constraint engine once made (None before the first constraint)."""
        return self._constraints.engine

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
        return self._constraints(spec)

    def encode(self, prompt: str, chat: bool | None = None) -> list[int]:
        """Token ids of ``prompt``, in the chat template when ``chat`` (None: the config's ``chat``).

        Raises:
            ConfigError: ``chat`` is not a bool or None (``"false"`` would otherwise read as true).
        """
        check_chat(chat)
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
        return self._job(ids, opts).run()  # this thread's own forwards

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
        """Queue a checked request (see :meth:`submit`); a bad plugin option raises here."""
        return self._queue.submit(self._job(ids, opts), cancel)

    @property
    def pending(self) -> int:
        """Submitted requests not finished yet (queued or decoding)."""
        return self._queue.pending

    def close(self) -> None:
        """Finish the requests in flight and stop the batch loop thread (``batch_size`` > 1); safe to call twice."""
        self._queue.close()

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
        prompts = check_batch(prompts, batch_size, question_ids, on_result)
        opts = self._options("generate_batch_results", keywords, BATCH_KEYWORDS)
        encoded = [self.prompt_ids(p, opts.chat, index=i) for i, p in enumerate(prompts)]
        self.lease(opts.proposers, opts.merge, opts.router, opts.sampling).release()  # a bad option fails now
        if opts.constraint is not None:
            self.constraint(opts.constraint)  # and a bad constraint (each request compiles its own as it joins)
        return decode_jobs(self.target, encoded, lambda i, ids: self._job(
            ids, dataclasses.replace(opts, question_id=None if question_ids is None else question_ids[i]),
            measure_load=False), batch_size, on_result)

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
        return check_options(function, keywords, known, self.target, self.config)

    def _job(self, ids: list[int], opts: RequestOptions, measure_load: bool = True) -> RequestJob:
        """The :class:`~specframe.request_job.RequestJob` of a checked request (its constraint compiled, its plugin set
        leased)."""
        return RequestJob(ids, opts, target=self.target, registry=self.registry, plugins=self._plugins,
                          compile_constraint=self._constraints, measure_load=measure_load)

    def prompt_ids(self, prompt: str | list[int], chat: bool | None = None, index: int | None = None) -> list[int]:
        """The token ids of one prompt: text is encoded (with the chat template unless ``chat`` is False); token ids
        are checked and used as they are. ``index``: the prompt's place in a batch (named in errors).

        Raises:
            ConfigError: lone UTF-16 surrogates, an id outside the vocabulary, an empty prompt.
            PromptTooLongError: the prompt leaves no room in the model's context.
            TypeError: neither text nor a list of token ids.
        """
        return check_prompt(prompt, chat, self.target, self.config, index)

    def machine_info(self) -> dict[str, Any]:
        """How the target runs here: CPU, ISA flags, usable cores, dtype / threads / prepack and why, the profile."""
        return machine_info(self.target)

    def generate(self, prompt: str | list[int], **kwargs: Any) -> dict:
        """Like :meth:`generate_result` (same keyword arguments), returning the ``--json`` record (a dict).

        Raises:
            TypeError: an unknown keyword argument (the message lists the known ones).
        """
        check_keywords("generate", kwargs, REQUEST_KEYWORDS)
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
    check_keywords("load", overrides, _LOAD_KEYWORDS)
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
