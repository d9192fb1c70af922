"""Fixtures for the tool and reasoning parser tests: the built-in parsers by name, the recorded cases."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from specframe.registry import build_registry

CASES = json.loads((Path(__file__).with_name("vllm_cases.json")).read_text(encoding="utf-8"))["cases"]


@pytest.fixture(scope="session")
def registry():
    return build_registry()


def chunkings(text: str, seed: int, count: int = 6) -> list[list[str]]:
    """``count`` ways to cut ``text``: one character at a time, the whole text, and random cuts (seeded)."""
    rng = random.Random(seed)
    ways = [list(text), [text]]
    for _ in range(count - 2):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12)))) if len(text) > 1 else []
        ways.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])
    return ways
