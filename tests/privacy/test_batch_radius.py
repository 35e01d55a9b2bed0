"""The projection radius of a Poisson batch's clipped sum, and the wrap bound of 16-bit words that counts it."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedfair.core.errors import ConfigError
from fedfair.privacy import distributed, rounding
from fedfair.secagg.encode import Encoder, EncodingConfig, noised_encoding
from fedfair.secagg.noise import NoiseConfig


def bernstein(records: float) -> float:
    """The tail the radius is chosen for: exp(-t^2 / (2 (b + t / 3))) at t = BATCH_TAIL sqrt(b)."""
    t = rounding.BATCH_TAIL * math.sqrt(records)
    return math.exp(-t * t / (2.0 * (records + t / 3.0)))


@settings(max_examples=60, deadline=None)
@given(st.floats(1.0, 5000.0), st.integers(1, 200))
def test_a_poisson_batch_exceeds_the_radius_no_more_often_than_bernstein_says(records: float, spread: int) -> None:
    # Exact tails: the rows Poisson sampling draws from n rows at rate b / n are Binomial(n, b / n); Poisson(b) is
    # its limit. Neither may pass b + 8 sqrt(b) more often than the bound the docstring states.
    radius = rounding.batch_radius(records)
    rows = math.ceil(records) * spread + 1
    assert stats.binom.sf(math.floor(radius), rows, records / rows) <= bernstein(records)
    assert stats.poisson.sf(math.floor(radius), records) <= bernstein(records)
    assert bernstein(records) <= 2e-4


def test_the_radius_is_far_tighter_than_a_bound_linear_in_the_batch() -> None:
    assert rounding.batch_radius(875.0) == pytest.approx(875.0 + 8.0 * math.sqrt(875.0))
    assert rounding.batch_radius(875.0) < 8.0 * 875.0 / 6
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ConfigError, match="positive expected batch"):
            rounding.batch_radius(bad)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.0, 2000.0), st.sampled_from([None, 1.0, 1 / 50]))
def test_the_encoders_radius_is_a_batch_of_weight_over_r_records(weight: float, per_record: float | None) -> None:
    config = NoiseConfig(mu=1.0, norm_clip=0.3, dimension=8, weight_per_record=per_record)
    if per_record is None or weight == 0:
        assert config.radius(weight) == 0.3 * weight
    else:
        records = weight / per_record
        # One record moves the weighted vector by norm_clip r; the batch holds weight / r of them.
        assert config.radius(weight) == pytest.approx(0.3 * per_record * rounding.batch_radius(records))


@settings(max_examples=12, deadline=None)
@given(
    st.sampled_from([16, 32]),
    st.integers(2, 12),
    st.floats(1.0, 1000.0),
    st.sampled_from([1.0, 1 / 40]),
    st.integers(3, 300),
)
def test_a_ring_the_calibration_accepts_is_one_the_encoder_accepts_and_its_wraps_stay_below_2_to_the_minus_40(
    bits: int, parties: int, records: float, per_record: float, dimension: int
) -> None:
    # The ring (privacy) and the encoder (secure sum) bound the same sum: every f the calibration picks for a
    # ring must build an encoder at the ring's largest weight, whose own wrap bound is then within 2^-40.
    ring = distributed.Ring(bits, parties, max(1, parties - 1), records)
    padded = distributed.padded_dimension(dimension)
    try:
        noise = distributed.training_noise(1.0, 1e-5, 0.8 * per_record, 0.03, 200, padded, ring)
    except ConfigError as error:
        assert "no fractional bits" in str(error)
        return
    noise = dataclasses.replace(noise, weight_per_record=per_record)
    assert ring.wrap_probability(noise.fractional_bits, noise.release, padded) <= distributed.WRAP_FAILURE
    share = distributed.party_mu(noise.release.mu, parties, 1)
    plain = EncodingConfig(clip=10.0, max_weight=records * per_record, fractional_bits=0, modulus_bits=bits)
    encoder = Encoder(noised_encoding(plain, noise, share, "federation", 1, dimension), parties)
    assert encoder.dtype == {16: np.uint16, 32: np.uint32}[bits]


def test_parties_at_the_radius_sum_in_16_bit_words_and_decode_within_the_bound() -> None:
    # Adult's largest batch (875 records) in 16-bit words, which the linear bound (8 b) refused: every party sends a
    # vector at the full radius, the same direction, and the sum decodes within its stated error.
    dimension, parties, records, sensitivity = 109, 3, 875.0, 0.8
    ring = distributed.Ring(16, parties, parties - 1, records)
    padded = distributed.padded_dimension(dimension)
    noise = distributed.training_noise(1.0, 1e-5, sensitivity, 0.03, 200, padded, ring)
    share = distributed.party_mu(noise.release.mu, parties, 1)
    plain = EncodingConfig(clip=10.0, max_weight=records, fractional_bits=0, modulus_bits=16)
    encoding = noised_encoding(plain, noise, share, "federation", 1, dimension)
    assert encoding.noise is not None
    encoder = Encoder(encoding, parties)
    direction = np.ones(dimension) / math.sqrt(dimension)
    vector = direction * encoding.noise.radius(records)
    total = np.zeros(padded + 1, dtype=np.uint16)
    for _ in range(parties):
        total += encoder.encode(vector, records)
    decoded = encoder.decode(total, parties)
    assert decoded.total_weight == pytest.approx(parties * records, abs=parties * 2.0**-noise.fractional_bits)
    assert np.max(np.abs(decoded.weighted_sum - parties * vector)) <= decoded.error_bound
