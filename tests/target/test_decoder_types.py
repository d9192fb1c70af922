"""``specframe.testing.decoder_types``: the tiny configs third parties build their tests on honour ``vocab_size``
(issue 65, 7: a rule captured the module's ``VOCAB`` at import, so every tiny config had 64 tokens whatever was asked)."""

from __future__ import annotations

import pytest
import torch

from specframe.testing.decoder_types import VOCAB, build_tiny, tiny_config

TYPES = ["llama", "gpt2", "qwen3_next", "mamba2"]  # dense, learned positions, hybrid, recurrent


def _text(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


@pytest.mark.parametrize("model_type", TYPES)
@pytest.mark.parametrize("vocab_size", [17, 100, 1000])
def test_tiny_config_has_the_vocabulary_asked_for(model_type, vocab_size):
    config = _text(tiny_config(model_type, vocab_size=vocab_size))
    assert config.vocab_size == vocab_size
    ids = {k: v for k, v in config.to_dict().items() if k.endswith("token_id") and isinstance(v, int)}
    assert all(0 <= v < vocab_size for v in ids.values()), ids
    model = build_tiny(model_type, vocab_size=vocab_size)
    prompt = torch.tensor([[1, 5, 9, vocab_size - 1]])
    with torch.no_grad():
        logits = model(input_ids=prompt, attention_mask=torch.ones_like(prompt)).logits
    assert logits.shape == (1, 4, vocab_size)


def test_the_default_vocabulary_is_unchanged_and_nothing_leaks_between_calls():
    tiny_config("llama", vocab_size=300)
    assert _text(tiny_config("llama")).vocab_size == VOCAB == 64
    assert [_text(tiny_config("llama", vocab_size=n)).vocab_size for n in (300, 32, 300)] == [300, 32, 300]
