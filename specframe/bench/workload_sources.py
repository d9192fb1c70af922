"""Licensed material for the SPEED-Bench-shaped workload (:mod:`specframe.bench.workload`), each licence checked
where the material is installed, when the workload is built.

==================  ===============================================  ===============================================
source              what                                             licence (where it is checked)
==================  ===============================================  ===============================================
``python-stdlib``   source code and docstrings of pure-Python          PSF-2.0 (``LICENSE.txt`` of the standard library
                    standard-library modules (:data:`STDLIB_MODULES`)  the running Python uses)
``package-docs``    the long descriptions (READMEs) of specframe's     each distribution's own, used only when it is
                    dependencies (:data:`PACKAGE_DOCS`), read from     MIT, BSD or Apache-2.0 by its METADATA and its
                    their installed METADATA                           licence file says so too
``mt-bench``        the MT-bench questions of a Spec-Bench file        Apache-2.0 (lm-sys/FastChat, where MT-bench's
                    (its eight MT-bench categories)                    questions are published; Spec-Bench: Apache-2.0)
``gsm8k``           the GSM8K questions of a Spec-Bench file           MIT (openai/grade-school-math)
                    (``math_reasoning``)
``specframe``       instructions, topics, passages and facts of        Apache-2.0 (this repository)
                    :mod:`specframe.bench.workload_templates`
==================  ===============================================  ===============================================

Spec-Bench's other categories are left out: ``translation`` (WMT14 news text), ``summarization`` (CNN/DailyMail
articles), ``qa`` and ``rag`` (Natural Questions and DPR's Wikipedia passages, CC BY-SA): the terms of their text
are share-alike or unclear. SPEED-Bench's own files are never read here (its public files hold placeholders).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata as metadata
import json
import re
import sys
import sysconfig
import textwrap
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ..errors import ConfigError

STDLIB_MODULES = (
    "textwrap", "shlex", "difflib", "heapq", "bisect", "fractions", "statistics", "json/encoder", "json/decoder",
    "csv", "string", "calendar", "colorsys", "fnmatch", "glob", "posixpath", "base64", "quopri", "pprint", "reprlib",
    "copy", "configparser", "html/parser", "email/utils", "urllib/parse", "ipaddress", "gettext", "mimetypes",
    "tokenize", "argparse", "dataclasses", "functools", "random", "shutil", "zipfile", "tarfile", "logging/__init__",
)
PACKAGE_DOCS = ("rich", "typer", "pydantic", "transformers", "accelerate", "llguidance", "pydivsufsort",
                "huggingface_hub", "pluggy")
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
# licence names as METADATA spells them -> (SPDX id, a phrase its licence text holds)
_LICENCES = {
    "mit": ("MIT", "Permission is hereby granted"), "mit license": ("MIT", "Permission is hereby granted"),
    "apache-2.0": ("Apache-2.0", "Apache License"), "apache 2.0": ("Apache-2.0", "Apache License"),
    "apache 2.0 license": ("Apache-2.0", "Apache License"), "apache software license": ("Apache-2.0", "Apache License"),
    "apache": ("Apache-2.0", "Apache License"),
    "bsd-3-clause": ("BSD-3-Clause", "Redistribution and use"), "bsd-2-clause": ("BSD-2-Clause", "Redistribution and use"),
    "bsd license": ("BSD", "Redistribution and use"),
}


@dataclass
class WorkloadSource:
    """One source of the workload's text and what its licence check found (``sources.json`` lists these)."""

    name: str
    what: str
    licence: str
    checked: str  # where the licence was checked (a file name relative to its package, or a note)
    origin: str  # where the text comes from upstream
    details: dict = field(default_factory=dict)  # versions, parts used and left out

    def describe(self) -> dict:
        return {"name": self.name, "what": self.what, "licence": self.licence, "checked": self.checked,
                "origin": self.origin, **self.details}


# --- Python's standard library ---------------------------------------------------------------------------------------

def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_source() -> WorkloadSource:
    """The standard library as a source, its licence checked.

    Raises:
        ConfigError: the standard library's ``LICENSE.txt`` is missing or no longer the PSF licence.
    """
    path = stdlib_root() / "LICENSE.txt"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        raise ConfigError(f"cannot check the licence of Python's standard library: {path} is missing") from None
    if "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" not in text:
        raise ConfigError(f"{path} no longer holds the PSF licence version 2: re-check the licence of the standard "
                          "library before building the workload from it")
    version = ".".join(map(str, sys.version_info[:3]))
    return WorkloadSource("python-stdlib", "source code and docstrings of pure-Python standard-library modules",
                          "PSF-2.0", "LICENSE.txt of the standard library", f"CPython {version} (Lib/)",
                          {"python": version, "licence_sha256": hashlib.sha256(text.encode()).hexdigest()[:16]})


def _module_path(name: str) -> Path | None:
    for candidate in (stdlib_root() / f"{name}.py", stdlib_root() / name / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@lru_cache(maxsize=None)
def _parsed(name: str) -> tuple[str, ast.Module] | None:
    path = _module_path(name)
    if path is None:
        return None
    text = path.read_text(encoding="utf-8")
    return text, ast.parse(text)


def _label(name: str) -> str:
    return name.removesuffix("/__init__").replace("/", ".")


def _walk_defs(tree: ast.AST, prefix: str = ""):
    """``(qualified name, node)`` of every function and class, methods included, in source order."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            qual = f"{prefix}{node.name}"
            yield qual, node
            yield from _walk_defs(node, qual + ".")


@lru_cache(maxsize=4)
def stdlib_functions(min_lines: int = 8, max_lines: int = 40) -> tuple[tuple[str, str], ...]:
    """``(src_id, code)`` of the functions and methods of :data:`STDLIB_MODULES` with ``min_lines..max_lines`` lines
    (dedented; ``src_id`` is ``module:Qualified.name``), in module and source order."""
    out = []
    for name in STDLIB_MODULES:
        parsed = _parsed(name)
        if parsed is None:
            continue
        lines = parsed[0].splitlines()
        for qual, node in _walk_defs(parsed[1]):
            if isinstance(node, ast.ClassDef) or not min_lines <= node.end_lineno - node.lineno + 1 <= max_lines:
                continue
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out.append((f"{_label(name)}:{qual}", textwrap.dedent("\n".join(lines[first - 1:node.end_lineno]))))
    return tuple(out)


@lru_cache(maxsize=4)
def stdlib_docs(min_words: int = 25) -> tuple[tuple[str, str], ...]:
    """``(title, docstring)`` of the modules, classes and functions of :data:`STDLIB_MODULES` whose docstring has at
    least ``min_words`` words; ``title`` is ``module.Qualified.name``."""
    out = []
    for name in STDLIB_MODULES:
        parsed = _parsed(name)
        if parsed is None:
            continue
        nodes = [(_label(name), parsed[1])] + [(f"{_label(name)}.{q}", n) for q, n in _walk_defs(parsed[1])]
        for title, node in nodes:
            doc = ast.get_docstring(node)
            if doc and len(doc.split()) >= min_words and not title.rsplit(".", 1)[-1].startswith("_"):
                out.append((title, doc.strip()))
    return tuple(out)


def stdlib_blocks(name: str) -> list[str]:
    """Module ``name`` (one of :data:`STDLIB_MODULES`) as consecutive source blocks, the module docstring and
    imports left out: each top-level statement, a class split into its header and each statement of its body (the
    blocks joined by blank lines are the module's code again). The units a long code prompt is filled with."""
    parsed = _parsed(name)
    if parsed is None:
        return []
    lines = parsed[0].splitlines()

    def span(node: ast.stmt, last: int | None = None) -> str:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        return "\n".join(lines[first - 1:last or node.end_lineno])

    out = []
    for node in parsed[1].body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            continue
        if isinstance(node, ast.ClassDef) and len(node.body) > 1:
            out.append(span(node, node.body[0].lineno - 1 if node.body[0].lineno > node.lineno else node.lineno))
            out += [span(child) for child in node.body]
        else:
            out.append(span(node))
    return out


def stdlib_modules() -> list[str]:
    """The modules of :data:`STDLIB_MODULES` this Python has."""
    return [m for m in STDLIB_MODULES if _module_path(m) is not None]


# --- installed packages' READMEs ------------------------------------------------------------------------------------

def _licence_of(dist: metadata.Distribution) -> tuple[str, str, str] | None:
    """``(SPDX id, licence file, reason)`` when the distribution's METADATA names an accepted licence and its licence
    file (in its ``.dist-info``) holds that licence's text; ``None`` with nothing usable."""
    meta = dist.metadata
    field_lines = (meta.get("License") or "").strip().splitlines()
    names = [meta.get("License-Expression") or "", field_lines[0] if field_lines else ""]
    names += [c.split("::")[-1] for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    known = [_LICENCES[n.strip().lower()] for n in names if n and n.strip().lower() in _LICENCES]
    if not known:
        return None
    spdx, phrase = known[0]
    for f in dist.files or []:
        parts = f.parts
        if parts and parts[0].endswith(".dist-info") and re.search(r"LICEN[CS]E|COPYING", f.name, re.I):
            try:
                text = Path(dist.locate_file(f)).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            if phrase in text:
                return spdx, "/".join(parts), phrase
    return None


def _readme_paragraphs(text: str, min_words: int = 25) -> list[str]:
    """Prose paragraphs of a Markdown or reST README: links reduced to their text; headings, lists, tables, code,
    HTML, licence boilerplate and language menus left out."""
    out = []
    text = re.sub(r"^\s*(```|~~~).*?^\s*\1", "", text, flags=re.S | re.M)  # fenced code
    for block in re.split(r"\n\s*\n", text):
        b = block.strip()
        if not b or re.match(r"^(<|!\[|\[!\[|\||#|>|-|\*|\+|\d+\.|```|\.\.|:)", b):
            continue
        t = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", b)
        t = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", t)
        t = re.sub(r"<[^>]+>", "", t)
        t = re.sub(r"\s+", " ", t).strip()
        ascii_share = sum(c.isascii() for c in t) / max(len(t), 1)
        if (len(t.split()) >= min_words and t.count("`") < 8 and ascii_share > 0.97 and "http" not in t
                and not t.endswith(":") and not block.startswith((" ", "\t"))
                and not re.search(r"licen[cs]e|warrant", t, re.I)):
            out.append(t)
    return out


@lru_cache(maxsize=1)
def package_docs() -> tuple[tuple[tuple[str, str], ...], WorkloadSource]:
    """``(paragraphs, source)``: ``(src_id, paragraph)`` of the READMEs of :data:`PACKAGE_DOCS` whose licence checks
    out (``src_id`` is ``name==version#n``), and the source entry listing each distribution used or left out."""
    used, left_out, paragraphs = [], [], []
    for name in PACKAGE_DOCS:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            left_out.append({"distribution": name, "why": "not installed"})
            continue
        licence = _licence_of(dist)
        version = dist.version
        if licence is None:
            left_out.append({"distribution": name, "version": version,
                             "why": "licence not confirmed as MIT, BSD or Apache-2.0 by METADATA and a licence file"})
            continue
        found = _readme_paragraphs(dist.metadata.get_payload() or "")
        paragraphs += [(f"{name}=={version}#{i}", p) for i, p in enumerate(found)]
        used.append({"distribution": name, "version": version, "licence": licence[0], "licence_file": licence[1],
                     "paragraphs": len(found)})
    source = WorkloadSource(
        "package-docs", "README paragraphs of installed dependencies (their METADATA long descriptions)",
        "per distribution: " + ", ".join(sorted({u["licence"] for u in used})) if used else "none used",
        "each distribution's METADATA licence field and its licence file", "PyPI distributions installed here",
        {"distributions": used, "left_out": left_out})
    return tuple(paragraphs), source


# --- Spec-Bench's MT-bench and GSM8K questions ---------------------------------------------------------------------

def default_specbench() -> Path | None:
    """``../shared/specbench/question.jsonl`` beside this checkout (or the working directory), when it exists."""
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        path = base.parent / "shared" / "specbench" / "question.jsonl"
        if path.is_file():
            return path
    return None


def specbench_questions(path: Path) -> tuple[dict[str, list[dict]], list[WorkloadSource]]:
    """The MT-bench questions (by category) and the GSM8K questions (``"math_reasoning"``) of a Spec-Bench
    ``question.jsonl``, and their two sources. Other categories are not read (module docstring).

    Raises:
        ConfigError: the file cannot be read or is not Spec-Bench's format (the message names the file and line).
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the Spec-Bench questions {path}: {exc}") from None
    by_category: dict[str, list[dict]] = {}
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            category, turns = obj["category"], obj["turns"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ConfigError(f"{path}:{no}: not a Spec-Bench question (question_id, category, turns)") from None
        if category in MT_BENCH or category == "math_reasoning":
            by_category.setdefault(category, []).append({"question_id": obj.get("question_id"), "turns": list(turns)})
    counts = {c: len(v) for c, v in sorted(by_category.items())}
    note = f"Spec-Bench question.jsonl ({Path(path).name}; hemingkx/Spec-Bench, Apache-2.0)"
    mt = WorkloadSource("mt-bench", "MT-bench questions (Zheng et al. 2023) as Spec-Bench carries them", "Apache-2.0",
                        "lm-sys/FastChat's licence (fastchat/llm_judge/data/mt_bench/question.jsonl)",
                        note, {"read": {c: n for c, n in counts.items() if c in MT_BENCH}})
    gsm = WorkloadSource("gsm8k", "GSM8K grade-school math questions (Cobbe et al. 2021) as Spec-Bench carries them",
                         "MIT", "openai/grade-school-math's licence", note,
                         {"read": {"math_reasoning": counts.get("math_reasoning", 0)}})
    return by_category, [mt, gsm]


def own_source() -> WorkloadSource:
    from . import workload_templates

    text = Path(workload_templates.__file__).read_text(encoding="utf-8")
    return WorkloadSource("specframe", "specframe's own instructions, topics, passages and facts", "Apache-2.0",
                          "this repository's licence (pyproject.toml)", "specframe/bench/workload_templates.py",
                          {"templates_sha256": hashlib.sha256(text.encode()).hexdigest()[:16]})
