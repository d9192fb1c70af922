"""Running replay tasks — one strategy (a grid point is one) over all requests — here in order, or as Ray tasks.

Each task builds its own :class:`~specframe.api.Specframe` over the process's target (fresh proposer instances,
the bench's config → registry → instances path) and replays the requests in order, so a task gives the same
figures wherever it runs: in this process one after another, or on Ray workers (``ray`` installed: ``pip install
specframe[ray]``), locally or on a cluster (``address``). A Ray worker is an actor that loads the target once (the
model's weights: proposers such as medusa read its LM head; nothing runs the target's forward) and runs tasks one
at a time with one torch thread; the trace goes to the object store once.

τ, α, acceptance by position and attribution are the same either way; draft times are measured where the task
runs, so the predicted speed-ups (and a router that reads timings, ``measure: auto``) can differ by what
the clock says.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..errors import ConfigError, SpecframeError
from .driver import GREEDY, Request, TraceVerifier, check_needs, replay_requests
from .trace import Trace


@dataclass(frozen=True)
class Task:
    """One strategy's replay: the bench strategy (as a dict), the requests, the token limit (``max_new_tokens``)."""

    strategy: dict[str, Any]
    requests: tuple[Request, ...]
    max_new_tokens: int


@dataclass
class TaskResult:
    name: str
    records: list[dict[str, Any]]
    seconds: float  # the replay's own wall time for this task (not modeled)
    where: str  # "here" or the Ray node


def specframe_for(target: Any, registry: Any) -> Any:
    """A :class:`~specframe.api.Specframe` over an already loaded (or trace-made) target, with its own instance pool
    (the default isolation policy, as ``specframe bench`` runs)."""
    import specframe

    return specframe.load(model=target.name, proposers=[{"name": "none"}], target=target, registry=registry)


def check_task(sf: Any, trace: Trace, task: Task) -> None:
    """Build the task's proposers once and refuse a strategy that reads features the trace lacks.

    Raises:
        TraceError: see :func:`~.driver.check_needs`.
    """
    s = task.strategy
    with sf.engine(s["proposers"], s.get("merge"), s.get("router"), GREEDY, verifier=TraceVerifier()) as engine:
        check_needs(trace, engine.feature_layers, engine.wants_hidden, s["name"])


def run_task(target: Any, registry: Any, trace: Trace, task: Task, advance: Callable[[], None] = lambda: None,
             where: str = "here") -> TaskResult:
    """Replay one task on ``target`` (see the module docstring)."""
    sf = specframe_for(target, registry)
    s = task.strategy
    check_task(sf, trace, task)
    t0 = time.perf_counter()
    records = replay_requests(
        lambda: sf.engine(s["proposers"], s.get("merge"), s.get("router"), GREEDY, verifier=TraceVerifier()),
        trace, task.requests, task.max_new_tokens, advance)
    seconds = time.perf_counter() - t0
    for r in records:
        r.update(strategy=s["name"], kind="specframe", plain=s["proposers"] == [{"name": "none"}])
    return TaskResult(s["name"], records, seconds, where)


def run_here(target: Any, registry: Any, trace: Trace, tasks: Sequence[Task],
             advance: Callable[[str], None] = lambda s: None) -> list[TaskResult]:
    """Every task in this process, one after another."""
    return [run_task(target, registry, trace, t, lambda name=t.strategy["name"]: advance(name)) for t in tasks]


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


class _Worker:
    """A Ray actor: the target loaded once; replays tasks one at a time (see the module docstring)."""

    def __init__(self, model: str, dtype: str, device: str, trace: Trace) -> None:
        import logging

        import torch

        from ..registry import build_registry
        from ..target.loader import load_target
        from .driver import with_trace_cost

        logging.getLogger("transformers").setLevel(logging.ERROR)
        self.trace = trace
        self.target = with_trace_cost(load_target(model, dtype, device, threads=1, prepack=False, measure=False), trace)
        torch.set_num_threads(1)
        self.registry = build_registry()

    def run(self, task: Task) -> TaskResult:
        import ray

        return run_task(self.target, self.registry, self.trace, task, where=ray.util.get_node_ip_address())


def run_on_ray(trace: Trace, tasks: Sequence[Task], model: str, device: str = "cpu", address: str | None = None,
               workers: int | None = None, advance: Callable[[str], None] = lambda s: None) -> tuple[list[TaskResult], str]:
    """Every task as a Ray actor task; returns the results (in ``tasks`` order) and a line saying where they ran.

    ``model``: what each worker loads (a built-in name or a path every node has; the trace's model). ``address``: a Ray cluster (``ray://host:10001`` or ``auto``); None starts Ray on this machine. ``workers``:
    actors (default: the cluster's CPUs, at most one per task). Every node needs specframe, its plugins and the model
    installed (the trace itself travels through the object store).

    Raises:
        ConfigError: ``ray`` is not installed, or Ray cannot start / reach ``address``.
    """
    try:
        import ray
        from ray.util import ActorPool
    except ImportError:
        raise ConfigError("Ray is not installed: pip install 'specframe[ray]' (or run without --ray)") from None
    import logging

    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(address=address, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
        except Exception as exc:  # noqa: BLE001 - Ray raises many kinds; the user fixes the address or the install
            raise ConfigError(f"Ray could not {'connect to ' + address if address else 'start'}: "
                              f"{(str(exc).strip().splitlines() or [type(exc).__name__])[0]}") from None
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        n = max(1, min(workers or cpus, len(tasks)))
        trace_ref = ray.put(trace)
        actor = ray.remote(num_cpus=1)(_Worker)
        pool = ActorPool([actor.remote(model, trace.dtype, device, trace_ref) for _ in range(n)])
        results: dict[str, TaskResult] = {}
        for t in tasks:
            pool.submit(lambda a, task: a.run.remote(task), t)
        for _ in tasks:
            try:
                res = pool.get_next_unordered()
            except ray.exceptions.RayTaskError as exc:  # a SpecframeError raised in a worker: its own one line
                cause = getattr(exc, "cause", None)
                if isinstance(cause, SpecframeError):
                    raise cause from None
                raise
            results[res.name] = res
            advance(res.name)
        where = f"Ray: {n} workers on {len({r.where for r in results.values()})} node(s)" + (f" at {address}" if address else " (local)")
        return [results[t.strategy["name"]] for t in tasks], where
    finally:
        if started_here:
            ray.shutdown()
