"""Fixtures every test folder uses (see :mod:`tests.fakes` for the builders they use), and the test device.

The device: ``--device cuda`` (or ``cpu``, ``cuda:1``), else the environment variable ``SPECFRAME_TEST_DEVICE``, else
the CPU. The option is written into the environment variable for the session, so the fakes' builders
(:func:`tests.fakes.test_device`), the kit's tiny target and any subprocess follow it. Tests marked ``cuda`` are
skipped without a CUDA device; ``pytest -m device_subset --device cuda`` runs the first CUDA subset.
"""

from __future__ import annotations

import os

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from specframe.target.hf import Target
from specframe.testing.tiny import DEVICE_ENV

from tests.fakes import ARCHS, VOCAB, build_model, build_tokenizer
from tests.fakes import test_device as current_test_device

_ENV_BEFORE = "_specframe_test_device_env_before"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device", default=None, dest="specframe_test_device", metavar="DEVICE",
        help=f"torch device the tests' models run on (cpu, cuda, cuda:1); default ${DEVICE_ENV}, else cpu",
    )


def resolve_device(option: str | None, env: str | None) -> torch.device:
    """The test device: ``option`` (``--device``) wins, then ``env`` (``$SPECFRAME_TEST_DEVICE``), then the CPU."""
    for value in (option, env):
        if value and value.strip():
            try:
                return torch.device(value.strip())
            except RuntimeError as exc:
                raise pytest.UsageError(f"test device {value!r} is not a torch device: {exc}") from None
    return torch.device("cpu")


def pytest_configure(config: pytest.Config) -> None:
    device = resolve_device(config.getoption("specframe_test_device", None), os.environ.get(DEVICE_ENV))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"test device {device} asked for, but torch sees no CUDA device")
    setattr(config, _ENV_BEFORE, os.environ.get(DEVICE_ENV))
    os.environ[DEVICE_ENV] = str(device)


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, _ENV_BEFORE):
        return
    before = getattr(config, _ENV_BEFORE)
    if before is None:
        os.environ.pop(DEVICE_ENV, None)
    else:
        os.environ[DEVICE_ENV] = before


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests marked ``cuda`` when torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def test_device() -> torch.device:
    """The torch device the tests' models live on (``--device``, else ``$SPECFRAME_TEST_DEVICE``, else the CPU)."""
    return current_test_device()


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
