"""Fixtures of the combining tests (the builders are in :mod:`tests.fakes`)."""

from __future__ import annotations

import pytest

from specframe.target.hf import Target

from tests.fakes import ARCHS, COMBINING_N_NEW, PROMPT, PROMPT_2, build_model, build_tokenizer, draft_dir, hf_greedy


@pytest.fixture(scope="module")
def envs(tmp_path_factory) -> dict:
    """Per architecture: (target, greedy references of PROMPT and PROMPT_2, a draft folder); one per test module."""
    root = tmp_path_factory.mktemp("combining")
    out = {}
    for arch in ARCHS:
        model = build_model(arch)
        target = Target(model, build_tokenizer(), name="specframe-test-combining")
        refs = [hf_greedy(model, p, COMBINING_N_NEW + 8) for p in (PROMPT, PROMPT_2)]
        out[arch] = (target, refs, draft_dir(root, arch))
    return out
