"""One checked request made ready to decode, whichever host decodes it.

Every entry point of :class:`~specframe.api.Specframe` turns a request into a :class:`RequestJob` the same way:
its :class:`~specframe.request_options.RequestOptions` and prompt ids (checked once), its own compiled constraint,
the observers, the lease of its plugin set and the load other processes put on the machine when it starts. The
hosts then differ only in who calls the loop:

- ``generate_result`` at ``batch_size`` 1: the caller's thread runs :meth:`RequestJob.run` (each thread its own
  forwards, so threads decode in parallel);
- ``submit`` (and ``generate_result`` at ``batch_size`` > 1): the batch loop thread decodes
  :meth:`RequestJob.batch_request` with every other submitted request (:class:`SubmitQueue`);
- ``generate_batch_results``: the caller's thread decodes the jobs' batch requests together (:func:`decode_jobs`).

:meth:`RequestJob.finish` is the end every host shares: the observers' request event, the question id and the
machine record.
"""

from __future__ import annotations

import threading
import warnings
from concurrent.futures import Future
from typing import Any, Callable, Iterator, Sequence

from .contracts.optional import optional
from .decode.batch import BatchRequest
from .decode.engine import GenerationResult
from .request_options import RequestOptions


class RequestJob:
    """A request's options, prompt and leased plugin set (see the module docstring).

    Args:
        ids: the prompt's token ids, checked (:func:`~specframe.request_options.check_prompt`).
        opts: the request's options, checked (:func:`~specframe.request_options.check_options`).
        target: the loaded target (its thread governor and machine settings).
        registry: the plugin registry (its observers).
        plugins: the :class:`~specframe.instance_pool.PluginSets` that lends the request its plugin set.
        compile_constraint: compiles the request's constraint spec
            (:class:`~specframe.request_options.ConstraintCompiler`).
        measure_load: read the others' load at the start (``finish`` then records it in ``machine``).

    Raises:
        ConfigError: a bad proposer, merge or router option (nothing is leased then).
        ConstraintError: a constraint the engine refuses.
    """

    def __init__(self, ids: list[int], opts: RequestOptions, *old: Any, target: Any = None, registry: Any = None,
                 plugins: Any = None, compile_constraint: Callable[[Any], Any] | None = None,
                 measure_load: bool = True) -> None:
        if hasattr(ids, "registry"):  # the old RequestJob(sf, ids, opts[, measure_load])
            from . import MOVED_UNTIL

            warnings.warn("RequestJob(sf, ids, opts) is deprecated: pass RequestJob(ids, opts, target=sf.target, "
                          "registry=sf.registry, plugins=..., compile_constraint=sf.constraint) (the old form goes in "
                          f"specframe {MOVED_UNTIL})", DeprecationWarning, stacklevel=2)
            sf, ids, opts = ids, opts, old[0]
            measure_load = old[1] if len(old) > 1 else measure_load
            target, registry, plugins, compile_constraint = sf.target, sf.registry, sf._plugins, sf.constraint
        assert compile_constraint is not None
        self.ids, self.opts, self.target = ids, opts, target
        self.constraint = compile_constraint(opts.constraint) if opts.constraint is not None else None
        self.decode = opts.decode_with(self.constraint)
        self.governor = optional(target, "governor")
        self.observer = registry.observers()  # None when no plugin observes: the loop then skips events
        self.lease = plugins.lease(opts.proposers, opts.merge, opts.router, opts.sampling)
        self.measure_load = measure_load
        self.load = self.governor.check() if measure_load and self.governor is not None else None

    @property
    def between_steps(self) -> Any:
        """The thread governor's check between steps (a neighbour may start mid-request), or None."""
        return self.governor.check if self.governor is not None else None

    def run(self) -> GenerationResult:
        """Decode in the caller's thread on the leased engine, release the lease, and :meth:`finish`."""
        with self.lease:
            result = self.lease.engine.generate(self.ids, self.decode, observer=self.observer,
                                                between_steps=self.between_steps)
        return self.finish(result)

    def batch_request(self, cancel: Any = None) -> BatchRequest:
        """The job for a batch loop; the loop releases the lease when the request leaves the batch."""
        return BatchRequest(self.lease.engine, self.ids, self.decode, observer=self.observer,
                            release=self.lease.release, cancel=cancel)

    def finish(self, result: GenerationResult) -> GenerationResult:
        """The observers' request event, the question id and the machine record (with the others' load when it was
        measured) of the finished ``result``, which is returned."""
        if self.observer is not None:
            self.observer.request(tuple(self.lease.engine.labels), len(self.ids), tuple(result.token_ids),
                                  result.finish_reason, result.metrics.to_dict())
        result.question_id = self.opts.question_id
        if optional(self.target, "settings") is not None:
            result.machine = machine_info(self.target)
            if self.measure_load:
                result.machine["others_load"] = round(self.load or 0.0, 2)
        return result


class SubmitQueue:
    """The batch loop thread of one loaded target, made on the first :meth:`submit` (``Specframe.submit``, and
    ``generate_result`` at ``batch_size`` > 1): submitted jobs are decoded together, ``batch_size`` at most per
    forward."""

    def __init__(self, target: Any, batch_size: int) -> None:
        self.target, self.batch_size = target, batch_size
        self._scheduler: Any = None
        self._lock = threading.Lock()

    def submit(self, job: RequestJob, cancel: Any = None) -> Future:
        """Queue ``job`` (its lease is released if it cannot be queued); a future of its finished result."""
        try:
            inner = self._loop().submit(job.batch_request(cancel))
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

    def _loop(self) -> Any:
        from .decode.scheduler import BatchScheduler

        with self._lock:
            if self._scheduler is None:
                governor = optional(self.target, "governor")
                self._scheduler = BatchScheduler(self.target, self.batch_size,
                                                 governor.check if governor is not None else None)
            return self._scheduler

    def close(self) -> None:
        """Finish the requests in flight and stop the loop thread; safe to call twice (a later submit starts one)."""
        with self._lock:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.close()


def decode_jobs(target: Any, prompts: Sequence[list[int]], make_job: Callable[[int, list[int]], RequestJob],
                batch_size: int, on_result: Callable[[int, GenerationResult], None] | None = None,
                ) -> list[GenerationResult]:
    """Decode ``prompts`` (checked ids) in the caller's thread, ``batch_size`` at most per forward; ``make_job(i,
    ids)`` makes each request's job as it joins the batch (its plugin set leased then). Returns the results in prompt
    order; ``on_result(index, result)`` is called as each finishes."""
    from .decode.batch import decode_batch

    jobs: dict[int, RequestJob] = {}

    def requests() -> Iterator[BatchRequest]:
        for i, ids in enumerate(prompts):
            jobs[i] = make_job(i, ids)
            yield jobs[i].batch_request()

    governor = optional(target, "governor")
    results: list[GenerationResult | None] = [None] * len(prompts)
    for i, result in decode_batch(target, requests(), batch_size,
                                  between_steps=governor.check if governor is not None else None):
        results[i] = jobs.pop(i).finish(result)
        if on_result is not None:
            on_result(i, results[i])
    return [r for r in results if r is not None]


def machine_info(target: Any) -> dict[str, Any]:
    """How ``target`` runs here: CPU, ISA flags, usable cores, dtype / threads / prepack and why, the profile."""
    from .target.machine import fingerprint

    settings = optional(target, "settings")
    out: dict[str, Any] = fingerprint()
    describe = optional(target, "describe")  # the engine and its build (llama.cpp)
    out.update(describe() if describe is not None else {"engine": optional(target, "engine")})
    if settings is not None:
        out.update(settings.to_dict())
    return out
