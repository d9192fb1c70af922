"""Load-time probes of a transformers target: what its forwards over specframe's cache actually compute.

Two checks run once when a :class:`~specframe.target.hf.Target` is built, on 8 token ids (taken modulo the
vocabulary), each a few forwards of at most 4 tokens:

- :func:`cached_forward_obstacle`: a multi-token forward over the cache, a rollback and another must give the logits
  of decoding the same tokens one at a time: the engine's contract (exactness is one-token decoding on the same
  engine). A model that fails it is refused.
- :func:`tree_forward_obstacle`: one tree-masked forward must give each branch's logits as a chain. A model that
  fails it verifies chains.

Numbers are compared in every dtype, against the logit scale S (the largest absolute logit of the reference path, at
least 1). In float32 and float64 the two paths' logits must agree within 1e-3 S. In a low-precision dtype (bfloat16,
float16) the two paths round differently, by far more than that (a 3-token forward against one-token steps of
SmolLM2-135M in bf16 on a CPU: logits apart by up to 0.1 S), so there the probe asks what exactness needs of them:
no logit NaN or +inf (float16 overflows where a model's activations outgrow 65 504; it then decodes garbage),
and the top token of each path scored within :data:`_TOP1_ULPS` units of the dtype's precision (``eps``, times S)
of the other path's best: a near-tie may break either way, a forward that computes something else leaves a top token
far below the best. Every forward passes consecutive ``position_ids`` when the model takes them, as the target does
(:func:`consecutive_positions`).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from ..errors import first_line

_PROBE = [3, 1, 4, 1, 5, 9, 2, 6]  # token ids of the probes (taken modulo the vocabulary)
_TOLERANCE = 1e-3  # of the logit scale, in float32 / float64
_TOP1_ULPS = 32  # low-precision dtypes: a top token's shortfall allowed, in eps of the dtype times the logit scale
# (bf16: 0.25 S, fp16: 0.031 S; the path gap of a 3-token forward measured at 12.7 eps S in bf16 and 8.7 in fp16)


def takes_positions(model: Any) -> bool:
    """The model's forward takes ``position_ids`` (then specframe always passes them, as transformers' ``generate``
    does: a few models, BAMBA among them, number a multi-token forward from 0 when given none)."""
    return "position_ids" in inspect.signature(model.forward).parameters


def consecutive_positions(cache: Any, n: int, device: Any) -> Tensor:
    """``[1, n]`` int64: the positions after what ``cache`` holds."""
    past = int(cache.get_seq_length()) if cache is not None else 0
    return torch.arange(past, past + n, device=device)[None]


class CacheRunner:
    """How the probes run a model over specframe's transformers cache, the way the target does: a new cache, a
    forward over new tokens (``[1, n, V]`` logits), a rollback. A target kind with a state of its own passes its own
    runner (:mod:`specframe.target.state_target`)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.positions = takes_positions(model)

    def new_cache(self) -> Any:
        from .kv_cache import new_cache

        return new_cache(self.model.config)

    def forward(self, cache: Any, ids: Tensor, **kw: Any) -> Tensor:
        if self.positions and "position_ids" not in kw:
            kw["position_ids"] = consecutive_positions(cache, ids.shape[1], ids.device)
        return self.model(input_ids=ids, cache=cache, use_cache=True, **kw).logits

    def rollback(self, cache: Any, length: int) -> None:
        from .kv_cache import rollback

        rollback(cache, length)


class _Probe:
    """The model, its probe ids and one forward over a cache the way the target runs it."""

    def __init__(self, model: Any, runner: Any = None) -> None:
        self.runner = runner or CacheRunner(model)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        vocab = int(model.get_output_embeddings().weight.shape[0])
        self.ids = [t % vocab for t in _PROBE]

    def new_cache(self) -> Any:
        return self.runner.new_cache()

    def forward(self, cache: Any, tokens: list[int], **kw: Any) -> Tensor:
        """``[n, V]`` float32 logits of ``tokens`` appended after ``cache``."""
        return self.runner.forward(cache, torch.tensor([tokens], device=self.device), **kw)[0].float()

    def prefilled(self) -> Any:
        """A cache holding the first 3 probe ids."""
        cache = self.new_cache()
        self.forward(cache, self.ids[:3])
        return cache

    def gap(self, pairs: list[tuple[Tensor, Tensor]]) -> str | None:
        """How the pairs ``(got, want)`` (``[n, V]`` or ``[V]`` float32 logits of the same tokens by two paths) differ beyond
        this dtype's tolerance (module docstring), as a phrase, else None: "largest gap G, logit scale S" in float32
        and float64; in a low-precision dtype "NaN or infinite logits in DTYPE (an overflow)" or "top token T scored
        D below the best, logit scale S"."""
        if self.dtype in (torch.float32, torch.float64):
            scale = max(1.0, max(float(want.abs().max()) for _, want in pairs))
            gap = max(float((got - want).abs().max()) for got, want in pairs)
            return f"largest gap {gap:.3g}, logit scale {scale:.3g}" if gap > _TOLERANCE * scale else None
        # (-inf is a token the model rules out, as some heads do; NaN or +inf is an overflow)
        if any(bool(torch.isnan(t).any() or torch.isposinf(t).any()) for pair in pairs for t in pair):
            return f"NaN or infinite logits in {str(self.dtype).removeprefix('torch.')} (an overflow)"
        scale = max(1.0, max(float(want.nan_to_num(0.0, 0.0, 0.0).abs().max()) for _, want in pairs))
        allowed = _TOP1_ULPS * torch.finfo(self.dtype).eps * scale if self.dtype.is_floating_point else float("inf")
        worst, token = 0.0, -1
        for got, want in pairs:
            got, want = got.reshape(-1, got.shape[-1]), want.reshape(-1, want.shape[-1])  # ([V] rows too)
            for a, b in ((got, want), (want, got)):  # each path's top token, scored by the other
                top = a.argmax(-1, keepdim=True)  # [n, 1]
                short = b.max(-1).values - b.gather(-1, top)[:, 0]  # [n]
                i = int(short.argmax())
                if float(short[i]) > worst:
                    worst, token = float(short[i]), int(top[i, 0])
        if worst > allowed:
            return f"top token {token} scored {worst:.3g} below the best, logit scale {scale:.3g}"
        return None


def cached_forward_obstacle(model: Any, runner: Any = None) -> str | None:
    """Why this model's verification forwards do not reproduce its one-token decoding, or None when they do.

    After a 3-token prefill: a forward over 3 new tokens, :func:`~specframe.target.kv_cache.rollback` of the last
    one and a forward over 3 more must give the logits that decoding those 5 tokens one at a time gives. It catches
    a model whose multi-token forward over a cache raises or computes something else (an encoder used as a decoder,
    a cache read in ways the engine does not keep), which would otherwise fail at the first draft or decode silently
    wrong tokens. ``runner``: how the target runs the model (default: :class:`CacheRunner`).
    """
    p = _Probe(model, runner)
    ids = p.ids
    try:
        with torch.inference_mode():
            one = p.prefilled()
            steps = torch.cat([p.forward(one, [t]) for t in ids[3:8]])
            wide = p.prefilled()
            first = p.forward(wide, ids[3:6])
            p.runner.rollback(wide, 5)
            second = p.forward(wide, ids[5:8])
    except Exception as exc:  # noqa: BLE001 - any failure here is the one-line refusal
        return f"a forward of several new tokens over its cache raised {type(exc).__name__}: {first_line(exc)[:160]}"
    gap = p.gap([(first, steps[0:3]), (second, steps[2:5])])
    if gap is not None:
        return f"a forward of several new tokens over its cache gives other logits than decoding them one at a time ({gap})"
    return None


def tree_forward_obstacle(model: Any) -> str | None:
    """Why one tree-masked forward of this model does not give each branch's chain logits, or None when it does.

    After a 3-token prefill, the newest token and a 3-node tree (a 2-token branch and a 1-token sibling) in one
    forward with :func:`~specframe.token_tree.tree_attention_mask` and :func:`~specframe.token_tree.tree_position_ids`,
    against the two branches as chains. A model whose attention cannot take the 4-D mask (ALiBi biases built from a
    2-D one, as BLOOM's) or ignores it would raise at the first tree draft or score the wrong context.
    """
    from ..token_tree import tree_attention_mask, tree_position_ids

    p = _Probe(model)
    ids = p.ids
    parent = [-1, 0, -1]  # nodes ids[4] (child of the newest), ids[5] (its child), ids[6] (a sibling of ids[4])
    try:
        with torch.inference_mode():
            tree = p.forward(p.prefilled(), ids[3:7], attention_mask=tree_attention_mask(parent, 3, p.dtype, p.device),
                             position_ids=tree_position_ids(parent, 3, p.device))
            branch = p.forward(p.prefilled(), ids[3:6])
            sibling = p.forward(p.prefilled(), [ids[3], ids[6]])
    except Exception as exc:  # noqa: BLE001 - the target then verifies chains
        return f"a tree-masked forward raised {type(exc).__name__}: {first_line(exc)[:120]}"
    gap = p.gap([(tree[:3], branch), (tree[3], sibling[1])])
    if gap is not None:
        return f"a tree-masked forward scores other logits than its branches as chains ({gap})"
    return None
