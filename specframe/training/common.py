"""What the trainers (draft, EAGLE, Medusa) share: the frequent-token subset, batching (resumable), a cosine
schedule, resumable checkpoints, the loss log (``train-log.jsonl``, one ``{"step", "loss", "acc"}`` record per step;
plotted into ``loss.png``; both in the output folder, or for a shipped weights folder in the repository's
``lab/data/<target>/training/<proposer>/``: :func:`~specframe.training.data.log_folder`) and :class:`TrainingRun`, the
bookkeeping of one training loop."""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import torch
from torch import Tensor

from ..errors import ConfigError
from ..io.jsonl import jsonl_lines
from .data import log_folder

T = TypeVar("T")


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


def subset_index(token_map: Tensor, vocab_size: int) -> Tensor:
    """``[vocab_size]`` int64: each token's index in the subset ``token_map``, -100 (ignored by the loss) outside."""
    sub_index = torch.full((vocab_size,), -100, dtype=torch.int64)
    sub_index[token_map] = torch.arange(token_map.numel())
    return sub_index


def padded_batch(rows: list[tuple[list[int], int]], sub_index: Tensor, shift: int) -> tuple[Tensor, Tensor, Tensor]:
    """A training batch of token rows ``(ids, response start)``: ``ids [B, W]`` int64 (right-padded with 0),
    ``valid [B, W]`` bool and ``labels [B, W]`` int64: at position ``t`` the subset index (``sub_index``) of token
    ``t + shift`` where that token is a response token inside the subset, else -100 (``shift`` 1: a draft LM's next
    token; 2: EAGLE's token after the next)."""
    width = max(len(r[0]) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.int64)
    valid = torch.zeros((len(rows), width), dtype=torch.bool)
    labels = torch.full((len(rows), width), -100, dtype=torch.int64)
    for j, (seq, start) in enumerate(rows):
        t = torch.tensor(seq)
        ids[j, : len(seq)] = t
        valid[j, : len(seq)] = True
        first = max(start - shift, 0)  # label position of the first response token
        labels[j, first : len(seq) - shift] = sub_index[t[first + shift :]]
    return ids, valid, labels


def length_batches(lengths: list[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (little padding), batch order shuffled per epoch."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    random.Random(seed * 1000 + epoch).shuffle(batches)
    return batches


def resumed_batches(batches_of: Callable[[int], Sequence[T]], per_epoch: int, epochs: int, step: int) -> Iterator[T]:
    """The batches ``batches_of(epoch)`` (``per_epoch`` of them) epoch after epoch, from the run's ``step``-th batch
    on: a resumed run skips the batches it has done. Each batch yielded must count as one step."""
    for epoch in range(step // per_epoch, epochs):
        yield from batches_of(epoch)[max(0, step - epoch * per_epoch) :]


def cosine_lr(step: int, total: int, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


class PieceDone(Exception):
    """A training run reached its time limit (``--max-minutes``) and checkpointed: running the same command again
    resumes it. ``step`` / ``total``: the steps done and planned."""

    def __init__(self, step: int, total: int) -> None:
        super().__init__(f"stopped at the time limit after step {step} of {total}")
        self.step, self.total = step, total


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix or "settings": d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def refuse_changed(path: Path, saved: Any, now: dict, only: tuple[str, ...] | None = None) -> None:
    """Refuse to resume from the checkpoint ``path`` when the settings it was made with (``saved``) differ from
    ``now`` (only the top-level keys ``only``, when given), naming each changed setting.

    Raises:
        ConfigError: "... was made with other settings: lr 0.001 (now 0.002), ...".
    """
    if only is not None:
        saved = {k: v for k, v in (saved or {}).items() if k in only} if isinstance(saved, dict) else saved
        now = {k: v for k, v in now.items() if k in only}
    if saved == now:
        return
    old, new = _flat(saved), _flat(now)
    changed = [f"{k.split('.', 1)[-1]} {old.get(k, 'unset')!r} (now {new.get(k, 'unset')!r})"
               for k in sorted(set(old) | set(new)) if old.get(k, "unset") != new.get(k, "unset")]
    raise ConfigError(f"{path} was made with other settings: {', '.join(changed) or 'unreadable'}: run the same "
                      "command as before to resume it, or use another --output folder (or delete it) to start over")


def check_resume(out: Path, key: str, settings: dict, records: int | None = None) -> None:
    """Before any costly stage: refuse early when ``out/ckpt.pt`` was made with other recipe settings (``key``:
    the recipe's entry in the checkpoint's settings) or, given ``records``, another number of training records
    (see :func:`refuse_changed`)."""
    path = out / "ckpt.pt"
    if not path.exists():
        return
    state = torch.load(path, weights_only=False, map_location="cpu")
    now = {key: settings} if records is None else {key: settings, "records": records}
    refuse_changed(path, state.get("settings"), now, only=tuple(now))


class Checkpoint:
    """``ckpt.pt`` in the output folder: model + optimizer state, step, and the settings it was made with."""

    def __init__(self, out: Path, settings: dict) -> None:
        self.path = out / "ckpt.pt"
        self.settings = settings

    def load(self) -> dict | None:
        """The saved state, or None. Raises ConfigError when it was made with other settings."""
        if not self.path.exists():
            return None
        state = torch.load(self.path, weights_only=False, map_location="cpu")  # (made on another device, perhaps)
        refuse_changed(self.path, state.get("settings"), self.settings)
        return state

    def save(self, **state: Any) -> None:
        tmp = self.path.with_suffix(".tmp")
        torch.save({"settings": self.settings, **state}, tmp)
        os.replace(tmp, self.path)


class TrainingRun:
    """The bookkeeping of one training loop: resume ``model`` and ``opt`` from ``out/ckpt.pt`` (made with
    ``settings``; with ``rng``, the torch RNG state too), optimizer steps, the loss log, ``progress(step, total,
    loss)`` calls, and a checkpoint every ``save_every`` steps and at the last one. ``step`` counts the batches
    done, skipped ones included. With ``deadline`` (a ``time.monotonic()`` value), the first step done after it
    checkpoints and raises :class:`PieceDone`: long training runs in pieces that each fit a session.

    Raises:
        ConfigError: the checkpoint was made with other settings.
    """

    def __init__(self, out: Path, settings: dict, model: torch.nn.Module, opt: torch.optim.Optimizer, total: int, *,
                 save_every: int = 50, rng: bool = True, strict: bool = True,
                 progress: Callable[[int, int, float], None] | None = None, deadline: float | None = None) -> None:
        self.out, self.model, self.opt, self.total, self.deadline = out, model, opt, total, deadline
        self.save_every, self.rng, self.progress = save_every, rng, progress
        self.ckpt = Checkpoint(out, settings)
        self.before_s, self.pieces = 0.0, 1  # training seconds and pieces of the runs this one resumes
        self.t0 = time.monotonic()
        self.step = self._resume(strict)
        self.log = LossLog(out, self.step)

    def _resume(self, strict: bool) -> int:
        state = self.ckpt.load()
        if state is None:
            return 0
        self.model.load_state_dict(state["model"], strict=strict)
        self.opt.load_state_dict(state["opt"])
        if self.rng:
            torch.set_rng_state(state["rng"])
        self.before_s, self.pieces = float(state.get("elapsed_s", 0.0)), int(state.get("pieces", 0)) + 1
        return state["step"]

    @property
    def elapsed_s(self) -> float:
        """Training seconds over every piece of this run (resumed ones included)."""
        return self.before_s + time.monotonic() - self.t0

    def update(self, loss: Tensor, lr: float, clip: float | None = None) -> None:
        """One optimizer step on ``loss`` at learning rate ``lr``, the gradient norm clipped to ``clip`` if given."""
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_([p for g in self.opt.param_groups for p in g["params"]], clip)
        self.opt.step()

    def done(self, loss: float, acc: float, **figures: Any) -> None:
        """Log the step just trained (``figures``: more JSON-able entries for its log line), report progress, and
        checkpoint when it is due."""
        self.log.add(self.step, loss, acc, figures)
        self.step += 1
        if self.progress:
            self.progress(self.step, self.total, loss)
        over = self.deadline is not None and time.monotonic() > self.deadline and self.step < self.total
        if self.step % self.save_every == 0 or self.step == self.total or over:
            state: dict[str, Any] = {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                                     "elapsed_s": self.elapsed_s, "pieces": self.pieces}
            if self.rng:
                state["rng"] = torch.get_rng_state()
            self.ckpt.save(**state)
        if over:
            self.log.close()
            raise PieceDone(self.step, self.total)

    def skip(self) -> None:
        """A batch with nothing to learn: it counts as a step, with no update, log line or checkpoint."""
        self.step += 1

    def close(self) -> tuple[float, float]:
        """Close the loss log; the mean loss and accuracy of the last 20 steps (:func:`final_means`)."""
        self.log.close()
        return final_means(self.out)


class LossLog:
    def __init__(self, out: Path, resume_step: int) -> None:
        self.path = log_folder(out) / "train-log.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rows = []
        if resume_step and self.path.exists():
            rows = [json.loads(x) for _, x in jsonl_lines(self.path.read_text(encoding="utf-8"))]
            rows = [r for r in rows if r["step"] < resume_step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        self._f = self.path.open("a")

    def add(self, step: int, loss: float, acc: float, figures: dict | None = None) -> None:
        row = {"step": step, "loss": round(loss, 5), "acc": round(acc, 5), **(figures or {})}
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def final_rows(out: Path, last: int = 20) -> list[dict]:
    """The last ``last`` lines of ``train-log.jsonl`` (also after a resumed run), as dicts."""
    log = log_folder(out) / "train-log.jsonl"
    return [json.loads(x) for _, x in jsonl_lines(log.read_text(encoding="utf-8"))][-last:]


def final_means(out: Path, last: int = 20) -> tuple[float, float]:
    """Mean loss and accuracy of the last ``last`` steps in ``train-log.jsonl`` (also after a resumed run)."""
    rows = final_rows(out, last)
    if not rows:
        return float("nan"), float("nan")
    return sum(r["loss"] for r in rows) / len(rows), sum(r["acc"] for r in rows) / len(rows)


def plot_loss(out: Path, title: str) -> Path:
    """``loss.png`` from ``train-log.jsonl`` (loss and top-1 accuracy, smoothed over 20 steps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(x) for _, x in jsonl_lines((log_folder(out) / "train-log.jsonl").read_text(encoding="utf-8"))]
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
    path = log_folder(out) / "loss.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
