"""One checked request made ready to decode, whichever host decodes it.

Every entry point of :class:`~specframe.api.Specframe` turns a request into a :class:`RequestJob` the same way:
its :class:`~specframe.request_options.RequestOptions` and prompt ids (checked once), its own compiled constraint,
the observers, the lease of its plugin set and the load other processes put on the machine when it starts. The
hosts then differ only in who calls the loop:

- ``generate_result`` at ``batch_size`` 1: the caller's thread runs :meth:`RequestJob.run` (each thread its own
  forwards, so threads decode in parallel);
- ``submit`` (and ``generate_result`` at ``batch_size`` > 1): the batch loop thread decodes
  :meth:`RequestJob.batch_request` with every other submitted request;
- ``generate_batch_results``: the caller's thread decodes the jobs' batch requests together (``decode_batch``).

:meth:`RequestJob.finish` is the end every host shares: the observers' request event, the question id and the
machine record.
"""

from __future__ import annotations

from typing import Any

from .contracts.optional import optional
from .decode.batch import BatchRequest
from .decode.engine import GenerationResult
from .request_options import RequestOptions


class RequestJob:
    """A request's options, prompt and leased plugin set (see the module docstring).

    Args:
        sf: the loaded :class:`~specframe.api.Specframe`.
        ids: the prompt's token ids, checked (:meth:`~specframe.api.Specframe.prompt_ids`).
        opts: the request's options, checked (:meth:`~specframe.api.Specframe.options`).
        measure_load: read the others' load at the start (``finish`` then records it in ``machine``).

    Raises:
        ConfigError: a bad proposer, merge or router option (nothing is leased then).
        ConstraintError: a constraint the engine refuses.
    """

    def __init__(self, sf: Any, ids: list[int], opts: RequestOptions, measure_load: bool = True) -> None:
        self.sf, self.ids, self.opts = sf, ids, opts
        self.constraint = sf.constraint(opts.constraint) if opts.constraint is not None else None
        self.governor = optional(sf.target, "governor")
        self.observer = sf.registry.observers()  # None when no plugin observes: the loop then skips events
        self.lease = sf.lease(opts.proposers, opts.merge, opts.router, opts.sampling)
        self.measure_load = measure_load
        self.load = self.governor.check() if measure_load and self.governor is not None else None

    @property
    def between_steps(self) -> Any:
        """The thread governor's check between steps (a neighbour may start mid-request), or None."""
        return self.governor.check if self.governor is not None else None

    def run(self) -> GenerationResult:
        """Decode in the caller's thread on the leased engine, release the lease, and :meth:`finish`."""
        opts = self.opts
        with self.lease:
            result = self.lease.engine.generate(
                self.ids, max_new_tokens=opts.max_new_tokens, sampling=opts.sampling, seed=opts.seed,
                stop_strings=opts.stop, on_text=opts.on_text, observer=self.observer,
                between_steps=self.between_steps, constraint=self.constraint, logprobs=opts.logprobs,
            )
        return self.finish(result)

    def batch_request(self, cancel: Any = None) -> BatchRequest:
        """The job for a batch loop; the loop releases the lease when the request leaves the batch."""
        opts = self.opts
        return BatchRequest(self.lease.engine, self.ids, opts.max_new_tokens, opts.sampling, opts.seed, opts.stop,
                            opts.on_text, self.observer, release=self.lease.release, cancel=cancel,
                            constraint=self.constraint, logprobs=opts.logprobs)

    def finish(self, result: GenerationResult) -> GenerationResult:
        """The observers' request event, the question id and the machine record (with the others' load when it was
        measured) of the finished ``result``, which is returned."""
        if self.observer is not None:
            self.observer.request(tuple(self.lease.engine.labels), len(self.ids), tuple(result.token_ids),
                                  result.finish_reason, result.metrics.to_dict())
        result.question_id = self.opts.question_id
        if optional(self.sf.target, "settings") is not None:
            result.machine = self.sf.machine_info()
            if self.measure_load:
                result.machine["others_load"] = round(self.load or 0.0, 2)
        return result
