"""Which decoder layers a layer-skipping self-draft skips: a greedy search on calibration prompts, cached beside the
machine profile.

Training-free, after Draft & Verify (Zhang et al. 2024, ACL, sec. 3.2, which searches the skipped set by Bayesian
optimisation) and SWIFT (Xia et al. 2025, ICLR: on-the-fly layer selection): here, a greedy path. The target
continues a few built-in calibration prompts greedily; one teacher-forced forward of the full model over them gives
its argmax at every continuation position. Starting from no layer skipped, each round adds the layer whose skipping
keeps the draft's argmax equal to the target's at the most positions (the *agreement* a, a per-token acceptance
estimate), up to ``max_fraction`` of the layers. Every set on the path is scored by the expected speed of a k-token
chain draft over plain decoding (Leviathan et al. 2022, eq. 1 and sec. 3.4):

    speed(S) = E[tokens per step] / cost = ((1 - a^(k+1)) / (1 - a)) / (v(k + 1) + k * d(S))

with v(n) the target's cost curve (the machine's fixed curve: a choice that changes sampled draws must not follow
the load) and d(S) a draft token's cost relative to one target token, counted in weights read: the kept layers plus
the LM head, over all layers plus the same. Each set is scored at its best k from 1 to the configured one; the set
with the highest speed wins (the empty set stands for "does not pay": speed 1). Deterministic for a model, dtype and machine; the result is cached as JSON
under ``$SPECFRAME_CACHE/machine/layer-skip/``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .layer_skip import decoder_layers, skipping

log = logging.getLogger("specframe")

__all__ = ["CALIBRATION_PROMPTS", "SkipChoice", "cached_skip_choice", "calibrate", "chain_speed", "search_skip",
           "skip_cache_path"]

VERSION = 2  # of the search: a cached choice from another version is searched again
CALIBRATION_PROMPTS = (  # one per kind of request people send: explain, code, reason, write, summarise
    "Explain why the sky is blue in a few sentences.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "A train travels 120 km in 1.5 hours. What is its average speed? Think step by step.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Summarise the main causes of the French Revolution.",
)


@dataclass(frozen=True)
class SkipChoice:
    """A searched set of layers to skip.

    ``skip``: layer indices (ascending; empty: skipping does not pay). ``agreement``: the draft's argmax equal to the
    target's, as a fraction of calibration positions. ``speed``: the estimated speed over plain decoding (the
    formula in the module docstring). ``path``: ``(skip, agreement, speed)`` of every set the greedy search chose.
    """

    skip: tuple[int, ...]
    agreement: float
    speed: float
    layers: int
    k: int
    path: tuple[tuple[tuple[int, ...], float, float], ...] = ()


def chain_speed(agreement: float, k: int, v: Callable[[float], float], draft_cost: float) -> float:
    """Expected tokens per unit time of a ``k``-token chain draft over plain decoding (module docstring)."""
    a = min(max(agreement, 0.0), 0.999999)
    tokens = (1 - a ** (k + 1)) / (1 - a)
    return tokens / (v(k + 1) + k * draft_cost)


def _weights(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())


def _draft_cost(model: Any, skip: frozenset[int]) -> float:
    """A draft token's cost relative to a target token, in weights read (module docstring): the kept layers and the
    LM head (embedding a token reads one row: not counted)."""
    per = [_weights(layer) for layer in decoder_layers(model)]
    head = _weights(model.get_output_embeddings())
    kept = sum(w for i, w in enumerate(per) if i not in skip)
    return (kept + head) / (sum(per) + head)


@torch.inference_mode()
def calibrate(model: Any, prompts: Sequence[list[int]], new_tokens: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    """The calibration batch: each prompt (token ids) continued greedily by ``model`` for ``new_tokens``, right-padded.

    Returns ``(ids [S, L] int64, scored [S, L] bool)``: ``scored[s, t]`` marks the positions whose next token is a
    continuation token (where agreement is counted).
    """
    device = next(model.parameters()).device
    rows, marks = [], []
    for p in prompts:
        ids = torch.tensor([p], dtype=torch.int64, device=device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=0)
        row = out[0].tolist()
        rows.append(row)
        marks.append([len(p) - 1 <= t < len(row) - 1 for t in range(len(row))])
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int64, device=device)
    scored = torch.tensor([m + [False] * (width - len(m)) for m in marks], dtype=torch.bool, device=device)
    return ids, scored


@torch.inference_mode()
def _argmax(model: Any, ids: torch.Tensor, skip: frozenset[int]) -> torch.Tensor:
    with skipping(model, skip):
        return model(input_ids=ids, use_cache=False).logits.argmax(-1)


def search_skip(model: Any, ids: torch.Tensor, scored: torch.Tensor, k: int, v: Callable[[float], float],
                max_fraction: float = 0.5, tick: Callable[[], None] = lambda: None) -> SkipChoice:
    """The greedy search of the module docstring on a calibration batch (:func:`calibrate`); each set is scored at
    its best draft length from 1 to ``k``, which the choice carries.

    Args:
        ids: ``[S, L]`` int64 calibration sequences; scored: ``[S, L]`` bool, the positions counted.
        k: the longest draft length a set is scored for.
        v: the target's cost curve, v(n) = T(n) / T(1).
        max_fraction: skip at most this fraction of the layers.
        tick: called after each candidate set is tried (a progress bar).
    """
    n = len(decoder_layers(model))
    ref = _argmax(model, ids, frozenset())
    total = max(int(scored.sum()), 1)

    def agree(skip: frozenset[int]) -> float:
        return int(((_argmax(model, ids, skip) == ref) & scored).sum()) / total

    skip: frozenset[int] = frozenset()
    best = SkipChoice((), 1.0, 1.0, n, k)
    path = []
    for _ in range(int(max_fraction * n)):
        tried = []
        for layer in range(1, n):
            if layer not in skip:
                tried.append((agree(skip | {layer}), -layer, layer))
                tick()
        if not tried:
            break
        a, _, layer = max(tried)
        skip = skip | {layer}
        cost = _draft_cost(model, skip)
        speed, best_k = max((chain_speed(a, j, v, cost), j) for j in range(1, k + 1))
        path.append((tuple(sorted(skip)), a, speed))
        if speed > best.speed:
            best = SkipChoice(tuple(sorted(skip)), a, speed, n, best_k)
    return SkipChoice(best.skip, best.agreement, best.speed, n, best.k, tuple(path))


def skip_cache_path(key: dict[str, Any]) -> Path:
    """Where the choice for ``key`` (model, dtype, machine, k, ...) is cached."""
    from .models import cache_root

    digest = hashlib.sha256(json.dumps({**key, "version": VERSION}, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "machine" / "layer-skip" / f"{digest}.json"


def load_choice(path: Path) -> SkipChoice | None:
    try:
        d = json.loads(path.read_text())
        return SkipChoice(tuple(d["skip"]), float(d["agreement"]), float(d["speed"]), int(d["layers"]), int(d["k"]),
                          tuple((tuple(s), float(a), float(sp)) for s, a, sp in d.get("path", ())))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_choice(path: Path, choice: SkipChoice, key: dict[str, Any]) -> None:
    """Write the choice atomically; a cache that cannot be written costs a search next time, not this run."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**asdict(choice), "key": key}, indent=1))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("layer-skip choice not saved to %s (%s): the next run searches again", path,
                    exc.strerror or type(exc).__name__)


def cached_skip_choice(target: Any, k: int, max_fraction: float = 0.5) -> SkipChoice:
    """The layer-skip choice for ``target`` (a :class:`~specframe.contracts.TargetInfo` with ``model`` and
    ``tokenizer``) on this machine, in its dtype, for ``k``-token drafts: read from the cache, else searched on
    :data:`CALIBRATION_PROMPTS` (with a warning saying so) and cached.

    Raises:
        ConfigError: the target has no torch model or no tokenizer.
    """
    from ..errors import ConfigError
    from .machine import fingerprint_key

    model, tok = target.model, target.tokenizer
    if model is None or tok is None:
        raise ConfigError("the layer-skip search needs the target's torch model and tokenizer (engine transformers); "
                          "or name the layers to skip")
    key = {"machine": fingerprint_key(target.name, str(target.device)), "dtype": str(target.dtype), "k": k,
           "max_fraction": max_fraction, "layers": len(decoder_layers(model)),
           "weights": round(float(next(model.parameters()).detach().float().abs().sum()), 3)}
    path = skip_cache_path(key)
    choice = load_choice(path)
    if choice is not None:
        return choice
    log.warning("layer-skip: searching which layers to skip on %d calibration prompts (once for this model, dtype "
                "and machine; cached in %s)", len(CALIBRATION_PROMPTS), path.parent)
    from .hf import TextSide

    text = TextSide()
    text.tokenizer = tok  # (the prompts encode as every engine's target encodes them)
    ids, scored = calibrate(model, [text.encode_prompt(p) for p in CALIBRATION_PROMPTS])
    v = target.cost.v_fixed if target.cost else (lambda n: 1.0)
    choice = search_skip(model, ids, scored, k, v, max_fraction)
    save_choice(path, choice, key)
    if choice.skip:
        log.warning("layer-skip: skips layers %s of %d, k = %d (agreement %.2f, estimated %.2fx plain decoding)",
                    list(choice.skip), choice.layers, choice.k, choice.agreement, choice.speed)
    else:
        top = max(choice.path, key=lambda p: p[2]) if choice.path else ((), 1.0, 1.0)
        log.warning("layer-skip: no set of layers to skip pays on this model and machine (best: %d layers, "
                    "agreement %.2f, estimated %.2fx plain decoding): it drafts nothing", len(top[0]), top[1], top[2])
    return choice
