"""Raw material for the self-distillation prompts, from packages that install offline, each with its licence
checked in the package's own licence or copyright file.

=====================  ==========================================  ==============================================
source                 package (how to install)                    licence (file checked)
=====================  ==========================================  ==============================================
``chitchat``           PyPI ``chitchat-dataset==0.9.0``             MIT (``chitchat_dataset-0.9.0.dist-info/LICENSE``)
``wordnet``            Debian ``wordnet-base``                     WordNet 3.0 licence, BSD-like, commercial use
                                                                   allowed (``/usr/share/doc/wordnet-base/copyright``)
``python-docs``        Debian ``python3.X-doc`` (reST sources)      PSF License 2.0; code examples Zero-Clause BSD
                                                                   (``_sources/license.rst.txt``)
``faker``              PyPI ``faker``                              MIT (``faker-*.dist-info/licenses/LICENSE.txt``)
=====================  ==========================================  ==============================================

specframe's own templates, word lists and synthetic problems are Apache-2.0. No Spec-Bench text is used.
Every loader raises :class:`~specframe.errors.ConfigError` with the install command when its package is missing,
or when the licence file no longer says what it said when the source was chosen.
"""

from __future__ import annotations

import glob
import hashlib
import json
import re
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import ConfigError


@dataclass(frozen=True)
class CorpusSource:
    name: str
    package: str
    install: str
    licence: str
    licence_phrase: str  # must occur in the licence file

    def licence_file(self) -> Path:
        path = _licence_paths[self.name]()
        if path is None or not path.exists():
            raise ConfigError(f"training source {self.name!r} needs {self.package}: {self.install}")
        return path

    def describe(self) -> dict:
        """What ``corpus.json`` and the model cards say about this source (licence checked now)."""
        path = self.licence_file()
        text = path.read_text(errors="replace")
        if self.licence_phrase not in text:
            raise ConfigError(f"{path} no longer contains {self.licence_phrase!r}: re-check the licence of {self.name}")
        return {"package": self.package, "licence": self.licence, "licence_file": str(path),
                "licence_sha256": hashlib.sha256(text.encode()).hexdigest()[:16]}


def _site_file(pattern: str) -> Path | None:
    import site
    import sys

    for base in [*site.getsitepackages(), *sys.path]:
        hits = sorted(glob.glob(str(Path(base) / pattern)))
        if hits:
            return Path(hits[-1])
    return None


def _docs_root() -> Path | None:
    hits = sorted(glob.glob("/usr/share/doc/python3*/html/_sources"))
    return Path(hits[-1]) if hits else None


_licence_paths = {
    "chitchat": lambda: _site_file("chitchat_dataset-*.dist-info/LICENSE"),
    "wordnet": lambda: Path("/usr/share/doc/wordnet-base/copyright"),
    "python-docs": lambda: (_docs_root() / "license.rst.txt") if _docs_root() else None,
    "faker": lambda: _site_file("faker-*.dist-info/licenses/LICENSE*") or _site_file("[Ff]aker-*.dist-info/LICENSE*"),
}

SOURCES = {
    s.name: s
    for s in [
        CorpusSource("chitchat", "PyPI chitchat-dataset 0.9.0 (BYU PCC lab human conversations)",
               "pip install chitchat-dataset==0.9.0", "MIT", "Permission is hereby granted, free of charge"),
        CorpusSource("wordnet", "Debian wordnet-base (Princeton WordNet 3.0)", "apt-get install wordnet-base",
               "WordNet 3.0 licence (BSD-like: use, copy, modify, distribute for any purpose)",
               "for any purpose and without fee or"),
        CorpusSource("python-docs", "Debian python3.X-doc (Python documentation reST sources)",
               "apt-get install python3.11-doc (or the python3.X-doc of your Debian)",
               "PSF License 2.0; code examples Zero-Clause BSD", "PSF LICENSE AGREEMENT"),
        CorpusSource("faker", "PyPI faker (synthetic names, addresses, companies)", "pip install faker", "MIT",
               "Permission is hereby granted, free of charge"),
    ]
}
OWN = {"package": "specframe (templates, word lists, synthetic problems)", "licence": "Apache-2.0"}
MIX_SOURCES = {"broad": tuple(SOURCES), "long": ("python-docs",), "pydoc": ()}  # the packaged sources each mix reads


def require(mix: str) -> None:
    """Check that every packaged source of ``mix`` is installed, before anything is built or loaded.

    Raises:
        ConfigError: one line naming every missing source and the commands that install them all (one ``apt-get
            install`` and one ``pip install`` line, not one source at a time).
    """
    missing = []
    for name in MIX_SOURCES.get(mix, ()):
        try:
            SOURCES[name].licence_file()
        except ConfigError:
            missing.append(SOURCES[name])
    if not missing:
        return
    commands: dict[str, list[str]] = {}
    notes = []
    for src in missing:
        command, _, note = src.install.partition(" (")
        tool, package = command.rsplit(" ", 1)  # "apt-get install", "wordnet-base"
        commands.setdefault(tool, []).append(package)
        if note:
            notes.append(f"{package}: {note.rstrip(')')}")
    install = "; ".join(f"{tool} {' '.join(packages)}" for tool, packages in commands.items())
    raise ConfigError(f"--mix {mix} needs training sources that are not installed "
                      f"({', '.join(s.name for s in missing)}): {install}"
                      + (f" ({'; '.join(notes)})" if notes else "")
                      + "; see docs/training.md, or use --mix pydoc (no extra packages)")


# --- chitchat-dataset ------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def conversations() -> list[list[str]]:
    """Human conversations: each a list of turns, a turn being one sender's consecutive messages joined."""
    SOURCES["chitchat"].licence_file()
    import chitchat_dataset

    path = Path(chitchat_dataset.__file__).parent / "dataset.json"
    data = json.loads(path.read_text())
    out = []
    for key in sorted(data):
        turns = []
        for group in data[key]["messages"]:
            text = " ".join(m["text"].strip() for m in group if m.get("text", "").strip())
            text = re.sub(r"\s+", " ", text).strip()
            if text:
                turns.append(text)
        if len(turns) >= 2:
            out.append(turns)
    return out


# --- WordNet ---------------------------------------------------------------------------------------------------
_LEXFILES = {  # lexicographer file number -> name (WordNet lexnames)
    4: "act", 5: "animal", 6: "artifact", 7: "attribute", 8: "body", 9: "cognition", 10: "communication",
    11: "event", 12: "feeling", 13: "food", 14: "group", 15: "location", 17: "object", 18: "person",
    19: "phenomenon", 20: "plant", 21: "possession", 22: "process", 26: "state", 27: "substance", 28: "time",
}


@lru_cache(maxsize=1)
def nouns(min_tagged: int = 1) -> dict[str, list[str]]:
    """Common English nouns by WordNet category (``"animal"``, ``"artifact"``, ...): lemmas whose most frequent
    sense belongs to that category and that occur at least ``min_tagged`` times in WordNet's tagged corpus."""
    root = Path("/usr/share/wordnet")
    if not (root / "index.noun").exists():
        raise ConfigError(f"training source 'wordnet' needs {SOURCES['wordnet'].package}: {SOURCES['wordnet'].install}")
    offsets: dict[str, list[str]] = {}
    for line in (root / "index.noun").read_text(errors="replace").splitlines():
        if line.startswith(" "):
            continue
        f = line.split()
        lemma, p_cnt = f[0], int(f[3])
        tagged = int(f[5 + p_cnt])
        if tagged >= min_tagged and lemma.isascii() and not any(c.isdigit() for c in lemma):
            offsets.setdefault(f[6 + p_cnt], []).append(lemma)
    by_cat: dict[str, list[str]] = {}
    for line in (root / "data.noun").read_text(errors="replace").splitlines():
        if line.startswith(" "):
            continue
        off, lex = line[:8], int(line[9:11])
        if off in offsets and lex in _LEXFILES:
            by_cat.setdefault(_LEXFILES[lex], []).extend(w.replace("_", " ") for w in offsets[off])
    return {k: sorted(v) for k, v in by_cat.items()}


# --- Python documentation --------------------------------------------------------------------------------------
_ROLE = re.compile(r":[a-z:]+:`!?~?([^`<]*?)(?:\s*<[^>]*>)?`")


def _clean_rst(text: str) -> str:
    text = _ROLE.sub(r"\1", text)
    text = text.replace("``", "")
    text = re.sub(r"`([^`<]*?)(?:\s*<[^>]*>)?`_*", r"\1", text)
    text = re.sub(r"\*\*?([^*]+)\*\*?", r"\1", text)
    return re.sub(r"\s+", " ", text).strip()


@lru_cache(maxsize=1)
def doc_passages(min_words: int = 70, max_words: int = 240) -> list[tuple[str, str]]:
    """``(title, passage)`` pairs of prose from the Python tutorial, HOWTOs, FAQ, glossary, reference and library
    docs (reST sources of Debian's python3.X-doc): paragraphs joined up to ``min_words``..``max_words`` words."""
    root = _docs_root()
    if root is None:
        raise ConfigError(f"training source 'python-docs' needs {SOURCES['python-docs'].install}")
    out = []
    for sub in ("tutorial", "howto", "faq", "reference", "library", "glossary.rst.txt"):
        for path in sorted((root / sub).rglob("*.txt")) if (root / sub).is_dir() else [root / sub]:
            title, chunk = path.name.split(".")[0], []
            for para in re.split(r"\n\s*\n", path.read_text(errors="replace")):
                lines = para.strip("\n").splitlines()
                if not lines or lines[0].startswith((" ", "..", ">>>", "*", "-", "=", "|", "+", ":")):
                    continue
                if len(lines) >= 2 and set(lines[1].strip()) <= set("=-~^*#\"'") and lines[1].strip():
                    title, chunk = _clean_rst(lines[0]), []
                    continue
                text = _clean_rst(" ".join(lines))
                if len(text.split()) < 12 or text.endswith("::"):
                    continue
                chunk.append(text)
                words = " ".join(chunk).split()
                if len(words) >= min_words:
                    out.append((title, " ".join(words[:max_words])))
                    chunk = []
    return out


@lru_cache(maxsize=1)
def doc_code(min_lines: int = 3, max_lines: int = 18) -> list[str]:
    """Python code examples (literal blocks after ``::`` without interpreter prompts) from the Python docs."""
    root = _docs_root()
    if root is None:
        raise ConfigError(f"training source 'python-docs' needs {SOURCES['python-docs'].install}")
    out = []
    for path in sorted((root / "tutorial").rglob("*.txt")) + sorted((root / "howto").rglob("*.txt")) + sorted(
        (root / "library").rglob("*.txt")
    ):
        blocks = re.split(r"::\n[ \t]*\n", path.read_text(errors="replace"))[1:]
        for block in blocks:
            lines = block.splitlines()
            indent = len(lines[0]) - len(lines[0].lstrip()) if lines else 0
            body = []
            for line in lines:
                if line.strip() and len(line) - len(line.lstrip()) < max(indent, 1):
                    break
                body.append(line)
            code = textwrap.dedent("\n".join(body)).strip("\n")
            n = code.count("\n") + 1
            if min_lines <= n <= max_lines and ">>>" not in code and "$ " not in code and ("def " in code or "=" in code):
                out.append(code)
    return out
