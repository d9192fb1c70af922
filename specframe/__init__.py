"""specframe: model-agnostic speculative decoding with pluggable proposers.

Public API::

    import specframe
    sf = specframe.load(model="smollm2-135m-instruct", proposers=[{"name": "ngram"}])
    record = sf.generate("Summarize: ...", max_new_tokens=128)   # same dict as `specframe generate --json`

**This module is the public face.** Plugin authors (the built-in plugins and ``contrib/`` included) import only
from ``specframe``; every name in ``__all__`` is public and keeps its meaning across minor versions. The modules
behind it (``specframe.decode``, ``specframe.target``, ...) are the implementation and may move. The names, by group:

- contracts: ``DraftTree``, ``DecodeState``, ``Proposer``, ``ProposerBase``, ``ProposerConfig``, ``TargetInfo``,
  ``TargetModel``, ``Verifier``, ``VerifyOutcome``, ``VerifyResult``, ``Capabilities``, ``hookimpl``;
- combining several proposers: ``MergePolicy``, ``MergePolicyBase``, ``MergePolicyConfig``, ``Router``,
  ``RouterBase``, ``RouterConfig``, ``ProposerStep``, ``StepReport``;
- token trees and probabilities: ``TokenTrie``, ``children_of``, ``node_depths``, ``SamplingParams``,
  ``probs_from_logits``;
- the target's cost curve v(n): ``CostCurve``, ``v_at``;
- what requests share: ``shared``, ``folder_key``;
- errors: ``SpecframeError`` and its subclasses (``ConfigError``, ``DraftError``, ...);
- services heavier to import, loaded on first use: a draft's KV cache (``new_cache``, ``cache_length``,
  ``rollback``, ``compact``), two tokenizers over one text (``TextBridge``, ``check_lossless``, ``shared_tokens``),
  the learned drafters' networks (``EagleDrafter``, ``KVBuffer``, ``MedusaHeads``, published EAGLE-3 drafters
  (``Eagle3Drafter``, ``load_eagle3``) Medusa heads (``PublishedMedusa``, ``load_medusa``) and a target's MTP layers (``load_mtp``,
  ``mtp_layer_count``), ``is_small_draft``,
  ``load_small_draft``), model lookup (``resolve_model``, ``load_model``, ``model_directory``,
  ``tokenizer_directory``, ``file_sha256``, ``DRAFT_SUFFIX``), retrieval datastores (``Datastore``,
  ``DatastoreError``, ``Retrieval``, ``default_datastore``, ``tokenizer_info``), llama.cpp (``import_llama_cpp``,
  ``LlamaModel``, ``LlamaContext``), the registry (``build_registry``, ``Registry``: plugins passed in without
  installing them) and the runtime (``load``, ``Specframe``, ``Engine``).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .contracts.combining import (
    MergePolicy,
    MergePolicyBase,
    MergePolicyConfig,
    ProposerStep,
    Router,
    RouterBase,
    RouterConfig,
    StepReport,
)
from .contracts import (
    Capabilities,
    DecodeState,
    DraftTree,
    Proposer,
    ProposerBase,
    ProposerConfig,
    TargetInfo,
    TargetModel,
    Verifier,
    VerifyOutcome,
    VerifyResult,
)
from .errors import (
    CacheError,
    ConfigError,
    DraftError,
    ModelNotInstalledError,
    PluginContractError,
    PluginError,
    ProposerTimeoutError,
    SpecframeError,
    TraceError,
)
from .hookspecs import hookimpl
from .sampling import SamplingParams, probs_from_logits
from .shared_weights import folder_key, shared
from .target.cost import CostCurve, v_at
from .token_tree import children_of, node_depths
from .token_tree import TokenTrie

__version__ = "0.1.0"

# name -> module: imported on first use (these pull in transformers, safetensors, ctypes or the engine)
_LAZY = {
    "new_cache": ".target.kv_cache", "cache_length": ".target.kv_cache", "rollback": ".target.kv_cache",
    "compact": ".target.kv_cache",
    "skipping": ".target.layer_skip", "decoder_layers": ".target.layer_skip", "check_skip": ".target.layer_skip",
    "cached_skip_choice": ".target.skip_search", "SkipChoice": ".target.skip_search",
    "TextBridge": ".learned.crossvocab", "check_lossless": ".learned.crossvocab", "shared_tokens": ".learned.crossvocab",
    "EagleDrafter": ".learned.eagle_drafter", "KVBuffer": ".learned.eagle_drafter",
    "MedusaHeads": ".learned.medusa_heads",
    "Eagle3Drafter": ".learned.eagle3", "load_eagle3": ".learned.eagle3",
    "PublishedMedusa": ".learned.medusa_published", "load_medusa": ".learned.medusa_published",
    "load_mtp": ".learned.mtp", "mtp_layer_count": ".learned.mtp",
    "is_small_draft": ".learned.small_draft", "load_small_draft": ".learned.small_draft",
    "resolve_model": ".target.models", "load_model": ".target.models", "model_directory": ".target.models",
    "tokenizer_directory": ".target.models", "file_sha256": ".target.models", "DRAFT_SUFFIX": ".target.models",
    "Datastore": ".datastore", "DatastoreError": ".datastore", "Retrieval": ".datastore",
    "default_datastore": ".datastore.default", "tokenizer_info": ".datastore.sources",
    "import_llama_cpp": ".target.llamacpp.binding", "LlamaModel": ".target.llamacpp.binding",
    "LlamaContext": ".target.llamacpp.binding",
    "load": ".api", "Specframe": ".api", "Engine": ".decode.engine",
    "build_registry": ".registry", "Registry": ".registry",
}

__all__ = [
    "CacheError", "Capabilities", "ConfigError", "CostCurve", "DecodeState", "DraftError", "DraftTree",
    "MergePolicy", "MergePolicyBase", "MergePolicyConfig", "ModelNotInstalledError", "PluginContractError",
    "PluginError", "Proposer", "ProposerBase", "ProposerConfig", "ProposerStep", "ProposerTimeoutError", "Router",
    "RouterBase", "RouterConfig", "SamplingParams", "SpecframeError", "StepReport", "TargetInfo", "TargetModel",
    "TokenTrie", "TraceError", "Verifier", "VerifyOutcome", "VerifyResult", "children_of", "folder_key", "hookimpl",
    "node_depths", "probs_from_logits", "shared", "v_at", *_LAZY,
]


def __getattr__(name: str) -> Any:  # PEP 562: heavy imports only when used
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'specframe' has no attribute {name!r}")
    return getattr(import_module(module, __name__), name)  # (not cached here: a patched module attribute is seen)
