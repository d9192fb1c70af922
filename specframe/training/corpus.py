"""Self-distillation corpus: the target's own greedy answers to :mod:`specframe.training.prompts`.

Written as numbered JSONL shards (one per generation batch, each written to a temporary name and renamed when
complete), so an interrupted build resumes where it stopped; ``corpus.json`` records the settings, and a build
into a folder made with other settings is refused.

Record: ``{"kind": str, "prompt_ids": [int], "response_ids": [int]}`` — the prompt in the target's chat
template, the response without padding (an EOS that ended it included).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from ..errors import ConfigError
from .prompts import SOURCE, build_prompts


@dataclass(frozen=True)
class CorpusSettings:
    model: str
    num_prompts: int
    max_new_tokens: int
    batch_size: int
    seed: int
    dtype: str


def _shard(out: Path, i: int) -> Path:
    return out / f"shard-{i:05d}.jsonl"


def build_corpus(target: Any, out: Path, settings: CorpusSettings, progress: Any = None) -> Path:
    """Generate (or finish generating) the corpus in ``out``.

    Args:
        target: a loaded :class:`specframe.target.Target` (its model generates greedily, batched, left-padded).
        out: corpus folder; created if missing.
        settings: what to build; must equal the settings of an existing folder.
        progress: optional callable ``(done_batches, total_batches)``.

    Raises:
        ConfigError: ``out`` holds a corpus built with other settings.
    """
    out.mkdir(parents=True, exist_ok=True)
    meta = out / "corpus.json"
    want = {"settings": asdict(settings), "source": SOURCE, "format": 1}
    if meta.exists():
        have = json.loads(meta.read_text())
        if have != want:
            raise ConfigError(f"{out} holds a corpus built with other settings ({have.get('settings')}): use a new folder")
    else:
        meta.write_text(json.dumps(want, indent=1))
    tok = target.tokenizer
    prompts = build_prompts(settings.num_prompts, settings.seed)
    ids = [target.encode_prompt(p["text"]) for p in prompts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths per batch: little padding
    batches = [order[i : i + settings.batch_size] for i in range(0, len(order), settings.batch_size)]
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    eos = set(target.eos_token_ids)
    for b, idx in enumerate(batches):
        if _shard(out, b).exists():
            if progress:
                progress(b + 1, len(batches))
            continue
        width = max(len(ids[i]) for i in idx)
        inp = torch.full((len(idx), width), pad, dtype=torch.int64)
        mask = torch.zeros((len(idx), width), dtype=torch.int64)
        for r, i in enumerate(idx):
            inp[r, width - len(ids[i]) :] = torch.tensor(ids[i])
            mask[r, width - len(ids[i]) :] = 1
        with torch.inference_mode():
            gen = target.model.generate(
                input_ids=inp.to(target.device), attention_mask=mask.to(target.device), do_sample=False,
                max_new_tokens=settings.max_new_tokens, pad_token_id=pad, top_p=None, top_k=None, temperature=None,
            )[:, width:].tolist()
        lines = []
        for r, i in enumerate(idx):
            resp = []
            for t in gen[r]:
                resp.append(t)
                if t in eos:
                    break
            lines.append(json.dumps({"kind": prompts[i]["kind"], "prompt_ids": ids[i], "response_ids": resp}))
        tmp = out / f".tmp-{b:05d}"
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, _shard(out, b))
        if progress:
            progress(b + 1, len(batches))
    return out


def read_corpus(out: Path) -> Iterator[dict]:
    """The corpus records, shard by shard.

    Raises:
        ConfigError: no ``corpus.json`` in ``out``.
    """
    if not (out / "corpus.json").exists():
        raise ConfigError(f"{out} is not a corpus folder (no corpus.json): build it with `specframe train corpus`")
    for shard in sorted(out.glob("shard-*.jsonl")):
        for line in shard.read_text().splitlines():
            if line.strip():
                yield json.loads(line)
