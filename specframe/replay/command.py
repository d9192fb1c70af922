"""``specframe trace record`` and ``specframe replay``: validate everything first, then work with a progress bar, then
write the output folder whole (a temporary folder swapped in; nothing is written on an error)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence

import typer

from ..errors import ConfigError, SpecframeError

trace_app = typer.Typer(no_args_is_help=True, help="Record target traces for `specframe replay`.")


def _cats(categories: Optional[List[str]]) -> Optional[list[str]]:
    return [c.strip() for entry in (categories or []) for c in entry.split(",") if c.strip()] or None


def _proposer_entry(text: str) -> dict[str, Any]:
    """``--features-for`` value: a proposer name, or a proposer config as a YAML / JSON mapping with a ``name``."""
    if not text.lstrip().startswith("{"):
        return {"name": text}
    from ..io.yamlfile import parse_yaml

    entry = parse_yaml(text, f"--features-for {text!r}")
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise ConfigError(f"--features-for {text!r}: give a proposer name or a mapping with a name, e.g. "
                          "'{name: medusa, heads: runs/medusa}'")
    return entry


def _check_output(output: Path) -> None:
    if output.exists() and not output.is_dir():
        raise ConfigError(f"--output {output} is a file: give a folder")


def _quiet_transformers() -> None:
    import logging

    from transformers.utils import logging as hf_logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    hf_logging.disable_progress_bar()


@trace_app.command("record")
def record(
    questions: Path = typer.Option(..., "--questions", help="Spec-Bench-format JSONL (first turn used)."),
    output: Path = typer.Option(..., "--output", help="Trace folder to write (replaced when complete)."),
    model: str = typer.Option("smollm2-135m-instruct", "--model", help="Built-in name, model directory or .gguf file."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 | bfloat16 | float16 (exact replay comparisons: float32)."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", help="Tokens generated per question at most."),
    categories: Optional[List[str]] = typer.Option(None, "--categories", help="Category filter (repeatable or comma list)."),
    limit_per_category: Optional[int] = typer.Option(None, "--limit-per-category", help="First N questions per category."),
    proposer: Optional[List[str]] = typer.Option(
        None, "--proposer", help="The strategy that runs the target (default none; any exact one gives the same ids "
        "in float32; repeat to combine)."),
    features_for: Optional[List[str]] = typer.Option(
        None, "--features-for", help="Also store the hidden states this proposer reads: a name (medusa, eagle) or a "
        "proposer config as YAML/JSON, e.g. '{name: medusa, heads: runs/medusa}' (repeatable)."),
    threads: Optional[str] = typer.Option(None, "--threads", help="torch threads, or auto (default)."),
    no_chat: bool = typer.Option(False, "--no-chat", help="Do not apply the chat template."),
    profile: bool = typer.Option(
        True, "--profile/--no-profile", help="Store the target's cost curve v(n) from the machine profile, measuring "
        "the profile first when this machine has none (as `specframe tune`)."),
) -> None:
    """Run the target once per question (greedy) and store the prompt and generated ids, the hidden states
    feature-based proposers read, and the target's cost curve: the input of `specframe replay`."""
    from ..cli.console import fail

    try:
        _record(questions, output, model, dtype, max_new_tokens, _cats(categories), limit_per_category,
                proposer or ["none"], [_proposer_entry(f) for f in features_for or []], threads, not no_chat, profile)
    except SpecframeError as exc:
        fail(exc)


def _record(questions, output, model, dtype, max_new_tokens, cats, limit, proposers, features_for, threads, chat,
            profile) -> None:
    from ..bench.runner import select_questions
    from ..cli.console import err, load_with_progress, machine_flags, progress_bar
    from ..config import load_config
    from ..io.atomic import replace_folder
    from ..io.prompts import read_prompts
    from ..registry import build_registry
    from ..target.models import check_device, resolve_model
    from .record import declared_needs, record_trace
    from .trace import write_trace

    if dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"--dtype must be float32, bfloat16 or float16, got {dtype!r} (a trace fixes the dtype)")
    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit-per-category must be >= 1, got {limit}")
    _check_output(output)
    prompts = read_prompts(questions)
    chosen = select_questions(prompts, cats, limit)
    if not chosen:
        found = sorted({str(p.category) for p in prompts if p.category is not None})
        raise ConfigError(f"--categories {cats} match no question; the file has: {', '.join(found) or '(no categories)'}")
    registry = build_registry()
    entries = [{"name": p} for p in proposers]
    cfg = load_config(None, registry=registry, model=model, dtype=dtype, chat=chat, proposers=entries, merge=None,
                      **machine_flags(threads, None))
    if features_for:  # an unknown name or option fails now, before the model loads
        load_config(None, registry=registry, proposers=features_for)
    check_device(cfg.device)
    resolve_model(cfg.model)

    import specframe

    _quiet_transformers()
    if profile:  # the machine profile (measured once if missing) gives the cost curve
        from ..target.loader import load_target

        target = load_target(cfg.model, dtype, cfg.device, lambda s: err.print(s, markup=False), threads=cfg.threads,
                             prepack=cfg.prepack, measure=True)
        sf = specframe.load(cfg, target=target, registry=registry)
    else:
        sf = load_with_progress(cfg, registry)
    declared_needs(sf, features_for)  # builds those proposers: one that cannot be built fails before the bar starts
    with progress_bar() as progress:
        task = progress.add_task("record", total=len(chosen))
        trace = record_trace(sf, chosen, max_new_tokens=max_new_tokens, chat=chat, proposers=entries,
                             features_for=features_for, advance=lambda: progress.advance(task))
    replace_folder(output, lambda tmp: write_trace(trace, tmp))
    bpt = trace.manifest["bytes_per_token"]
    err.print(f"wrote {output}: {trace.describe()}; {bpt['token_ids']} bytes per generated token for the ids"
              + (f", {bpt['features']} for the features" if "features" in bpt else "")
              + ("" if trace.manifest["cost"] else "; no cost curve (no machine profile): replay predicts no speed-up"),
              markup=False, soft_wrap=True)


def replay(
    traces: Path = typer.Option(..., "--traces", help="Trace folder (specframe trace record)."),
    config: Path = typer.Option(..., "--config", help="Bench YAML: the strategies to replay (peers are skipped)."),
    output: Path = typer.Option(Path("replay-out"), "--output", help="Folder for results.json, report.md, PNGs."),
    categories: Optional[List[str]] = typer.Option(None, "--categories", help="Category filter (repeatable or comma list)."),
    limit_per_category: Optional[int] = typer.Option(None, "--limit-per-category", help="First N questions per category."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="At most the trace's (default: the trace's)."),
    use_ray: Optional[bool] = typer.Option(
        None, "--ray/--no-ray", help="Run the strategies as Ray tasks (default: when the config sweeps a grid and ray "
        "is installed: pip install 'specframe[ray]')."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="A Ray cluster to run on (implies --ray)."),
    compare: Optional[Path] = typer.Option(
        None, "--compare", help="results.json of a live `specframe bench` on the same questions: adds replay vs live."),
    profile: Optional[List[Path]] = typer.Option(
        None, "--profile", help="A speculation_profile.json (ours or another engine's, schema 1.0) to report beside "
        "the replayed strategies' own (repeatable)."),
) -> None:
    """Replay every strategy of a bench config against recorded traces: τ, α, attribution and predicted speed-ups in
    seconds, without running the target."""
    from ..cli.console import fail

    try:
        _replay(traces, config, output, _cats(categories), limit_per_category, max_new_tokens, use_ray, ray_address,
                compare, profile or [])
    except SpecframeError as exc:
        fail(exc)


@dataclass
class _Setup:
    """A replay, checked: the config, the trace, the strategies to run as tasks and how."""

    cfg: Any
    trace: Any
    strategies: list[Any]
    chosen: list[Any]
    tasks: list[Any]
    max_new_tokens: int  # new tokens to replay per question (the token limit)
    use_ray: bool
    live: dict[str, Any] | None
    registry: Any


def _replay(traces, config, output, cats, limit, max_new_tokens, use_ray, ray_address, compare, profiles=()) -> None:
    from ..bench.speculation_profile import read_profile
    from ..cli.console import err, progress_bar

    theirs = [(path, read_profile(path)) for path in profiles]
    setup = _setup(traces, config, output, cats, limit, max_new_tokens, use_ray, ray_address, compare, err)  # 1. validate
    target = _load(setup, err)  # 2. the target's weights (proposers may read them; no forward runs)
    t0 = time.perf_counter()  # 3. replay
    with progress_bar() as progress:
        if setup.use_ray:
            from .sweep import run_on_ray

            bar = progress.add_task("replay (Ray)", total=len(setup.tasks))
            results, where = run_on_ray(setup.trace, setup.tasks, setup.cfg.model, setup.cfg.device, ray_address,
                                        advance=lambda s: progress.update(bar, advance=1, description=f"replay {s:>16}"))
        else:
            from .sweep import run_here

            bar = progress.add_task("replay", total=len(setup.tasks) * len(setup.tasks[0].requests))
            results = run_here(target, setup.registry, setup.trace, setup.tasks,
                               advance=lambda s: progress.update(bar, advance=1, description=f"replay {s:>16}"))
            where = "run here, strategies one after another"
    _write(setup, results, where, time.perf_counter() - t0, traces, output, compare, err, target, theirs)  # 4. report


def _setup(traces, config, output, cats, limit, max_new_tokens, use_ray, ray_address, compare, err) -> _Setup:
    """Everything checked before any model loads (the features a strategy reads are checked once it is built)."""
    from ..bench.command import validate_bench_config
    from ..registry import build_registry
    from .driver import Request
    from .report import read_live
    from .sweep import Task

    cfg, trace, max_new = _replay_inputs(traces, config, output, cats, limit, max_new_tokens)
    index, chosen = _chosen_questions(cfg, trace)
    peers = [s.name for s in cfg.strategies if s.peer is not None]
    strategies = [s for s in cfg.strategies if s.proposers is not None]
    registry = build_registry()
    validate_bench_config(cfg.model_copy(update={"strategies": strategies}), registry)
    live = read_live(compare) if compare is not None else None
    use_ray = _use_ray(use_ray, ray_address, strategies)
    if peers:
        err.print(f"replay skips the peers {', '.join(peers)} (they run transformers' own generate, not specframe "
                  "proposers)", markup=False, soft_wrap=True)
    requests = tuple(Request(index[id(p)], seed, rep) for p in chosen for seed in cfg.seeds for rep in range(cfg.repeats))
    tasks = [Task(s.model_dump(), requests, max_new) for s in strategies]
    return _Setup(cfg, trace, strategies, chosen, tasks, max_new, use_ray, live, registry)


def _replay_inputs(traces, config, output, cats, limit, max_new_tokens) -> tuple[Any, Any, int]:
    """The bench config with the command line's overrides (greedy only) and the trace, checked against each other:
    ``(config, trace, new tokens to replay per question)``.

    Raises:
        ConfigError: a bad option or output folder, or a sampling config; TraceError: see
            :func:`_check_against_trace`.
    """
    from ..bench.config import load_bench_config
    from ..sampling import is_greedy_temperature
    from .trace import read_trace

    if max_new_tokens is not None and max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit-per-category must be >= 1, got {limit}")
    _check_output(output)
    cfg = load_bench_config(config, max_new_tokens=max_new_tokens, limit_per_category=limit, categories=cats)
    if not is_greedy_temperature(cfg.temperature):
        raise ConfigError(f"{config}: temperature {cfg.temperature}: replay is greedy only (a trace holds the target's "
                          "greedy continuation, which sampled output does not follow): set temperature: 0")
    trace = read_trace(traces)
    return cfg, trace, _check_against_trace(cfg, trace, config)


def _check_against_trace(cfg: Any, trace: Any, config: Path) -> int:
    """Check that ``cfg`` can replay ``trace``: the same model and dtype, the same chat setting, no strategy asking for
    another dtype, and no more new tokens than the trace holds. Returns the new tokens to replay per question.

    Raises:
        TraceError: one of those does not hold.
    """
    from ..errors import TraceError
    from ..target.models import builtin_names, resolve_model
    from .trace import check_trace_matches

    # (a built-in name is its own name: another model is refused even where its package is not installed)
    name = cfg.model if cfg.model in builtin_names() else resolve_model(cfg.model).name
    check_trace_matches(trace, name, cfg.dtype, where=str(config))
    if cfg.chat != trace.manifest["chat"]:
        raise TraceError(f"{config}: chat: {cfg.chat}, but the trace's prompts were encoded with chat: "
                         f"{trace.manifest['chat']}: set chat: {str(trace.manifest['chat']).lower()}")
    from ..bench.config import strategy_engine

    recorded = trace.manifest.get("engine", "transformers")  # (traces before the field: transformers only)
    for s in cfg.strategies:
        engine = strategy_engine(cfg, s)
        if engine != recorded:
            raise TraceError(f"{config}: strategy {s.name!r} runs on {engine}, the trace was recorded on {recorded} "
                             f"({trace.manifest.get('model')}, {trace.dtype}): its continuation is not that engine's "
                             f"tokens; drop the strategy's engine, or bench it live (specframe bench)")
        if s.dtype not in (None, "auto", trace.dtype):
            raise TraceError(f"{config}: strategy {s.name!r} asks for {s.dtype}, the trace was recorded in "
                             f"{trace.dtype}: drop its dtype, or record a trace in {s.dtype}")
    max_new = cfg.max_new_tokens if "max_new_tokens" in cfg.model_fields_set else trace.max_new_tokens
    if max_new > trace.max_new_tokens:
        raise TraceError(f"max_new_tokens {max_new} is more than the trace holds ({trace.max_new_tokens}): replay with "
                         f"--max-new-tokens {trace.max_new_tokens} or less, or record again with --max-new-tokens {max_new}")
    return max_new


def _chosen_questions(cfg: Any, trace: Any) -> tuple[dict[int, int], list[Any]]:
    """The trace's questions the config's category filter and limit select, as prompts, and each chosen prompt's
    index in the trace (keyed by ``id`` of the prompt).

    Raises:
        ConfigError: the category filter matches no question of the trace.
    """
    from ..bench.runner import select_questions
    from ..io.prompts import Prompt

    prompts = [Prompt("", q.question_id, q.category) for q in trace.questions]
    index = {id(p): i for i, p in enumerate(prompts)}  # select_questions returns the same objects
    chosen = select_questions(prompts, cfg.categories, cfg.limit_per_category)
    if not chosen:
        found = sorted({str(q.category) for q in trace.questions if q.category is not None})
        raise ConfigError(f"--categories {cfg.categories} match no question of the trace; it has: {', '.join(found)}")
    return index, chosen


def _use_ray(use_ray: bool | None, ray_address: str | None, strategies: list[Any]) -> bool:
    """Whether to run the tasks on Ray: as asked, else when a cluster is named or a grid sweep can use an installed
    Ray.

    Raises:
        ConfigError: a cluster named with ``--no-ray``, or ``--ray`` without Ray installed.
    """
    from .sweep import ray_available

    if use_ray is None:
        use_ray = ray_address is not None or (any(s.grid_of for s in strategies) and ray_available())
    elif ray_address is not None and not use_ray:
        raise ConfigError("--ray-address names a Ray cluster, --no-ray runs here: give one of them")
    if use_ray and not ray_available():
        raise ConfigError("--ray: Ray is not installed: pip install 'specframe[ray]' (or drop --ray)")
    return use_ray


def _load(setup: _Setup, err: Any) -> Any:
    """The target (weights only) with the trace's cost curve; every task's proposers built once, so a strategy that
    reads features the trace lacks fails before any replay."""
    from ..target.loader import load_target
    from .driver import with_trace_cost
    from .sweep import check_task, specframe_for
    from .trace import check_same_target

    _quiet_transformers()
    with err.status(f"loading {setup.trace.model} ({setup.trace.dtype}) ...", spinner="dots"):
        target = with_trace_cost(load_target(setup.cfg.model, setup.trace.dtype, setup.cfg.device,
                                             threads=setup.cfg.threads, prepack=False, measure=False), setup.trace)
        check_same_target(setup.trace, target)
        sf = specframe_for(target, setup.registry)
        for t in setup.tasks:
            check_task(sf, setup.trace, t)
    return target


def _write(setup: _Setup, results: list[Any], where: str, total: float, traces: Path, output: Path,
           compare: Path | None, err: Any, target: Any = None, theirs: Sequence[tuple[Path, dict]] = ()) -> None:
    """results.json, report.md and the plots, swapped in whole; the main table on stdout."""
    from ..bench.command import conditions, print_table, profiles_and_ceilings
    from ..bench.plots import write_plots
    from ..bench.report import aggregate, render_markdown, speedup_table
    from ..bench.runner import category_group, environment
    from ..bench.speculation_profile import write_profiles
    from ..io.atomic import replace_folder
    from ..target.cost import CostCurve
    from .report import compare as compare_live
    from .report import forward_only_speedups, profile_beside, replay_sections
    from .sweep import specframe_for

    cfg, trace = setup.cfg, setup.trace
    order = {s.name: i for i, s in enumerate(setup.strategies)}
    records = sorted((r for res in results for r in res.records),  # the bench's order: questions, then strategies
                     key=lambda r: (r["question"], r["seed"], r["repeat"], order[r["strategy"]]))
    for r in records:
        r["group"] = category_group(r["category"], cfg.categories)
    summary = aggregate(records, [s.name for s in setup.strategies])
    forward_only_speedups(summary, records)
    curve = CostCurve.from_manifest(trace.manifest.get("cost")).profile()
    asked = {r["question"] for r in records}
    moments = [mo for i in sorted(asked) for mo in (trace.questions[i].entropy or [])[: setup.max_new_tokens]]
    env = environment()
    env["machine"] = trace.manifest.get("machine") or {}
    extra = profiles_and_ceilings(cfg.model_copy(update={"strategies": setup.strategies}),
                                  lambda name: specframe_for(target, setup.registry), records, summary, curve,
                                  conditions(cfg, len(setup.chosen), traces, env, "specframe replay"), moments)
    seconds = {res.name: res.seconds for res in results}
    m = trace.manifest
    doc = {
        "config": cfg.model_dump(), "environment": environment(), "profile": None, "summary": summary, "lossless": None,
        "records": records,
        "replay": {
            "trace": {"path": str(traces), **{k: m[k] for k in ("model", "dtype", "specframe", "created",
                                                                  "max_new_tokens", "chat")},
                      "recorded_with": "+".join(p["name"] for p in m["recorded_with"]), "machine": m.get("machine")},
            "max_new_tokens": setup.max_new_tokens, "run": where, "total_s": total, "seconds": seconds,
            "requests": {res.name: len(res.records) for res in results},
            "cost": CostCurve.from_manifest(m.get("cost")).profile(),
            "skipped_peers": [s.name for s in cfg.strategies if s.peer is not None],
            "compare": compare_live(summary, seconds, setup.live, compare) if setup.live is not None else None,
            "profiles_read": [profile_beside(path, doc) for path, doc in theirs],
        },
        **extra,
    }

    def fill(tmp: Path) -> None:
        (tmp / "results.json").write_text(json.dumps(doc, indent=1))
        write_profiles(tmp, doc["speculation_profiles"])
        plots = write_plots(summary, tmp, predicted=True)
        (tmp / "report.md").write_text(render_markdown(doc, plots, replay_sections(doc)))

    replace_folder(output, fill)
    title = f"predicted speed-up over none (replay) — {trace.model} {trace.dtype}, {len(setup.chosen)} questions"
    print_table(speedup_table(summary, title))
    err.print(f"replayed {len(setup.strategies)} strategies in {total:.1f} s ({where}); wrote {output}/results.json, "
              "report.md, speedup_by_category.png, acceptance_by_depth.png", markup=False, soft_wrap=True)
