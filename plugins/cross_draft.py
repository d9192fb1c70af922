"""``cross-draft``: a small causal LM with *another tokenizer* drafts for the target (transformers' Universal
Assisted Generation; vLLM's token-level intersection drafting).

Each step the draft continues the committed text in its own tokens: the target's prompt is re-written in the
draft's chat template (a single user turn; anything else is re-encoded as plain text), and the committed answer is
decoded and re-encoded whole in the draft's vocabulary; the draft's KV cache is rolled back to the longest prefix
it shares with that encoding, so a re-tokenised boundary costs only the tokens after it and the draft cannot drift
over a long answer. Its proposal reaches the target as target tokens, by one of two mappings:

- ``text`` (UAG): the draft writes ``k`` of its own tokens; their text, after a window of committed target tokens,
  is re-encoded by the target's tokenizer, and the target tokens after that window are the draft. The proposal is
  deterministic given what was drawn, so the verifier treats it as one-hot q, which is exact for any way the
  draft was drawn (Leviathan et al. 2022, Algorithm 1 with q = δ(x): the output is p whatever x is).
- ``shared`` (TLI): the draft may only write tokens whose text is one target token (the shared vocabulary); each is
  that target token. Under sampling, q is the draft's warped distribution over the shared tokens, mapped to target
  ids, and given to the verifier as ``draft_probs``.

Greedy output is the target's own greedy output under either mapping; so is the sampling distribution.

A catch-up longer than ``context`` draft tokens (the first ask after a long prompt, or after many steps the router
left the draft out) restarts the draft on the text's last ``context`` tokens, so no step pays a long draft prefill.
The draft runs on llama.cpp when it is a ``.gguf`` and llama-cpp-python loads (``engine: auto``; several times
cheaper per draft token than transformers on a 2-core CPU), else on transformers in the target's dtype. What it
costs where it runs decides, through the router, whether it drafts at all.

Refused at load (``ConfigError``, exit 2 from the command line): a draft whose tokenizer cannot spell the target's
text, one that shares the target's tokenizer (use ``draft-model``), and the target itself under another name.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from specframe import (
    ConfigError,
    DecodeState,
    DraftTree,
    ProposerBase,
    ProposerConfig,
    SpecframeError,
    TargetInfo,
    hookimpl,
)
from specframe.services import (
    TextBridge,
    cache_length,
    check_lossless,
    new_cache,
    probs_from_logits,
    rollback,
    shared,
    shared_tokens,
)

log = logging.getLogger("specframe")


# the draft a built-in target gets when `model` is not set (a built-in model with another tokenizer, about half the cost)
DEFAULT_DRAFTS = {"gemma3-270m": "smollm2-135m-instruct"}


class CrossDraftConfig(ProposerConfig):
    name: Literal["cross-draft"] = "cross-draft"
    model: str | None = Field(None, description="The draft: a built-in model name, a transformers model folder or a "
                                 ".gguf file; default: the one named for a built-in target (gemma3-270m: "
                                 "smollm2-135m-instruct).")
    k: int = Field(4, ge=1, le=64, description="Draft tokens written per step (in the draft's vocabulary).")
    mapping: Literal["text", "shared"] = Field(
        "text", description="text: re-encode the draft's text with the target's tokenizer (UAG); shared: draft only "
        "tokens both vocabularies hold (TLI).")
    window: int = Field(4, ge=1, le=64, description="Committed target tokens re-encoded with the draft's text.")
    context: int = Field(
        256, ge=1, le=1 << 20, description="Most draft tokens one step feeds the draft: a longer catch-up (the first "
        "ask after a long prompt, or after steps the router left the draft out) restarts it on the last `context` "
        "tokens of the text.")
    engine: Literal["auto", "transformers", "llama.cpp"] = Field(
        "auto", description="What runs the draft: auto = llama.cpp for a .gguf draft when llama-cpp-python loads "
        "(its kernels are several times faster per token on a CPU), else transformers (in the target's dtype).")


class _TorchRunner:
    """The draft on transformers: its own KV cache; ``feed`` returns the last position's logits ``[Vd]``."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache = new_cache(model.config)

    @property
    def length(self) -> int:
        return cache_length(self.cache)

    def rollback(self, n: int) -> None:
        if self.length > n:
            rollback(self.cache, n)

    def feed(self, ids: list[int]) -> Tensor:
        x = torch.tensor([ids], dtype=torch.int64, device=self.model.device)
        return self.model(input_ids=x, cache=self.cache, use_cache=True, logits_to_keep=1).logits[0, -1]


class _LlamaRunner:
    """The draft on llama.cpp (its GGUF run as is, at the threads torch runs with): one context per proposer
    instance; a rollback drops the cells past ``n`` (``seq_rm``)."""

    def __init__(self, model: Any, n_ctx: int) -> None:
        from specframe.services import LlamaContext

        self.ctx = LlamaContext(model, n_ctx=n_ctx, n_batch=512, threads=max(1, torch.get_num_threads()))
        self.length = 0

    def rollback(self, n: int) -> None:
        if self.length > n:
            self.ctx.remove(0, n)
            self.length = n

    def feed(self, ids: list[int]) -> Tensor:
        self.ctx.set_threads(max(1, torch.get_num_threads()))
        out = None
        for i in range(0, len(ids), self.ctx.n_batch):
            chunk = ids[i : i + self.ctx.n_batch]
            out = self.ctx.decode(chunk, list(range(self.length, self.length + len(chunk))), logits="last")
            self.length += len(chunk)
        assert out is not None
        return out[0]


def _same_weights(a: Any, b: Any) -> bool:
    ea, eb = a.get_input_embeddings().weight, b.get_input_embeddings().weight
    if ea.shape != eb.shape:
        return False
    rows = min(64, ea.shape[0])
    return bool(torch.equal(ea[:rows].float().cpu(), eb[:rows].float().cpu()))


class _Draft:
    """The draft's weights (a transformers model, or a llama.cpp model), its tokenizer, the text bridge and the
    shared-token map; read-only once built. ``runner()`` makes one request's KV state."""

    def __init__(self, spec: str, target: TargetInfo, window: int, engine: str) -> None:
        from specframe.services import (
            load_model,
            model_directory,
            resolve_model,
            tokenizer_directory,
        )

        if target.tokenizer is None:
            raise ConfigError("cross-draft needs the target's tokenizer (to move text between vocabularies); this "
                              "target has none")
        source = resolve_model(spec)
        if engine == "auto":
            engine = "llama.cpp" if source.gguf is not None and _llama_cpp_loads() else "transformers"
        if engine == "llama.cpp" and source.gguf is None:
            raise ConfigError(f"cross-draft: engine llama.cpp runs a .gguf draft, and {spec} is not one: use engine "
                              "transformers")
        self.engine = engine
        if engine == "llama.cpp":
            from transformers import AutoTokenizer

            from specframe.services import LlamaModel

            self.llama = LlamaModel(source.gguf)
            self.model = None
            self.tok = AutoTokenizer.from_pretrained(tokenizer_directory(source.gguf))
            self.vocab = int(self.llama.n_vocab)
            self.max_context = min(int(self.llama.n_ctx_train or 4096), 4096)
            self.eos = set(self.llama.eos_ids())
        else:
            self.model, self.tok = load_model(model_directory(source), target.dtype, str(target.device))
            self.vocab = int(self.model.get_output_embeddings().weight.shape[0])
            self.max_context = int(getattr(self.model.config, "max_position_embeddings", 0) or 1 << 30)
            gen = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
            self.eos = {int(i) for i in (gen if isinstance(gen, (list, tuple)) else [gen]) if i is not None}
        if self.tok is None:
            raise ConfigError(f"cross-draft: draft model {spec} has no tokenizer files")
        if self.tok.eos_token_id is not None:
            self.eos.add(int(self.tok.eos_token_id))
        if self.tok.get_vocab() == target.tokenizer.get_vocab():
            same = self.model is not None and target.model is not None and _same_weights(self.model, target.model)
            if same or _same_gguf(source, target):
                raise ConfigError(f"cross-draft: draft model {spec} is the target itself (same tokenizer and "
                                  "weights); a draft must be a smaller model")
            raise ConfigError(f"cross-draft: draft model {spec} shares the target's tokenizer; use proposer "
                              "draft-model, which needs no re-tokenisation")
        check_lossless(self.tok, target.tokenizer, target.vocab_size, f"cross-draft: draft model {spec}")
        self.bridge = TextBridge(target.tokenizer, self.tok, window)
        self.target_tok = target.tokenizer  # (keeps it, whose id is part of the sharing key, alive)
        self._shared: tuple[Tensor, Tensor, dict[int, int]] | None = None
        self._target_vocab = target.vocab_size

    def runner(self) -> Any:
        return _LlamaRunner(self.llama, self.max_context) if self.engine == "llama.cpp" else _TorchRunner(self.model)

    def shared_map(self) -> tuple[Tensor, Tensor, dict[int, int]]:
        """``(draft_ids [M], target_ids [M], target id -> draft id)``, built on first use."""
        if self._shared is None:
            d, t = shared_tokens(self.target_tok, self._target_vocab, self.tok, self.vocab)
            self._shared = (d, t, dict(zip(t.tolist(), d.tolist())))
        return self._shared


def _llama_cpp_loads() -> bool:
    try:
        from specframe.services import import_llama_cpp

        import_llama_cpp()
        return True
    except (ConfigError, ImportError):
        return False


def _same_gguf(source: Any, target: TargetInfo) -> bool:
    """The draft's GGUF holds the same bytes as the GGUF the target was loaded from (its name resolved again)."""
    from specframe.services import file_sha256, resolve_model

    try:
        own = resolve_model(target.name).gguf
    except SpecframeError:
        return False
    if source.gguf is None or own is None or source.gguf.stat().st_size != own.stat().st_size:
        return False
    return file_sha256(source.gguf) == file_sha256(own)


class CrossDraftProposer(ProposerBase):
    """A draft of another vocabulary drafts a chain (see the module docstring)."""

    name = "cross-draft"
    Config = CrossDraftConfig
    produces_trees = False
    provides_draft_probs = True

    def __init__(self, config: CrossDraftConfig, target: TargetInfo) -> None:
        super().__init__(config, target)
        spec = config.model or DEFAULT_DRAFTS.get(target.name)
        if spec is None:
            raise ConfigError(f"cross-draft needs `model:` (a draft model with another tokenizer) for target "
                              f"{target.name or '(unnamed)'}; only {', '.join(DEFAULT_DRAFTS)} has a default draft")
        key = ("cross-draft", spec, config.engine, str(target.dtype), str(target.device), id(target.tokenizer),
               config.window)
        self.draft: _Draft = shared(key, lambda: _Draft(spec, target, config.window, config.engine))
        if config.mapping == "shared":
            self.draft.shared_map()  # a pair with no shared token fails with the config
        self._run: Any = None  # the draft's KV state for the current request
        self._seen: list[int] = []  # draft token ids whose keys / values are in the draft's cache
        self._prompt: list[int] | None = None  # the draft's tokens of the target's prompt (its chat template)
        self._base = 0  # the first of the draft's tokens (of the committed text) that it reads

    def start(self, state: DecodeState) -> None:
        if self._run is None or self.draft.engine != "llama.cpp":
            self._run = self.draft.runner()
        self._run.rollback(0)
        self._seen = []
        self._prompt = self.draft.bridge.draft_prompt(state.tokens[0, : state.prompt_len].tolist())
        self._base = 0

    def _window(self, ids: list[int]) -> list[int]:
        """The draft's tokens it reads: ``ids`` from ``_base`` on. When that would feed more than ``context`` tokens
        (a first ask after a long prompt, or one after many steps without the draft), the draft restarts on the last
        ``context`` tokens: catching up costs at most ``context`` draft positions."""
        limit = max(1, min(self.config.context, self.draft.max_context - self.config.k))
        if self._base > len(ids):
            self._base = 0
        window = ids[self._base :]
        keep, n = 0, min(len(self._seen), len(window), self._run.length)
        while keep < n and self._seen[keep] == window[keep]:
            keep += 1
        if len(window) - keep > limit or len(window) > self.draft.max_context - self.config.k:
            self._base = max(0, len(ids) - limit)
            self._run.rollback(0)
            self._seen = []
            window = ids[self._base :]
        return window

    def _sync(self, ids: list[int]) -> list[int]:
        """Roll the draft's cache back to its common prefix with ``ids``; returns the tokens still to feed."""
        keep, n = 0, min(len(self._seen), len(ids) - 1, self._run.length)
        while keep < n and self._seen[keep] == ids[keep]:
            keep += 1
        self._run.rollback(keep)
        self._seen = ids[:]
        return ids[keep:]

    @torch.inference_mode()
    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        batch = state.tokens.shape[0]
        if self._run is None or budget < 1:
            return DraftTree.empty(batch)
        bridge = self.draft.bridge
        committed = state.tokens[0].tolist()
        ids, n_prompt, text = bridge.draft_ids(self._prompt, committed, state.prompt_len)
        k = min(self.config.k, budget)
        if not ids:
            return DraftTree.empty(batch)
        feed = self._sync(self._window(ids))
        if self.config.mapping == "shared":
            return self._shared_chain(state, feed, k)
        new: list[int] = []
        for _i in range(k):
            logits = self._run.feed(feed)
            if state.sampling.is_greedy:
                tok = int(logits.argmax())
            else:
                q = probs_from_logits(logits.float(), state.sampling)
                tok = int(torch.multinomial(q.to(state.generator.device), 1, generator=state.generator))
            if tok in self.draft.eos:
                break
            new.append(tok)
            self._seen.append(tok)
            feed = [tok]
        self._seen = self._seen[: self._run.length]  # the last drafted token was never fed
        out = bridge.to_target(committed, bridge.draft_text(ids[n_prompt:], new, text))[:budget]
        if not out:
            return DraftTree.empty(batch)
        return DraftTree.chain(out)

    def _shared_chain(self, state: DecodeState, feed: list[int], k: int) -> DraftTree:
        d_ids, t_ids, _ = self.draft.shared_map()
        dev = self.target.device
        d_ids, t_ids = d_ids.to(dev), t_ids.to(dev)
        v = self.target.vocab_size
        drafted: list[int] = []
        probs: list[Tensor] = []
        for _i in range(k):
            logits = self._run.feed(feed).float().to(dev)
            full = torch.full((v,), float("-inf"), dtype=torch.float32, device=dev)
            full.index_copy_(0, t_ids, logits[d_ids])  # the draft's logits of shared tokens, at their target ids
            if state.sampling.is_greedy:
                top = int(full.argmax())
            else:
                q = probs_from_logits(full, state.sampling)
                if not bool(torch.isfinite(q).all()) or float(q.sum()) <= 0:
                    break
                top = int(torch.multinomial(q.to(state.generator.device), 1, generator=state.generator))
                probs.append(q.cpu())
            drafted.append(top)  # (special tokens, EOS among them, are never shared: see piece_texts)
            own = self.draft.shared_map()[2][top]
            self._seen.append(own)
            feed = [own]
        self._seen = self._seen[: self._run.length]  # the last drafted token was never fed
        if not drafted:
            return DraftTree.empty(state.tokens.shape[0])
        return DraftTree.chain(drafted, torch.stack(probs) if probs else None)


@hookimpl
def specframe_register_proposers(register) -> None:
    register(CrossDraftProposer)
