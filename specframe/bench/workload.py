"""A SPEED-Bench-shaped workload built from text that may be shipped (``specframe workload build``).

SPEED-Bench (NVIDIA Model-Optimizer, ``examples/specdec_bench``) is the field's reference workload for speculative
decoding: 11 categories of a "qualitative" split and "throughput" splits by input length with low / mixed / high
entropy tiers. Its public files hold placeholders instead of prompts, so they are not vendored: this module writes a
workload of the same schema from the sources of :mod:`specframe.bench.workload_sources`, each licence checked.

Each line of ``questions.jsonl`` (:func:`write_workload`) has SPEED-Bench's fields — ``question_id`` (str),
``category``, ``sub_category``, ``turns`` (list of user turns), ``source``, ``src_id``, ``difficulty`` (str or
null), ``multiturn`` (bool) — and specframe's: ``entropy_tier`` (``low``: the answer is largely in the prompt, as in
copying, reformatting or editing given text; ``mixed``: benchmark questions and explanations; ``high``: open-ended
writing), ``split`` (``qualitative``, or ``throughput_1k`` / ``_2k`` / ``_8k`` for at most 1000 / 2000 / 8000
tokens, as SPEED-Bench names its throughput splits; ``throughput_1024`` for a length that is not a multiple of
1000), ``context_tokens`` (tokens of the first turn) and, in the throughput splits, ``target_tokens`` (the most
tokens the prompt was filled to). ``specframe bench`` reports each qualitative category and each throughput split
as a column (:func:`specframe.bench.runner.question_group`). Everything is drawn with seeded random generators: the
same settings on the same installed sources give the same bytes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import ConfigError
from . import workload_sources as src
from . import workload_templates as T

CATEGORIES = ("coding", "humanities", "math", "multilingual", "qa", "rag", "reasoning", "roleplay", "stem",
              "summarization", "writing")
TIERS = ("low", "mixed", "high")
LONG_DEFAULT = (1000, 2000, 8000)  # SPEED-Bench's throughput_1k / _2k / _8k lengths
QUESTIONS = "questions.jsonl"
FIELDS = ("question_id", "category", "sub_category", "turns", "source", "src_id", "difficulty", "multiturn",
          "entropy_tier", "split", "context_tokens")
APPROX = "approx"  # the token counter used without a tokenizer: see approx_tokens
_PIECE = re.compile(r"\w{1,6}|[^\w\s]")


def approx_tokens(text: str) -> int:
    """An approximate token count without a tokenizer: runs of up to six word characters and single punctuation
    marks. On SmolLM2's tokenizer it is within about 10 % for English prose and Python code, and undercounts
    other languages (German by about half)."""
    return len(_PIECE.findall(text))


@dataclass
class TokenCounter:
    """``count(text) -> int``: the tokens of ``text`` without special tokens; ``name`` says by which tokenizer."""

    name: str
    count: Callable[[str], int]


def model_counter(model: str) -> TokenCounter:
    """The token counter of a target's tokenizer, its weights not loaded (a GGUF's tokenizer is read once into the
    model cache).

    Raises:
        UnknownModelError, ModelNotInstalledError: as :func:`specframe.target.models.resolve_model`.
        CacheError: the tokenizer cannot be written into the model cache.
    """
    import logging

    from transformers import AutoTokenizer

    from ..target.models import model_directory, resolve_model, tokenizer_directory

    source = resolve_model(model)
    folder = tokenizer_directory(source.gguf) if source.gguf is not None else (source.directory or model_directory(source))
    logging.getLogger("transformers").setLevel(logging.ERROR)  # (sequence longer than the model's limit: counted)
    tok = AutoTokenizer.from_pretrained(folder)
    return TokenCounter(source.name, lambda text: len(tok(text, add_special_tokens=False, verbose=False)["input_ids"]))


# --- what the pools draw from -------------------------------------------------------------------------------------

@dataclass
class Material:
    """The loaded sources: standard-library functions and docs, README paragraphs, Spec-Bench's questions."""

    functions: tuple[tuple[str, str], ...]
    docs: tuple[tuple[str, str], ...]
    paragraphs: tuple[tuple[str, str], ...]
    specbench: dict[str, list[dict]]
    sources: list[src.WorkloadSource]

    @classmethod
    def load(cls, specbench: Path | None) -> Material:
        sources = [src.stdlib_source()]
        paragraphs, docs_source = src.package_docs()
        sources.append(docs_source)
        questions: dict[str, list[dict]] = {}
        if specbench is not None:
            questions, more = src.specbench_questions(specbench)
            sources += more
        sources.append(src.own_source())
        return cls(src.stdlib_functions(), src.stdlib_docs(), paragraphs, questions, sources)


def _item(sub: str, turns: list[str], source: str, src_id: str, difficulty: str | None = None) -> dict[str, Any]:
    return {"sub_category": sub, "turns": turns, "source": source, "src_id": src_id, "difficulty": difficulty}


def _shuffled(rng: random.Random, items) -> list:
    out = list(items)
    rng.shuffle(out)
    return out


def _code(code: str) -> str:
    return f"```python\n{code}\n```"


def _mt_bench(m: Material, rng: random.Random, category: str, sub: str) -> Iterator[dict]:
    source = "gsm8k" if category == "math_reasoning" else "mt-bench"
    for q in _shuffled(rng, m.specbench.get(category, [])):
        yield _item(sub, q["turns"], source, f"spec-bench:{q['question_id']}")


def _paragraph_sets(m: Material, rng: random.Random, k: tuple[int, int], docs: bool = False) -> Iterator[list]:
    """Endless sets of ``k[0]..k[1]`` passages: README paragraphs, or (``docs``) standard-library docstrings."""
    pool = [(f"{i}", t) for i, t in (m.docs if docs else m.paragraphs)]
    if len(pool) < k[1]:
        return
    for _ in range(10_000):
        yield rng.sample(pool, rng.randint(*k))


def _ids(chosen: list) -> str:
    return ",".join(i for i, _ in chosen)


def _interleave(rng: random.Random, outer, inner) -> list[tuple]:
    """Every ``(o, i)`` pair, ordered so that each round visits every ``o`` once (in a seeded order) before any
    ``o`` comes again: consecutive prompts differ in ``o``."""
    outer, inner = _shuffled(rng, outer), list(inner)
    offsets = {o: rng.randrange(len(inner)) for o in outer}
    return [(o, inner[(offsets[o] + r) % len(inner)]) for r in range(len(inner)) for o in outer]


# --- the pools of each category and tier (each a generator of partial records) ------------------------------------

def _coding(m: Material, rng: random.Random, tier: str) -> list[Iterator[dict]]:
    fns = _shuffled(rng, m.functions)
    if tier == "low":
        return [(_item("code-edit", [f"{rng.choice(T.CODE_EDITS)}\n\n{_code(c)}"], "python-stdlib", i) for i, c in fns)]
    if tier == "mixed":
        return [_mt_bench(m, rng, "coding", "code-question"),
                (_item("code-review", [f"{rng.choice(T.CODE_REVIEWS)}\n\n{_code(c)}"], "python-stdlib", i)
                 for i, c in fns)]
    return [(_item("program-design", [f"Write a Python program that {t}. Choose the design yourself and explain it "
                                      "briefly."], "specframe", f"code-task:{T.CODE_TASKS.index(t)}")
             for t in _shuffled(rng, T.CODE_TASKS))]


def _humanities(m: Material, rng: random.Random, tier: str) -> list[Iterator[dict]]:
    if tier == "low":
        def timelines():
            for topic, n in _interleave(rng, T.TIMELINES, range(len(T.TIMELINE_TASKS))):
                events = T.TIMELINES[topic]
                lines = _shuffled(rng, events) if n == 1 else events
                text = "\n".join(f"- {d}: {e}" for d, e in lines)
                yield _item("reformat", [f"{T.TIMELINE_TASKS[n].format(topic=topic)}\n\n{text}"], "specframe",
                            f"timeline:{topic}:{n}")
        return [timelines()]
    if tier == "mixed":
        return [_mt_bench(m, rng, "humanities", "explain"),
                (_item("explain", [T.CONCEPT_TASK.format(a=a, b=b)], "specframe", f"concepts:{a}|{b}")
                 for a, b in _shuffled(rng, T.CONCEPT_PAIRS))]
    return [(_item("essay", [T.ESSAY_TASK.format(theme=t)], "specframe", f"essay:{t}")
             for t in _shuffled(rng, T.ESSAY_THEMES))]


def _arithmetic(rng: random.Random) -> Iterator[dict]:
    for n in range(10_000):
        kind = n % len(T.ARITHMETIC_TASKS)
        digits = rng.randint(3, 6)
        a, b = rng.randint(10 ** (digits - 1), 10**digits - 1), rng.randint(10 ** (digits - 2), 10 ** (digits - 1) - 1)
        numbers = ", ".join(str(rng.randint(100, 99_999)) for _ in range(rng.randint(4, 7)))
        text = T.ARITHMETIC_TASKS[kind].format(a=a, b=b, n=a, numbers=numbers)
        difficulty = "easy" if digits <= 3 else "medium" if digits <= 5 else "hard"
        yield _item("arithmetic-procedure", [text], "specframe", f"arithmetic:{kind}", difficulty)


def _word_problems(rng: random.Random) -> Iterator[dict]:
    for _ in range(10_000):
        n1, n2, p1, p2 = rng.randint(2, 9), rng.randint(2, 12), rng.randint(2, 9), rng.randint(1, 4)
        paid = next(b for b in (20, 50, 100, 200) if b > n1 * p1 + n2 * p2)
        text = T.WORD_PROBLEM.format(name=rng.choice(T.NAMES), n1=n1, n2=n2, p1=p1, p2=p2, paid=paid)
        yield _item("word-problem", [text], "specframe", "word-problem", "easy")


def _math(m: Material, rng: random.Random, tier: str) -> list[Iterator[dict]]:
    if tier == "low":
        return [_arithmetic(rng)]
    if tier == "mixed":
        return [_mt_bench(m, rng, "math_reasoning", "word-problem"), _mt_bench(m, rng, "math", "math-question"),
                _word_problems(rng)]
    pairs = _interleave(rng, range(len(T.MATH_OPEN_TASKS)), T.MATH_OPEN_TOPICS)
    return [(_item("open-math", [T.MATH_OPEN_TASKS[n].format(topic=topic)], "specframe", f"open-math:{n}:{topic}")
             for n, topic in pairs)]


def _multilingual(m: Material, rng: random.Random, tier: str) -> list[Iterator[dict]]:
    if tier == "low":
        pairs = _interleave(rng, T.PASSAGES, range(len(T.COPY_TASKS)))
        return [(_item("copy-format", [f"{T.COPY_TASKS[n].format(lang=lang)}\n\n{T.PASSAGES[lang]}"], "specframe",
                       f"passage:{lang}:{n}") for lang, n in pairs)]
    if tier == "mixed":
        def translations():
            for _ in range(10_000):
                lang, chosen = rng.choice(T.LANGUAGES), rng.sample(T.ENGLISH_SENTENCES, 3)
                text = "\n".join(chosen)
                yield _item("translation", [T.TRANSLATE_TASK.format(lang=lang, text=text)], "specframe",
                            f"translate:{lang}:" + ",".join(str(T.ENGLISH_SENTENCES.index(s)) for s in chosen))
        return [translations()]
    return [(_item("open-writing", [text], "specframe", f"open-writing:{lang}:{T.OPEN_PROMPTS.index((lang, text))}")
             for lang, text in _shuffled(rng, T.OPEN_PROMPTS))]


def _qa(m: Material, rng: random.Random, tier: str) -> list[Iterator[dict]]:
    if tier == "low":
        docs = [(t, d) for t, d in _shuffled(rng, m.docs) if len(d.split()) <= 250]
        return [(_item("extractive", [T.QUOTE_TASK.format(name=f"`{t}`", doc=d)], "python-stdlib", t) for t, d in docs)]
    if tier == "mixed":
        return [(_item("factual", [q], "specframe", f"fact:{T.FACT_QUESTIONS.index(q)}")
                 for q in _shuffled(rng, T.FACT_QUESTIONS))]
    return [(_item("open-question", [q], "specframe", f"open:{T.OPEN_QUESTIONS.index(q)}")
             for q in _shuffled(rng, T.OPEN_QUESTIONS))]


def _numbered(chosen: list) -> str:
    return "\n\n".join(f"[{n}] {t}" for n, (_, t) in enumerate(chosen, 1))


def _distinct_word(chosen: list, rng: random.Random) -> tuple[int, str] | None:
    """A word of seven letters or more that occurs in exactly one of the passages: ``(passage number, word)``."""
    words = [set(re.findall(r"\b[A-Za-z]{7,}\b", t.lower())) for _, t in chosen]
    candidates = sorted((n, w) for n, ws in enumerate(words) for w in ws
                        if sum(w in other for other in words) == 1)
    return rng.choice(candidates) if candidates else None


def _rag(m: Material, rng: random.Random, tier: str) -> list[Iterator[dict]]:
    if tier == "low":
        def locate():
            for chosen in _paragraph_sets(m, rng, (3, 5)):
                hit = _distinct_word(chosen, rng)
                if hit is not None:
                    text = T.RAG_LOW.format(word=hit[1], context=_numbered(chosen))
                    yield _item("locate-and-quote", [text], "package-docs", _ids(chosen))
        return [locate()]
    if tier == "mixed":
        def grounded():
            for chosen in _paragraph_sets(m, rng, (3, 5), docs=True):
                name = rng.choice(chosen)[0]
                context = "\n\n".join(f"Document {n}: {t}\n{d}" for n, (t, d) in enumerate(chosen, 1))
                yield _item("grounded-answer", [T.RAG_MIXED.format(name=f"`{name}`", context=context)],
                            "python-stdlib", _ids(chosen))
        return [_mt_bench(m, rng, "extraction", "extraction"), grounded()]
    return [(_item("inspired-writing", [T.RAG_HIGH.format(context=_numbered(c))], "package-docs", _ids(c))
             for c in _paragraph_sets(m, rng, (3, 4)))]


def _orderings(rng: random.Random) -> Iterator[dict]:
    for _ in range(10_000):
        people = rng.sample(T.PEOPLE, rng.randint(4, 6))  # oldest first
        facts = [f"{a} is older than {b}." for a, b in zip(people, people[1:])]
        text = T.ORDER_TASK.format(facts=" ".join(_shuffled(rng, facts)))
        yield _item("ordering", [text], "specframe", "ordering:" + ",".join(people),
                    "easy" if len(people) == 4 else "medium" if len(people) == 5 else "hard")


def _sequences(rng: random.Random) -> Iterator[dict]:
    for n in range(10_000):
        a, d = rng.randint(1, 9), rng.randint(2, 7)
        seq = ([a + d * i for i in range(5)], [a * d**i for i in range(5)], [a + i * i * d for i in range(5)])[n % 3]
        yield _item("sequence", [T.SEQUENCE_TASK.format(seq=", ".join(map(str, seq)))], "specframe",
                    f"sequence:{n % 3}", ("easy", "medium", "hard")[n % 3])


def _reasoning(m: Material, rng: random.Random, tier: str) -> list[Iterator[dict]]:
    if tier == "low":
        return [_orderings(rng)]
    if tier == "mixed":
        return [_mt_bench(m, rng, "reasoning", "puzzle"), _sequences(rng)]
    return [(_item("argument", [T.ARGUE_TASK.format(claim=c)], "specframe", f"claim:{T.CLAIMS.index(c)}")
             for c in _shuffled(rng, T.CLAIMS))]


def _roleplay(m: Material, rng: random.Random, tier: str) -> list[Iterator[dict]]:
    if tier == "low":
        return [(_item("read-script", [T.SCRIPT_TASK.format(lines="\n".join(s))], "specframe",
                       f"script:{T.SCRIPTS.index(s)}") for s in _shuffled(rng, T.SCRIPTS))]
    if tier == "mixed":
        return [_mt_bench(m, rng, "roleplay", "role-question"),
                (_item("role-question", [T.ROLE_TASK.format(role=r, question=q1), q2], "specframe",
                       f"role:{T.ROLES.index((r, q1, q2))}") for r, q1, q2 in _shuffled(rng, T.ROLES))]
    return [(_item("character", [T.CHARACTER_TASK.format(character=c, turn=turns[0]), *turns[1:]], "specframe",
                   f"character:{T.CHARACTERS.index((c, turns))}") for c, turns in _shuffled(rng, T.CHARACTERS))]


def _conversions(rng: random.Random) -> Iterator[dict]:
    for _ in range(10_000):
        chosen = rng.sample(T.UNITS, rng.randint(4, 6))
        lines = "\n".join(f"- {q}: {rng.randint(2, 500)} {unit}" for q, unit, _, _ in chosen)
        yield _item("unit-conversion", [T.UNITS_TASK.format(lines=lines)], "specframe",
                    "units:" + ",".join(str(T.UNITS.index(u)) for u in chosen))


def _stem(m: Material, rng: random.Random, tier: str) -> list[Iterator[dict]]:
    if tier == "low":
        return [_conversions(rng)]
    if tier == "mixed":
        return [_mt_bench(m, rng, "stem", "explain"),
                (_item("explain", [T.STEM_EXPLAIN.format(phenomenon=p)], "specframe", f"phenomenon:{T.PHENOMENA.index(p)}")
                 for p in _shuffled(rng, T.PHENOMENA))]
    return [(_item("speculate", [T.STEM_SPECULATE.format(scenario=s)], "specframe", f"scenario:{T.SCENARIOS.index(s)}")
             for s in _shuffled(rng, T.SCENARIOS))]


def _summarization(m: Material, rng: random.Random, tier: str) -> list[Iterator[dict]]:
    def texts(docs: bool, k: tuple[int, int]):
        for chosen in _paragraph_sets(m, rng, k, docs=docs):
            yield chosen, "\n\n".join(t for _, t in chosen)

    if tier == "low":
        return [(_item("extract-sentences", [T.SUMMARY_LOW.format(text=t)], "package-docs", _ids(c))
                 for c, t in texts(False, (3, 4)))]
    if tier == "mixed":
        return [(_item("summary", [T.SUMMARY_MIXED.format(text=t)], "python-stdlib", _ids(c))
                 for c, t in texts(True, (2, 3))),
                (_item("summary", [T.SUMMARY_MIXED.format(text=t)], "package-docs", _ids(c))
                 for c, t in texts(False, (3, 4)))]
    return [(_item("creative-retelling", [rng.choice(T.SUMMARY_HIGH).format(text=t)], "package-docs", _ids(c))
             for c, t in texts(False, (2, 3)))]


_TYPO = re.compile(r"\b[a-z]{5,}\b")


def _with_typos(text: str, rng: random.Random, share: float = 0.12) -> str:
    """``text`` with ``share`` of its lower-case words of five letters or more (at least one) misspelled: two
    different neighbouring inner letters swapped."""
    spots = [(m.start(), m.group(0)) for m in _TYPO.finditer(text) if len(set(m.group(0)[1:-1])) > 1]
    out = text
    for start, w in sorted(rng.sample(spots, max(1, round(share * len(spots)))) if spots else [], reverse=True):
        i = rng.choice([j for j in range(1, len(w) - 2) if w[j] != w[j + 1]])
        out = out[:start] + w[:i] + w[i + 1] + w[i] + w[i + 2:] + out[start + len(w):]
    return out


def _writing(m: Material, rng: random.Random, tier: str) -> list[Iterator[dict]]:
    if tier == "low":
        return [(_item("proofread", [T.PROOFREAD_TASK.format(text=_with_typos(t, rng))], "package-docs", i)
                 for i, t in _shuffled(rng, m.paragraphs))]
    if tier == "mixed":
        return [_mt_bench(m, rng, "writing", "rewrite"),
                (_item("rewrite", [rng.choice(T.REWRITE_TASKS).format(text=t)], "package-docs", i)
                 for i, t in _shuffled(rng, m.paragraphs))]
    return [(_item("story", [T.STORY_TASK.format(opening=o)], "specframe", f"opening:{T.STORY_OPENINGS.index(o)}")
             for o in _shuffled(rng, T.STORY_OPENINGS))]


POOLS: dict[str, Callable[[Material, random.Random, str], list[Iterator[dict]]]] = {
    "coding": _coding, "humanities": _humanities, "math": _math, "multilingual": _multilingual, "qa": _qa, "rag": _rag,
    "reasoning": _reasoning, "roleplay": _roleplay, "stem": _stem, "summarization": _summarization,
    "writing": _writing,
}


def _draw(pools: list[Iterator[dict]], n: int, seen: set[str]) -> list[dict]:
    """Up to ``n`` items taken from ``pools`` in turn (a pool that runs dry drops out), none whose first turn was
    taken before."""
    out, live = [], list(pools)
    while len(out) < n and live:
        for pool in list(live):
            if len(out) >= n:
                break
            item = next((it for it in pool if it["turns"][0] not in seen), None)
            if item is None:
                live.remove(pool)
                continue
            seen.add(item["turns"][0])
            out.append(item)
    return out


# --- long inputs (the throughput splits) ----------------------------------------------------------------------------

LONG_KINDS = {  # tier -> [(category, sub_category, template, context kind)], taken in turn
    "low": [("coding", "long-code-copy", T.LONG_CODE, "code"), ("summarization", "long-extract", T.LONG_EXTRACT, "docs")],
    "mixed": [("rag", "long-grounded-answer", T.LONG_RAG, "docs"), ("summarization", "long-summary", T.LONG_SUMMARY,
                                                                    "docs")],
    "high": [("writing", "long-story", T.LONG_STORY, "docs"), ("roleplay", "long-teacher", T.LONG_ROLEPLAY, "docs")],
}


def _units(m: Material, rng: random.Random, kind: str) -> list[tuple[str, str]]:
    """``(label, text)`` units a long prompt is filled with, in a seeded order: a run of standard-library modules'
    top-level blocks (``code``), or docstring sections (``docs``)."""
    if kind == "code":
        modules = src.stdlib_modules()
        start = rng.randrange(len(modules))
        return [(name, block) for name in modules[start:] + modules[:start] for block in src.stdlib_blocks(name)]
    return [(title, f"## {title}\n\n{doc}") for title, doc in _shuffled(rng, m.docs)]


def _fill(template: str, units: list[tuple[str, str]], target: int, count: Callable[[str], int],
          extra: dict[str, str], skip: bool = True) -> tuple[str, list[str], int]:
    """The template filled with as many units, in order, as fit in ``target`` tokens (a unit that would overflow is
    skipped; with ``skip`` false it ends the filling once 90 % is filled, so code stays contiguous where it can):
    ``(text, labels used, tokens)``, tokens never above ``target``."""
    chosen: list[str] = []
    labels: list[str] = []
    used = count(template.format(context="", **extra))
    skipped = 0
    for label, text in units:
        n = count(text) + 1
        if used + n > target:
            skipped += 1
            if skipped > 40 or used > 0.97 * target or (not skip and used >= 0.9 * target):
                break
            continue
        chosen.append(text)
        labels.append(label)
        used += n
    while True:  # the units were counted apart: the whole may differ by a few tokens
        prompt = template.format(context="\n\n".join(chosen), **extra)
        n = count(prompt)
        if n <= target or not chosen:
            return prompt, labels, n
        chosen, labels = chosen[:-1], labels[:-1]


def _long_records(m: Material, targets: tuple[int, ...], per_tier: int, seed: int,
                  count: Callable[[str], int]) -> list[dict]:
    out = []
    for target in targets:
        split = f"throughput_{target // 1000}k" if target % 1000 == 0 else f"throughput_{target}"
        for tier in TIERS:
            rng = random.Random(f"{seed}:{split}:{tier}")
            for i in range(per_tier):
                category, sub, template, kind = LONG_KINDS[tier][i % len(LONG_KINDS[tier])]
                extra = {"goal": rng.choice(T.LONG_GOALS)} if "{goal}" in template else {}
                text, labels, _ = _fill(template, _units(m, rng, kind), target, count, extra, skip=kind != "code")
                modules = list(dict.fromkeys(lbl.split(".")[0] if kind == "docs" else lbl for lbl in labels))
                item = _item(sub, [text], "python-stdlib", f"{kind}:{len(labels)} units from " + ",".join(modules[:8])
                             + (",..." if len(modules) > 8 else ""))
                out.append(_record(item, category, tier, split, f"{split}-{tier}-{i:03d}", count, target))
    return out


# --- the workload ------------------------------------------------------------------------------------------------

def _record(item: dict, category: str, tier: str, split: str, qid: str, count: Callable[[str], int],
            target: int | None = None) -> dict[str, Any]:
    rec = {"question_id": qid, "category": category, **item, "multiturn": len(item["turns"]) > 1,
           "entropy_tier": tier, "split": split, "context_tokens": count(item["turns"][0])}
    if target is not None:
        rec["target_tokens"] = target
    return rec


def _split_counts(n: int) -> dict[str, int]:
    """``n`` prompts of a category spread over the tiers, the remainder to the first tiers."""
    return {t: n // 3 + (i < n % 3) for i, t in enumerate(TIERS)}


@dataclass
class Workload:
    """The records (``questions.jsonl``'s lines, in order) and the sources they were drawn from."""

    records: list[dict[str, Any]]
    sources: list[src.WorkloadSource]
    settings: dict[str, Any] = field(default_factory=dict)

    def counts(self, key: str = "category") -> dict[str, dict[str, dict[str, int]]]:
        """``{split: {record[key]: {tier: n}}}``."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for r in self.records:
            row = out.setdefault(r["split"], {}).setdefault(str(r[key]), {t: 0 for t in TIERS})
            row[r["entropy_tier"]] += 1
        return out

    def summary(self) -> dict[str, Any]:
        """What ``sources.json`` holds: settings, counts per split / category / tier and per source, the sources
        with their licences, and the SHA-256 of ``questions.jsonl``."""
        body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.records)
        return {"schema": list(FIELDS) + ["target_tokens (throughput splits)"], "settings": self.settings,
                "records": len(self.records), "questions_sha256": hashlib.sha256(body.encode()).hexdigest(),
                "counts": self.counts(), "by_source": self.counts("source"),
                "sources": [s.describe() for s in self.sources], "not_used": NOT_USED}


NOT_USED = [
    "SPEED-Bench's own files (nvidia/SPEED-Bench): the public files hold placeholders; fetch them with specdec_bench's "
    "prepare_data.py and pass the result to `specframe bench --questions`",
    "Spec-Bench translation (WMT14), summarization (CNN/DailyMail), qa and rag (Natural Questions, DPR Wikipedia "
    "passages): the terms of the underlying text are share-alike or unclear",
]


def build_workload(per_category: int = 6, long: tuple[int, ...] = LONG_DEFAULT, long_per_tier: int = 1,
                   seed: int = 0, counter: TokenCounter | None = None, specbench: Path | None = None) -> Workload:
    """Build the workload: ``per_category`` prompts for each of :data:`CATEGORIES` in the ``qualitative`` split
    (spread over the tiers, interleaved low, mixed, high, low, ...), and for each length in ``long`` (tokens) ``long_per_tier`` prompts per tier
    in a ``throughput_<n>k`` split.

    ``counter`` counts tokens (default: :func:`approx_tokens`); ``specbench``: a Spec-Bench ``question.jsonl`` whose
    MT-bench and GSM8K questions join the mixed tier (None: own templates only).

    Raises:
        ConfigError: a count out of range, or a source whose licence cannot be confirmed (the standard library's).
    """
    if not 1 <= per_category <= 1000 or not 0 <= long_per_tier <= 100:
        raise ConfigError(f"--per-category must be 1..1000 and --long-per-tier 0..100 (got {per_category}, "
                          f"{long_per_tier})")
    if any(not 128 <= n <= 131072 for n in long):
        raise ConfigError(f"--long lengths must be 128..131072 tokens (got {','.join(map(str, long))})")
    counter = counter or TokenCounter(APPROX, approx_tokens)
    m = Material.load(specbench)
    records, seen = [], set()
    for c, category in enumerate(CATEGORIES):
        by_tier = []
        for tier, n in _split_counts(per_category).items():
            rng = random.Random(f"{seed}:{category}:{tier}")
            by_tier.append([_record(item, category, tier, "qualitative", f"qualitative-{category}-{tier}-{i:03d}",
                                    counter.count) for i, item in enumerate(_draw(POOLS[category](m, rng, tier), n, seen))])
        # tiers interleaved, each category starting one tier further (coding low, mixed, high, ...; humanities mixed,
        # high, low, ...): the first N of a category (--limit-per-category) span the tiers, and the first one of
        # every category spans them across categories
        by_tier = by_tier[c % len(by_tier):] + by_tier[: c % len(by_tier)]
        records += [r for group in itertools.zip_longest(*by_tier) for r in group if r is not None]
    records += _long_records(m, tuple(long), long_per_tier, seed, counter.count)
    settings = {"seed": seed, "per_category": per_category, "long": list(long), "long_per_tier": long_per_tier,
                "tokenizer": counter.name, "specbench": specbench.name if specbench is not None else None}
    used = {r["source"] for r in records}
    return Workload(records, [s for s in m.sources if s.name in used], settings)


def sources_markdown(w: Workload) -> str:
    """``SOURCES.md``: each source and its licence, then the counts per category and tier of every split."""
    s = w.summary()
    lines = ["# Sources of this workload", "",
             f"{s['records']} prompts in `{QUESTIONS}` (SPEED-Bench's schema; see specframe/bench/workload.py), built "
             f"by `specframe workload build` with seed {w.settings['seed']}; tokens counted with "
             f"{w.settings['tokenizer']}.", "", "| source | licence | what | licence checked in | from |",
             "|---|---|---|---|---|"]
    for src_ in s["sources"]:
        lines.append(f"| {src_['name']} | {src_['licence']} | {src_['what']} | {src_['checked']} | {src_['origin']} |")
    docs = next((x for x in s["sources"] if x["name"] == "package-docs"), None)
    if docs:
        lines += ["", "package-docs, per distribution:", ""]
        lines += [f"- {d['distribution']} {d['version']}: {d['licence']} ({d['licence_file']})"
                  for d in docs["distributions"]]
    for split, table in s["counts"].items():
        lines += ["", f"## {split}", "", "| category | " + " | ".join(TIERS) + " | total |",
                  "|---|" + "---:|" * (len(TIERS) + 1)]
        for cat, row in table.items():
            lines.append(f"| {cat} | " + " | ".join(str(row[t]) for t in TIERS) + f" | {sum(row.values())} |")
    lines += ["", "## Prompts per source", "", "| split | source | " + " | ".join(TIERS) + " |",
              "|---|---|" + "---:|" * len(TIERS)]
    for split, table in s["by_source"].items():
        for name, row in table.items():
            lines.append(f"| {split} | {name} | " + " | ".join(str(row[t]) for t in TIERS) + " |")
    lines += ["", "Not used:", ""] + [f"- {n}" for n in NOT_USED]
    return "\n".join(lines) + "\n"


def write_workload(w: Workload, output: Path) -> list[str]:
    """Write ``questions.jsonl``, ``sources.json`` and ``SOURCES.md`` into the folder ``output`` (replaced whole,
    :func:`specframe.io.atomic.replace_folder`); returns the file names.

    Raises:
        ConfigError: ``output`` is a file, or a folder holding files specframe did not write.
    """
    from ..io.atomic import replace_folder

    files = {QUESTIONS: "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in w.records),
             "sources.json": json.dumps(w.summary(), indent=1, ensure_ascii=False) + "\n",
             "SOURCES.md": sources_markdown(w)}

    def fill(tmp: Path) -> None:
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")

    replace_folder(Path(output), fill)
    return list(files)
