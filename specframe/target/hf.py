"""The target adapter: any transformers causal LM plus its tokenizer, seen through the few calls the engine
needs (encode a prompt, one forward over new tokens with a KV cache, decode)."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from ..contracts import TargetInfo
from ..errors import ConfigError
from .probes import cached_forward_obstacle, consecutive_positions, takes_positions, tree_forward_obstacle


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


# layer kinds one tree mask serves: full causal attention, and layers without attention or a cache of their own
_TREE_LAYER_TYPES = frozenset({"full_attention", "dummy"})
# per-layer attention kinds some configs declare in a list of their own (GPT-Neo: ``attention_types`` expanded into
# ``attention_layers``, with ``window_size``), which transformers' cache does not see: kinds other than these are local
_GLOBAL_ATTENTION = frozenset({"global", "full", "full_attention", "attention"})


def _declared_local_layers(text: Any) -> list[str]:
    kinds = getattr(text, "attention_layers", None)
    if not isinstance(kinds, (list, tuple)):
        return []
    return sorted({str(k) for k in kinds if isinstance(k, str)} - _GLOBAL_ATTENTION)


def tree_obstacle(config: Any) -> str | None:
    """Why one token-tree mask cannot serve every layer of a model with this config, or None when it can.

    Decided as transformers decides it when it builds the model's KV cache and attention masks: the attention kind
    of each decoder layer (``layer_types``, or inferred from ``sliding_window`` / ``attention_chunk_size`` when a
    config has none, as for Mistral, Mixtral, Phi-3 or Starcoder2), and the cache layer class it gets. A sliding or
    chunked window, a linear-attention or recurrent layer, or any cache layer other than the plain growing one sees
    another key range than the tree mask describes, so such targets verify chains only.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DummyLayer, DynamicLayer, get_layer_types_and_kwargs

    text = config.get_text_config(decoder=True)
    layer_types, _ = get_layer_types_and_kwargs(text)
    other = sorted({str(t) for t in layer_types} - _TREE_LAYER_TYPES) or _declared_local_layers(text)
    if other:
        return f"layers of kind {', '.join(other)}"
    kinds = sorted({type(layer).__name__ for layer in DynamicCache(config=config).layers
                    if type(layer) not in (DynamicLayer, DummyLayer)})
    if kinds:
        return f"cache layers {', '.join(kinds)}"
    return None


# types whose forwards over several tokens were measured to differ from their one-token decoding in ways the load
# probes (8 tokens) cannot reach, with the cause as far as it is known (issue 52's sweep, transformers 5.25)
MEASURED_INEXACT = {
    "moshi": "its KV cache keeps a sliding window but its attention mask is full causal, so a forward of several "
             "tokens past the window sees more keys than decoding them one at a time",
    "doge": "its dynamic-mask attention keeps the top keep_window_size keys per row, and past that window a "
            "position's logits change with the length of the forward (gap 1.7 on a 9-token forward)",
}


def cache_obstacle(model: Any) -> str | None:
    """Why specframe cannot keep and roll back this model's state in a transformers ``Cache``, or None when it can.

    A model whose forward takes no ``cache`` (GPT-1, RWKV, XLNet), one that transformers itself gives a cache of its
    own instead of a ``DynamicCache`` (MiniMax's linear attention, xLSTM), or one whose recurrent state lives in its
    modules rather than in the cache (RecurrentGemma) would decode from a state that a rejected draft left behind.
    Types in :data:`MEASURED_INEXACT` are refused with the measured cause.
    """
    import inspect

    known = MEASURED_INEXACT.get(getattr(model.config, "model_type", ""))
    if known:
        return known
    if "cache" not in inspect.signature(model.forward).parameters:
        return "its forward takes no KV cache (state kept by the model itself, or none)"
    supports = getattr(type(model), "_supports_default_dynamic_cache", None)
    if callable(supports) and not supports():
        return "transformers gives it a cache of its own, not a DynamicCache that specframe can roll back"
    if any(callable(getattr(m, "_setup_cache", None)) for m in model.modules()):
        return "its recurrent state is kept inside its layers, outside the KV cache, so a rejected draft cannot be undone"
    return None


ENGINE_TRANSFORMERS = (5, 24)  # the KV-cache API the engine drives (cache layers, DummyLayer)


def require_engine_transformers() -> None:
    """Raise :class:`~specframe.errors.ConfigError` when the installed transformers predates the cache API the engine
    drives. (specframe installs beside older transformers so that the vLLM adapter, which never runs a target, can
    live in vLLM's environment: docs/vllm.md.)"""
    import transformers

    version = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
    if version < ENGINE_TRANSFORMERS:
        raise ConfigError(
            f"specframe's engine needs transformers >= 5.24, this environment has {transformers.__version__} (vLLM 0.32 "
            "pins it below 5.20: run the engine in its own environment, the vLLM adapter in vLLM's, see docs/vllm.md)")


class TextSide:
    """The text side of a target (needs ``self.tokenizer``): prompts to ids with the chat template, ids to text.
    Shared by every engine's target, so a prompt encodes to the same ids on each."""

    tokenizer: Any

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode_prompt(self, prompt: str, chat: bool = True) -> list[int]:
        """Token ids of ``prompt``; wrapped in the chat template (user turn + generation prompt) when
        ``chat`` and the tokenizer has one."""
        if chat and self.has_chat_template:
            enc = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=True
            )
            return list(enc["input_ids"])
        return list(self.tokenizer(prompt)["input_ids"])

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)


class Target(TextSide):
    """A transformers causal LM as the speculative-decoding target.

    Args:
        model: a ``PreTrainedModel`` with a causal-LM head that accepts a transformers ``Cache`` (``cache=``).
        tokenizer: its tokenizer (may be None for id-only use, e.g. tests).
        name: display name.
    """

    engine = "transformers"

    def __init__(self, model: Any, tokenizer: Any = None, name: str = "") -> None:
        require_engine_transformers()
        obstacle = self.load_obstacle(model)
        if obstacle:
            kind = getattr(model.config, "model_type", type(model).__name__)
            raise ConfigError(f"model type {kind!r} cannot be a specframe target: {obstacle}")
        self.model = model.eval()
        self.takes_positions = takes_positions(model)
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "name_or_path", "") or model.config.model_type
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_context = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self.eos_token_ids = _eos_ids(model, tokenizer)
        # a tree mask is one [N+1, T] mask for every layer: only full-attention layers can take it
        self.tree_obstacle = self.branching_obstacle(model)
        self.supports_trees = self.tree_obstacle is None
        self.info = TargetInfo(
            vocab_size=self.vocab_size,
            eos_token_ids=self.eos_token_ids,
            max_context=self.max_context,
            device=self.device,
            dtype=self.dtype,
            name=self.name,
            tokenizer=tokenizer,
            model=model,
            supports_trees=self.supports_trees,
            engine=self.engine,
        )
        self.settings: Any = None  # specframe.target.profile.Settings when loaded by load_target (dtype/threads and why)
        self.governor: Any = None  # specframe.target.profile.ThreadGovernor: threads within the free cores during a run

    @staticmethod
    def load_obstacle(model: Any) -> str | None:
        """Why ``model`` cannot be this kind of target, or None (probes: :mod:`specframe.target.probes`)."""
        return cache_obstacle(model) or cached_forward_obstacle(model)

    @staticmethod
    def branching_obstacle(model: Any) -> str | None:
        """Why one forward cannot verify a token tree on ``model``, or None."""
        return tree_obstacle(model.config) or tree_forward_obstacle(model)

    def attach_machine(self, settings: Any, governor: Any) -> None:
        """Record how this target runs on this machine and expose the live cost curve as ``info.cost``."""
        from dataclasses import replace

        self.settings, self.governor = settings, governor
        self.info = replace(self.info, cost=governor.curve if governor.curve else None)

    # --- model --------------------------------------------------------------------------------------------
    def new_cache(self) -> Any:
        """An empty KV cache for one request (see :mod:`specframe.target.kv_cache` for rollback)."""
        from .kv_cache import new_cache

        return new_cache(self.model.config)

    def new_batch(self, rows: int = 0) -> Any:
        """Several requests' rows in one KV cache, one forward per step for all (:mod:`specframe.target.batch_kv`;
        ``rows``, the most at once, sizes nothing here); None when a layer cannot take the per-row mask (a sliding
        window: see :func:`tree_obstacle`)."""
        if not self.supports_trees:
            return None
        from .batch_kv import TransformersBatch

        return TransformersBatch(self)

    def forward(
        self,
        input_ids: Tensor,
        cache: Any,
        want_hidden: bool = False,
        logits_to_keep: int = 0,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """One target forward over new tokens appended after the cache.

        Args:
            input_ids: ``[B, n]`` int64 on the target's device.
            cache: the request's KV cache; grows by ``n`` positions.
            want_hidden: also return the last layer's hidden states.
            logits_to_keep: compute logits for the last this-many positions only (0 = all); the prefill keeps 1,
                which saves an ``[n, V]`` LM-head product over the whole prompt.
            attention_mask: ``[B, 1, n, cached + n]`` additive mask for a token tree (None = causal).
            position_ids: ``[B, n]`` int64 positions for a token tree (None = consecutive).

        Returns:
            ``(logits [B, n or logits_to_keep, V] in the model's dtype, hidden [B, n, H] or None)``.
        """
        logits, hidden, _ = self.forward_features(input_ids, cache, (), want_hidden, logits_to_keep, attention_mask,
                                                  position_ids)
        return logits, hidden

    def last_logits(self, ids: list[int]) -> Tensor:
        """``[V]`` float32: the target's logits after ``ids`` (one forward over them, no cache)."""
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([ids], device=self.device), logits_to_keep=1)
        return out.logits[0, -1].float()

    def forward_features(
        self,
        input_ids: Tensor,
        cache: Any,
        layers: Sequence[int],
        want_hidden: bool = False,
        logits_to_keep: int = 0,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """:meth:`forward` that also returns the hidden states of ``layers`` (indices into transformers'
        ``hidden_states``: 0 = the embeddings, ``i`` = after decoder layer ``i``) at every new position.

        Returns:
            ``(logits, hidden, features)``: as :meth:`forward`, plus ``features [B, n, len(layers), H]`` in the
            model's dtype (None when ``layers`` is empty).
        """
        if position_ids is None and self.takes_positions:  # (as generate: some models number from 0 otherwise)
            position_ids = consecutive_positions(cache, input_ids.shape[1], input_ids.device).expand(
                input_ids.shape[0], -1)
        out = self.model(
            input_ids=input_ids, cache=cache, use_cache=True, output_hidden_states=bool(want_hidden or layers),
            logits_to_keep=logits_to_keep, attention_mask=attention_mask, position_ids=position_ids,
        )
        hidden = out.hidden_states[-1] if want_hidden else None
        feats = torch.stack([out.hidden_states[i] for i in layers], 2) if layers else None
        return out.logits, hidden, feats
