"""``specframe train pard``: train a PARD parallel draft (An et al. 2025, arXiv 2504.18583; the layout:
:mod:`specframe.learned.pard`) for the ``draft-model`` proposer's parallel mode: one forward over ``[context,
newest, mask x (k - 1)]`` drafts ``k`` tokens.

Two starting points (``--init``):

- ``target``: **the target itself with LoRA adapters** (Hu et al. 2021) on every linear layer of its decoder, the
  base weights frozen — a self-drafting block drafter: the target learns to fill the masks after its own context
  (the family of Orthrus / Uno, which add a small adapter to the target so it drafts a block; here the adapted copy
  runs as its own draft forward, not inside the verification forward). The adapters are merged into the weights
  at the end, so the draft is an ordinary model in PARD's layout.
- ``draft``: the small draft shipped for the target (``<target>-draft``, as a standalone transformers model), every
  weight trained: PARD's own recipe on a draft that already predicts the next token.

Data: the corpus sequences (the target's own greedy answers: self-distillation), each laid out ``k`` times by
:func:`~specframe.learned.pard.pard_batch` (group 0 the tokens, group ``i`` masks that predict ``i + 1`` places
ahead, every block position of the sequence trained in one forward), thinned by PARD's conditional drop
(:func:`~specframe.learned.pard.drop_rows`, ``--cod-ratio``). Cross-entropy on the answer tokens, every group
weighted the same (as the paper). The mask is ``--mask-token``, by default the lowest token id no training record
holds (0, ``<|endoftext|>``, for SmolLM2's corpus; PARD's Llama 3 drafts use a reserved token the same way).
AdamW, cosine, seeded, resumable from ``ckpt.pt`` (only the trained weights: for ``target`` the adapters).
Writes the PARD folder (``config.json`` with ``pard_token`` and ``spd_type``, weights, the tokenizer),
``train-log.jsonl`` (loss, the first mask group's accuracy) and ``loss.png``.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..learned.lora import add_lora, merge_lora, trainable
from ..learned.pard import drop_rows, pard_batch, write_pard
from .common import TrainingRun, cosine_lr, length_batches, padded_batch, plot_loss, resumed_batches
from .dflash import mask_token_for
from .draft import training_sequences
from .options import cli

INITS = ("target", "draft")


@dataclass(frozen=True)
class PardSettings:
    """The ``specframe train pard`` recipe; fields with ``cli`` metadata are its options (same defaults)."""

    init: str = field(default="target", metadata=cli(
        "--init", "What the draft starts from: target (the target with LoRA adapters: self-drafting) or draft (the "
        "shipped small draft, every weight trained).", choices=INITS))
    lora_rank: int = field(default=16, metadata=cli("--lora-rank", "Rank of the adapters on the decoder's linear "
                                                    "layers (--init target).", low=1))
    block_size: int = field(default=8, metadata=cli("--block-size", "k: tokens drafted per forward (the newest "
                                                    "token's next and k - 1 masks).", low=2))
    cod_ratio: float = field(default=0.7, metadata=cli("--cod-ratio", "Conditional drop: mask group i keeps "
                                                       "max(ratio ** i, 0.2) of its rows.", positive=True))
    epochs: int = field(default=1, metadata=cli("--epochs", "Passes over the corpus.", low=1))
    batch_size: int = field(default=4, metadata=cli("--batch-size", "Sequences per step.", low=1))
    max_len: int = field(default=256, metadata=cli("--max-len", "Longest training sequence (cut from the left).", low=8))
    lr: float = field(default=3e-4, metadata=cli("--lr", "Peak learning rate (AdamW, cosine).", positive=True))
    warmup: int = 50
    cod_min: float = 0.2
    mask_token: int = field(default=-1, metadata=cli("--mask-token", "Token id of the mask (-1 = the lowest id no "
                                                     "training record uses).", low=-1, omit=(-1,)))
    max_records: int = field(default=0, metadata=cli("--max-records", "Train on the first N corpus records only "
                                                     "(0 = all).", low=0, omit=(0,)))
    skip_records: int = field(default=0, metadata=cli("--skip-records", "Leave out the first N of the corpus records "
                                                      "(after --max-records).", low=0, omit=(0,)))
    seed: int = 0


def new_draft(target: Any, target_name: str, s: PardSettings) -> tuple[Any, torch.nn.Module, Any]:
    """``(model, the module whose weights train and are checkpointed, tokenizer)`` for ``s.init``, float32 on the
    target's device.

    Raises:
        ConfigError: ``--init draft`` for a target with no shipped draft; an unknown ``--init``."""
    if s.init == "target":
        model = copy.deepcopy(target.model).float()
        adapters = add_lora(model, s.lora_rank, seed=s.seed)
        return model, adapters, target.tokenizer
    if s.init != "draft":
        raise ConfigError(f"--init {s.init!r}: choose {' or '.join(INITS)}")
    from transformers import AutoModelForCausalLM

    from ..target.models import DRAFT_SUFFIX, model_directory, resolve_model

    try:
        folder = model_directory(resolve_model(target_name + DRAFT_SUFFIX))
    except Exception as exc:  # noqa: BLE001 - any lookup failure means the same thing here
        raise ConfigError(f"--init draft: no draft is shipped for {target_name!r} ({exc}); use --init target") from None
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(target.device)
    return model, model, target.tokenizer


def _step(model: Any, rows: list[tuple[list[int], int]], s: PardSettings, mask: int, vocab: int,
          gen: torch.Generator, device: torch.device) -> tuple[torch.Tensor, dict] | None:
    """One batch's loss and accuracy by group (``acc``: the first mask group's, 2 tokens ahead)."""
    ids, _, labels = padded_batch(rows, torch.arange(vocab), shift=0)  # labels: the answer tokens themselves
    batch = pard_batch(ids, s.block_size, mask, labels)
    n = ids.shape[1]
    batch["group"] = torch.arange(s.block_size).repeat_interleave(n)[None].expand(ids.shape[0], -1)
    batch = drop_rows(batch, s.block_size, s.cod_ratio, s.cod_min, gen)
    keep = batch["labels"] != -100
    if not bool(keep.any()):
        return None
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    hidden = body(input_ids=batch["input_ids"].to(device), position_ids=batch["position_ids"].to(device),
                  attention_mask=batch["attention_mask"].to(device)).last_hidden_state  # [B, R, H]
    logits = model.get_output_embeddings()(hidden[keep.to(device)]).float()  # only the rows with a label
    target = batch["labels"][keep].to(device)
    loss = F.cross_entropy(logits, target)
    with torch.no_grad():
        hit = (logits.argmax(-1) == target).float()
        group = batch["group"][keep].to(device)
        acc = [float(hit[group == g].mean()) if bool((group == g).any()) else float("nan")
               for g in range(s.block_size)]
    return loss, {"acc": acc[1] if len(acc) > 1 else acc[0], "acc_by_group": acc}


def train_pard(target: Any, target_name: str, records: list[dict], out: Path, s: PardSettings,
               progress: Callable[[int, int, float], None] | None = None, deadline: float | None = None) -> dict:
    """Train a PARD draft into ``out``; resumes from ``out/ckpt.pt`` when present.

    Returns:
        Summary: steps, final loss / first-mask-group accuracy (means of the last 20 steps), accuracy by group,
        train seconds, pieces, trainable parameter count, the mask token, ``"model"`` and ``"tokenizer"``.

    Raises:
        ConfigError: no usable records, ``--init draft`` without a shipped draft, a checkpoint made with other
            settings.
        PieceDone: ``deadline`` passed (the checkpoint holds the steps done; the same call resumes).
    """
    out.mkdir(parents=True, exist_ok=True)
    examples = training_sequences(records, s.max_len)
    if not examples:
        raise ConfigError("the corpus has no usable responses (none with 2 or more tokens): build a larger corpus")
    vocab = int(target.model.get_input_embeddings().weight.shape[0])
    mask = mask_token_for(records, s.mask_token, vocab)
    torch.manual_seed(s.seed)
    model, trained, tokenizer = new_draft(target, target_name, s)
    model.train()
    params = trainable(trained)
    opt = torch.optim.AdamW(params, lr=s.lr, weight_decay=0.0, betas=(0.9, 0.95))
    lengths = [len(e[0]) for e in examples]
    per_epoch = len(length_batches(lengths, s.batch_size, s.seed, 0))
    total = per_epoch * s.epochs
    run = TrainingRun(out, {"pard": asdict(s), "records": len(records)}, trained, opt, total, progress=progress,
                      deadline=deadline)
    warmup = max(1, min(s.warmup, total // 25))
    recent: list[dict] = []
    for b in resumed_batches(lambda epoch: length_batches(lengths, s.batch_size, s.seed, epoch), per_epoch, s.epochs,
                             run.step):
        gen = torch.Generator().manual_seed(s.seed * 1_000_003 + run.step)  # the same drop on a resumed run
        got = _step(model, [examples[i] for i in b], s, mask, vocab, gen, target.device)
        if got is None or not bool(torch.isfinite(got[0])):
            run.skip()
            continue
        loss, figures = got
        run.update(loss, cosine_lr(run.step, total, s.lr, warmup), clip=1.0)
        recent = (recent + [figures])[-20:]
        run.done(float(loss.detach()), figures["acc"])
    final_loss, final_acc = run.close()
    model.eval()
    by_group = [sum(f["acc_by_group"][g] for f in recent) / len(recent) for g in range(s.block_size)] if recent else []
    return {
        "steps": run.step, "final_loss": final_loss, "final_acc": final_acc, "final_acc_by_group": by_group,
        "train_s": run.elapsed_s, "pieces": run.pieces, "trainable_params": sum(p.numel() for p in params),
        "mask_token_id": mask, "model": model, "tokenizer": tokenizer,
    }


def finish_pard(model: Any, tokenizer: Any, mask: int, out: Path) -> None:
    """Merge the adapters (if any) and write the draft in PARD's layout into ``out`` (beside the run's log and
    checkpoint, which are kept), and the loss plot."""
    import shutil
    import tempfile

    merge_lora(model)
    keep = {"train-log.jsonl", "ckpt.pt", "recipe.json", "README.md", "loss.png", "corpus"}
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:  # write_pard replaces a folder whole: write beside
        folder = Path(tmp) / "pard"
        write_pard(model, folder, mask, tokenizer)
        for f in folder.iterdir():
            if f.name not in keep:
                shutil.move(str(f), out / f.name)
    plot_loss(out, "PARD draft (accuracy: first mask group, 2 tokens ahead)")
