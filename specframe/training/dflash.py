"""``specframe train dflash``: train a DFlash block drafter (:mod:`specframe.learned.dflash`; arXiv 2602.06036) on
the target's own hidden states and greedy answers, saved in z-lab's layout for the ``dflash`` proposer.

Per batch the frozen target runs once over the corpus sequences (no cache) and gives the hidden states of the
drafter's ``target_layer_ids``, fused by the drafter into one context row per position. In each sequence
``anchors`` positions ``a`` of the answer are drawn at random (seeded per step, so a resumed run draws the same);
each starts a block ``[token a, mask, ..., mask]`` of ``block_size`` rows that sees the context rows of positions
``< a`` and its own rows, exactly what the proposer's forward sees when token ``a`` is the newest committed one
(:meth:`~specframe.learned.dflash.DFlashDrafter.forward_blocks`: all the blocks in one forward). Row ``k`` is
scored by the target's own LM head against token ``a + k`` of the target's greedy answer (the corpus responses
*are* its argmax: self-distillation), cross-entropy weighted ``exp(-(k - 1) / gamma)`` (the paper's decay: the
early rows decide how much of a block is accepted). The target's embeddings and LM head are shared and frozen
(never trained, never saved with the drafter); the draft layers, ``fc`` and the norms train.

The draft layers start as copies of the target's last ``draft_layers`` decoder layers when the shapes match
(Llama-like targets; the Qwen3 q/k norms start at 1), else random (seeded); ``fc`` starts random. Weights train in
float32; forwards run under bfloat16 autocast where the target is on CUDA or the CPU multiplies bfloat16 natively
(:func:`~specframe.training.eagle.native_bf16`). Seeded, resumable from ``ckpt.pt`` (every 50 steps and when a
``--max-minutes`` piece ends); writes ``config.json`` + ``model.safetensors`` (z-lab's layout, float32),
``train-log.jsonl`` (loss, first-row accuracy) and ``loss.png``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError
from ..learned.dflash import DFLASH, DFlashDrafter, dflash_config, read_spec, save_dflash
from .common import (
    PieceDone,  # noqa: F401 - raised by TrainingRun, documented here
    TrainingRun,
    cosine_lr,
    final_rows,
    length_batches,
    padded_batch,
    plot_loss,
    resumed_batches,
)
from .draft import training_sequences
from .eagle import native_bf16_on, target_features
from .options import cli

PAPER_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}  # the paper's loss decay per block size


@dataclass(frozen=True)
class DFlashSettings:
    """The ``specframe train dflash`` recipe; fields with ``cli`` metadata are its options (same defaults)."""

    draft_layers: int = field(default=2, metadata=cli("--draft-layers", "Decoder layers of the drafter.", low=1))
    # None: spread from layer 1 to L - 3 as z-lab's drafters (specframe.learned.dflash.default_target_layers)
    target_layers: Optional[tuple[int, ...]] = field(default=None, metadata=cli(
        "--target-layers", "Target decoder layers (0-based) whose outputs the drafter reads (comma-separated; "
        "default: one per draft layer, spread from layer 1 to L-3, as z-lab's drafters).", ints=True))
    block_size: int = field(default=8, metadata=cli("--block-size", "Rows of a block: the newest token and "
                                                    "block_size - 1 drafts.", low=2))
    anchors: int = field(default=16, metadata=cli("--anchors", "Blocks per training sequence, at random positions of "
                                                  "its answer.", low=1))
    gamma: float = field(default=0.0, metadata=cli(
        "--gamma", "Loss decay over block rows: row k weighs exp(-(k-1)/gamma); 0 = the paper's (7 for blocks of 16, "
        "5 for 10, 4 for 8; (block_size-1)/2 for others).", low=0, omit=(0.0,)))
    epochs: int = field(default=1, metadata=cli("--epochs", "Passes over the corpus.", low=1))
    batch_size: int = field(default=8, metadata=cli("--batch-size", "Sequences per step.", low=1))
    max_len: int = field(default=384, metadata=cli("--max-len", "Longest training sequence (cut from the left).", low=8))
    lr: float = field(default=6e-4, metadata=cli("--lr", "Peak learning rate (AdamW, cosine).", positive=True))
    warmup: int = 50  # steps at most; at most 4 % of the run (a short run is not all warm-up)
    # -1: the lowest token id that no training record holds (an unused special token for SmolLM2)
    mask_token: int = field(default=-1, metadata=cli("--mask-token", "Token id filling the block's draft rows (-1 = "
                                                     "the lowest id no training record uses).", low=-1, omit=(-1,)))
    init_from_target: bool = True
    autocast: bool = True
    max_records: int = field(default=0, metadata=cli("--max-records", "Train on the first N corpus records only "
                                                     "(0 = all).", low=0, omit=(0,)))
    skip_records: int = field(default=0, metadata=cli("--skip-records", "Leave out the first N of the corpus records "
                                                      "(after --max-records).", low=0, omit=(0,)))
    seed: int = 0  # the command's --seed (shared with the corpus)


def loss_weights(s: DFlashSettings) -> Tensor:
    """``[block_size - 1]`` float32: row ``k``'s loss weight ``exp(-(k - 1) / gamma)``, ``k = 1 .. block_size - 1``."""
    gamma = s.gamma or PAPER_GAMMA.get(s.block_size, (s.block_size - 1) / 2)
    return torch.exp(-torch.arange(s.block_size - 1, dtype=torch.float32) / gamma)


def mask_token_for(records: list[dict], mask_token: int, vocab: int) -> int:
    """``mask_token`` (a ``--mask-token``), or for -1 the lowest token id that no record's prompt or answer holds
    (else the last id).

    Raises:
        ConfigError: ``mask_token`` is not a token id of the target."""
    if mask_token >= 0:
        if mask_token >= vocab:
            raise ConfigError(f"--mask-token {mask_token} is not a token id of the target (0..{vocab - 1})")
        return mask_token
    used = {t for r in records for t in (*r["prompt_ids"], *r["response_ids"])}
    return next((t for t in range(vocab) if t not in used), vocab - 1)


def new_drafter(target: Any, s: DFlashSettings, mask_token_id: int) -> tuple[DFlashDrafter, bool]:
    """A new float32 drafter for ``target`` (seeded), its layers copied from the target's last ``s.draft_layers``
    decoder layers when ``s.init_from_target`` and the shapes match: ``(drafter, whether they were copied)``.

    Raises:
        ConfigError: ``s.target_layers`` names a layer the target does not have."""
    cfg = target.model.config.get_text_config()
    n_target = int(cfg.num_hidden_layers)
    if s.target_layers is not None and not all(0 <= i < n_target for i in s.target_layers):
        raise ConfigError(f"--target-layers {','.join(map(str, s.target_layers))}: the target has layers "
                          f"0..{n_target - 1}")
    config = dflash_config(cfg, DFLASH, s.draft_layers, s.target_layers, s.block_size, mask_token_id)
    spec = read_spec(Path("<new>"), config)
    bad = [i for i in spec.target_layer_ids if not 0 <= i < n_target]
    if bad:
        raise ConfigError(f"the default target layers {list(spec.target_layer_ids)} do not fit a target of {n_target} "
                          "layers: give --target-layers")
    torch.manual_seed(s.seed)
    drafter = DFlashDrafter(spec).float()
    copied = s.init_from_target and _copy_target_layers(drafter, target.model)
    return drafter, copied


def _copy_target_layers(drafter: DFlashDrafter, model: Any) -> bool:
    """Load the target's last ``len(drafter.layers)`` decoder layers into the draft layers where every weight they
    share has the same shape (Llama / Qwen layouts); returns whether it did."""
    from ..target.layer_skip import decoder_layers

    try:
        source = list(decoder_layers(model))[-len(drafter.layers):]
    except ConfigError:
        return False
    pairs = []
    for own, src in zip(drafter.layers, source):
        mine, theirs = own.state_dict(), src.state_dict()
        common = {k: v for k, v in theirs.items() if k in mine}
        if len(common) < 9 or any(v.shape != mine[k].shape for k, v in common.items()):
            return False  # not a Llama-like layer (q/k/v/o, gate/up/down and the two norms)
        pairs.append((own, common))
    with torch.no_grad():
        for own, common in pairs:
            own.load_state_dict({k: v.float() for k, v in common.items()}, strict=False)
    return True


def draw_blocks(rows: list[tuple[list[int], int]], anchors: int, seed: int, step: int) -> tuple[Tensor, Tensor]:
    """The blocks of one batch: for each row ``(ids, first answer index)``, up to ``anchors`` distinct positions
    ``a`` in ``first - 1 .. len(ids) - 2`` (token ``a`` is committed, ``a + 1`` is an answer token), drawn by a
    generator seeded from ``(seed, step)``. Returns ``(seq [N], anchors [N])`` int64."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    seq, pos = [], []
    for j, (ids, start) in enumerate(rows):
        first, last = max(start - 1, 0), len(ids) - 2
        if last < first:
            continue
        cand = torch.arange(first, last + 1)
        pick = cand[torch.randperm(len(cand), generator=gen)[:anchors]].sort().values
        seq += [j] * len(pick)
        pos += pick.tolist()
    return torch.tensor(seq, dtype=torch.int64), torch.tensor(pos, dtype=torch.int64)


def block_labels(ids: Tensor, lengths: Tensor, seq: Tensor, anchors: Tensor, block_size: int) -> Tensor:
    """``[N, block_size - 1]`` int64: the token ``a + k`` of the block's sequence for row ``k = 1 ..``, -100 past
    the sequence's end. ``ids [S, W]`` right-padded, ``lengths [S]``."""
    at = anchors[:, None] + torch.arange(1, block_size)
    inside = at < lengths[seq][:, None]
    tok = ids[seq[:, None], at.clamp(max=ids.shape[1] - 1)]
    return torch.where(inside, tok, torch.full_like(tok, -100))


def block_loss(drafter: DFlashDrafter, out: Tensor, labels: Tensor, head_weight: Tensor,
               weights: Tensor) -> tuple[Tensor, dict]:
    """The decay-weighted cross-entropy of the draft rows ``out[:, 1:]`` (scored by the frozen LM head
    ``head_weight [V, H]``) against ``labels [N, b - 1]``, and its figures: ``acc`` (row 1's top-1 accuracy),
    ``row_acc`` (each row's), ``tau`` (1 + the mean number of leading rows right, over the blocks whose rows all
    have a label: the acceptance length greedy verification would give each block, teacher-forced)."""
    logits = drafter.logits(out[:, 1:], lambda rows: F.linear(rows, head_weight)).float()
    keep = labels != -100
    ce = F.cross_entropy(logits.flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none").view(labels.shape)
    w = weights.to(ce.device)[None] * keep
    loss = (ce * w).sum() / w.sum().clamp(min=1e-9)
    with torch.no_grad():
        hit = (logits.argmax(-1) == labels) & keep
        row_acc = (hit.sum(0) / keep.sum(0).clamp(min=1)).tolist()
        full = keep.all(1)
        lead = hit[full].long().cumprod(1).sum(1).float()
        tau = 1.0 + float(lead.mean()) if lead.numel() else float("nan")
    return loss, {"acc": row_acc[0], "row_acc": row_acc, "tau": tau}


def _bf16(s: DFlashSettings, target: Any) -> bool:
    """Whether the drafter's forwards run under bfloat16 autocast: on a device that computes it natively (a CUDA GPU
    of compute capability 8.0+, a CPU with AVX-512 BF16 / AMX; :func:`native_bf16_on`)."""
    return s.autocast and native_bf16_on(target.device)


def _autocast(s: DFlashSettings, target: Any) -> contextlib.AbstractContextManager:
    return torch.autocast(target.device.type, dtype=torch.bfloat16) if _bf16(s, target) else contextlib.nullcontext()


def _step_loss(target: Any, drafter: DFlashDrafter, rows: list[tuple[list[int], int]], s: DFlashSettings,
               step: int, head_weight: Tensor, weights: Tensor) -> tuple[Tensor, dict] | None:
    """One batch's loss and figures (:func:`block_loss`), or None when no row has an answer position to draw."""
    seq, anchors = draw_blocks(rows, s.anchors, s.seed, step)
    if not len(seq):
        return None
    ids, valid, _ = padded_batch(rows, torch.arange(target.vocab_size), shift=1)
    labels = block_labels(ids, valid.sum(1), seq, anchors, s.block_size)
    dev = target.device
    feats = target_features(target.model, ids, valid, drafter.feature_layers)  # [S, W, F, H], frozen
    block = torch.full((len(seq), s.block_size), drafter.mask_token_id, dtype=torch.int64)
    block[:, 0] = ids[seq, anchors]
    table = target.model.get_input_embeddings().weight.detach()
    with _autocast(s, target):
        out = drafter.forward_blocks(drafter.fuse(feats), drafter.embed(block.to(dev), table), seq.to(dev),
                                     anchors.to(dev))
        return block_loss(drafter, out, labels.to(dev), head_weight, weights)


def train_dflash(target: Any, records: list[dict], out: Path, s: DFlashSettings,
                 progress: Callable[[int, int, float], None] | None = None, deadline: float | None = None) -> dict:
    """Train a DFlash drafter into ``out``; resumes from ``out/ckpt.pt`` when present.

    Args:
        target: a loaded :class:`specframe.target.hf.Target` (frozen, in its own dtype).
        records: the corpus records to train on (``max_records`` / ``skip_records`` are applied by
            :func:`specframe.training.recipe.run_recipe`).
        out: the output folder (the drafter folder itself).
        s: settings; a checkpoint made with other settings is refused.
        progress: optional ``(step, total_steps, loss)`` callback.
        deadline: a ``time.monotonic()`` after which the run checkpoints and stops (:class:`PieceDone`).

    Returns:
        Summary: steps, final loss / first-row accuracy / teacher-forced block τ (means of the last 20 steps),
        per-row accuracy, train seconds, pieces, parameter count, the mask token, and ``"drafter"`` (the module).

    Raises:
        ConfigError: no usable records, target layers the target lacks, or a checkpoint made with other settings.
        PieceDone: ``deadline`` passed (the checkpoint holds the steps done; the same call resumes).
    """
    out.mkdir(parents=True, exist_ok=True)
    examples = training_sequences(records, s.max_len)
    if not examples:
        raise ConfigError("the corpus has no usable responses (none with 2 or more tokens): build a larger corpus")
    mask = mask_token_for(records, s.mask_token, int(target.model.get_input_embeddings().weight.shape[0]))
    drafter, copied = new_drafter(target, s, mask)
    drafter.to(target.device).train()
    head_weight = target.model.get_output_embeddings().weight.detach()
    if head_weight.dtype != torch.float32 and not _bf16(s, target):
        head_weight = head_weight.float()  # (an emulated-bfloat16 CPU: float32 is faster)
    lengths = [len(e[0]) for e in examples]
    per_epoch = len(length_batches(lengths, s.batch_size, s.seed, 0))
    total = per_epoch * s.epochs
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=s.lr, weight_decay=0.0, betas=(0.9, 0.95))
    run = TrainingRun(out, {"dflash": asdict(s), "records": len(records)}, drafter, opt, total, progress=progress,
                      deadline=deadline)
    weights = loss_weights(s)
    warmup = max(1, min(s.warmup, total // 25))
    for b in resumed_batches(lambda epoch: length_batches(lengths, s.batch_size, s.seed, epoch), per_epoch, s.epochs,
                             run.step):
        got = _step_loss(target, drafter, [examples[i] for i in b], s, run.step, head_weight, weights)
        if got is None or not bool(torch.isfinite(got[0])):
            run.skip()
            continue
        loss, figures = got
        run.update(loss, cosine_lr(run.step, total, s.lr, warmup), clip=1.0)
        tau = None if math.isnan(figures["tau"]) else round(figures["tau"], 4)
        run.done(float(loss.detach()), figures["acc"], tau=tau, row_acc=[round(a, 5) for a in figures["row_acc"]])
    final_loss, final_acc = run.close()
    drafter.eval()
    recent = [r for r in final_rows(out) if "row_acc" in r]  # from the log: a resumed run reports them too
    taus = [r["tau"] for r in recent if r.get("tau") is not None]
    return {
        "steps": run.step, "final_loss": final_loss, "final_acc": final_acc,
        "final_block_tau": sum(taus) / len(taus) if taus else float("nan"),
        "final_acc_by_row": [sum(f["row_acc"][k] for f in recent) / len(recent)
                             for k in range(s.block_size - 1)] if recent else [],
        "train_s": run.elapsed_s, "pieces": run.pieces, "trainable_params": sum(p.numel() for p in params),
        "init_from_target_layers": bool(copied), "target_layer_ids": list(drafter.spec.target_layer_ids),
        "mask_token_id": mask, "drafter": drafter,
    }


def finish_dflash(drafter: DFlashDrafter, out: Path) -> None:
    """Save the trained drafter in z-lab's layout (``config.json``, ``model.safetensors``) and its loss plot."""
    save_dflash(drafter, out)
    plot_loss(out, "DFlash drafter (accuracy: first draft row)")
