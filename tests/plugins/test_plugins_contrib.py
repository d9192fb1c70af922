"""contrib/specframe-recall as an installed distribution would be seen (a dist-info with its entry point on
sys.path, the module from contrib/): selectable by name with no other change, listed by `specframe plugins`,
and exact. (The real `pip install` into a fresh venv is the closing check of issue #4.)"""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

import specframe
from specframe.cli import app
from specframe.registry import ALLOW_ENV

from tests.fakes import ROOT

CONTRIB = ROOT / "contrib" / "specframe-recall"
PROMPT = [11, 4, 9, 0, 15, 2, 6, 13, 4, 9]


@pytest.fixture
def recall_installed(fake_dist, monkeypatch):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    monkeypatch.syspath_prepend(str(CONTRIB))
    fake_dist("specframe-recall", "0.1.0", {"recall": "specframe_recall"}, {})
    yield
    sys.modules.pop("specframe_recall", None)


def test_recall_is_listed_by_specframe_plugins(recall_installed):
    doc = json.loads(CliRunner().invoke(app, ["plugins", "--json"]).stdout)
    (entry,) = [p for p in doc["plugins"] if p["distribution"] == "specframe-recall"]
    assert entry["version"] == "0.1.0" and [p["name"] for p in entry["proposers"]] == ["recall"]
    assert [o["option"] for o in entry["proposers"][0]["config"]] == ["k", "min_n", "max_n", "max_outputs"]


def test_recall_drafts_a_repeated_request_from_its_earlier_output(recall_installed, specframe_tiny_target):
    sf = specframe.load(target=specframe_tiny_target, proposers=[{"name": "recall", "k": 6}])
    reference = specframe.load(target=specframe_tiny_target, proposers=[{"name": "none"}]).generate(
        PROMPT, max_new_tokens=24)["token_ids"]
    first = sf.generate_result(PROMPT, max_new_tokens=24)
    second = sf.generate_result(PROMPT, max_new_tokens=24)  # the same instance serves both requests
    assert first.token_ids == second.token_ids == reference
    # 24 tokens in 4 verification steps: 6 drafted + 1 bonus, three times, then 2 + 1; nothing rejected
    assert second.metrics.target_forwards == 4 and second.metrics.accepted_nodes == 20
    assert second.metrics.drafted_nodes == 20
