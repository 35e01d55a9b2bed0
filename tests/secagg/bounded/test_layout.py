"""The circuit's sizes and the soundness error they give."""

from __future__ import annotations

import math

import pytest

from fedfair.core.errors import ConfigError
from fedfair.secagg.bounded.field import P
from fedfair.secagg.bounded.layout import TAU, Layout, largest_dimension, squared_bound


def test_the_squared_bound_is_exact_in_the_encoded_scale() -> None:
    assert squared_bound(1.0, 1.0, 10) == 2**20
    assert squared_bound(0.1, 0.5, 10) == math.floor((0.1 * 0.5 * 1024) ** 2)  # 2621.44 -> 2621
    with pytest.raises(ConfigError, match="positive and finite"):
        squared_bound(0.0, 1.0, 10)


def test_a_small_bound_needs_64_tests_and_a_large_one_more() -> None:
    small = Layout(10**6, 2**20)  # 4 d T^2 < p: a passing input has no coordinate beyond 2T
    assert small.pass_probability == 0.5 and small.tests == 64
    large = Layout(10**6, 2**34)  # beyond it: Paley-Zygmund, each test at most 1 - (1 - 2T^2/L)^2 / 3
    assert 0.5 < large.pass_probability < 0.67 and large.tests > 64
    for layout in (small, large):
        assert layout.pass_probability**layout.tests <= 2.0**-64
        assert layout.soundness_error <= 2.0**-60
        assert layout.test_offset >= TAU * math.isqrt(layout.bound_sq)


def test_every_call_fits_and_the_proof_is_small() -> None:
    layout = Layout(10**5, 2**30)
    chunk = layout.chunk
    assert layout.square_calls_for(chunk) + 2 * layout.bit_calls_for(chunk) <= layout.calls
    assert layout.square_calls_for(chunk - 1) + 2 * layout.bit_calls_for(chunk - 1) > layout.calls
    assert layout.proof_length < 0.07 * layout.dimension  # 2 QUERIES c + 2N - 1, c about d / 62


@pytest.mark.parametrize("bits", [44, 47, 50, 52, 64, 80])
def test_a_bound_with_no_room_below_p_is_refused(bits: int) -> None:
    """At any d, up to a slack whose bits alone reach p's (where L = p - 2^m is no longer positive)."""
    with pytest.raises(ConfigError, match="lower fractional_bits"):
        Layout(1, 1 << bits)
    with pytest.raises(ConfigError, match="lower fractional_bits"):
        Layout(10**6, P // 4)
    with pytest.raises(ConfigError, match="at least 1"):
        Layout(10, 0)


@pytest.mark.parametrize("bits", [10, 20, 21])
def test_a_model_too_large_for_its_bound_is_refused_naming_its_dimension(bits: int) -> None:
    """The projections need 4 d T < p: at init's B = 2^20 (T = 2^24) d = 2^26 - 1 fits and 2^26 does not, though
    B^2 = 2^40 alone is far below the bound's own limit. The refusal names the dimension and every fix."""
    bound_sq = squared_bound(1.0, 1.0, bits)
    most = largest_dimension(bound_sq)
    layout = Layout(most, bound_sq)
    assert 4 * most * layout.test_offset < P <= 4 * (most + 1) * layout.test_offset
    assert layout.soundness_error <= 2.0**-60
    if bits == 20:
        assert most == 2**26 - 1
    with pytest.raises(ConfigError) as refused:
        Layout(most + 1, bound_sq)
    said = str(refused.value)
    assert f"dimension {most + 1:,}" in said and f"at most {most:,} coordinates" in said, said
    assert "fewer fractional bits" in said and "smaller update_norm" in said and "smaller model" in said, said
    assert "about 2^43" not in said  # the bound alone fits: it is not the cause


def test_a_bound_that_fits_no_dimension_has_a_largest_dimension_of_zero() -> None:
    assert largest_dimension(squared_bound(1.0, 1.0, 22)) == 0  # B^2 = 2^44, beyond the bound's own limit
    assert largest_dimension(squared_bound(1.0, 1.0, 21)) > 10**6
