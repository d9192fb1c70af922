""""Until EOS" budgets: a ``max_new_tokens`` far beyond the context (``10**12``) sizes nothing by what was asked; it
gives the same tokens as a small budget when EOS comes first, and stops with ``length`` where the context ends. A
budget beyond int64 is one error line, before anything loads."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from specframe import cli
from specframe.acceptance import GreedyVerifier
from specframe.config import RequestSettings
from specframe.decode.engine import Engine
from specframe.target.hf import Target
from specframe_plugins.ngram import NgramConfig, NgramProposer

from tests.fakes import PROMPT, build_model, build_tokenizer, plain_generate

HUGE = 10**12  # 8 TB of int64 token ids if a buffer were sized by it


@pytest.fixture(scope="module")
def target():
    return Target(build_model("llama"), build_tokenizer())


def ngram_engine(target: Target) -> Engine:
    return Engine(target, [NgramProposer(NgramConfig(), target.info)], GreedyVerifier())


def test_a_huge_budget_with_an_eos_first_equals_a_small_one(monkeypatch):
    model = build_model("llama")
    reference = plain_generate(Target(model, build_tokenizer()), PROMPT, 64).token_ids
    eos = reference[20]
    j = reference.index(eos)  # the first time the EOS token is generated
    monkeypatch.setattr(model.generation_config, "eos_token_id", eos)
    target = Target(model, build_tokenizer())
    small = ngram_engine(target).generate(PROMPT, max_new_tokens=64)
    huge = ngram_engine(target).generate(PROMPT, max_new_tokens=HUGE)
    assert small.token_ids == reference[: j + 1] and small.finish_reason == "stop"
    assert (huge.token_ids, huge.text, huge.finish_reason) == (small.token_ids, small.text, small.finish_reason)


def test_a_huge_budget_stops_where_the_context_ends(target):
    room = target.max_context - len(PROMPT)
    result = ngram_engine(target).generate(PROMPT, max_new_tokens=HUGE)
    assert len(result.token_ids) == room and result.finish_reason == "length"
    assert result.token_ids == plain_generate(target, PROMPT, room).token_ids


def test_buffers_are_sized_by_the_context(target, monkeypatch):
    sizes: list[int] = []
    real_empty = torch.empty

    def recording_empty(*shape, **kwargs):
        dims = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        sizes.append(int(torch.Size(dims).numel()))
        return real_empty(*shape, **kwargs)

    monkeypatch.setattr(torch, "empty", recording_empty)
    ngram_engine(target).generate(PROMPT, max_new_tokens=HUGE)
    assert sizes and max(sizes) <= target.max_context * 64  # nothing near HUGE was asked for


@pytest.mark.parametrize("value", [2**63, 10**30])
def test_a_budget_beyond_int64_is_one_line(value, no_model_load):
    res = CliRunner().invoke(cli.app, ["generate", "hi", "--max-new-tokens", str(value)])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --max-new-tokens must be a whole number in [1, 2**63)")
    with pytest.raises(Exception, match="max_new_tokens"):
        RequestSettings(max_new_tokens=value)


def test_a_huge_budget_through_the_python_api(target):
    import specframe
    from specframe.registry import build_registry

    sf = specframe.load(target=target, registry=build_registry())
    assert sf.generate(PROMPT, max_new_tokens=HUGE)["finish_reason"] == "length"
