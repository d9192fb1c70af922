"""``specframe train medusa``: Medusa-1 heads (:mod:`specframe.learned.medusa_heads`) on the target's own greedy
answers (self-distillation, as Medusa's recipe for models without their SFT data).

1. One target forward per corpus record gives the last hidden state at every position (``collect``).
2. Head ``i`` at position ``t`` learns the token at ``t + 2 + i`` with cross-entropy over the frequent-token
   subset of the LM head (training only: inference uses the full LM head), loss weight ``0.8 ** i``
   (Medusa paper §2.1.1). The target stays frozen.
The hidden states are kept on the CPU; the heads train on the target's device (a GPU where there is one). Seeded, resumable from ``ckpt.pt``; writes ``medusa.safetensors`` + ``medusa.json``, ``train-log.jsonl``,
``loss.png``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError
from ..learned.medusa_heads import MedusaHeads
from .common import TrainingRun, cosine_lr, length_batches, plot_loss, resumed_batches, subset_index, token_subset
from .options import cli


@dataclass(frozen=True)
class MedusaSettings:
    """The ``specframe train medusa`` recipe; fields with ``cli`` metadata are its options (same defaults)."""

    num_heads: int = field(default=4, metadata=cli("--heads", "Number of Medusa heads.", low=1))
    num_layers: int = 1
    vocab_subset: int = 8192
    epochs: int = field(default=3, metadata=cli("--epochs", "Passes over the corpus positions.", low=1))
    batch_positions: int = field(default=256, metadata=cli("--batch-positions", "Corpus positions per step.", low=1))
    lr: float = field(default=1e-3, metadata=cli("--lr", "Peak learning rate (AdamW, cosine).", positive=True))
    warmup: int = 50
    seed: int = 0  # the command's --seed (shared with the corpus)
    max_len: int = 640
    max_records: int = field(default=0, metadata=cli("--max-records", "Train on the first N corpus records only "
                                                     "(0 = all).", low=0, omit=(0,)))


@torch.inference_mode()
def collect(target: Any, records: list[dict], num_heads: int, max_len: int,
            progress: Callable[[int, int], None] | None = None) -> tuple[Tensor, Tensor]:
    """Hidden states and head labels at every position whose head-0 label is a response token (M positions).

    Returns:
        ``(hidden [M, H] in the target's dtype, labels [M, num_heads] int64)``; label ``-1`` = past the end.
    """
    hs, ls = [], []
    lengths = [min(max_len, len(r["prompt_ids"]) + len(r["response_ids"])) for r in records]
    batches = length_batches(lengths, 8, 0, 0)
    for n, b in enumerate(batches):
        rows = []
        for i in b:
            r = records[i]
            ids = (r["prompt_ids"] + r["response_ids"])[-max_len:]
            start = len(ids) - len(r["response_ids"])  # first response index
            rows.append((ids, max(start, 0)))
        width = max(len(x[0]) for x in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.int64)
        mask = torch.zeros((len(rows), width), dtype=torch.int64)
        for j, (seq, _) in enumerate(rows):
            ids[j, : len(seq)] = torch.tensor(seq)
            mask[j, : len(seq)] = 1
        out = target.model(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                           output_hidden_states=True, logits_to_keep=1)
        hidden = out.hidden_states[-1].cpu()
        for j, (seq, start) in enumerate(rows):
            first = max(start - 2, 0)  # hidden at t -> head 0 predicts t + 2
            last = len(seq) - 3
            if last < first:
                continue
            t = torch.arange(first, last + 1)
            lab = torch.full((len(t), num_heads), -1, dtype=torch.int64)
            seq_t = torch.tensor(seq)
            for i in range(num_heads):
                pos = t + 2 + i
                ok = pos < len(seq)
                lab[ok, i] = seq_t[pos[ok]]
            hs.append(hidden[j, first : last + 1])
            ls.append(lab)
        if progress:
            progress(n + 1, len(batches))
    if not hs:
        raise ConfigError("the corpus has no usable responses (none with 2 or more tokens): build a larger corpus")
    return torch.cat(hs), torch.cat(ls)


def from_teacher(teacher: list[dict], num_heads: int) -> tuple[Tensor, Tensor]:
    """:func:`collect`'s output, from the hidden states the teacher pass already holds."""
    hs, ls = [], []
    for t in teacher:
        seq, h0 = t["ids"], t["h0"]
        last = len(seq) - 3
        if last < h0:
            continue
        pos = torch.arange(h0, last + 1)
        seq_t = torch.tensor(seq)
        lab = torch.full((len(pos), num_heads), -1, dtype=torch.int64)
        for i in range(num_heads):
            p = pos + 2 + i
            ok = p < len(seq)
            lab[ok, i] = seq_t[p[ok]]
        hs.append(t["hidden"][: len(pos)])
        ls.append(lab)
    if not hs:
        raise ConfigError("the corpus has no usable responses (none with 2 or more tokens): build a larger corpus")
    return torch.cat(hs), torch.cat(ls)


def _hidden_and_labels(target: Any, records: list[dict], s: MedusaSettings,
                       progress: Callable[[str, int, int, float], None] | None,
                       teacher: list[dict] | None) -> tuple[Tensor, Tensor]:
    """The training positions: ``(hidden [M, H], labels [M, num_heads] int64, -1 = past the end)``, from the
    teacher pass's hidden states (:func:`from_teacher`) when given, else from a target forward per batch of records
    (:func:`collect`, reported to ``progress`` as phase ``"hidden"``).

    Raises:
        ConfigError: no record has a usable response."""
    if teacher is not None:
        return from_teacher(teacher, s.num_heads)
    return collect(target, records, s.num_heads, s.max_len,
                   (lambda d, n: progress("hidden", d, n, 0.0)) if progress else None)


def _position_batches(m: int, size: int, seed: int, epoch: int) -> tuple[Tensor, ...]:
    """The batches of an epoch: ``size`` of the ``m`` positions each, in a permutation seeded per epoch."""
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    return torch.randperm(m, generator=g).split(size)


def _head_losses(logits: Tensor, lab: Tensor) -> Tensor:
    """``[L]``: each head's cross-entropy over the subset (``logits [B, L, S]``, ``lab [B, L]``, -100 = no label);
    a head with no label in the batch gets a zero that keeps the graph."""
    return torch.stack([
        F.cross_entropy(logits[:, i], lab[:, i], ignore_index=-100) if bool((lab[:, i] != -100).any())
        else logits.sum() * 0.0
        for i in range(lab.shape[1])
    ])


def train_medusa(
    target: Any, records: list[dict], out: Path, s: MedusaSettings,
    progress: Callable[[str, int, int, float], None] | None = None, teacher: list[dict] | None = None,
    deadline: float | None = None,
) -> dict:
    """Train heads and save them into ``out``; resumes from ``out/ckpt.pt`` when present.

    Args:
        target: a loaded :class:`specframe.target.hf.Target` (its dtype is the one the hidden states are taken in).
        records: corpus records.
        out: output folder.
        s: settings; a checkpoint made with other settings is refused (ConfigError).
        progress: optional ``(phase, done, total, loss)`` callback; phase is ``"hidden"`` or ``"train"``.
        teacher: :func:`specframe.training.teacher.teacher_pass` output (its hidden states are reused).
        deadline: a ``time.monotonic()`` after which the run checkpoints and stops (``PieceDone``).

    Returns:
        Summary: steps, positions, final loss / head-0 accuracy (mean of the last 20 steps), coverage, seconds.
    """
    torch.manual_seed(s.seed)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    hidden, labels = _hidden_and_labels(target, records, s, progress, teacher)
    t_hidden = time.perf_counter() - t0
    token_map, coverage = token_subset(records, s.vocab_subset, target.eos_token_ids)
    sub_index = subset_index(token_map, target.vocab_size)
    sub_labels = torch.where(labels >= 0, sub_index[labels.clamp(min=0)], torch.full_like(labels, -100))
    dev = target.device
    w_sub = target.model.get_output_embeddings().weight.detach()[token_map.to(dev)].float()  # [S, H]
    heads = MedusaHeads(hidden.shape[1], s.num_heads, s.num_layers, token_map).float().to(dev).train()
    opt = torch.optim.AdamW(heads.parameters(), lr=s.lr, weight_decay=0.0)
    m = hidden.shape[0]
    per_epoch = (m + s.batch_positions - 1) // s.batch_positions
    total = per_epoch * s.epochs
    run = TrainingRun(out, {"medusa": asdict(s), "records": len(records), "positions": m}, heads, opt, total,
                      save_every=200, rng=False,
                      progress=(lambda d, n, loss: progress("train", d, n, loss)) if progress else None,
                      deadline=deadline)
    weights = torch.tensor([0.8**i for i in range(s.num_heads)], device=dev)
    batches = resumed_batches(lambda epoch: _position_batches(m, s.batch_positions, s.seed, epoch), per_epoch,
                              s.epochs, run.step)
    for idx in batches:
        h, lab = hidden[idx].to(dev).float(), sub_labels[idx].to(dev)
        logits = heads(h) @ w_sub.T  # [b, D, S]
        losses = _head_losses(logits, lab)
        run.update((losses * weights).sum(), cosine_lr(run.step, total, s.lr, s.warmup))
        with torch.no_grad():
            valid = lab[:, 0] != -100
            acc = float((logits[:, 0].argmax(-1)[valid] == lab[valid, 0]).float().mean()) if valid.any() else 0.0
        run.done(float(losses[0].detach()), acc)
    final_loss, final_acc = run.close()
    heads.eval()
    return {
        "steps": run.step, "positions": m, "final_loss_head0": final_loss,
        "final_acc_head0": final_acc, "subset_coverage": coverage,
        "hidden_s": t_hidden, "train_s": run.elapsed_s, "pieces": run.pieces, "heads": heads,
    }


def finish_medusa(heads: MedusaHeads, out: Path, target_name: str) -> None:
    heads.save(out, target_name)
    plot_loss(out, "Medusa head 0")
