"""Fixtures every test folder uses (see :mod:`tests.fakes` for the builders they use)."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from specframe.target.hf import Target

from tests.fakes import ARCHS, VOCAB, build_model, build_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    tok = build_tokenizer()
    assert len(tok) == VOCAB
    return tok


@pytest.fixture(scope="session", params=ARCHS)
def model(request):
    """One tiny model per architecture, shared by the session; tests must not change its weights."""
    return build_model(request.param)


@pytest.fixture(scope="session")
def llama_model():
    return build_model("llama")


@pytest.fixture
def target(model, tokenizer) -> Target:
    return Target(model, tokenizer)


@pytest.fixture
def llama_target(llama_model, tokenizer) -> Target:
    return Target(llama_model, tokenizer)


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if anything tries to load a real model (bad input must be refused before that)."""
    import specframe.api
    import specframe.target.loader
    import specframe.target.models

    def forbidden(*args, **kwargs):
        raise AssertionError("a model load was attempted")

    monkeypatch.setattr(specframe.target.loader, "load_target", forbidden)
    monkeypatch.setattr(specframe.target.models, "load_model", forbidden)
    monkeypatch.setattr(specframe.api, "load", forbidden)
