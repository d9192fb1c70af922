"""HF transformers peers, run in the same process on the same loaded target model.

- ``hf-greedy``: ``model.generate(do_sample=False)`` (or sampling when temperature > 0);
- ``hf-prompt-lookup``: ``generate(prompt_lookup_num_tokens=..., max_matching_ngram_size=...)``
  (defaults stated in the record: 10 and 2, transformers' own defaults);
- ``hf-assisted``: ``generate(assistant_model=...)`` with a draft model loaded by specframe's model loader; a draft
  whose tokenizer differs from the target's runs as transformers' Universal Assisted Generation (``tokenizer`` and
  ``assistant_tokenizer`` given; the record's ``peer_options`` says ``universal: true``).

Target forwards and their time are counted with forward hooks on the target module.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ..decode.metrics import with_legacy_keys
from ..sampling import is_greedy_temperature

PROMPT_LOOKUP_DEFAULTS = {"prompt_lookup_num_tokens": 10, "max_matching_ngram_size": 2}


class ForwardMeter:
    """Counts calls of ``module.forward`` and the time spent in them (hooks; removed on exit)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module, self.calls, self.seconds, self._t0 = module, 0, 0.0, 0.0

    def _pre(self, *_: Any) -> None:
        self._t0 = time.perf_counter()

    def _post(self, *_: Any) -> None:
        self.calls += 1
        self.seconds += time.perf_counter() - self._t0

    def __enter__(self) -> "ForwardMeter":
        self._handles = [self.module.register_forward_pre_hook(self._pre), self.module.register_forward_hook(self._post)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()


def peer_kwargs(peer: str, options: dict[str, Any], assistant: Any = None,
                target_tokenizer: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(generate kwargs, options as run)`` for a peer; ``assistant`` is the hf-assisted draft model, or ``(model,
    tokenizer)``."""
    if peer == "hf-greedy":
        return {}, {}
    if peer == "hf-prompt-lookup":
        run = {**PROMPT_LOOKUP_DEFAULTS, **{k: v for k, v in options.items() if k in PROMPT_LOOKUP_DEFAULTS}}
        return dict(run), run
    if peer == "hf-assisted":
        model, tok = assistant if isinstance(assistant, tuple) else (assistant, None)
        kw: dict[str, Any] = {"assistant_model": model}
        run: dict[str, Any] = {"assistant_model": options["assistant_model"]}
        if tok is not None and target_tokenizer is not None and tok.get_vocab() != target_tokenizer.get_vocab():
            kw.update(tokenizer=target_tokenizer, assistant_tokenizer=tok)  # transformers' UAG: text between them
            run["universal"] = True
        if "num_assistant_tokens" in options:
            kw["num_assistant_tokens"] = run["num_assistant_tokens"] = options["num_assistant_tokens"]
        return kw, run
    raise ValueError(f"unknown peer {peer!r}")


def run_peer(
    target: Any,
    peer: str,
    options: dict[str, Any],
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: int,
    assistant: Any = None,
) -> dict[str, Any]:
    """Run one peer generation; returns a bench record (metrics named as specframe's)."""
    model = target.model
    kwargs, run_options = peer_kwargs(peer, options, assistant, getattr(target, "tokenizer", None))
    ids = torch.tensor([prompt_ids], device=model.device)
    if not is_greedy_temperature(temperature):  # (below 1e-5 is greedy, as in specframe: no NaN from HF's warper)
        kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k or None)
        torch.manual_seed(seed)  # HF generate samples from the global RNG
    else:
        kwargs.update(do_sample=False)
    eos = sorted(target.eos_token_ids)
    with torch.inference_mode(), ForwardMeter(model) as meter:
        t0 = time.perf_counter()
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
            eos_token_id=eos or None, pad_token_id=(eos[0] if eos else None), **kwargs,
        )
        wall = time.perf_counter() - t0
    generated = out[0, len(prompt_ids):].tolist()
    # HF's prefill forward also yields the first new token, so it counts as a decoding forward (plain greedy:
    # n tokens, n forwards, τ = 1 — as for specframe's `none`, whose prefill yields no token and is not counted)
    forwards = max(meter.calls, 1)
    n = len(generated)
    return {
        "token_ids": generated,
        "peer_options": run_options,
        "metrics": with_legacy_keys({
            "new_tokens": n,
            "target_forwards": forwards,
            "tau": n / forwards,
            "acceptance_rate": None,
            "drafted_nodes": None,
            "accepted_nodes": None,
            "wall_s": wall,
            "tokens_per_s": n / wall if wall > 0 else 0.0,
            "forward_s": meter.seconds,
            "prefill_s": None,
            "propose_s": None,
            "verify_s": None,
            "other_s": None,
            "drafted_by_depth": [],
            "accepted_by_depth": [],
        }),
    }
