"""specframe: model-agnostic speculative decoding with pluggable proposers.

Public API::

    import specframe
    sf = specframe.load(model="smollm2-135m-instruct", proposers=[{"name": "ngram"}])
    record = sf.generate("Summarize: ...", max_new_tokens=128)   # same dict as `specframe generate --json`

**This module is the public face**: what a user needs to run specframe and what a plugin author needs to write a
proposer, a verifier, a merge policy or a router. Two submodules complete it: :mod:`specframe.services` (what the
engine offers a plugin beyond the contracts: token tries, the cost curve, shared weights, KV caches, learned
drafters, model lookup, datastores, llama.cpp, the registry, the engine) and :mod:`specframe.errors` (every
``SpecframeError`` subclass, for code that catches one kind). Plugins (the built-in ones and ``contrib/``
included) import from these three only. Every name in ``__all__`` here and in :mod:`specframe.services`, and
every error class of :mod:`specframe.errors`, is public and keeps its meaning across minor versions. The modules
behind them (``specframe.decode``, ``specframe.target``, ...) are the implementation and may move. The names,
each with why it is here:

- running: ``load`` (build an instance from a config or keywords: the one entry point), ``Specframe`` (what it
  returns: ``generate``, ``generate_result``, ``generate_batch``, ``lease``), ``SamplingParams`` (a request's
  temperature / top-p / top-k / seed; a proposer reads it as ``DecodeState.sampling``);
- writing a proposer: ``ProposerBase`` (the class to subclass), ``ProposerConfig`` (the base of its pydantic
  options), ``DraftTree`` (what ``propose`` returns), ``DecodeState`` (what ``propose`` reads), ``TargetInfo``
  (what ``__init__`` is told about the target: vocabulary, EOS ids, context, dtype, cost, tree support),
  ``VerifyOutcome`` (what ``on_verified`` hears), ``Proposer`` and ``Capabilities`` (the protocol the registry
  checks, for a proposer that does not subclass ``ProposerBase``, and the flags the engine reads from it),
  ``hookimpl`` (marks the hook that registers the classes);
- writing a verifier: ``Verifier`` (its protocol), ``VerifyResult`` (what ``verify`` returns), ``TargetModel``
  (the target as the engine uses it: what a test or replay target implements);
- combining proposers: ``MergePolicyBase``, ``MergePolicyConfig`` and ``RouterBase``, ``RouterConfig`` (the
  classes to subclass and their options), ``MergePolicy`` and ``Router`` (their protocols), ``StepReport`` and
  ``ProposerStep`` (what a step reports to them, per proposer);
- errors: ``SpecframeError`` (the base of every error specframe raises on purpose: what a user catches),
  ``ConfigError`` (what a plugin raises for a setting the user must fix: one error line, not a plugin fault),
  ``DraftError`` (a draft that breaks the contract: what the conformance kit reports); the others are in
  :mod:`specframe.errors`.

The names this module used to export that moved to :mod:`specframe.services` or :mod:`specframe.errors`
still resolve here, with a ``DeprecationWarning`` naming their new place, until specframe 0.3.0
(:data:`MOVED_UNTIL`), which removes them; they are not in ``__all__`` nor ``dir(specframe)``.
"""

from __future__ import annotations

import sys
import warnings
from importlib import import_module
from typing import Any

from . import services  # (and specframe.errors, bound by the import below)
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
from .errors import ConfigError, DraftError, SpecframeError
from .hookspecs import hookimpl
from .sampling import SamplingParams

__version__ = "0.1.0"

# name -> module: imported on first use (the runtime pulls in transformers and the engine)
_LAZY = {"load": ".api", "Specframe": ".api"}

MOVED_UNTIL = "0.3.0"  # the release that removes the moved names below (0.1.0 and 0.2.x warn)

# name -> its public home now: the names this module exported before (they resolve, with a DeprecationWarning)
_MOVED = {
    **dict.fromkeys(services.__all__, "specframe.services"),
    **dict.fromkeys(("CacheError", "ModelNotInstalledError", "PluginContractError", "PluginError",
                     "ProposerTimeoutError", "TraceError"), "specframe.errors"),
}

__all__ = [
    "Capabilities", "ConfigError", "DecodeState", "DraftError", "DraftTree", "MergePolicy", "MergePolicyBase",
    "MergePolicyConfig", "Proposer", "ProposerBase", "ProposerConfig", "ProposerStep", "Router", "RouterBase",
    "RouterConfig", "SamplingParams", "SpecframeError", "StepReport", "TargetInfo", "TargetModel", "Verifier",
    "VerifyOutcome", "VerifyResult", "hookimpl", *_LAZY,
]


def __getattr__(name: str) -> Any:  # PEP 562: heavy imports only when used, moved names with a warning
    module = _LAZY.get(name)
    if module is not None:
        return getattr(import_module(module, __name__), name)  # (not cached here: a patched module attribute is seen)
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module 'specframe' has no attribute {name!r}")
    caller = sys._getframe(1).f_code
    if caller.co_name == "_handle_fromlist" and "importlib" in caller.co_filename:
        return getattr(import_module(home), name)  # its hasattr before `from specframe import name`, which warns next
    warnings.warn(f"specframe.{name} is moved: import it from {home} (the old name goes in specframe {MOVED_UNTIL})",
                  DeprecationWarning, stacklevel=2)
    return getattr(import_module(home), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
