"""specframe.services: what the engine offers a plugin beyond the contracts.

:mod:`specframe` holds what every user and plugin author needs (``load``, the contracts, the combining base classes,
the base errors); this module holds the rest a plugin *may* build on — helpers, shared machinery and the heavier
services a learned or model-backed proposer reuses instead of writing again. Every name in ``__all__`` is public
and keeps its meaning across minor versions, like :mod:`specframe`'s; the modules behind it (``specframe.target``,
``specframe.learned``, ...) are the implementation and may move. ::

    from specframe.services import TokenTrie, folder_key, probs_from_logits, shared

It is one module rather than several (``specframe.models``, ``specframe.learned``, ...) so that a plugin's imports
name two places at most, the same for every kind of service; it is called *services* because everything here is
something specframe does for a plugin, not something a plugin implements (that is :mod:`specframe`). The errors
are in :mod:`specframe.errors` (every ``SpecframeError`` subclass, public), except ``DatastoreError``, which belongs
to the datastores here.

The names, by group (the first three groups are light and imported with the module; the rest load on first use,
since they pull in transformers, safetensors, ctypes or the engine):

- token trees and probabilities: ``TokenTrie`` (a deduplicating ``(parent, token) -> node`` trie that builds a
  :class:`specframe.DraftTree`), ``children_of``, ``node_depths`` (a draft's shape), ``probs_from_logits`` (apply
  ``DecodeState.sampling``'s warp to a drafter's logits), ``block_tree`` (a block proposer's chain and per-slot
  candidates as one tree, best paths first);
- the target's cost curve v(n): ``CostCurve`` (the type of ``TargetInfo.cost``), ``v_at``;
- tool calls and reasoning in a model's own text (a server's ``tool_choice: auto`` and ``reasoning_content``):
  ``ToolParser``, ``StreamingToolParser``, ``ToolCall``, ``ToolCallDelta``, ``ContentDelta`` and the format helpers
  ``call_from_json``, ``calls_from_json``, ``decode_json_prefix``, ``json_arguments``, ``new_call_id``,
  ``join_content``, ``tool_call_schema``, ``lark_json``, ``lark_literal``;
  ``ReasoningParser``, ``StreamingReasoningParser``, ``ReasoningDelta`` (see docs/tool-calling.md);
- what requests share: ``shared(key, build)`` (weights loaded once per process), ``folder_key`` (the key's folder
  part);
- a draft model's KV cache: ``new_cache``, ``cache_length``, ``rollback``, ``compact``;
- the target drafting with part of itself: ``skipping``, ``decoder_layers``, ``check_skip`` (layer skipping),
  ``cached_skip_choice``, ``SkipChoice`` (the per-machine searched choice);
- two tokenizers over one text: ``TextBridge``, ``check_lossless``, ``shared_tokens``;
- learned drafters' networks: ``EagleDrafter``, ``KVBuffer``, ``MedusaHeads``, ``is_small_draft``,
  ``load_small_draft``;
- drafters in published formats: EAGLE-3 (``Eagle3Drafter``, ``load_eagle3``), Medusa (``PublishedMedusa``,
  ``load_medusa``), a target's MTP layers (``load_mtp``, ``mtp_layer_count``), DFlash / DFlash2 block drafters
  (``DFlashDrafter``, ``load_dflash``), PARD parallel drafts' mask token (``pard_mask_token``, ``PARD_MASK_FIELD``);
- model lookup: ``resolve_model``, ``load_model``, ``model_directory``, ``tokenizer_directory``, ``file_sha256``,
  ``DRAFT_SUFFIX``;
- retrieval datastores: ``Datastore``, ``DatastoreError``, ``Retrieval``, ``default_datastore``, ``tokenizer_info``;
- llama.cpp: ``import_llama_cpp``, ``LlamaModel``, ``LlamaContext``;
- the registry: ``build_registry`` (plugins passed in without installing them), ``Registry`` (pass it as
  ``specframe.load(..., registry=...)``);
- the decode loop itself: ``Engine`` (what ``lease.engine`` is; see docs/how-it-works.md).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .block_drafts import block_tree
from .contracts.reasoning import ReasoningDelta, ReasoningParser, StreamingReasoningParser
from .contracts.tool_formats import (
    call_from_json,
    calls_from_json,
    decode_json_prefix,
    json_arguments,
    lark_json,
    lark_literal,
    tool_call_schema,
)
from .contracts.tool_parsing import (
    ContentDelta,
    StreamingToolParser,
    ToolCall,
    ToolCallDelta,
    ToolParser,
    join_content,
    new_call_id,
)
from .sampling import probs_from_logits
from .shared_weights import folder_key, shared
from .target.cost import CostCurve, v_at
from .token_tree import TokenTrie, children_of, node_depths

# name -> module: imported on first use (these pull in transformers, safetensors, ctypes or the engine)
_LAZY = {
    "new_cache": ".target.kv_cache", "cache_length": ".target.kv_cache", "rollback": ".target.kv_cache",
    "compact": ".target.kv_cache",
    "skipping": ".target.layer_skip", "decoder_layers": ".target.layer_skip", "check_skip": ".target.layer_skip",
    "cached_skip_choice": ".target.skip_search", "SkipChoice": ".target.skip_search",
    "TextBridge": ".learned.crossvocab", "check_lossless": ".learned.crossvocab",
    "shared_tokens": ".learned.crossvocab",
    "EagleDrafter": ".learned.eagle_drafter", "KVBuffer": ".learned.eagle_drafter",
    "MedusaHeads": ".learned.medusa_heads",
    "is_small_draft": ".learned.small_draft", "load_small_draft": ".learned.small_draft",
    "Eagle3Drafter": ".learned.eagle3", "load_eagle3": ".learned.eagle3",
    "PublishedMedusa": ".learned.medusa_published", "load_medusa": ".learned.medusa_published",
    "load_mtp": ".learned.mtp", "mtp_layer_count": ".learned.mtp",
    "DFlashDrafter": ".learned.dflash", "load_dflash": ".learned.dflash",
    "pard_mask_token": ".learned.pard", "PARD_MASK_FIELD": ".learned.pard",
    "resolve_model": ".target.models", "load_model": ".target.models", "model_directory": ".target.models",
    "tokenizer_directory": ".target.models", "file_sha256": ".target.models", "DRAFT_SUFFIX": ".target.models",
    "Datastore": ".datastore", "DatastoreError": ".datastore", "Retrieval": ".datastore",
    "default_datastore": ".datastore.default", "tokenizer_info": ".datastore.sources",
    "import_llama_cpp": ".target.llamacpp.binding", "LlamaModel": ".target.llamacpp.binding",
    "LlamaContext": ".target.llamacpp.binding",
    "build_registry": ".registry", "Registry": ".registry",
    "Engine": ".decode.engine",
}

__all__ = [
    "CostCurve", "TokenTrie", "block_tree", "children_of", "folder_key", "node_depths", "probs_from_logits", "shared", "v_at",
    "ContentDelta", "ReasoningDelta", "ReasoningParser", "StreamingReasoningParser", "StreamingToolParser", "ToolCall",
    "ToolCallDelta", "ToolParser", "call_from_json", "calls_from_json", "decode_json_prefix", "join_content",
    "json_arguments", "lark_json", "lark_literal", "new_call_id", "tool_call_schema",
    *_LAZY,
]


def __getattr__(name: str) -> Any:  # PEP 562: heavy imports only when used
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'specframe.services' has no attribute {name!r}")
    return getattr(import_module(module, "specframe"), name)  # (not cached here: a patched module attribute is seen)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
