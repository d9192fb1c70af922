"""Every causal-LM type of the installed transformers, as a tiny random float32 model, is a specframe target that
decodes token-identically to transformers' greedy ``generate`` under none / ngram / lookahead / layer-skip /
early-exit / retrieval, or is refused in one line that names the type and what it lacks (issue 52; the table:
``python scripts/decoder_sweep.py``). Types transformers itself cannot build or generate with are skipped."""

from __future__ import annotations

import pytest

from specframe.testing.decoder_sweep import PROPOSERS, check_type
from specframe.testing.decoder_types import causal_lm_types

# whole-type refusals and a word of each message (Target's one-line ConfigError)
REFUSED = {
    "openai-gpt": "takes no KV cache",
    "xlnet": "takes no KV cache",
    "reformer": "takes no KV cache",
    "minimax": "cache of its own",
    "xlstm": "takes no KV cache",
    "recurrent_gemma": "inside its layers",
    "moshi": "full causal",  # (measured: specframe.target.hf.MEASURED_INEXACT)
    "doge": "dynamic-mask attention",
}
# a model whose multi-token forward over a cache raises or differs from its one-token decoding (the load probe)
PROBE_REFUSED = "a forward of several new tokens over its cache"

@pytest.mark.parametrize("model_type", causal_lm_types())
def test_decoder_type_is_exact_or_refused_in_one_line(model_type):
    row = check_type(model_type, tokens=16)
    if row.status == "unbuildable":
        pytest.skip(f"transformers cannot build or generate with it here: {row.reason}")
    if row.status == "refused":
        assert "\n" not in row.reason and repr(model_type) in row.reason
        expected = REFUSED.get(model_type, PROBE_REFUSED)
        assert expected in row.reason, row.reason
        return
    assert model_type not in REFUSED, f"{model_type} is no longer refused: take it off REFUSED"
    assert row.status == "exact", row.cells
    assert set(row.cells) == set(PROPOSERS)


@pytest.mark.parametrize("model_type", ["moshi", "doge"])
def test_measured_inexact_types_still_diverge(model_type, monkeypatch):
    """The measured refusals stay honest: without them, each type still decodes other tokens than transformers
    (remove it from MEASURED_INEXACT when this fails)."""
    from specframe.target import hf

    monkeypatch.setattr(hf, "MEASURED_INEXACT", {})
    row = check_type(model_type, tokens=16)
    assert row.status == "broken", (model_type, row.status, row.cells)
