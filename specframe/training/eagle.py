"""``specframe train eagle``: train an EAGLE-style drafter (:mod:`specframe.learned.eagle_drafter`) on the target's
own hidden features and greedy answers.

Per batch the frozen target runs once over the corpus sequences (no cache) and returns the hidden states of the
drafter's feature layers; the drafter is unrolled ``ttt_steps`` times on its own outputs (training-time test,
EAGLE-3 §3.3), every pass predicting the token two positions ahead of its input feature, and the loss is the
cross-entropy against the target's greedy token (the corpus responses *are* the target's argmax) over the
frequent-token subset, response positions only, pass ``j`` weighted ``step_decay ** (j - 1)``.

The drafter's decoder layer starts as a copy of the target's last layer when the shapes match (Llama-like
targets); the rest starts random (seeded). Weights train in float32, forwards run under bfloat16 autocast when
``autocast`` on a CUDA target or a CPU with native bfloat16 (float32 on others, where autocast is emulated). The drafter trains on the target's device, so the same recipe runs
on a GPU whenever there is one (``specframe train eagle --device cuda``). Seeded, resumable from ``ckpt.pt`` (every
50 steps, and when a ``--max-minutes`` piece ends); writes ``eagle.json``, ``eagle.safetensors``,
``train-log.jsonl`` (pass-1 loss and accuracy) and ``loss.png``.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..learned.eagle3 import Eagle3Drafter, init_eagle3_from_target, load_eagle3, save_eagle3
from ..learned.eagle_drafter import EagleDrafter, EagleSpec, init_from_target, new_drafter
from .common import (
    PieceDone,  # noqa: F401 - raised by TrainingRun, documented here
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
class EagleSettings:
    """The ``specframe train eagle`` recipe; fields with ``cli`` metadata are its options (same defaults)."""

    vocab_subset: int = field(default=8192, metadata=cli("--vocab-subset", "Output head size: most frequent tokens "
                                                         "kept.", low=16))
    epochs: int = field(default=1, metadata=cli("--epochs", "Passes over the corpus.", low=1))
    batch_size: int = field(default=8, metadata=cli("--batch-size", "Sequences per step.", low=1))
    max_len: int = field(default=384, metadata=cli("--max-len", "Longest training sequence (cut from the left).", low=8))
    lr: float = field(default=5e-4, metadata=cli("--lr", "Peak learning rate (AdamW, cosine).", positive=True))
    warmup: int = 50
    ttt_steps: int = field(default=3, metadata=cli("--ttt-steps", "Training-time test: drafter passes unrolled per "
                                                   "step.", low=1))
    step_decay: float = 0.8
    # None: low / middle / high (EagleSpec.for_target)
    feature_layers: Optional[tuple[int, ...]] = field(default=None, metadata=cli(
        "--feature-layers", "Target hidden_states indices to fuse (comma-separated; default: a low, a middle and a "
        "high layer).", ints=True))
    init_from_target: bool = True
    autocast: bool = True
    # 0: every record of the corpus (run_recipe selects the records; train_eagle takes them all)
    max_records: int = field(default=0, metadata=cli("--max-records", "Train on the first N corpus records only "
                                                     "(0 = all).", low=0, omit=(0,)))
    seed: int = 0  # the command's --seed (shared with the corpus)
    skip_records: int = field(default=0, metadata=cli(
        "--skip-records", "Leave out the first N of the corpus records (after --max-records), e.g. the ones an --init "
        "drafter trained on.", low=0, omit=(0,)))
    # warm start: an EAGLE drafter folder (its weights, token map and feature layers), "" = new
    init: str = field(default="", metadata=cli("--init", "Warm start: go on training this EAGLE drafter folder (its "
                                               "weights, head rows and feature layers), e.g. the shipped one.",
                                               path=True, omit=("",)))
    # "specframe" (eagle.json) or "eagle3": the published EAGLE-3 architecture, saved in the speculators layout
    # (specframe.learned.eagle3)
    arch: str = field(default="specframe", metadata=cli(
        "--arch", "specframe: specframe's own drafter (eagle.json); eagle3: the published EAGLE-3 architecture, "
        "written in the speculators layout that vLLM loads (docs/drafters.md).", choices=("specframe", "eagle3"),
        omit=("specframe",)))


def _examples(records: list[dict], max_len: int) -> list[tuple[list[int], int]]:
    """``(ids, first response index)`` per record with 3+ response tokens, cut from the left to ``max_len``.

    Raises:
        ConfigError: no record has 3 or more response tokens.
    """
    out = []
    for r in records:
        ids = r["prompt_ids"] + r["response_ids"]
        cut = max(0, len(ids) - max_len)
        if len(r["response_ids"]) >= 3:
            out.append((ids[cut:], max(1, len(r["prompt_ids"]) - cut)))
    if not out:
        raise ConfigError("the corpus has no usable responses (none with 3 or more tokens): build a larger corpus")
    return out


@torch.no_grad()
def target_features(model: Any, ids: torch.Tensor, valid: torch.Tensor, layers: tuple[int, ...]) -> torch.Tensor:
    """``[B, W, F, H]`` hidden states of ``layers`` (transformers ``hidden_states`` indices) of the target over
    right-padded ``ids`` (one forward, no cache; the LM head scores the last position only where the model can)."""
    keep = {"logits_to_keep": 1} if getattr(model, "_supports_logits_to_keep", lambda: False)() else {}
    out = model(input_ids=ids.to(model.device), attention_mask=valid.long().to(model.device), use_cache=False,
                output_hidden_states=True, **keep)
    return torch.stack([out.hidden_states[i] for i in layers], 2)


def _drafter(target: Any, s: EagleSettings, token_map: torch.Tensor) -> tuple[tuple[int, ...], Any, bool]:
    """The drafter to train, in training mode: the one in ``s.init`` (warm start), else a new one for the target
    (seeded) in the architecture ``s.arch``, its decoder layer copied from the target's last layer when
    ``s.init_from_target`` and the shapes allow: ``(feature layers, drafter, whether a target layer was copied)``.

    Raises:
        ConfigError: ``s.init`` holds no drafter for this target, or one with other feature layers than asked."""
    cfg = target.model.config.get_text_config()
    if s.init:
        if s.arch == "eagle3":
            drafter = load_eagle3(Path(s.init), int(cfg.hidden_size), target.vocab_size, int(cfg.num_hidden_layers),
                                  target.info.name)
            layers = drafter.feature_layers
        else:
            drafter = EagleDrafter.load(Path(s.init), target.model.config.hidden_size, target.vocab_size)
            layers = tuple(drafter.spec.feature_layers)
        if s.feature_layers is not None and tuple(s.feature_layers) != tuple(layers):
            raise ConfigError(f"--init {s.init} reads feature layers {list(layers)}, not "
                              f"{list(s.feature_layers)}: leave out --feature-layers")
        drafter.to(target.device).train()
        return tuple(layers), drafter, False
    if s.arch == "eagle3":
        drafter = Eagle3Drafter.new(target.model.config, token_map, s.feature_layers, s.seed)
        copied = s.init_from_target and init_eagle3_from_target(drafter, target.model)
        with torch.no_grad():  # the head starts as the target's LM-head rows of the subset
            drafter.lm_head.weight.copy_(target.model.get_output_embeddings().weight.detach()[token_map].float())
        drafter.to(target.device).train()
        return drafter.feature_layers, drafter, copied
    spec = EagleSpec.for_target(target.model.config, target.info.name, s.feature_layers)
    drafter = new_drafter(spec, token_map, s.seed)
    copied = s.init_from_target and init_from_target(drafter, target.model)
    drafter.to(target.device).train()
    return spec.feature_layers, drafter, copied


def _drafter_and_subset(target: Any, records: list[dict],
                        s: EagleSettings) -> tuple[tuple[int, ...], Any, bool, torch.Tensor, float]:
    """The drafter to train (:func:`_drafter`) and the subset of the target vocabulary its head drafts over:
    ``(feature layers, drafter, whether a target layer was copied, token_map, coverage)``, ``token_map`` ``[S]``
    int64 target ids on the CPU: the ``s.vocab_subset`` most frequent response tokens of ``records``
    (:func:`~specframe.training.common.token_subset`), or for a warm start (``s.init``) the rows its head was
    trained with; ``coverage``: the share of the records' response tokens in it.

    Raises:
        ConfigError: as :func:`_drafter`."""
    token_map, coverage = token_subset(records, s.vocab_subset, target.eos_token_ids)
    layers, drafter, copied = _drafter(target, s, token_map)
    if s.init:  # the head keeps the rows it was trained with
        token_map = drafter.token_map.cpu()
        coverage = _coverage(records, token_map)
    return layers, drafter, copied, token_map, coverage


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16, AMX, or Arm BF16): elsewhere bfloat16 autocast is
    emulated and slower than float32 (an EAGLE-3 training step at batch 8 x 256 tokens: 20.3 s under autocast, 2.9 s
    in float32 on a 2-core AVX2-only AMD EPYC)."""
    from ..target.machine import fingerprint

    return bool({"avx512_bf16", "amx_bf16", "bf16"} & set(fingerprint()["isa"]))


def native_bf16_on(device: torch.device) -> bool:
    """Whether ``device`` (a CUDA GPU or this CPU) multiplies bfloat16 natively (see :func:`native_bf16`)."""
    if device.type == "cuda":
        from ..target.models import cuda_native_bf16

        return cuda_native_bf16(device)
    return device.type == "cpu" and native_bf16()


def _autocast(s: EagleSettings, target: Any) -> contextlib.AbstractContextManager:
    """The context the drafter's forwards run in: bfloat16 autocast when ``s.autocast`` on a CUDA GPU with native
    bfloat16 (compute capability 8.0+, :func:`specframe.target.models.cuda_native_bf16`), or on a CPU target whose CPU
    has native bfloat16 (:func:`native_bf16`); float32 otherwise (a T4 or V100 only emulates bfloat16)."""
    if s.autocast and native_bf16_on(target.device):
        return torch.autocast(target.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _inputs(target: Any, ids: torch.Tensor, valid: torch.Tensor, layers: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """The drafter's inputs, on the target's device: the target's features ``[B, W, F, H]``
    (:func:`target_features`) and, at every position ``t``, the target's input embedding of token ``t + 1`` (0 past
    the end) ``[B, W, H]`` float32."""
    feats = target_features(target.model, ids, valid, layers)
    with torch.no_grad():
        nxt = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], 1)
        emb = target.model.get_input_embeddings()(nxt.to(target.device)).float()
    return feats, emb


def _batch(target: Any, rows: list[tuple[list[int], int]], sub_index: torch.Tensor,
           layers: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """One training batch of ``rows`` (``(ids, first response index)``, :func:`_examples`), right-padded, on the
    target's device: the drafter's inputs (:func:`_inputs`: features ``[B, W, F, H]``, next-token embeddings
    ``[B, W, H]`` float32), ``valid [B, W]`` bool and ``labels [B, W]`` int64, the subset index (``sub_index``) of the
    token two positions ahead, -100 where there is none (:func:`~specframe.training.common.padded_batch`)."""
    ids, valid, labels = padded_batch(rows, sub_index, shift=2)
    valid, labels = valid.to(target.device), labels.to(target.device)
    feats, emb = _inputs(target, ids, valid, layers)
    return feats, emb, valid, labels


def _unrolled_loss(drafter: Any, feats: torch.Tensor, emb: torch.Tensor, valid: torch.Tensor,
                   labels: torch.Tensor, head_rows: torch.Tensor,
                   weights: list[float]) -> tuple[torch.Tensor, list[float]]:
    """The drafter unrolled ``len(weights)`` times on its own outputs: the weighted mean of each pass's
    cross-entropy, and each pass's accuracy (NaN for a pass with no label; pass ``j + 1`` needs real features up
    to ``t - j``, so its first ``j`` positions are left out)."""
    outs = drafter.unrolled(drafter.fuse_features(feats.float()), emb, len(weights), valid)
    loss = feats.new_zeros((), dtype=torch.float32)
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
    return loss / sum(weights), accs


def train_eagle(target: Any, records: list[dict], out: Path, s: EagleSettings,
                progress: Callable[[int, int, float], None] | None = None, deadline: float | None = None) -> dict:
    """Train and save an EAGLE drafter into ``out``; resumes from ``out/ckpt.pt`` when present.

    Args:
        target: a loaded :class:`specframe.target.hf.Target` (its model stays frozen, in its own dtype).
        records: the corpus records to train on (:func:`specframe.training.corpus.read_corpus`; ``max_records``
            and ``skip_records`` are applied by :func:`specframe.training.recipe.run_recipe`, not here).
        out: output folder (the drafter folder itself).
        s: settings; a checkpoint made with other settings is refused.
        progress: optional ``(step, total_steps, loss)`` callback.
        deadline: a ``time.monotonic()`` after which the run checkpoints and stops (:class:`PieceDone`).

    Returns:
        Summary: steps, final loss / accuracy (pass 1, mean of the last 20 steps), per-pass accuracy of the last
        steps, subset coverage, train seconds, parameter count, and ``"drafter"`` (the trained module).

    Raises:
        ConfigError: no usable records, bad feature layers, or a checkpoint made with other settings.
        PieceDone: ``deadline`` passed (the checkpoint holds the steps done; the same call resumes).
    """
    torch.manual_seed(s.seed)
    out.mkdir(parents=True, exist_ok=True)
    layers, drafter, copied, token_map, coverage = _drafter_and_subset(target, records, s)
    sub_index = subset_index(token_map, target.vocab_size)
    examples = _examples(records, s.max_len)
    head_rows = target.model.get_output_embeddings().weight.detach()[token_map.to(target.device)].float()
    lengths = [len(e[0]) for e in examples]
    per_epoch = len(length_batches(lengths, s.batch_size, s.seed, 0))
    total = per_epoch * s.epochs
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=s.lr, weight_decay=0.0, betas=(0.9, 0.95))
    run = TrainingRun(out, {"eagle": asdict(s), "records": len(records)}, drafter, opt, total, progress=progress,
                      deadline=deadline)
    weights = [s.step_decay**j for j in range(s.ttt_steps)]
    pass_acc = [[] for _ in range(s.ttt_steps)]
    batches = resumed_batches(lambda epoch: length_batches(lengths, s.batch_size, s.seed, epoch), per_epoch,
                              s.epochs, run.step)
    for b in batches:
        feats, emb, valid, labels = _batch(target, [examples[i] for i in b], sub_index, layers)
        with _autocast(s, target):
            loss, accs = _unrolled_loss(drafter, feats, emb, valid, labels, head_rows, weights)
        if not bool(torch.isfinite(loss)) or not loss.requires_grad:
            run.skip()
            continue
        run.update(loss, cosine_lr(run.step, total, s.lr, s.warmup), clip=1.0)
        for j, acc in enumerate(accs):
            pass_acc[j] = (pass_acc[j] + [acc])[-20:]
        run.done(float(loss.detach()), accs[0])
    final_loss, final_acc = run.close()
    drafter.eval()
    return {
        "steps": run.step, "final_loss": final_loss, "final_acc": final_acc,
        "final_acc_by_pass": [sum(a) / len(a) if a else float("nan") for a in pass_acc],
        "subset_coverage": coverage, "train_s": run.elapsed_s, "pieces": run.pieces,
        "trainable_params": sum(p.numel() for p in params), "init_from_target_layer": bool(copied),
        "feature_layers": list(layers), "arch": s.arch, "drafter": drafter,
    }


def _coverage(records: list[dict], token_map: torch.Tensor) -> float:
    """Share of the records' response tokens that ``token_map`` holds."""
    keep = set(token_map.tolist())
    total = sum(len(r["response_ids"]) for r in records)
    return sum(t in keep for r in records for t in r["response_ids"]) / max(1, total)


def finish_eagle(drafter: Any, out: Path, verifier: str = "") -> None:
    """Save the trained drafter folder and its loss plot: specframe's format, or an EAGLE-3 drafter in the
    speculators layout (``verifier``: the target's name or folder, written as ``verifier.name_or_path``)."""
    if isinstance(drafter, Eagle3Drafter):
        save_eagle3(drafter, out, "speculators", verifier, "LlamaForCausalLM")
    else:
        drafter.save(out)
    plot_loss(out, "EAGLE drafter (pass 1)")
