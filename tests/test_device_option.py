"""The test device option (issue 69): ``--device`` beats ``$SPECFRAME_TEST_DEVICE`` beats the CPU; the fakes' models
and the kit's tiny target land on it; tests marked ``cuda`` are skipped without a CUDA device."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from specframe.sampling import SamplingParams
from specframe.testing.tiny import (
    DEVICE_ENV,
    default_device,
    first_two_tokens,
    last_hidden,
    reference_greedy,
    tiny_target,
)

from tests import conftest
from tests.fakes import ROOT, build_bpe_model, build_bpe_tokenizer, build_model, test_device

pytestmark = pytest.mark.device_subset


def _same(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` are the same device here (a model's parameters report the index)."""
    return a.type == b.type and (a.index or 0) == (b.index or 0)


# --- precedence ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("option, env, expected", [
    (None, None, "cpu"),
    (None, "", "cpu"),
    (None, "cpu", "cpu"),
    (None, "cuda:1", "cuda:1"),
    ("cpu", "cuda", "cpu"),  # the option wins
    ("cuda", "cpu", "cuda"),
    ("  cpu ", None, "cpu"),
])
def test_the_option_wins_over_the_environment_then_the_cpu(option, env, expected):
    assert conftest.resolve_device(option, env) == torch.device(expected)


def test_a_bad_device_is_a_usage_error():
    with pytest.raises(pytest.UsageError, match="not a torch device"):
        conftest.resolve_device("gpu0", None)


def _config(option):
    return SimpleNamespace(getoption=lambda name, default=None: option)


def test_configure_writes_the_device_into_the_environment_and_unconfigure_restores_it(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "meta")  # what was there before the (inner) session
    config = _config("cpu")
    conftest.pytest_configure(config)
    assert os.environ[DEVICE_ENV] == "cpu" and test_device() == torch.device("cpu")
    conftest.pytest_unconfigure(config)
    assert os.environ[DEVICE_ENV] == "meta"
    monkeypatch.delenv(DEVICE_ENV)
    config = _config(None)
    conftest.pytest_configure(config)
    assert os.environ[DEVICE_ENV] == "cpu"
    conftest.pytest_unconfigure(config)
    assert DEVICE_ENV not in os.environ


def test_asking_for_cuda_without_cuda_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(pytest.UsageError, match="no CUDA device"):
        conftest.pytest_configure(_config("cuda"))


def test_the_session_sees_one_device(request):
    fixture = request.getfixturevalue("test_device")  # (the name test_device is the fakes' function here)
    assert os.environ[DEVICE_ENV] == str(fixture)
    assert fixture == test_device() == default_device()


def test_the_environment_variable_is_read_at_each_call(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "meta")
    assert test_device() == default_device() == torch.device("meta")
    monkeypatch.setenv(DEVICE_ENV, "")
    assert test_device() == torch.device("cpu")
    monkeypatch.delenv(DEVICE_ENV)
    assert test_device() == torch.device("cpu")


def test_the_option_beats_the_environment_in_a_real_session():
    """``--device cpu`` with a bad ``$SPECFRAME_TEST_DEVICE``: the option wins, and the session's tests see cpu."""
    env = {**os.environ, DEVICE_ENV: "not-a-device", "SPECFRAME_TEST_EXPECT": "cpu"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--device", "cpu",
         f"{__file__}::test_inner_session_device"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "1 passed" in out.stdout


def test_inner_session_device(test_device):
    """Run by the test above in a child pytest (skipped otherwise)."""
    expected = os.environ.get("SPECFRAME_TEST_EXPECT")
    if expected is None:
        pytest.skip("only run inside test_the_option_beats_the_environment_in_a_real_session")
    assert test_device == torch.device(expected) and os.environ[DEVICE_ENV] == expected


# --- the fakes and the kit follow it ------------------------------------------------------------------------------


def test_the_fakes_models_land_on_the_test_device(test_device, target, llama_model):
    for model in (build_model("llama"), build_model("qwen2-sliding"), llama_model, target.model,
                  build_bpe_model(build_bpe_tokenizer())):
        assert _same(next(model.parameters()).device, test_device)
        assert _same(model.device, test_device)
    assert _same(target.device, test_device)


def _bare_tiny_models(monkeypatch) -> None:
    """Make tiny_target return its bare model: a Target cannot be built on the meta device (no data to read)."""
    import specframe.testing.tiny as tiny

    monkeypatch.setattr(tiny, "Target", lambda model, tokenizer, name: model)


def test_the_builders_follow_the_environment_variable_outside_fixtures(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "meta")  # a device every machine has, where no model can run
    assert build_model("llama").device == torch.device("meta")
    assert build_bpe_model(build_bpe_tokenizer()).device == torch.device("meta")
    _bare_tiny_models(monkeypatch)
    assert tiny_target().device == torch.device("meta")
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert build_model("llama").device == torch.device("cpu")
    assert tiny_target().device == torch.device("cpu")


def test_the_kits_tiny_target_takes_a_device_and_defaults_to_the_test_device(test_device, specframe_tiny_target,
                                                                             monkeypatch):
    assert _same(tiny_target().device, test_device)
    assert _same(specframe_tiny_target.device, test_device)
    assert tiny_target(device="cpu").device == torch.device("cpu")
    _bare_tiny_models(monkeypatch)
    assert tiny_target(device=torch.device("meta")).device == torch.device("meta")


def test_a_seed_gives_the_same_weights_on_every_device(test_device):
    here, cpu = tiny_target(seed=3, device=test_device), tiny_target(seed=3, device="cpu")
    for a, b in zip(here.model.parameters(), cpu.model.parameters()):
        assert torch.equal(a.detach().cpu(), b.detach())


def test_the_kits_references_feed_the_target_on_its_device_and_answer_on_the_cpu(test_device):
    target = tiny_target(device=test_device)
    prompt = [1, 2, 3, 4, 5]
    greedy = reference_greedy(target, prompt, 4)
    assert isinstance(greedy, list) and len(greedy) == 4
    exact = first_two_tokens(target, prompt, SamplingParams(temperature=1.0))
    assert exact.device == torch.device("cpu") and exact.shape == (16, 16)
    assert abs(float(exact.sum()) - 1.0) < 1e-6
    hidden = last_hidden(target, prompt)
    assert _same(hidden.device, test_device) and hidden.shape == (1, 32)


# --- the cuda marker ----------------------------------------------------------------------------------------------


class _Item:
    def __init__(self, *markers: str) -> None:
        self.markers = {m: getattr(pytest.mark, m).mark for m in markers}
        self.added: list = []

    def get_closest_marker(self, name):
        return self.markers.get(name)

    def add_marker(self, marker):
        self.added.append(marker)


def test_the_cuda_marker_skips_without_cuda(monkeypatch):
    items = [_Item("cuda"), _Item(), _Item("device_subset"), _Item("cuda", "device_subset")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    conftest.pytest_collection_modifyitems(None, items)
    skipped = [bool(i.added) for i in items]
    assert skipped == [True, False, False, True]
    assert items[0].added[0].mark.name == "skip" and "CUDA" in items[0].added[0].mark.kwargs["reason"]


def test_the_cuda_marker_runs_with_cuda(monkeypatch):
    items = [_Item("cuda"), _Item()]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    conftest.pytest_collection_modifyitems(None, items)
    assert not any(i.added for i in items)


@pytest.mark.cuda
def test_a_cuda_test_runs_only_where_there_is_cuda():
    """Skipped (not failed) on a machine without CUDA: the marker's skip, end to end."""
    assert torch.cuda.is_available()
    x = torch.ones(2, device="cuda")
    assert float(x.sum()) == 2.0
