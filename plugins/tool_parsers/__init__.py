"""The built-in tool-call parsers, one format a module: :mod:`.hermes`, :mod:`.xlam` (and SmolLM2-1.7B's list
form), :mod:`.llama3_json`, :mod:`.mistral`, :mod:`.pythonic`, :mod:`.qwen3_xml`, :mod:`.harmony` (gpt-oss,
``openai``) and :mod:`.generic` (a JSON envelope for models with no tool format). Each is a
:class:`specframe.services.ToolParser`; this module registers them all (entry point ``tool-parsers``)."""

from __future__ import annotations

from specframe import hookimpl

from .generic import GenericToolParser
from .harmony import HarmonyToolParser
from .hermes import HermesToolParser
from .llama3_json import Llama3JsonToolParser
from .mistral import MistralToolParser
from .pythonic import PythonicToolParser
from .qwen3_xml import Qwen3XmlToolParser
from .xlam import XlamToolParser

PARSERS = (HermesToolParser, XlamToolParser, Llama3JsonToolParser, MistralToolParser, PythonicToolParser,
           Qwen3XmlToolParser, HarmonyToolParser, GenericToolParser)


@hookimpl
def specframe_register_tool_parsers(register) -> None:
    for cls in PARSERS:
        register(cls)


__all__ = [cls.__name__ for cls in PARSERS] + ["PARSERS", "specframe_register_tool_parsers"]
