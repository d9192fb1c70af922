"""The ``specframe`` command line (typer + rich).

Every user error prints one line ``error: ...`` on stderr and exits with code 2, before anything is written to
stdout.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence

import typer
from rich.console import Console

from ..errors import ConfigError, PromptTooLongError, SpecframeError
from .console import err, fail, json_line, load_with_progress, machine_flags

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="specframe: speculative decoding with pluggable proposers, exact output.",
)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        sys.stdout.write(f"specframe {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print specframe's version and exit."),
) -> None:
    """specframe: speculative decoding with pluggable proposers, exact output."""
    from .console import tolerant_stdio

    tolerant_stdio()


_FLAGS = {"max_new_tokens": "--max-new-tokens", "temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k",
          "seed": "--seed"}


def _check_flags(**given) -> None:
    """The flags' values, by the config's own rules (:class:`~specframe.config.RequestSettings`), named as flags."""
    from pydantic import ValidationError

    from ..config import RequestSettings, settings_error

    try:
        RequestSettings.model_validate({k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(settings_error(exc, _FLAGS)) from None


def _proposer_entries(names: list[str], configured: Sequence[Any]) -> list[dict]:
    """CLI proposer names; a name also configured in the file keeps the file's options (``configured``: the typed
    config's proposer config objects)."""
    by_name = {p.name: p.model_dump() for p in configured}
    return [dict(by_name.get(n, {"name": n})) for n in names]


def generate(
    prompt: Optional[str] = typer.Argument(None, help="Prompt text (or use --prompts-file)."),
    prompts_file: Optional[Path] = typer.Option(None, "--prompts-file", help="Spec-Bench style JSONL; first turn used."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Use only the first N prompts of the file."),
    category: Optional[str] = typer.Option(None, "--category", help="Use only prompts of this Spec-Bench category."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML config; flags override it."),
    model: Optional[str] = typer.Option(None, "--model", help="Built-in name, model directory or .gguf file."),
    proposer: Optional[List[str]] = typer.Option(
        None, "--proposer", help="Proposer name (see `specframe plugins`); repeat it to combine proposers."
    ),
    merge: Optional[str] = typer.Option(None, "--merge", help="Merge policy for combined proposers (default priority)."),
    max_nodes: Optional[int] = typer.Option(None, "--max-nodes", help="Node budget of the merged tree (default 24)."),
    router: Optional[str] = typer.Option(None, "--router", help="Who drafts each step and with how many nodes (combined proposers; a lone one too when given): adaptive (default) | none."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Most tokens to generate (default 128)."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="0 = greedy (default 0)."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="Nucleus filter in (0, 1] (default 1)."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="Top-k filter, 0 = off (default 0)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Per-request generator seed (default 0)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="bfloat16 | float16 | float32 | auto: fastest measured here (default; on CUDA bf16 where native, else fp16)."),
    threads: Optional[str] = typer.Option(None, "--threads", help="torch threads, or auto: fit the free cores (default)."),
    prepack: Optional[str] = typer.Option(None, "--prepack", help="on | off | auto: pre-packed oneDNN weights (default auto)."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu | cuda | cuda:N (default cpu)."),
    engine: Optional[str] = typer.Option(None, "--engine", help="transformers (default) | llama.cpp: what runs the target."),
    stop: Optional[List[str]] = typer.Option(None, "--stop", help="Stop string (repeatable)."),
    no_chat: bool = typer.Option(False, "--no-chat", help="Do not apply the chat template."),
    stream: bool = typer.Option(False, "--stream", help="Print text as tokens are committed."),
    as_json: bool = typer.Option(False, "--json", help="One JSON record per prompt on stdout, nothing else."),
    batch_size: Optional[int] = typer.Option(
        None, "--batch-size", help="Decode up to N prompts of --prompts-file in each target forward (default 1)."),
    json_schema: Optional[Path] = typer.Option(
        None, "--json-schema", help="Structured output: the answer is JSON valid under this JSON Schema file."),
    json_object: bool = typer.Option(False, "--json-object", help="Structured output: the answer is a JSON object."),
    regex: Optional[str] = typer.Option(None, "--regex", help="Structured output: the answer matches this regex."),
    grammar: Optional[Path] = typer.Option(
        None, "--grammar", help="Structured output: the answer follows this Lark grammar file (start rule `start`)."),
) -> None:
    """Generate text with the target model, drafting through a proposer."""
    flags = GenerateFlags(
        prompt=prompt, prompts_file=prompts_file, limit=limit, category=category, config=config, model=model,
        proposer=tuple(proposer or ()), merge=merge, max_nodes=max_nodes, router=router,
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, dtype=dtype,
        threads=threads, prepack=prepack, device=device, engine=engine, stop=tuple(stop or ()), no_chat=no_chat,
        stream=stream, as_json=as_json, batch_size=batch_size, json_schema=json_schema, json_object=json_object,
        regex=regex, grammar=grammar)
    try:
        _generate(flags)
    except SpecframeError as exc:
        fail(str(exc))
    except BrokenPipeError:  # `specframe generate ... | head`: the reader had enough; not an error
        _pipe_closed()


def _pipe_closed() -> None:
    """stdout's reader went away: stop quietly with exit status 0 (as ``cat | head`` does in a shell that does not
    count SIGPIPE), with nothing more flushed into the closed pipe at exit."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise typer.Exit(0)


@dataclass(frozen=True)
class GenerateFlags:
    """``specframe generate``'s flags as given (None: not given, the config's value holds)."""

    prompt: Optional[str] = None
    prompts_file: Optional[Path] = None
    limit: Optional[int] = None
    category: Optional[str] = None
    config: Optional[Path] = None
    model: Optional[str] = None
    proposer: tuple[str, ...] = ()
    merge: Optional[str] = None
    max_nodes: Optional[int] = None
    router: Optional[str] = None
    max_new_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    seed: Optional[int] = None
    dtype: Optional[str] = None
    threads: Optional[str] = None
    prepack: Optional[str] = None
    device: Optional[str] = None
    engine: Optional[str] = None
    stop: tuple[str, ...] = ()
    no_chat: bool = False
    stream: bool = False
    as_json: bool = False
    batch_size: Optional[int] = None
    json_schema: Optional[Path] = None
    json_object: bool = False
    regex: Optional[str] = None
    grammar: Optional[Path] = None


def _generate(f: GenerateFlags) -> None:
    from ..registry import build_registry
    from ..target.models import check_device, resolve_dtype, resolve_model

    # 1. every flag and the config, checked before anything loads
    _check_flags(max_new_tokens=f.max_new_tokens, temperature=f.temperature, top_p=f.top_p, top_k=f.top_k,
                 seed=f.seed)
    if f.stream and f.as_json:
        raise ConfigError("--stream and --json cannot be combined: --json keeps stdout for records only")
    if (f.prompt is None) == (f.prompts_file is None):
        raise ConfigError("give either a PROMPT argument or --prompts-file (exactly one)")
    if f.batch_size is not None and f.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {f.batch_size}")
    if f.batch_size is not None and f.batch_size > 1 and f.stream:
        raise ConfigError("--stream prints one answer as it is generated; with --batch-size > 1 several answers are "
                          "generated at once: drop --stream, or use --batch-size 1")
    registry = build_registry()
    cfg = _flags_config(f, registry)  # an unknown plugin or bad option fails here, before the model loads
    _check_flags_apply(cfg, f)
    prompts = _select_prompts(f.prompt, f.prompts_file, f.limit, f.category)
    check_device(cfg.device)
    resolve_dtype(cfg.dtype, cfg.device)
    resolve_model(cfg.model)  # unknown name / missing package fails here, before loading
    if cfg.engine == "llama.cpp":
        from ..target.llamacpp.loader import check_request

        check_request(cfg.dtype, cfg.device, cfg.prepack)
    # 2. load, encode, 3. generate
    sf = load_with_progress(cfg, registry)
    from ..decode.stopping import special_stop_ids

    special_stop_ids(tuple(cfg.stop), sf.target.tokenizer)  # a stop string that cannot match fails before any output
    encoded = [sf.encode(p.text) for p in prompts]
    for p, ids in zip(prompts, encoded):
        if len(ids) >= sf.target.max_context:
            where = f"question {p.question_id}" if p.question_id is not None else "the prompt"
            raise PromptTooLongError(
                f"{where} has {len(ids)} tokens; the model's context is {sf.target.max_context}: shorten it"
            )
    if f.batch_size is not None and f.batch_size > 1:
        _run_batched(sf, prompts, encoded, f.batch_size, f.as_json)
    else:
        _run(sf, prompts, encoded, f.stream, f.as_json)


def _flags_config(f: GenerateFlags, registry: Any):
    """The config file (if any) with the flags applied over it: the typed config (:func:`~specframe.config.load_config`)."""
    from ..config import load_config

    cfg = load_config(
        f.config, registry=registry, model=f.model, max_new_tokens=f.max_new_tokens, temperature=f.temperature, top_p=f.top_p,
        top_k=f.top_k, seed=f.seed, dtype=f.dtype, device=f.device, chat=False if f.no_chat else None,
        stop=list(f.stop) or None, engine=f.engine, constraint=_constraint_flags(f),
        **machine_flags(f.threads, f.prepack),
    )
    merge, max_nodes, router = f.merge, f.max_nodes, f.router
    # each change is a new config from the fields set so far (exclude_unset): a merge or router the file and the
    # flags leave alone stays unset, as it is for a file saying the same (resolve_plugins reads what is set)
    if f.proposer:
        cfg = load_config(None, base=cfg.model_dump(exclude_unset=True), registry=registry,
                          proposers=_proposer_entries(list(f.proposer), cfg.proposers))
    if merge is not None or max_nodes is not None:
        configured = cfg.merge.model_dump() if cfg.merge is not None else {}
        settings = {**configured, **({"name": merge} if merge else {}),
                    **({"max_nodes": max_nodes} if max_nodes is not None else {})}
        if merge and merge != configured.get("name"):  # another policy: the file's options were for the old one
            settings = {k: v for k, v in settings.items() if k in ("name", "max_nodes")}
        cfg = load_config(None, base=cfg.model_dump(exclude_unset=True), registry=registry, merge=settings)
    if router is not None:  # the router the file names keeps its options; another starts from its defaults
        keep = cfg.router is not None and router == cfg.router.name
        cfg = load_config(None, base=cfg.model_dump(exclude_unset=True), registry=registry,
                          router=cfg.router.model_dump() if keep else router)
    return cfg


def _constraint_flags(f: GenerateFlags) -> dict[str, Any] | None:
    """The constraint the flags ask for (None: none given, the config's holds).

    Raises:
        ConfigError: two constraint flags, or a file that cannot be read (or, for --json-schema, is not JSON).
    """
    given = [(flag, v) for flag, v in (("--json-schema", f.json_schema), ("--json-object", f.json_object or None),
                                       ("--regex", f.regex), ("--grammar", f.grammar)) if v is not None]
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(g for g, _ in given)} each constrain the whole answer: give one of them")
    if not given:
        return None
    flag, value = given[0]
    if flag == "--json-object":
        return {"json_object": True}
    if flag == "--regex":
        return {"regex": value}
    try:
        text = Path(value).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{flag} {value}: cannot read it ({exc.strerror or exc})") from None
    if flag == "--grammar":
        return {"grammar": text}
    try:
        return {"json_schema": json.loads(text)}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{flag} {value}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:  # (Python's JSON reader stops near 1000 levels)
        from ..contracts.constraint import MAX_SCHEMA_DEPTH

        raise ConfigError(f"{flag} {value}: nests deeper than Python's JSON reader goes; a schema may nest at most "
                          f"{MAX_SCHEMA_DEPTH} levels (specframe.contracts.constraint.MAX_SCHEMA_DEPTH)") from None


def _check_flags_apply(cfg, f: GenerateFlags) -> None:
    """Refuse a flag that would have no effect with the others (it would silently do nothing)."""
    merge, max_nodes, top_p, top_k, limit = f.merge, f.max_nodes, f.top_p, f.top_k, f.limit
    if len(cfg.proposers) < 2 and (merge is not None or max_nodes is not None):
        given = " and ".join(f for f, v in (("--merge", merge), ("--max-nodes", max_nodes)) if v is not None)
        raise ConfigError(
            f"{given} set how two or more combined proposers share the tree; with one proposer "
            f"({cfg.proposers[0].name}) there is nothing to merge: add another --proposer, or drop {given}"
        )
    if cfg.sampling.temperature == 0:
        for flag, value in (("--top-p", top_p), ("--top-k", top_k)):
            if value is not None:
                raise ConfigError(f"{flag} filters the distribution that sampling draws from; at temperature 0 "
                                  f"decoding is greedy (argmax) and never uses it: add --temperature > 0, or drop {flag}")
    if cfg.device != "cpu":
        for flag, value in (("--threads", f.threads), ("--prepack", f.prepack)):
            if value is not None:
                raise ConfigError(f"{flag} sets how a CPU target runs; with --device {cfg.device} it has no effect: "
                                  f"drop {flag}, or use --device cpu")
    if f.prompts_file is None:
        for flag, value in (("--limit", limit), ("--category", f.category)):
            if value is not None:
                raise ConfigError(f"{flag} selects prompts of --prompts-file; with a PROMPT argument it has nothing "
                                  f"to select: give --prompts-file, or drop {flag}")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {limit}")


def _select_prompts(prompt, prompts_file, limit, category) -> list:
    """The PROMPT argument, or the prompts of --prompts-file selected by --category and --limit."""
    from ..io.prompts import Prompt, read_prompts

    prompts = read_prompts(prompts_file) if prompts_file is not None else [Prompt(prompt)]
    if category is not None:
        found = sorted({str(p.category) for p in prompts if p.category is not None})
        prompts = [p for p in prompts if p.category == category]
        if not prompts:
            has = f"the file has: {', '.join(found)}" if found else "the file's prompts have no `category`"
            raise ConfigError(f"--category {category!r} matches no prompt; {has}")
    return prompts[:limit]


def answer_header(i: int, n: int, prompt) -> str:
    """The line before each answer when several prompts are answered in plain text (stdout), e.g.
    ``=== 2/5: question 81 (writing) ===``; ``--json`` records carry ``question_id`` instead."""
    what = []
    if prompt.question_id is not None:
        what.append(f"question {prompt.question_id}")
    if prompt.category is not None:
        what.append(f"({prompt.category})")
    return f"{'' if i == 1 else chr(10)}=== {i}/{n}{': ' + ' '.join(what) if what else ''} ===\n"


def _write(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def _run(sf, prompts, encoded, stream: bool, as_json: bool) -> None:
    from rich.progress import Progress

    several = len(prompts) > 1
    show_progress = several and not stream
    with Progress(console=err, transient=True, disable=not show_progress) as progress:
        task = progress.add_task("generating", total=len(prompts))
        for i, (p, ids) in enumerate(zip(prompts, encoded), 1):
            if stream and several and not as_json:  # (the header comes before the streamed text)
                _write(answer_header(i, len(prompts), p))
            result = sf.generate_result(ids, question_id=p.question_id, on_text=_write if stream else None)
            _print_result(i, len(prompts), p, result, as_json, stream)
            progress.advance(task)


def _run_batched(sf, prompts, encoded, batch_size: int, as_json: bool) -> None:
    """--batch-size N: requests decoded together; answers printed in prompt order as soon as each one's turn comes."""
    from rich.progress import Progress

    done: dict[int, Any] = {}
    printed = 0
    with Progress(console=err, transient=True, disable=len(prompts) < 2) as progress:
        task = progress.add_task(f"generating (batch {batch_size})", total=len(prompts))

        def on_result(i: int, result: Any) -> None:
            nonlocal printed
            done[i] = result
            progress.advance(task)
            while printed in done:
                _print_result(printed + 1, len(prompts), prompts[printed], done.pop(printed), as_json, False)
                printed += 1

        sf.generate_batch_results(encoded, batch_size=batch_size, question_ids=[p.question_id for p in prompts],
                                  on_result=on_result)


def _print_result(i: int, n: int, p: Any, result: Any, as_json: bool, streamed: bool) -> None:
    """One answer: its JSON record, or its header (several prompts), text and the metrics line on stderr."""
    if as_json:
        _write(json_line(result.to_dict()))
        return
    if n > 1 and not streamed:
        _write(answer_header(i, n, p))
    if not streamed:
        _write(result.text)
    _write("\n")
    m = result.metrics
    err.print(
        f"[dim]{m.new_tokens} tokens, {m.tokens_per_s:.1f} tok/s, τ={m.tau:.2f}, "
        f"α={m.acceptance_rate:.2f}, finish={result.finish_reason}[/dim]"
    )
    if len(m.proposers) > 1:  # attribution (credited: a node two proposers drafted counts for both)
        err.print("[dim]" + ", ".join(
            f"{label}: {pm.accepted_nodes}/{pm.drafted_nodes} accepted, {pm.steps} steps"
            for label, pm in m.proposers.items()) + "[/dim]", markup=True)


def plugins(
    as_json: bool = typer.Option(False, "--json", help="One JSON document: {\"plugins\": [...]}."),
    schema: bool = typer.Option(False, "--schema", help="The JSON Schema of specframe.yaml with these plugins' "
                                "options (for an editor to check and complete a config)."),
) -> None:
    """List installed plugins: distribution, version, proposers and verifiers with capabilities and options."""
    try:
        from ..installed import inventory, render_text
        from ..registry import build_registry

        if schema and as_json:
            raise ConfigError("--schema and --json are two documents: give one of them")
        registry = build_registry()
        if schema:
            from ..config import config_schema

            sys.stdout.write(json.dumps(config_schema(registry), indent=1) + "\n")
            return
        doc = inventory(registry)
    except SpecframeError as exc:
        fail(str(exc))
    sys.stdout.write((json.dumps(doc, indent=2) if as_json else render_text(doc)) + "\n")


def tune(
    model: str = typer.Option("smollm2-135m-instruct", "--model", help="Built-in name, model directory or .gguf file."),
    device: str = typer.Option("cpu", "--device", help="cpu (a CUDA target needs no profile)."),
    engine: str = typer.Option("transformers", "--engine", help="transformers | llama.cpp: whose kernels to measure."),
    refresh: bool = typer.Option(False, "--refresh", help="Measure again even when a profile is cached."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile as JSON."),
) -> None:
    """Measure (or show) this machine's profile: target forward times T(n) per dtype, threads and weight layout,
    and what `auto` picks from them (docs/machine.md)."""
    try:
        _tune(model, device, refresh, as_json, engine)
    except SpecframeError as exc:
        fail(str(exc))


def _engine_profile(model: str, device: str, engine: str, refresh: bool, progress: Any) -> tuple[Any, str]:
    """(the machine profile of ``model`` on ``engine``, the model's display name), measured when missing."""
    from ..target.models import model_directory, resolve_model

    if engine not in ("transformers", "llama.cpp"):
        raise ConfigError(f"--engine must be transformers or llama.cpp, got {engine!r}")
    source = resolve_model(model)
    if engine == "llama.cpp":
        from ..target.llamacpp.loader import load_llamacpp_target
        from ..target.llamacpp.profile import get_profile as llama_profile

        target = load_llamacpp_target(model, device=device, threads=1, measure=False)
        return llama_profile(target, source.name, progress, refresh=refresh), source.name
    from ..target.profile import get_profile

    directory = model_directory(source, lambda s: err.print(s, markup=False))
    return get_profile(directory, source.name, device, progress, refresh=refresh), source.name


def _tune(model: str, device: str, refresh: bool, as_json: bool, engine: str = "transformers") -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from ..target.machine import LoadMonitor, choose_threads, usable_cores
    from ..target.models import check_device
    from ..target.profile import NS

    check_device(device)
    if device != "cpu":
        raise ConfigError(f"--device {device}: the machine profile is for CPU targets; a CUDA target's T(n) curve is "
                          "measured on its first load and cached per GPU, dtype and model (docs/gpu.md), and dtype "
                          "auto there is bf16 where the GPU computes it natively, else fp16")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=err, transient=True) as progress:
        prof, name = _engine_profile(model, device, engine, refresh, progress)
    if as_json:
        sys.stdout.write(json.dumps(prof.to_json(), indent=1) + "\n")
        return
    fp = prof.fingerprint
    con = Console()
    con.print(f"{fp['cpu']} | ISA: {' '.join(fp['isa']) or '-'} | {fp['cores']} usable cores | torch {fp['torch']}")
    con.print(f"profile: {prof.path} (measured in {prof.seconds:.0f} s, others' load then {prof.others_load:.1f} cores)")
    for ctx in sorted({c for m in prof.measured for c in m.t_ms}):
        table = Table(title=f"T(n) ms, one forward over n new tokens after {ctx} cached tokens — {name} on {engine}")
        table.add_column("dtype/threads/layout")
        for n in NS:
            table.add_column(f"T({n})", justify="right")
        table.add_column("T(8)/T(1)", justify="right")
        for m in prof.measured:
            row = m.t_ms[ctx]
            table.add_row(m.candidate.label, *(f"{t:.1f}" for t in row), f"{row[NS.index(8)] / row[0]:.2f}")
        con.print(table)
    cores, _ = usable_cores()
    others = LoadMonitor().sample().others
    fit = choose_threads(cores, others)
    from ..target.profile import runnable_on

    # (a profile from another machine, forced: a candidate this machine cannot run is not shown as the choice)
    runnable = runnable_on(device) if engine == "transformers" else None
    for spec in (True, False):
        c, _, why = prof.choose(max_threads=fit, speculative=spec, runnable=runnable)
        con.print(f"auto ({'speculative' if spec else 'plain decoding'}; others using {others:.1f} cores): "
                  f"{c.label} — {why}")


def attach(app: typer.Typer) -> None:
    """Attach every command and command group to ``app``: the one place where commands attach. A command group
    (``train``, ``datastore``, ``trace``, ``vllm``, ``export``, ``workload``) attaches its own subcommands in its
    module."""
    from ..bench.command import bench
    from ..bench.workload_command import workload_app
    from ..datastore.command import datastore_app
    from ..integrations.command import vllm_app
    from ..learned.command import export_app
    from ..replay.command import replay, trace_app
    from ..serve.command import serve
    from ..training.command import train_app

    for name, command in (("generate", generate), ("plugins", plugins), ("tune", tune), ("bench", bench),
                          ("serve", serve)):
        app.command(name)(command)
    app.add_typer(train_app, name="train")
    app.add_typer(datastore_app, name="datastore")
    app.command("replay")(replay)
    for name, group in (("trace", trace_app), ("vllm", vllm_app), ("export", export_app), ("workload", workload_app)):
        app.add_typer(group, name=name)


attach(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
