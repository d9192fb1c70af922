"""The conformance kit's replay: a proposer class's τ on recorded traces of a real target, without loading it.

    from specframe.testing import replay_proposer
    result = replay_proposer(MyProposer, {"k": 4})        # the dev-set traces shipped with specframe
    print(result)                                        # τ 1.74, α 0.38, predicted 1.52× over plain decoding ...

The shipped traces (:func:`shipped_traces`) are SmolLM2-135M-Instruct's greedy continuations of Spec-Bench dev
questions in float32 (token ids and the cost curve only, no hidden states): they serve proposers that need neither
the target model nor its hidden states (lookup proposers such as n-gram or retrieval; pass ``tokenizer=`` to one that
reads text). A proposer that reads hidden states (``needs_hidden_states``, ``feature_layers``) or the target's
weights needs a trace recorded with ``specframe trace record --features-for NAME`` and ``specframe replay``, which
loads the weights (see docs/replay.md).

It is the same driver as ``specframe replay`` (:mod:`specframe.replay.driver`): the engine's step with the trace
answering for the target, the kit's isolation (faults are counted, never hidden by a time limit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..decode.engine import Engine
from ..errors import ConfigError
from ..replay.driver import Request, TraceTarget, TraceVerifier, check_needs, fixed_engine, replay_requests
from ..replay.trace import read_trace
from ..target.cost import CostCurve

TRACES = Path(__file__).resolve().parent / "traces"
DEFAULT_TRACE = "smollm2-135m-instruct-fp32-dev"


def shipped_traces() -> dict[str, Path]:
    """The traces that ship with specframe: name -> folder."""
    return {p.name: p for p in sorted(TRACES.iterdir()) if (p / "manifest.json").is_file()} if TRACES.is_dir() else {}


@dataclass(frozen=True)
class ReplayResult:
    """One proposer replayed on a trace. τ = committed tokens / target forwards (bonus included); α = accepted /
    drafted nodes; predicted speed-up over plain decoding from the trace's cost curve (None without one)."""

    tau: float
    alpha: float
    predicted_speedup: float | None
    tau_by_category: dict[str, float]
    draft_ms_per_step: float  # measured here
    requests: int
    faults: int  # the proposer's faults (raised, malformed drafts): each costs a target-only step
    trace: str
    records: list[dict[str, Any]] = field(repr=False, default_factory=list)

    def __str__(self) -> str:
        speed = "" if self.predicted_speedup is None else f", predicted {self.predicted_speedup:.2f}× over plain decoding"
        cats = ", ".join(f"{c} {t:.2f}" for c, t in self.tau_by_category.items())
        return (f"τ {self.tau:.2f}, α {self.alpha:.2f}{speed}, draft {self.draft_ms_per_step:.2f} ms/step, "
                f"{self.faults} faults on {self.requests} requests of {self.trace} (τ by category: {cats})")


def replay_proposer(proposer: type, config: dict[str, Any] | None = None, trace: str | Path | None = None, *,
                    tokenizer: Any = None, max_new_tokens: int | None = None) -> ReplayResult:
    """Replay one proposer class on a trace (default: the shipped dev-set trace) and summarise it.

    Args:
        proposer: the proposer class (registered or not).
        config: its options (``name`` is added); validated by ``proposer.Config``.
        trace: a trace folder or the name of a shipped one (:func:`shipped_traces`).
        tokenizer: given to the proposer as ``TargetInfo.tokenizer`` (the shipped traces carry none).
        max_new_tokens: replay only the first this-many tokens of each request (default: all recorded).

    Raises:
        TraceError: an unreadable trace, or a proposer that reads hidden states the trace does not hold.
        ConfigError: options the proposer's config rejects, or a proposer that cannot be built without the model.
    """
    from ..decode.isolation import NEVER_DISABLED, IsolationPolicy

    folder = Path(trace) if trace is not None and Path(trace).exists() else shipped_traces().get(str(trace or DEFAULT_TRACE))
    if folder is None:
        raise ConfigError(f"no trace {trace!r}: give a trace folder or one of {sorted(shipped_traces())}")
    t = read_trace(folder)
    target = TraceTarget(t, tokenizer)
    cfg = proposer.Config.model_validate({"name": proposer.name, **(config or {})})
    try:
        instance = proposer(cfg, target.info)
    except ConfigError as exc:
        raise ConfigError(f"{proposer.__name__} cannot be built on a trace without its target ({exc}); replay it with "
                          "`specframe replay`, which loads the target's weights") from None
    engine = Engine(target, [instance], TraceVerifier(), isolation=IsolationPolicy(propose_timeout_s=None,
                                                                                    max_faults=NEVER_DISABLED))
    check_needs(t, engine.feature_layers, engine.wants_hidden, proposer.name)
    max_new = t.max_new_tokens if max_new_tokens is None else max_new_tokens
    records = replay_requests(lambda: fixed_engine(engine), t, [Request(i) for i in range(len(t.questions))], max_new)
    return _summary(records, CostCurve.from_manifest(t.manifest.get("cost")), folder.name)


def _summary(records: list[dict[str, Any]], cost: CostCurve, name: str) -> ReplayResult:
    def total(key: str, rs: list[dict[str, Any]] = records) -> float:
        return sum(r["metrics"][key] for r in rs)

    steps = total("target_forwards") or 1
    from ..bench.runner import category_group

    cats: dict[str, list[dict[str, Any]]] = {}
    for r in records:  # Spec-Bench's columns, as in the bench report
        cats.setdefault(category_group(r["category"]), []).append(r)
    wall = total("wall_s")
    return ReplayResult(
        tau=total("new_tokens") / steps,
        alpha=total("accepted_nodes") / (total("drafted_nodes") or 1),
        predicted_speedup=total("new_tokens") * cost.t1_ms() / 1e3 / wall if cost and wall else None,
        tau_by_category={c: total("new_tokens", rs) / (total("target_forwards", rs) or 1) for c, rs in cats.items()},
        draft_ms_per_step=1e3 * total("propose_s") / steps,
        requests=len(records),
        faults=int(total("proposer_faults")),
        trace=name,
        records=records,
    )
