"""llama.cpp's own decoding as bench peers, through llama-cpp-python's high-level ``Llama`` on the same GGUF and
build as the llama.cpp target:

- ``llamacpp-greedy``: ``Llama.generate`` at temperature 0 (greedy sampler, no penalties): llama.cpp decoding alone,
  the reference the llama.cpp engine's output must equal token for token;
- ``llamacpp-prompt-lookup``: the same with ``draft_model=LlamaPromptLookupDecoding(...)`` (llama-cpp-python's prompt
  lookup; defaults stated in the record: 10 and 2, its own defaults).

Target forwards are counted as ``Llama.eval`` calls (the prompt's counts as one: it yields the first token).
"""

from __future__ import annotations

import time
from typing import Any

from ...decode.metrics import with_legacy_keys

PEERS = ("llamacpp-greedy", "llamacpp-prompt-lookup")
PROMPT_LOOKUP_DEFAULTS = {"num_pred_tokens": 10, "max_ngram_size": 2}


def _llama(target: Any, peer: str, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The high-level ``Llama`` of ``peer`` for ``target`` (made once per option set, kept on the target)."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    run: dict[str, Any] = {}
    if peer == "llamacpp-prompt-lookup":
        run = {**PROMPT_LOOKUP_DEFAULTS, **{k: v for k, v in options.items() if k in PROMPT_LOOKUP_DEFAULTS}}
    key = (peer, tuple(sorted(run.items())))
    cache = target.__dict__.setdefault("_peer_llamas", {})
    if key not in cache:
        draft = LlamaPromptLookupDecoding(**run) if run else None
        # (with a draft model, Llama keeps a logits row per position and needs logits_all set for its buffer to
        # hold them: left unset, it sizes the buffer for one batch and fails on prompts longer than n_batch)
        cache[key] = Llama(model_path=str(target.gguf), n_ctx=target.n_ctx, n_batch=512, n_ubatch=512,
                           n_threads=target.threads, n_threads_batch=target.threads, flash_attn=False,
                           draft_model=draft, logits_all=draft is not None, verbose=False)
    return cache[key], run


def run_llamacpp_peer(target: Any, peer: str, options: dict[str, Any], prompt_ids: list[int], *, max_new_tokens: int,
                      temperature: float, top_p: float, top_k: int, seed: int) -> dict[str, Any]:
    """Run one llama.cpp peer generation; returns a bench record (metrics named as specframe's).

    Raises:
        ValueError: an unknown peer, or sampling (these peers decode greedily: their samplers differ from specframe's).
    """
    from ...sampling import is_greedy_temperature

    if peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}")
    if not is_greedy_temperature(temperature):
        raise ValueError(f"peer {peer} decodes greedily; the bench samples at temperature {temperature}")
    llm, run_options = _llama(target, peer, options)
    llm.set_seed(seed)
    calls = {"n": 0, "s": 0.0, "first_s": None}
    plain_eval = type(llm).eval

    def counted_eval(tokens: Any) -> None:
        t0 = time.perf_counter()
        plain_eval(llm, tokens)
        calls["n"] += 1
        calls["s"] += time.perf_counter() - t0
        if calls["first_s"] is None:  # the prompt's forward: the prefill
            calls["first_s"] = time.perf_counter() - t0

    llm.eval = counted_eval  # (an instance attribute: generate() calls self.eval)
    eos = set(target.eos_token_ids)
    generated: list[int] = []
    ttft = None
    t0 = time.perf_counter()
    try:
        llm.reset()
        for token in llm.generate(list(prompt_ids), temp=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                  reset=True):
            generated.append(int(token))
            if ttft is None:
                ttft = time.perf_counter() - t0
            if int(token) in eos or len(generated) >= max_new_tokens:
                break
    finally:
        wall = time.perf_counter() - t0
        del llm.eval
    forwards = max(calls["n"], 1)
    n = len(generated)
    return {
        "token_ids": generated,
        "peer_options": run_options,
        "metrics": with_legacy_keys({
            "new_tokens": n, "target_forwards": forwards, "tau": n / forwards,
            "acceptance_rate": None, "drafted_nodes": None, "accepted_nodes": None, "wall_s": wall,
            "tokens_per_s": n / wall if wall > 0 else 0.0, "forward_s": calls["s"], "prefill_s": calls["first_s"], "ttft_s": ttft,
            "propose_s": None, "verify_s": None, "other_s": None, "drafted_by_depth": [],
            "accepted_by_depth": [],
        }),
    }
