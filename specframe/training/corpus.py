"""Self-distillation corpus: the target's own greedy answers to the training prompts.

``mix="broad"`` (the default of ``specframe train corpus``) uses :mod:`specframe.training.broad` (chat, questions,
explanations, writing, role-play, reasoning, arithmetic, code, extraction, translation, summaries, passage QA, and
second turns); ``mix="pydoc"`` the small dependency-free mix of :mod:`specframe.training.prompts`.

Written in two stages as numbered gzip JSONL shards, one per generation batch, each written to a temporary name
and renamed when complete, so an interrupted build resumes at the next missing shard:

- ``shard-XXXXX.jsonl.gz``: first turns. Prompts are taken in blocks of ``16 × batch_size`` in schedule order and
  sorted by length inside a block (little padding, and any prefix of the shards covers every kind evenly).
- ``turn2-XXXXX.jsonl.gz``: second turns, asked after the target's own first answer (needs stage 1 complete).

``corpus.json`` records the settings and every source's licence; a build into a folder made with other settings
is refused.

Record: ``{"id": int, "kind": str, "source": str, "turn": 1 | 2, "prompt_ids": [int], "response_ids": [int]}``:
the prompt in the target's chat template (for turn 2: user, the target's first answer, user), the response
without padding (an EOS that ended it included).
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ..errors import ConfigError
from . import prompts as pydoc_prompts

MIXES = ("broad", "pydoc", "long")


@dataclass(frozen=True)
class CorpusSettings:
    model: str
    num_prompts: int
    max_new_tokens: int
    batch_size: int
    seed: int
    dtype: str
    mix: str = "pydoc"


def mix_prompts(settings: CorpusSettings) -> list[dict]:
    """The prompt items of a corpus: ``{"kind", "source", "text"[, "followup"]}``.

    Raises:
        ConfigError: unknown mix, or a source package of the mix is missing.
    """
    if settings.mix == "broad":
        from .broad import build_broad_prompts

        return build_broad_prompts(settings.num_prompts, settings.seed)
    if settings.mix == "pydoc":
        return [{**p, "source": "python-docs"} for p in pydoc_prompts.build_prompts(settings.num_prompts, settings.seed)]
    if settings.mix == "long":
        from .long import build_long_prompts

        return build_long_prompts(settings.num_prompts, settings.seed)
    raise ConfigError(f"unknown corpus mix {settings.mix!r}: use one of {', '.join(MIXES)}")


def sources_record(mix: str) -> dict:
    """Each source's package, licence and checked licence file, for ``corpus.json`` and the model cards."""
    from .sources import OWN, SOURCES

    if mix == "pydoc":
        return {"pydoc_data": {"package": "CPython stdlib pydoc_data.topics", "licence": "PSF License 2.0"},
                "specframe": OWN}
    if mix == "long":
        return {"python-docs": SOURCES["python-docs"].describe(), "specframe": OWN}
    return {**{name: s.describe() for name, s in SOURCES.items()}, "specframe": OWN}


def _stage1(out: Path, i: int) -> Path:
    return out / f"shard-{i:05d}.jsonl.gz"


def _stage2(out: Path, i: int) -> Path:
    return out / f"turn2-{i:05d}.jsonl.gz"


def _write(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(".tmp-" + path.name)
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw, mtime=0) as fh:
        fh.write(("\n".join(lines) + "\n").encode())  # no name or time in the header: a rebuilt shard is identical
    os.replace(tmp, path)


def _read(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:  # iteration splits at "\n" only: JSON Lines
        return [json.loads(line) for line in fh if line.strip()]


def _batches(lengths: list[int], ids: list[int], batch_size: int) -> list[list[int]]:
    block = 16 * batch_size
    out = []
    for s in range(0, len(ids), block):
        part = sorted(ids[s : s + block], key=lambda i: lengths[i])
        out += [part[j : j + batch_size] for j in range(0, len(part), batch_size)]
    return out


def _generate(target: Any, seqs: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy answers of the target to ``seqs`` in one left-padded batch, each cut after its first EOS."""
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    width = max(len(s) for s in seqs)
    inp = torch.full((len(seqs), width), pad, dtype=torch.int64)
    mask = torch.zeros((len(seqs), width), dtype=torch.int64)
    for r, s in enumerate(seqs):
        inp[r, width - len(s) :] = torch.tensor(s)
        mask[r, width - len(s) :] = 1
    with torch.inference_mode():
        gen = target.model.generate(
            input_ids=inp.to(target.device), attention_mask=mask.to(target.device), do_sample=False,
            max_new_tokens=max_new_tokens, pad_token_id=pad, top_p=None, top_k=None, temperature=None,
        )[:, width:].tolist()
    eos = set(target.eos_token_ids)
    answers = []
    for row in gen:
        resp = []
        for t in row:
            resp.append(t)
            if t in eos:
                break
        answers.append(resp)
    return answers


def _second_turn(target: Any, first: dict, text: str, followup: str) -> list[int]:
    if target.has_chat_template:
        answer = target.tokenizer.decode(first["response_ids"], skip_special_tokens=True)
        enc = target.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}, {"role": "assistant", "content": answer},
             {"role": "user", "content": followup}], add_generation_prompt=True, tokenize=True, return_dict=True)
        return list(enc["input_ids"])
    return first["prompt_ids"] + first["response_ids"] + list(target.tokenizer(followup)["input_ids"])


def corpus_batches(settings: CorpusSettings) -> tuple[int, int]:
    """``(first-turn batches, second-turn batches)`` of a corpus with these settings."""
    items = mix_prompts(settings)
    n2 = sum("followup" in p for p in items)
    b = settings.batch_size
    return (len(items) + b - 1) // b, (n2 + b - 1) // b


def build_corpus(target: Any, out: Path, settings: CorpusSettings,
                 progress: Callable[[int, int], None] | None = None) -> Path:
    """Generate (or finish generating) the corpus in ``out``.

    Args:
        target: a loaded :class:`specframe.target.hf.Target` (its model generates greedily, batched, left-padded).
        out: corpus folder; created if missing.
        settings: what to build; must equal the settings of an existing folder.
        progress: optional callable ``(done_batches, total_batches)`` over both stages.

    Raises:
        ConfigError: ``out`` holds a corpus built with other settings; a source package is missing.
    """
    if (done := finished_shards(out, settings)) is not None:  # no source (nor its package) is read again
        if progress:
            progress(sum(done), sum(done))
        return out
    items = mix_prompts(settings)
    want = {"settings": asdict(settings), "sources": sources_record(settings.mix), "format": 2}
    out.mkdir(parents=True, exist_ok=True)
    meta = out / "corpus.json"
    if meta.exists():
        have = json.loads(meta.read_text())
        if have.get("settings") != want["settings"] or have.get("format") != 2:
            raise ConfigError(f"{out} holds a corpus built with other settings ({have.get('settings')}): use a new folder")
    else:
        meta.write_text(json.dumps(want, indent=1) + "\n")
    ids = [target.encode_prompt(p["text"]) for p in items]
    b1 = _batches([len(x) for x in ids], list(range(len(items))), settings.batch_size)
    second = [i for i, p in enumerate(items) if "followup" in p]
    total = len(b1) + (len(second) + settings.batch_size - 1) // settings.batch_size
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total)

    def stage(path: Callable[[Path, int], Path], batches: list[list[int]], seqs: dict[int, list[int]], turn: int) -> None:
        for b, idx in enumerate(batches):
            if not path(out, b).exists():
                answers = _generate(target, [seqs[i] for i in idx], settings.max_new_tokens)
                _write(path(out, b), [json.dumps({"id": i, "kind": items[i]["kind"], "source": items[i]["source"],
                                                  "turn": turn, "prompt_ids": seqs[i], "response_ids": a})
                                      for i, a in zip(idx, answers)])
            tick()

    stage(_stage1, b1, dict(enumerate(ids)), 1)
    b2: list[list[int]] = []
    if second:
        firsts = {r["id"]: r for b in range(len(b1)) for r in _read(_stage1(out, b)) if "followup" in items[r["id"]]}
        ids2 = {i: _second_turn(target, firsts[i], items[i]["text"], items[i]["followup"]) for i in second}
        lengths = [len(ids2.get(i, ())) for i in range(len(items))]
        b2 = _batches(lengths, second, settings.batch_size)
        stage(_stage2, b2, ids2, 2)
    done_meta = json.loads(meta.read_text())
    done_meta["finished"] = {"shards": len(b1), "turn2": len(b2)}
    meta.write_text(json.dumps(done_meta, indent=1) + "\n")
    return out


def finished_shards(out: Path, settings: CorpusSettings | None = None) -> tuple[int, int] | None:
    """``(first-turn shards, second-turn shards)`` of a finished corpus in ``out`` (its ``corpus.json`` says so and
    every shard is there), built with ``settings`` when given; None otherwise. Reads no source."""
    try:
        meta = json.loads((out / "corpus.json").read_text())
        n1, n2 = int(meta["finished"]["shards"]), int(meta["finished"]["turn2"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if settings is not None and (meta.get("settings") != asdict(settings) or meta.get("format") != 2):
        return None
    if not all(_stage1(out, i).is_file() for i in range(n1)) or not all(_stage2(out, i).is_file() for i in range(n2)):
        return None
    return n1, n2


def corpus_stats(out: Path) -> dict:
    """Records, prompt and response tokens per kind and per source, and bytes on disk, of a (partial) corpus."""
    stats: dict[str, Any] = {"records": 0, "prompt_tokens": 0, "response_tokens": 0, "by_kind": {}, "by_source": {}}
    for r in read_corpus(out):
        for key, name in (("by_kind", r["kind"]), ("by_source", r.get("source", "?"))):
            row = stats[key].setdefault(name, {"records": 0, "response_tokens": 0})
            row["records"] += 1
            row["response_tokens"] += len(r["response_ids"])
        stats["records"] += 1
        stats["prompt_tokens"] += len(r["prompt_ids"])
        stats["response_tokens"] += len(r["response_ids"])
    stats["bytes"] = sum(p.stat().st_size for p in out.glob("*.jsonl*"))
    return stats


def read_corpus(out: Path) -> Iterator[dict]:
    """The corpus records, first turns then second turns, shard by shard.

    Raises:
        ConfigError: no ``corpus.json`` in ``out``.
    """
    if not (out / "corpus.json").exists():
        raise ConfigError(f"{out} is not a corpus folder (no corpus.json): build it with `specframe train corpus`")
    shards = sorted(out.glob("shard-*.jsonl")) + sorted(out.glob("shard-*.jsonl.gz")) + sorted(out.glob("turn2-*.jsonl.gz"))
    for shard in shards:
        yield from _read(shard)
