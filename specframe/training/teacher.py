"""One target pass over the corpus, shared by both recipes: the target's top-``K`` next-token distribution at
every position (soft labels for the draft, Hinton et al. 2015 / DistillSpec, Zhou et al. 2024) and its last
hidden state at every response position (the Medusa heads' input).

Written next to the corpus as ``teacher-<dtype>-k<K>/part-XXXXX.pt`` (one per batch of 8 records, temporary name
then rename), so an interrupted pass resumes.

Per record: ``top_ids [n - 1, K]`` int32 and ``top_logp [n - 1, K]`` float16 (row ``i`` = the target's
distribution of token ``i + 1``, log-probabilities of its ``K`` most likely tokens), ``hidden [n - h0, H]``
(rows from position ``h0 = max(P - 2, 0)``, P = prompt length) in the target's dtype.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import torch

from .common import length_batches


def _folder(corpus: Path, target: Any, k: int) -> Path:
    return corpus / f"teacher-{str(target.dtype).replace('torch.', '')}-k{k}"


@torch.inference_mode()
def teacher_pass(target: Any, corpus: Path, records: list[dict], top_k: int = 16, max_len: int = 640,
                 progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Run (or finish) the pass and return one dict per record (in ``records`` order): ``ids`` (the sequence,
    cut from the left to ``max_len``), ``start`` (first response index in ``ids``), ``top_ids``, ``top_logp``,
    ``hidden``, ``h0``."""
    out = _folder(corpus, target, top_k)
    out.mkdir(parents=True, exist_ok=True)
    seqs = [(r["prompt_ids"] + r["response_ids"])[-max_len:] for r in records]
    starts = [max(len(s) - len(r["response_ids"]), 0) for s, r in zip(seqs, records)]
    batches = length_batches([len(s) for s in seqs], 8, 0, 0)
    result: list[dict | None] = [None] * len(records)
    for n, b in enumerate(batches):
        part = out / f"part-{n:05d}.pt"
        if part.exists():
            items = torch.load(part, weights_only=True)
        else:
            width = max(len(seqs[i]) for i in b)
            ids = torch.zeros((len(b), width), dtype=torch.int64)
            mask = torch.zeros((len(b), width), dtype=torch.int64)
            for j, i in enumerate(b):
                ids[j, : len(seqs[i])] = torch.tensor(seqs[i])
                mask[j, : len(seqs[i])] = 1
            o = target.model(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                             output_hidden_states=True)
            logp = torch.log_softmax(o.logits.float(), -1)
            top_logp, top_ids = logp.topk(top_k, dim=-1)
            hidden = o.hidden_states[-1]
            items = []
            for j, i in enumerate(b):
                n_i, h0 = len(seqs[i]), max(starts[i] - 2, 0)
                items.append({
                    "top_ids": top_ids[j, : n_i - 1].to(torch.int32).cpu(),
                    "top_logp": top_logp[j, : n_i - 1].to(torch.float16).cpu(),
                    "hidden": hidden[j, h0:n_i].cpu().clone(),
                })
            tmp = part.with_suffix(".tmp")
            torch.save(items, tmp)
            os.replace(tmp, part)
        for j, i in enumerate(b):
            result[i] = {"ids": seqs[i], "start": starts[i], "h0": max(starts[i] - 2, 0), **items[j]}
        if progress:
            progress(n + 1, len(batches))
    return result  # type: ignore[return-value]
