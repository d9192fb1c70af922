"""``specframe train eagle``: train an EAGLE-style drafter (:mod:`specframe.learned.eagle_drafter`) on the target's
own hidden features and greedy answers.

Per batch the frozen target runs once over the corpus sequences (no cache) and returns the hidden states of the
drafter's feature layers; the drafter is unrolled ``ttt_steps`` times on its own outputs (training-time test,
EAGLE-3 §3.3), every pass predicting the token two positions ahead of its input feature, and the loss is the
cross-entropy against the target's greedy token (the corpus responses *are* the target's argmax) over the
frequent-token subset, response positions only, pass ``j`` weighted ``step_decay ** (j - 1)``.

The drafter's decoder layer starts as a copy of the target's last layer when the shapes match (Llama-like
targets); the rest starts random (seeded). Weights train in float32, forwards run under bfloat16 autocast when
``autocast``. Seeded, resumable from ``ckpt.pt`` (every 50 steps); writes ``eagle.json``, ``eagle.safetensors``,
``train-log.jsonl`` (pass-1 loss and accuracy) and ``loss.png``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..learned.eagle_drafter import EagleDrafter, EagleSpec, init_from_target, new_drafter
from .common import Checkpoint, LossLog, cosine_lr, final_means, length_batches, plot_loss, token_subset


@dataclass(frozen=True)
class EagleSettings:
    vocab_subset: int = 8192
    epochs: int = 1
    batch_size: int = 8
    max_len: int = 384
    lr: float = 5e-4
    warmup: int = 50
    ttt_steps: int = 3
    step_decay: float = 0.8
    feature_layers: Optional[tuple[int, ...]] = None  # None: low / middle / high (EagleSpec.for_target)
    init_from_target: bool = True
    autocast: bool = True
    max_records: int = 0  # 0: every record of the corpus
    seed: int = 0


def _examples(records: list[dict], max_len: int) -> list[tuple[list[int], int]]:
    """``(ids, first response index)`` per record with 3+ response tokens, cut from the left to ``max_len``."""
    out = []
    for r in records:
        ids = r["prompt_ids"] + r["response_ids"]
        cut = max(0, len(ids) - max_len)
        if len(r["response_ids"]) >= 3:
            out.append((ids[cut:], max(1, len(r["prompt_ids"]) - cut)))
    return out


def _batch(rows: list[tuple[list[int], int]], sub_index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``ids [B, W]`` (right-padded with 0), ``valid [B, W]`` bool, ``labels [B, W]``: at ``t`` the subset index of
    token ``t + 2`` where that token is a response token inside the subset, else -100."""
    width = max(len(r[0]) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.int64)
    valid = torch.zeros((len(rows), width), dtype=torch.bool)
    labels = torch.full((len(rows), width), -100, dtype=torch.int64)
    for j, (seq, start) in enumerate(rows):
        t = torch.tensor(seq)
        ids[j, : len(seq)] = t
        valid[j, : len(seq)] = True
        first = max(start - 2, 0)  # label position of the first response token
        labels[j, first : len(seq) - 2] = sub_index[t[first + 2 :]]
    return ids, valid, labels


@torch.no_grad()
def target_features(model: Any, ids: torch.Tensor, valid: torch.Tensor, layers: tuple[int, ...]) -> torch.Tensor:
    """``[B, W, F, H]`` hidden states of ``layers`` (transformers ``hidden_states`` indices) of the target over
    right-padded ``ids`` (one forward, no cache)."""
    out = model(input_ids=ids.to(model.device), attention_mask=valid.long().to(model.device), use_cache=False,
                output_hidden_states=True)
    return torch.stack([out.hidden_states[i] for i in layers], 2)


def train_eagle(target: Any, records: list[dict], out: Path, s: EagleSettings,
                progress: Callable[[int, int, float], None] | None = None) -> dict:
    """Train and save an EAGLE drafter into ``out``; resumes from ``out/ckpt.pt`` when present.

    Args:
        target: a loaded :class:`specframe.target.Target` (its model stays frozen, in its own dtype).
        records: corpus records (:func:`specframe.training.corpus.read_corpus`).
        out: output folder (the drafter folder itself).
        s: settings; a checkpoint made with other settings is refused.
        progress: optional ``(step, total_steps, loss)`` callback.

    Returns:
        Summary: steps, final loss / accuracy (pass 1, mean of the last 20 steps), per-pass accuracy of the last
        steps, subset coverage, train seconds, parameter count, and ``"drafter"`` (the trained module).

    Raises:
        ConfigError: no usable records, bad feature layers, or a checkpoint made with other settings.
    """
    torch.manual_seed(s.seed)
    out.mkdir(parents=True, exist_ok=True)
    if s.max_records:
        records = records[: s.max_records]
    token_map, coverage = token_subset(records, s.vocab_subset, target.eos_token_ids)
    spec = EagleSpec.for_target(target.model.config, target.info.name, s.feature_layers)
    drafter = new_drafter(spec, token_map, s.seed)
    copied = s.init_from_target and init_from_target(drafter, target.model)
    drafter.train()
    sub_index = torch.full((target.vocab_size,), -100, dtype=torch.int64)
    sub_index[token_map] = torch.arange(token_map.numel())
    examples = _examples(records, s.max_len)
    if not examples:
        raise ConfigError("the corpus has no usable responses (none with 3 or more tokens): build a larger corpus")
    head_rows = target.model.get_output_embeddings().weight.detach()[token_map].float()
    embed = target.model.get_input_embeddings()
    per_epoch = len(length_batches([len(e[0]) for e in examples], s.batch_size, s.seed, 0))
    total = per_epoch * s.epochs
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=s.lr, weight_decay=0.0, betas=(0.9, 0.95))
    ckpt = Checkpoint(out, {"eagle": asdict(s), "records": len(records)})
    state = ckpt.load()
    step = 0
    if state is not None:
        drafter.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        torch.set_rng_state(state["rng"])
    logger = LossLog(out, step)
    weights = [s.step_decay**j for j in range(s.ttt_steps)]
    pass_acc = [[] for _ in range(s.ttt_steps)]
    t0 = time.perf_counter()
    amp = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if s.autocast and target.device.type == "cpu" else (
        contextlib.nullcontext)
    for epoch in range(step // per_epoch, s.epochs):
        batches = length_batches([len(e[0]) for e in examples], s.batch_size, s.seed, epoch)
        for b in batches[step - epoch * per_epoch :]:
            ids, valid, labels = _batch([examples[i] for i in b], sub_index)
            for g in opt.param_groups:
                g["lr"] = cosine_lr(step, total, s.lr, s.warmup)
            feats = target_features(target.model, ids, valid, spec.feature_layers).to("cpu")
            with torch.no_grad():
                nxt = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], 1)
                emb = embed(nxt.to(target.device)).to("cpu").float()
            with amp():
                outs = drafter.unrolled(drafter.fuse_features(feats.float()), emb, s.ttt_steps, valid)
                loss = torch.zeros(())
                accs = []
                for j, a in enumerate(outs):
                    lab = labels.clone()
                    lab[:, :j] = -100  # pass j+1 needs real features up to t - j
                    keep = lab != -100
                    if not bool(keep.any()):
                        accs.append(float("nan"))
                        continue
                    logits = drafter.logits(a[keep], head_rows).float()
                    loss = loss + weights[j] * F.cross_entropy(logits, lab[keep])
                    accs.append(float((logits.argmax(-1) == lab[keep]).float().mean()))
                loss = loss / sum(weights)
            if not bool(torch.isfinite(loss)) or not loss.requires_grad:
                step += 1
                continue
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            logger.add(step, float(loss.detach()), accs[0])
            for j, acc in enumerate(accs):
                pass_acc[j] = (pass_acc[j] + [acc])[-20:]
            step += 1
            if progress:
                progress(step, total, float(loss.detach()))
            if step % 50 == 0 or step == total:
                ckpt.save(model=drafter.state_dict(), opt=opt.state_dict(), step=step, rng=torch.get_rng_state())
    logger.close()
    drafter.eval()
    return {
        "steps": step,
        "final_loss": final_means(out)[0],
        "final_acc": final_means(out)[1],
        "final_acc_by_pass": [sum(a) / len(a) if a else float("nan") for a in pass_acc],
        "subset_coverage": coverage,
        "train_s": time.perf_counter() - t0,
        "trainable_params": sum(p.numel() for p in params),
        "init_from_target_layer": bool(copied),
        "feature_layers": list(spec.feature_layers),
        "drafter": drafter,
    }


def finish_eagle(drafter: EagleDrafter, out: Path) -> None:
    """Save the trained drafter folder and its loss plot."""
    drafter.save(out)
    plot_loss(out, "EAGLE drafter (pass 1)")
