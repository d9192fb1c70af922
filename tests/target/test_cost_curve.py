"""The cost of a verification forward (:mod:`specframe.target.cost`): tokens expected per step at the reference
acceptance, the cost per token of plain and speculative decoding, and the cost curve v(n), interpolated over the
measured n and averaged over contexts."""

from __future__ import annotations

import pytest

from specframe.target.cost import CostCurve, expected_tokens, token_cost_ms

# --- expected tokens, cost per token, cost curve ----------------------------------------------------------------------


def test_expected_tokens():
    assert expected_tokens(1) == pytest.approx(1.0)
    assert expected_tokens(2) == pytest.approx(1.6)  # 1 + a
    assert expected_tokens(4, 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(8) == pytest.approx((1 - 0.6 ** 8) / 0.4)
    assert expected_tokens(32, 0.9) < 10.0  # bounded by 1 / (1 - a)


def test_token_cost_ms_plain_and_speculative():
    rows = {128: [10.0, 12.0, 14.0, 20.0, 40.0, 80.0], 512: [20.0, 22.0, 30.0, 30.0, 50.0, 90.0]}
    assert token_cost_ms(rows, speculative=False) == pytest.approx(15.0)  # mean T(1)
    # the first row's best is n = 4 (14 / 2.176), the second's n = 8 (30 / 2.458)
    per_ctx = [14.0 / expected_tokens(4), 30.0 / expected_tokens(8)]
    assert per_ctx == pytest.approx([6.4338, 12.2050], abs=1e-3)
    assert token_cost_ms(rows, speculative=True) == pytest.approx(sum(per_ctx) / 2)
    # where verification never pays, speculation is judged by plain decoding's T(1)
    steep = {128: [10.0, 100.0, 200.0, 400.0, 800.0, 1600.0]}
    assert token_cost_ms(steep, speculative=True) == pytest.approx(10.0)


def test_cost_curve_interpolates_over_ns_and_averages_contexts():
    c = CostCurve({128: [10.0, 12.0, 14.0, 20.0, 40.0, 80.0]})
    assert c and c.v(1) == 1.0 and c.v(0.5) == 1.0
    assert c.v(2) == pytest.approx(1.2) and c.v(4) == pytest.approx(1.4)
    assert c.v(3) == pytest.approx(1.3)  # halfway between n = 2 and n = 4
    assert c.v(6) == pytest.approx(1.7)  # halfway between 1.4 and 2.0
    assert c.v(12) == pytest.approx(3.0)
    assert c.v(48) == pytest.approx(8.0 + 4.0 * 16 / 16)  # linear past the last point: slope 4 per 16 tokens
    c2 = CostCurve({"128": [10.0, 12.0, 14.0, 20.0, 40.0, 80.0], "512": [20.0, 30.0, 40.0, 60.0, 100.0, 180.0]})
    assert set(c2.t_ms) == {128, 512}  # context keys from JSON become ints
    assert c2.v(1) == 1.0
    assert c2.v(2) == pytest.approx((1.2 + 1.5) / 2) and c2.v(8) == pytest.approx((2.0 + 3.0) / 2)
    assert c2.t1_ms() == pytest.approx(15.0)
    empty = CostCurve()
    assert not empty and empty.v(1) == 1.0 and empty.v(17) == 1.0
    c.set({})  # the governor may repoint it
    assert not c and c.v(8) == 1.0
