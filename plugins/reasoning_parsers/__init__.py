"""The built-in reasoning parsers: :mod:`.think` (``deepseek_r1`` and ``qwen3``: a ``<think>...</think>`` span) and
:mod:`.harmony` (``openai_gptoss``: gpt-oss's analysis channel). Each is a
:class:`specframe.services.ReasoningParser`; this module registers them (entry point ``reasoning-parsers``)."""

from __future__ import annotations

from specframe import hookimpl

from .harmony import HarmonyReasoningParser
from .think import DeepSeekR1ReasoningParser, Qwen3ReasoningParser

PARSERS = (DeepSeekR1ReasoningParser, Qwen3ReasoningParser, HarmonyReasoningParser)


@hookimpl
def specframe_register_reasoning_parsers(register) -> None:
    for cls in PARSERS:
        register(cls)


__all__ = [cls.__name__ for cls in PARSERS] + ["PARSERS", "specframe_register_reasoning_parsers"]
