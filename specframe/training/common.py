"""What both recipes share: the frequent-token subset, batching, a cosine schedule, resumable checkpoints and the
loss log (``train-log.jsonl``, one ``{"step", "loss", "acc"}`` record per step; plotted into ``loss.png``)."""

from __future__ import annotations

import json
import math
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

import torch
from torch import Tensor

from ..errors import ConfigError


def token_subset(records: Iterable[dict], size: int, always: Iterable[int]) -> tuple[Tensor, float]:
    """``size`` token ids, ascending: ``always`` first, then the most frequent response tokens (ties: lower id).

    Returns:
        ``(token_map [S] int64, coverage)`` — coverage is the share of response tokens inside the subset.
    """
    counts: Counter[int] = Counter()
    for r in records:
        counts.update(r["response_ids"])
    keep = set(always)
    for tok, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(keep) >= size:
            break
        keep.add(tok)
    total = sum(counts.values()) or 1
    coverage = sum(c for t, c in counts.items() if t in keep) / total
    return torch.tensor(sorted(keep), dtype=torch.int64), coverage


def length_batches(lengths: list[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (little padding), batch order shuffled per epoch."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    random.Random(seed * 1000 + epoch).shuffle(batches)
    return batches


def cosine_lr(step: int, total: int, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


class Checkpoint:
    """``ckpt.pt`` in the output folder: model + optimizer state, step, and the settings it was made with."""

    def __init__(self, out: Path, settings: dict) -> None:
        self.path = out / "ckpt.pt"
        self.settings = settings

    def load(self) -> dict | None:
        """The saved state, or None. Raises ConfigError when it was made with other settings."""
        if not self.path.exists():
            return None
        state = torch.load(self.path, weights_only=False)
        if state.get("settings") != self.settings:
            raise ConfigError(
                f"{self.path} was made with other settings ({state.get('settings')}): "
                "use another --output folder or delete it to start over"
            )
        return state

    def save(self, **state: Any) -> None:
        tmp = self.path.with_suffix(".tmp")
        torch.save({"settings": self.settings, **state}, tmp)
        os.replace(tmp, self.path)


class LossLog:
    def __init__(self, out: Path, resume_step: int) -> None:
        self.path = out / "train-log.jsonl"
        rows = []
        if resume_step and self.path.exists():
            rows = [json.loads(x) for x in self.path.read_text().splitlines() if x.strip()]
            rows = [r for r in rows if r["step"] < resume_step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        self._f = self.path.open("a")

    def add(self, step: int, loss: float, acc: float) -> None:
        self._f.write(json.dumps({"step": step, "loss": round(loss, 5), "acc": round(acc, 5)}) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def final_means(out: Path, last: int = 20) -> tuple[float, float]:
    """Mean loss and accuracy of the last ``last`` steps in ``train-log.jsonl`` (also after a resumed run)."""
    rows = [json.loads(x) for x in (out / "train-log.jsonl").read_text().splitlines() if x.strip()][-last:]
    if not rows:
        return float("nan"), float("nan")
    return sum(r["loss"] for r in rows) / len(rows), sum(r["acc"] for r in rows) / len(rows)


def plot_loss(out: Path, title: str) -> Path:
    """``loss.png`` from ``train-log.jsonl`` (loss and top-1 accuracy, smoothed over 20 steps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(x) for x in (out / "train-log.jsonl").read_text().splitlines() if x.strip()]
    steps = [r["step"] for r in rows]

    def smooth(xs: list[float], w: int = 20) -> list[float]:
        return [sum(xs[max(0, i - w + 1) : i + 1]) / len(xs[max(0, i - w + 1) : i + 1]) for i in range(len(xs))]

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(steps, smooth([r["loss"] for r in rows]), label="loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax2 = ax.twinx()
    ax2.plot(steps, smooth([r["acc"] for r in rows]), color="tab:orange", label="top-1 acc")
    ax2.set_ylabel("top-1 accuracy")
    ax.set_title(title)
    fig.tight_layout()
    path = out / "loss.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
