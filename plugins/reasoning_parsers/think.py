"""``<think>...</think>`` reasoning (vLLM's ``deepseek_r1`` and ``qwen3`` reasoning parsers, SGLang's
``deepseek-r1`` and ``qwen3``).

- ``deepseek_r1`` (DeepSeek-R1, R1-0528, the R1 distills, QwQ): the template opens ``<think>`` in the prompt, so an
  output that does not open it starts inside the reasoning; one with no ``</think>`` is all reasoning (cut off while
  thinking). https://huggingface.co/deepseek-ai/DeepSeek-R1
- ``qwen3`` (Qwen3 hybrid models): the model writes ``<think>`` itself when thinking, and nothing when the template
  turned thinking off (``enable_thinking=False`` puts an empty span in the prompt), so an output without ``<think>``
  is all content. Qwen3's ``-Thinking-2507`` templates open ``<think>`` in the prompt: construct the parser with
  ``starts_inside=True`` there (:meth:`specframe.services.ReasoningParser.for_prompt` does it from the prompt).
  A ``<tool_call>`` written straight from the thinking ends it (vLLM's ``qwen3`` does the same).
  https://huggingface.co/Qwen/Qwen3-8B

Worked example (qwen3): ``<think>The user greets.</think>\\n\\nHello!`` -> reasoning "The user greets.", content
"Hello!".
"""

from __future__ import annotations

from specframe.services import ReasoningParser


class DeepSeekR1ReasoningParser(ReasoningParser):
    """``<think>`` opened by the prompt (or the model), closed by ``</think>``."""

    name = "deepseek_r1"
    starts_inside = True
    priority = 10

    @classmethod
    def detect(cls, chat_template: str) -> bool:
        """DeepSeek-R1-style templates: they use ``<think>`` and DeepSeek's ``<｜Assistant｜>`` marker."""
        return "<think>" in chat_template and "<｜Assistant｜>" in chat_template


class Qwen3ReasoningParser(ReasoningParser):
    """``<think>...</think>`` written by the model, or no reasoning at all."""

    name = "qwen3"
    starts_inside = False
    implicit_ends = ("<tool_call>",)
    priority = 5

    @classmethod
    def detect(cls, chat_template: str) -> bool:
        """Templates that use ``<think>``/``</think>`` (Qwen3's, and other ChatML thinking models)."""
        return "<think>" in chat_template and "</think>" in chat_template
