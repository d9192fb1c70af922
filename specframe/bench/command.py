"""The ``specframe bench`` command: validate everything, load once, run interleaved, write the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Optional

import typer

from ..errors import ConfigError, SpecframeError
from ..sampling import is_greedy_temperature


def bench(
    config: Optional[Path] = typer.Option(None, "--config", help="Bench YAML (see docs/bench.example.yaml)."),
    questions: Optional[Path] = typer.Option(None, "--questions", help="Spec-Bench-format JSONL (overrides config)."),
    categories: Optional[List[str]] = typer.Option(None, "--categories", help="Category filter (repeatable or comma list)."),
    limit_per_category: Optional[int] = typer.Option(None, "--limit-per-category", help="First N questions per category."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Overrides the config."),
    output: Path = typer.Option(Path("bench-out"), "--output", help="Directory for results.json, report.md, PNGs."),
    profile: Optional[bool] = typer.Option(
        None, "--profile/--no-profile",
        help="Measure the target's cost curve v(n) too (default: when the config has a `profile:` section)."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue an interrupted run of the same config and questions from OUTPUT/records.jsonl."),
    serve: Optional[List[str]] = typer.Option(
        None, "--serve", help="[NAME=]URL of an OpenAI-compatible server to bench (repeatable; docs/serving.md)."),
    concurrency: Optional[List[int]] = typer.Option(
        None, "--concurrency", help="Requests in flight (repeatable; overrides the config's `concurrency`)."),
) -> None:
    """Compare strategies side by side on Spec-Bench questions, against HF transformers peers, or OpenAI-compatible
    servers against each other (--serve)."""
    from ..cli.console import fail
    from ..errors import SpecframeError

    try:
        if config is None and not serve:
            raise ConfigError("give --config BENCH.yaml (or --serve URL for the serving bench)")
        servers = None
        if serve:
            from .config import parse_serve_flag

            servers = [parse_serve_flag(v) for v in serve]
        _bench(config, questions, categories, limit_per_category, max_new_tokens, output, profile, resume,
               servers=servers, concurrency=concurrency)
    except SpecframeError as exc:
        fail(exc)


def print_table(table: Any, console: Any = None) -> None:
    """Print a rich table without cutting a header or cell: into a file or pipe at the width the table needs (rich
    would otherwise assume 80 columns and shorten names with "…"); on a terminal narrower than the table, cells
    wrap (the columns fold) instead of being cut."""
    from rich.console import Console

    console = console or Console()
    if not console.is_terminal:
        needed = console.measure(table, options=console.options.update_width(10_000)).maximum
        if needed > console.width:
            console = Console(file=console.file, width=needed, color_system=None, highlight=False)
    console.print(table)


def validate_bench_config(cfg: Any, registry: Any) -> None:
    """Check everything a bench config names before any model loads: each strategy's proposers (and merge policy
    and router when combined or set) against the installed plugins, the device, the model and every
    ``hf-assisted`` assistant model (a built-in name, or a path that exists).

    Raises:
        ConfigError: a bad option or device; UnknownProposerError / UnknownMergePolicyError / UnknownRouterError:
            a name no installed plugin provides; UnknownModelError / ModelNotInstalledError: a model or assistant
            that cannot be found.
    """
    from ..config import load_config
    from ..target.models import check_device, resolve_model

    for s in cfg.strategies:
        if s.proposers is not None:
            combo = {k: v for k, v in (("merge", s.merge), ("router", s.router)) if v is not None}
            try:
                load_config(None, base={"proposers": s.proposers, **combo}, registry=registry)
            except ConfigError as exc:
                raise ConfigError(f"strategy {s.name!r}: {str(exc).removeprefix('config: ')}") from None
    check_device(cfg.device)
    resolve_model(cfg.model)
    from .config import machine_request

    for s in cfg.strategies:
        engine, dtype, _, prepack, _ = machine_request(cfg, s)
        if engine == "llama.cpp":
            from ..target.llamacpp.loader import check_request

            try:
                check_request(dtype, cfg.device, prepack)
            except ConfigError as exc:
                raise ConfigError(f"strategy {s.name!r}: {exc}") from None
    import importlib.util

    for s in cfg.strategies:
        if s.peer == "economize-batch" and importlib.util.find_spec("economize") is None:
            raise ConfigError(f"strategy {s.name!r}: peer economize-batch needs the economize package (PyPI): "
                              "pip install economize")
    for s in cfg.strategies:
        if s.peer == "hf-assisted":
            try:
                resolve_model(s.options["assistant_model"])
            except SpecframeError as exc:
                raise type(exc)(f"strategy {s.name!r}: assistant_model: {exc}") from None


def _bench(config, questions, categories, limit_per_category, max_new_tokens, output, profile, resume=False,
           servers=None, concurrency=None) -> None:
    """Validate everything, load each model once, run the strategies interleaved (each finished run appended to
    ``output/records.jsonl``, see :mod:`specframe.bench.journal`), then write results.json, report.md and the plots
    to ``output``. Ctrl-C keeps the finished runs and says how to resume."""
    from ..cli.console import err
    from ..registry import build_registry
    from .report import aggregate
    from .runner import lossless_check

    # 1. validate everything before any model loads
    cfg, chosen = _bench_inputs(config, questions, categories, limit_per_category, max_new_tokens, output, profile,
                                servers, concurrency)
    if cfg.servers is not None:
        if resume:
            raise ConfigError("--resume continues a per-question bench, not the serving bench: run it again")
        _bench_serving(cfg, chosen, output, err)
        return
    registry = build_registry()
    validate_bench_config(cfg, registry)
    _mkdir(output)
    if profile is None and cfg.profile is not None:
        err.print(f"measuring the cost curve v(n) too: {config} has a `profile:` section (--no-profile skips it)",
                  markup=False, soft_wrap=True)

    from .journal import Journal, run_key

    journal = Journal(output, run_key(cfg.model_dump(), chosen), resume)
    if resume:
        err.print(f"resuming: {len(journal.done)} finished runs kept from {journal.path}", markup=False, soft_wrap=True)

    if cfg.concurrency is not None:
        if resume:
            raise ConfigError("--resume continues a per-question bench; a bench with `concurrency` runs whole batches: "
                              "run it again without --resume")
        by_strategy, _ = _load_strategies(cfg, registry, err)
        _bench_load(cfg, chosen, by_strategy, output, err)
        return

    # 2. load once, 3. run
    by_strategy, assistants = _load_strategies(cfg, registry, err)
    records, prof = _run_journaled(cfg, chosen, by_strategy, assistants, err, journal)
    lossless = lossless_check(by_strategy.__getitem__, records, chosen, cfg.chat, _float32_target(cfg)) \
        if is_greedy_temperature(cfg.temperature) else None
    summary = aggregate(records, [s.name for s in cfg.strategies], prof, cfg.reference)
    env = _bench_environment(by_strategy, records)
    results: dict[str, Any] = {
        "config": cfg.model_dump(), "environment": env, "profile": prof,
        "summary": summary, "lossless": lossless, "records": records,
    }
    from .report import speed_surface

    results["speed_surface"] = speed_surface(results)
    results.update(profiles_and_ceilings(cfg, by_strategy.__getitem__, records, summary, _curve(prof, by_strategy),
                                         conditions(cfg, len(chosen), questions, env, "specframe bench")))

    # 4. write
    _write_results(output, results, cfg, len(chosen), err)


def _bench_load(cfg, chosen, by_strategy, output, err) -> None:
    """``concurrency``: run every strategy over all questions at each concurrency (:mod:`specframe.bench.load`),
    check each request against ``none`` alone, write results.json, report.md and the plots, print the table."""
    from rich.progress import Progress

    from .config import BASELINE
    from .load import load_table, lossless_records, run_load, write_load_plots
    from .runner import lossless_check

    runs = (len(cfg.concurrency) + 1) * len(cfg.strategies)
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task("bench under load", total=runs)
        load = run_load(cfg, chosen, by_strategy,
                        advance=lambda s: progress.update(task, advance=1, description=f"bench {s:>20}"))
    lossless = lossless_check(by_strategy[BASELINE], lossless_records(load), chosen, cfg.chat) \
        if is_greedy_temperature(cfg.temperature) else None
    env = _bench_environment(by_strategy, [])
    results = {"config": cfg.model_dump(), "environment": env, "load": load, "lossless": lossless}
    (output / "results.json").write_text(json.dumps(results, indent=1))
    plots = write_load_plots(load, output)
    m = env["machine"]
    head = [f"# specframe bench under load — {cfg.model}", "",
            f"{len(chosen)} questions, {cfg.max_new_tokens} new tokens at most, all arriving at the start; "
            f"concurrency {cfg.concurrency}. Machine: {env['cpu']}, {m.get('cores')} usable cores, ISA "
            f"{' '.join(m.get('isa', []) or [])}; torch {env['torch']}, transformers {env['transformers']}.", ""]
    verdict = _lossless_verdict(lossless, cfg.dtype)
    lines = head + load_table(load) + ["", f"Lossless check (each request against `none` decoding it alone): "
                                       f"{verdict}."]
    for x in lossless or []:
        lines.append(f"- {x['strategy']}, question {x['question_id']}: first divergence at token "
                     f"{x['first_divergence']} (top-2 logit gap {x['top2_logit_gap']:.4g}"
                     f"{', a near-tie' if x['near_tie'] else ''})")
    lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    (output / "report.md").write_text("\n".join(lines) + "\n")
    from rich.table import Table

    table = Table(title=f"throughput under load — {cfg.model} {cfg.dtype}, {len(chosen)} questions")
    for col in load_table(load)[0].strip("|").split("|"):
        table.add_column(col.strip())
    for row in load_table(load)[2:]:
        table.add_row(*[c.strip() for c in row.strip("|").split("|")])
    print_table(table)
    err.print(f"lossless check: {verdict}")
    err.print(f"wrote {output}/results.json, report.md, {', '.join(plots)}")


def _mkdir(output: Path) -> None:
    """Create ``output`` (and its parents) if missing.

    Raises:
        ConfigError: the directory cannot be created (the OS's reason)."""
    try:  # an unwritable output fails now, not after the run
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--output {output}: cannot create the directory ({exc.strerror})") from None


def _bench_serving(cfg, chosen, output, err) -> None:
    """The serving bench (:mod:`specframe.bench.serving`): check every endpoint answers, send the questions at each
    concurrency, write results.json, report.md and serving.png, print the table."""
    from rich.progress import Progress

    from .runner import environment
    from .serving import check_endpoints, run_serving, serving_table, write_serving_plots

    models = check_endpoints(cfg.servers)
    _mkdir(output)
    runs = (len(cfg.concurrency or [1]) + 1) * len(cfg.servers)
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task("serving bench", total=runs)
        load = run_serving(cfg, chosen, models,
                           advance=lambda s: progress.update(task, advance=1, description=f"bench {s:>20}"))
    env = environment()
    from ..target.machine import fingerprint

    env["client_machine"] = fingerprint()
    results = {"config": cfg.model_dump(), "environment": env, "serving": load}
    (output / "results.json").write_text(json.dumps(results, indent=1))
    plots = write_serving_plots(load, output)
    table = serving_table(load)
    m = env["client_machine"]
    lines = [f"# specframe serving bench — {', '.join(ep.name for ep in cfg.servers)}", "",
             f"{len(chosen)} questions, {cfg.max_new_tokens} new tokens at most, temperature {cfg.temperature}, all "
             f"sent at the start with up to C in flight; C in {cfg.concurrency or [1]}. Client machine: "
             f"{m.get('cpu')}, {m.get('cores')} cores, ISA {' '.join(m.get('isa', []) or [])}.", "",
             "| endpoint | URL | model |", "|---|---|---|"]
    lines += [f"| {ep.name} | {ep.url} | {models[ep.name]} |" for ep in cfg.servers]
    lines += ["", *table, "", "TTFT: sending to the first content chunk; TPOT: first chunk to the last / tokens after "
              "the first; τ: tokens per target forward (specframe serve's usage); same answers: identical text to "
              "the first row (greedy only).", "", "![serving.png](serving.png)"]
    (output / "report.md").write_text("\n".join(lines) + "\n")
    from rich.table import Table

    t = Table(title=f"serving bench — {len(chosen)} questions")
    for col in table[0].strip("|").split("|"):
        t.add_column(col.strip())
    for row in table[2:]:
        t.add_row(*[c.strip() for c in row.strip("|").split("|")])
    print_table(t)
    failed = sum(r["failed"] for r in load)
    if failed:
        first = next(x["error"] for r in load for x in r["requests"] if x["error"])
        err.print(f"warning: {failed} requests failed (first: {first})", markup=False, soft_wrap=True)
    err.print(f"wrote {output}/results.json, report.md, {', '.join(plots)}")


def _bench_inputs(config, questions, categories, limit_per_category, max_new_tokens, output, profile,
                  servers=None, concurrency=None):
    """The bench config with the command line's overrides applied, and the questions it selects.

    Raises:
        ConfigError: a bad option, an ``--output`` that is a file, no questions, or a category filter that
            matches none.
    """
    from ..io.prompts import read_prompts
    from .config import ProfileConfig, load_bench_config
    from .runner import select_questions

    if max_new_tokens is not None and max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if limit_per_category is not None and limit_per_category < 1:
        raise ConfigError(f"--limit-per-category must be >= 1, got {limit_per_category}")
    if output.exists() and not output.is_dir():
        raise ConfigError(f"--output {output} is a file: give a directory")
    _check_output_is_ours(output)
    cats = [c.strip() for entry in (categories or []) for c in entry.split(",") if c.strip()] or None
    cfg = load_bench_config(config, servers, max_new_tokens=max_new_tokens, limit_per_category=limit_per_category,
                            questions=str(questions) if questions else None, categories=cats,
                            concurrency=list(concurrency) if concurrency else None)
    if profile and cfg.profile is None:
        cfg = cfg.model_copy(update={"profile": ProfileConfig()})
    elif profile is False:
        cfg = cfg.model_copy(update={"profile": None})
    if not cfg.questions:
        raise ConfigError("no questions: pass --questions F.jsonl or set `questions` in the bench config")
    prompts = read_prompts(cfg.questions)
    chosen = select_questions(prompts, cfg.categories, cfg.limit_per_category)
    if not chosen:
        found = sorted({str(p.category) for p in prompts if p.category is not None})
        has = f"the file has: {', '.join(found)}" if found else "the file's questions have no `category`"
        raise ConfigError(f"--categories {cfg.categories} match no question; {has}")
    from .speculation_profile import read_profile

    for s in cfg.strategies:  # a synthetic acceptance's profile file: read now, before any model loads
        if s.synthetic is not None and s.synthetic.profile is not None:
            read_profile(s.synthetic.profile)
    return cfg, chosen


def _check_output_is_ours(output: Path) -> None:
    """A bench writes report.md, results.json and PNGs into ``--output``: refuse a folder whose report.md or
    results.json a bench did not write (no bench ``results.json`` beside it), before anything runs.

    Raises:
        ConfigError: names the file and what to do.
    """
    ours = False
    try:
        ours = {"config", "environment"} <= set(json.loads((output / "results.json").read_text()))
    except (OSError, ValueError, TypeError):
        pass
    for name in ("report.md", "results.json"):
        if (output / name).exists() and not ours:
            raise ConfigError(f"--output {output} already holds a {name} that specframe bench did not write (no bench "
                              "results.json beside it): give a new or empty folder, or move the file away")


def _load_strategies(cfg, registry, err) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load the target once per distinct machine request (dtype, threads, prepack, and whether it speculates where
    any of those is ``auto``), and the ``hf-assisted`` assistant models: (strategy name -> Specframe, strategy
    name -> (assistant model, its tokenizer))."""
    import logging

    from ..config import load_config
    from ..target.loader import load_target

    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from ..cli.console import load_with_progress
    from .config import machine_request

    loaded: dict[tuple, Any] = {}  # (engine, dtype, threads, prepack, speculative) asked -> Specframe
    by_strategy: dict[str, Any] = {}
    for s in cfg.strategies:
        engine, dtype, threads, prepack, speculative = machine_request(cfg, s)
        llama_opts = (s.llamacpp or cfg.llamacpp) if engine == "llama.cpp" else cfg.llamacpp
        key = (engine, dtype, threads, prepack, speculative if "auto" in (dtype, threads, prepack) else None,
               llama_opts.model_dump_json() if engine == "llama.cpp" else None)
        if key not in loaded:
            scfg = load_config(None, registry=registry, model=cfg.model, dtype=dtype, device=cfg.device,
                               chat=cfg.chat, threads=threads, prepack=prepack, engine=engine,
                               llamacpp=llama_opts.model_dump(), proposers=[{"name": "ngram" if speculative else "none"}])
            loaded[key] = load_with_progress(
                scfg, registry, f"{cfg.model} ({engine}, {dtype}, threads {threads}, prepack {prepack})")
        by_strategy[s.name] = loaded[key]
    assistant_names = {s.name: s.options["assistant_model"] for s in cfg.strategies if s.peer == "hf-assisted"}
    with err.status("loading assistant models ...", spinner="dots"):
        assistants = {}
        for k, v in assistant_names.items():
            t = load_target(v, by_strategy[k].target.settings.dtype, cfg.device, measure=False)
            assistants[k] = (t.model, t.tokenizer)  # the tokenizer: for an assistant of another vocabulary (UAG)
    return by_strategy, assistants


def _run_strategies(cfg, chosen, by_strategy, assistants, err, journal=None) -> tuple[list[dict], Any]:
    """Measure the cost curve v(n) when the config asks for it, then run every strategy on the chosen questions,
    interleaved, with a progress bar on a terminal and a line per finished question otherwise (piped, nohup, CI);
    each finished run goes to ``journal``: (records, cost profile or None)."""
    from ..cli.console import progress_bar
    from ..target.cost import measure as measure_cost
    from .config import BASELINE
    from .runner import BenchRunner

    sf = by_strategy[BASELINE]
    runs = len(chosen) * len(cfg.seeds) * cfg.repeats * len(cfg.strategies)
    warm = min(cfg.warmup, len(chosen)) * len(cfg.strategies)
    prof_steps = cfg.profile.max_tokens if cfg.profile else 0
    with progress_bar() as progress:
        prof = None
        if cfg.profile:
            t = progress.add_task("profile v(n)", total=prof_steps)
            ids = sf.encode(chosen[0].text, cfg.chat)
            prof = measure_cost(sf.target, ids, cfg.profile.context, cfg.profile.max_tokens,
                                      cfg.profile.repeats, progress=lambda: progress.advance(t))
        task = progress.add_task("bench", total=runs + warm)
        runner = BenchRunner(by_strategy, cfg, assistants)
        records = runner.run(chosen, advance=lambda s: progress.update(task, advance=1, description=f"bench {s:>16}"),
                             done=journal.done if journal else None, on_record=journal.add if journal else lambda r: None,
                             on_question=None if err.is_terminal else _question_line(err, chosen))
    return records, prof


def _run_journaled(cfg, chosen, by_strategy, assistants, err, journal) -> tuple[list[dict], Any]:
    """:func:`_run_strategies` with each finished run kept in ``journal`` (closed at the end): (records, cost profile
    or None). Ctrl-C closes the journal, says how to resume and exits with status 130.

    Raises:
        typer.Exit: 130, on Ctrl-C."""
    try:
        records, prof = _run_strategies(cfg, chosen, by_strategy, assistants, err, journal)
    except KeyboardInterrupt:
        journal.close()
        err.print(f"interrupted: the finished runs are kept in {journal.path}; to continue, run the same command with "
                  "--resume", markup=False, soft_wrap=True)
        raise typer.Exit(130) from None
    journal.close()
    return records, prof


def _question_line(err, chosen) -> Any:
    """``on_question`` for a stderr that is not a terminal: ``question 3/30 (id 81, writing): none 9.8 tok/s, ...``."""
    def line(i: int, recs: list[dict]) -> None:
        q = chosen[i]
        what = ", ".join(x for x in (f"id {q.question_id}" if q.question_id is not None else "", q.category or "") if x)
        speeds = ", ".join(f"{r['strategy']} {r['metrics'].get('tokens_per_s', 0):.1f} tok/s" for r in recs)
        err.print(f"question {i + 1}/{len(chosen)}{f' ({what})' if what else ''}: {speeds}", markup=False, soft_wrap=True)
    return line


def _bench_environment(by_strategy, records) -> dict[str, Any]:
    """The run's environment: software versions, the machine, each strategy's target settings, and how busy the
    other processes kept the machine (``exceeded_cores``: threads + their load beyond the usable cores)."""
    from .config import BASELINE
    from .runner import environment

    env = environment()
    env["machine"] = by_strategy[BASELINE].machine_info()
    env["strategy_settings"] = {name: {k: v for k, v in one.target.settings.to_dict().items() if k != "profile"}
                                for name, one in by_strategy.items() if one.target.settings is not None}
    loads = [r["others_load"] for r in records if "others_load" in r]
    busiest = max((r["others_load"] + r.get("settings", {}).get("threads", 0) for r in records
                   if "others_load" in r), default=0.0)
    env["load"] = {"others_mean": round(sum(loads) / len(loads), 2) if loads else None,
                   "others_max": max(loads) if loads else None,
                   "exceeded_cores": busiest > env["machine"]["cores"] + 0.3}
    return env


def _curve(prof: dict[str, Any] | None, by_strategy: dict[str, Any]) -> dict[str, Any] | None:
    """The cost curve the ceilings read: the bench's measured ``profile:``, else the machine profile's of the
    ``none`` strategy's settings (None: neither)."""
    from .config import BASELINE

    if prof:
        return prof
    cost = getattr(getattr(by_strategy[BASELINE].target, "info", None), "cost", None)
    return cost.profile() if cost else None


def conditions(cfg: Any, questions: int, questions_file: Any, env: dict[str, Any], source: str) -> dict[str, Any]:
    """A profile's ``measurement_conditions``: what was run where (the machine's CPU and ISA flags included)."""
    machine = env.get("machine") or {}
    return {"source": source, "model": cfg.model, "dtype": cfg.dtype, "device": cfg.device,
            "dataset": str(questions_file) if questions_file is not None else None, "questions": questions,
            "categories": cfg.categories, "max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature,
            "concurrency": 1, "cpu": machine.get("cpu") or env.get("cpu"), "isa": machine.get("isa"),
            "specframe": env.get("specframe"), "date": env.get("date")}


def profiles_and_ceilings(cfg: Any, sf_for: Any, records: list[dict[str, Any]], summary: dict[str, Any],
                          curve: dict[str, Any] | None, cond: dict[str, Any],
                          moments: Any = ()) -> dict[str, Any]:
    """``{"speculation_profiles": {strategy: profile}, "ceilings": ...}`` of a bench or replay run
    (:mod:`specframe.bench.speculation_profile`, :mod:`specframe.bench.ceilings`)."""
    from .ceilings import ceilings
    from .config import BASELINE
    from .speculation_profile import strategy_profiles

    profiles = strategy_profiles(sf_for, [s.model_dump() for s in cfg.strategies if s.proposers is not None], records,
                                 cond)
    return {"speculation_profiles": profiles, "ceilings": ceilings(summary, records, curve, BASELINE, moments)}


def _write_results(output, results, cfg, questions: int, err) -> None:
    """Write results.json, the plots and report.md to ``output``; print the speedup table, the lossless verdict and
    a warning when other processes crowded the machine."""
    from .plots import write_plots, write_surface_plot
    from .report import render_markdown, speedup_table
    from .speculation_profile import write_profiles

    summary, lossless, env = results["summary"], results["lossless"], results["environment"]
    output.mkdir(parents=True, exist_ok=True)
    (output / "results.json").write_text(json.dumps(results, indent=1))
    written = write_profiles(output, results.get("speculation_profiles") or {})
    plots = write_plots(summary, output)
    if results.get("speed_surface"):
        plots.append(write_surface_plot(results["speed_surface"], output))
    (output / "report.md").write_text(render_markdown(results, plots))
    print_table(speedup_table(summary, f"speedup over none — {cfg.model} {cfg.dtype}, {questions} questions"))
    if summary.get("reference"):
        print_table(speedup_table(summary, f"speedup over {summary['reference']}", "speedup_ref"))
    err.print(f"lossless check: {_lossless_verdict(lossless, cfg.dtype)}")
    if env["load"]["exceeded_cores"]:
        err.print(f"warning: other processes used up to {env['load']['others_max']:.1f} cores during the run, so "
                  f"threads + load exceeded the {env['machine']['cores']} usable cores: timings are not those of a "
                  "quiet machine")
    err.print(f"wrote {output}/results.json, report.md, {', '.join(plots + written)}")


def _float32_target(cfg: Any) -> Any:
    """A loader of the bench's model in float32 on transformers (the evidence for bf16 divergences), called only when
    one needs explaining."""
    def load() -> Any:
        from ..target.loader import load_target

        return load_target(cfg.model, "float32", cfg.device, threads="auto", prepack=False, measure=False)

    return load


def _lossless_verdict(lossless: list[dict] | None, dtype: str) -> str:
    """One line on the lossless check: ``None`` when sampling (not applicable), else whether the specframe
    strategies matched ``none`` token for token, or diverged only at near-ties of ``dtype``."""
    mism = [m for m in lossless or [] if m["kind"] == "specframe"]
    chosen = sorted({m["strategy"] for m in mism if m.get("inexact_by_choice")})
    bad = sorted({m["strategy"] for m in mism
                  if not m["near_tie"] and not m.get("explained") and not m.get("inexact_by_choice")})
    also = (f"; {', '.join(chosen)} diverged as their settings allow (llama.cpp token trees are not bit-exact)"
            if chosen else "")
    if lossless is None:
        return "not applicable (sampling)"
    if not mism:
        return "all specframe strategies identical to plain decoding"
    if not bad:
        ties = len([m for m in mism if not m.get("inexact_by_choice")])
        return (f"{ties} specframe mismatches, all at {dtype} near-ties or explained by {dtype} rounding (listed with "
                "their evidence in report.md)" if ties
                else "all other specframe strategies identical to plain decoding") + also
    return "FAILED for " + ", ".join(bad) + " (divergence not at a near-tie)" + also
