"""``specframe train draft``: distil a small draft (a few of the target's own layers, sharing its embeddings and
tokenizer) from the target's own greedy answers.

Loss: cross-entropy of the draft's next-token logits over the frequent-token subset against the target's greedy
choice, on response positions only (the corpus responses *are* the target's argmax, so this is sequence-level
knowledge distillation, Kim & Rush 2016). Seeded, resumable from ``ckpt.pt``; writes the draft folder
(:mod:`specframe.learned.small_draft`), ``train-log.jsonl`` and ``loss.png``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..learned.small_draft import build_from_target
from .common import (
    TrainingRun,
    cosine_lr,
    length_batches,
    padded_batch,
    plot_loss,
    resumed_batches,
    subset_index,
    token_subset,
)
from .options import cli


@dataclass(frozen=True)
class DraftSettings:
    """The ``specframe train draft`` recipe; fields with ``cli`` metadata are its options (same defaults)."""

    layers: list[int] = field(default_factory=lambda: [0, 1], metadata=cli(
        "--layers", "Target layers the draft starts from (comma-separated).", ints=True))
    vocab_subset: int = field(default=8192, metadata=cli("--vocab-subset", "Output head size: most frequent tokens "
                                                         "kept.", low=16))
    epochs: int = field(default=6, metadata=cli("--epochs", "Passes over the corpus.", low=1))
    batch_size: int = 8
    max_len: int = 512
    lr: float = field(default=1e-3, metadata=cli("--lr", "Peak learning rate (AdamW, cosine).", positive=True))
    warmup: int = 30
    seed: int = 0  # the command's --seed (shared with the corpus)
    # True: the target's top-K distribution at every position (needs the teacher pass); False: greedy answers only
    soft_labels: bool = field(default=True, metadata=cli(
        "--hard-labels", "Train on the greedy answers only (no teacher pass; weaker, faster).", negate=True))
    max_records: int = field(default=0, metadata=cli("--max-records", "Train on the first N corpus records only "
                                                     "(0 = all).", low=0, omit=(0,)))


def training_sequences(records: list[dict], max_len: int) -> list[tuple[list[int], int]]:
    """``(ids, first response index)`` per record, cut from the left to ``max_len`` tokens."""
    out = []
    for r in records:
        ids = r["prompt_ids"] + r["response_ids"]
        start = len(r["prompt_ids"])
        cut = max(0, len(ids) - max_len)
        if len(r["response_ids"]) >= 2:
            out.append((ids[cut:], max(1, start - cut)))
    return out


def _training_examples(records: list[dict], s: DraftSettings,
                       teacher: list[dict] | None) -> tuple[list[tuple[list[int], int]], dict[int, dict]]:
    """The examples to train on, and with ``s.soft_labels`` each example's teacher record (keyed by ``id`` of the
    example: the teacher's own sequences, prompt included).

    Raises:
        ConfigError: soft labels without the teacher pass, or no usable example.
    """
    soft: dict[int, dict] = {}
    if s.soft_labels:
        if teacher is None:
            raise ConfigError("soft labels need the teacher pass (specframe.training.teacher.teacher_pass)")
        examples = [(t["ids"], t["start"]) for t in teacher]
        soft = {id(e): t for e, t in zip(examples, teacher)}
    else:
        examples = training_sequences(records, s.max_len)
    if not examples:
        raise ConfigError("the corpus has no usable responses (none with 2 or more tokens): build a larger corpus")
    return examples, soft


def train_draft(
    target: Any, records: list[dict], out: Path, s: DraftSettings, progress: Callable[[int, int, float], None] | None = None,
    teacher: list[dict] | None = None, deadline: float | None = None,
) -> dict:
    """Train and save a draft into ``out``; resumes from ``out/ckpt.pt`` when present.

    Args:
        target: a loaded :class:`specframe.target.hf.Target` (any dtype; the draft trains in float32).
        records: corpus records (:func:`specframe.training.corpus.read_corpus`).
        out: output folder (the draft folder itself).
        s: settings; a checkpoint made with other settings is refused (ConfigError).
        progress: optional ``(step, total_steps, loss)`` callback.
        teacher: :func:`specframe.training.teacher.teacher_pass` output for ``records`` (required when
            ``s.soft_labels``): the loss is then the cross-entropy against the target's top-K distribution
            (renormalised over the subset) at every position, prompt included.

    Returns:
        Summary: steps, final loss / accuracy (mean of the last 20 steps), subset coverage, train seconds,
        parameter counts.
    """
    torch.manual_seed(s.seed)
    out.mkdir(parents=True, exist_ok=True)
    token_map, coverage = token_subset(records, s.vocab_subset, target.eos_token_ids)
    draft = build_from_target(target.model, list(s.layers), token_map)
    draft.train()
    sub_index = subset_index(token_map, target.vocab_size)
    examples, soft = _training_examples(records, s, teacher)
    lengths = [len(e[0]) for e in examples]
    per_epoch = len(length_batches(lengths, s.batch_size, s.seed, 0))
    total = per_epoch * s.epochs
    params = [p for p in draft.lm.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=s.lr, weight_decay=0.0, betas=(0.9, 0.98))
    run = TrainingRun(out, {"draft": asdict(s), "records": len(records)}, draft.lm, opt, total, strict=False,
                      progress=progress, deadline=deadline)
    batches = resumed_batches(lambda epoch: length_batches(lengths, s.batch_size, s.seed, epoch), per_epoch,
                              s.epochs, run.step)
    for b in batches:
        rows = [examples[i] for i in b]
        ids, valid, labels = padded_batch(rows, sub_index, shift=1)
        dev = target.device  # the draft is built from the target's layers, on its device
        ids, labels, mask = ids.to(dev), labels.to(dev), valid.to(dev, torch.int64)
        if not bool((labels != -100).any()):  # every label outside the subset: nothing to learn here
            run.skip()
            continue
        teach = [soft[id(r)] for r in rows] if s.soft_labels else None
        loss, acc = _loss(draft(ids, attention_mask=mask), labels, teach, sub_index.to(dev))
        run.update(loss, cosine_lr(run.step, total, s.lr, s.warmup), clip=1.0)
        run.done(float(loss.detach()), acc)
    final_loss, final_acc = run.close()
    draft.eval()
    return {
        "steps": run.step,
        "final_loss": final_loss,
        "final_acc": final_acc,
        "subset_coverage": coverage,
        "train_s": run.elapsed_s,
        "pieces": run.pieces,
        "trainable_params": sum(p.numel() for p in params),
        "draft": draft,
    }


def _loss(logits: torch.Tensor, labels: torch.Tensor, teach: list[dict] | None,
          sub_index: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The batch's loss (cross-entropy against the hard ``labels``, or with ``teach`` against the target's top-K
    distributions, :func:`_soft_loss`) and the draft's top-1 accuracy against the target's greedy choice."""
    if teach is not None:
        loss, labels = _soft_loss(logits, teach, sub_index)
    else:
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100)
    with torch.no_grad():
        valid = labels != -100
        acc = float((logits.argmax(-1)[valid] == labels[valid]).float().mean())
    return loss, acc


def _soft_loss(logits: torch.Tensor, teach: list[dict], sub_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of the draft ``[B, W, S]`` against the target's top-k distributions renormalised over the
    subset, averaged over positions; also returns the target's top-1 as hard labels ``[B, W]`` (for accuracy)."""
    b, w, _ = logits.shape
    dev = logits.device
    k = teach[0]["top_ids"].shape[1]
    idx = torch.full((b, w, k), -100, dtype=torch.int64, device=dev)
    prob = torch.zeros((b, w, k), dtype=torch.float32, device=dev)
    for j, t in enumerate(teach):
        n = t["top_ids"].shape[0]
        idx[j, :n] = sub_index[t["top_ids"].long().to(dev)]
        prob[j, :n] = t["top_logp"].to(dev).float().exp()
    inside = idx != -100
    prob = prob * inside
    total = prob.sum(-1, keepdim=True)
    valid = total[..., 0] > 0
    prob = prob / total.clamp(min=1e-9)
    logq = torch.log_softmax(logits.float(), -1).gather(-1, idx.clamp(min=0))
    loss = -(prob * logq).sum(-1)[valid].mean()
    hard = torch.where(inside[..., 0], idx[..., 0], torch.full_like(idx[..., 0], -100))
    return loss, hard


def finish_draft(draft: Any, out: Path, target_name: str, target_vocab_size: int) -> None:
    """Save the trained draft folder and its loss plot."""
    draft.save(out, target_name, target_vocab_size)
    plot_loss(out, "draft distillation")
