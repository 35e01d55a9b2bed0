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
from fedfair.privacy import distributed, ring, rounding
from fedfair.secagg.encode import (
    Encoder,
    EncodingConfig,
    check_no_wraparound,
    largest_safe_fractional_bits,
    weight_fractional_bits,
)
from fedfair.secagg.training_noise import noised_encoding
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
    st.booleans(),
)
def test_a_ring_the_calibration_accepts_is_one_the_encoder_accepts_and_its_wraps_stay_below_2_to_the_minus_40(
    bits: int, parties: int, records: float, per_record: float, dimension: int, agreed: bool
) -> None:
    # The ring (privacy) and the encoder (secure sum) bound the same sum: every f the calibration picks for a
    # ring must build an encoder at the ring's largest weight (or agreed weights), whose own wrap bound is then
    # within 2^-40.
    weights = (*(records * (index + 1) / parties for index in range(parties - 1)), records) if agreed else ()
    words = ring.Ring(bits, parties, max(1, parties - 1), records, weights)
    padded = distributed.padded_dimension(dimension)
    try:
        noise = distributed.training_noise(1.0, 1e-5, 0.8 * per_record, 0.03, 200, padded, words)
    except ConfigError as error:
        assert "no fractional bits" in str(error)
        return
    noise = dataclasses.replace(noise, weight_per_record=per_record)
    units = math.ldexp(noise.sensitivity, noise.fractional_bits)
    assert words.wrap_probability(units, noise.release.mu, padded) <= distributed.WRAP_FAILURE
    share = distributed.party_mu(noise.release.mu, parties, 1)
    agreed_weights = tuple(weight * per_record for weight in weights)
    plain = EncodingConfig(10.0, records * per_record, 0, bits, weights=agreed_weights)
    encoder = Encoder(noised_encoding(plain, noise, share, "federation", 1, dimension), parties)
    assert encoder.dtype == {16: np.uint16, 32: np.uint32}[bits]


def test_parties_at_the_radius_sum_in_16_bit_words_and_decode_within_the_bound() -> None:
    # Adult's largest batch (875 records) in 16-bit words, which the linear bound (8 b) refused: every party sends a
    # vector at the full radius, the same direction, and the sum decodes within its stated error.
    dimension, parties, records, sensitivity = 109, 3, 875.0, 0.8
    words = ring.Ring(16, parties, parties - 1, records)
    padded = distributed.padded_dimension(dimension)
    noise = distributed.training_noise(1.0, 1e-5, sensitivity, 0.03, 200, padded, words)
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


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 2000), min_size=2, max_size=12), st.data())
def test_agreed_weights_bound_a_16_bit_sum_exactly_and_decode_it_exactly(
    weights: list[int], data: st.DataObject
) -> None:
    # The range check with agreed weights is tight (one more bit and the parties' largest sum reaches 2^15), and
    # every party at its weight and the clip in every coordinate, in either sign, still decodes within the bound.
    agreed = tuple(float(weight) for weight in weights)
    parties = data.draw(st.integers(1, len(agreed)))
    bits = largest_safe_fractional_bits(1.0, 16, parties, max(agreed), agreed)
    if bits < 0:
        assert sum(sorted(weights)[-parties:]) + parties >= 2**15
        return
    with pytest.raises(ConfigError, match="could wrap"):
        check_no_wraparound(1.0, bits + 1, 16, parties, max(agreed), agreed)
    encoder = Encoder(EncodingConfig(1.0, max(agreed), bits, 16, weights=agreed), parties)
    chosen = sorted(agreed)[-parties:]
    signs = data.draw(st.lists(st.sampled_from([-1.0, 1.0]), min_size=parties, max_size=parties))
    vectors = [np.full(5, sign * weight) for sign, weight in zip(signs, chosen, strict=True)]
    total = np.zeros(6, dtype=np.uint16)
    for vector, weight in zip(vectors, chosen, strict=True):
        total += encoder.encode(vector, weight)
    decoded = encoder.decode(total, parties)
    assert decoded.total_weight == sum(chosen)  # whole weights round exactly
    assert np.max(np.abs(decoded.weighted_sum - np.sum(vectors, axis=0))) <= decoded.error_bound


def test_a_noised_sum_keeps_its_weight_word_at_its_own_scale() -> None:
    # Adult's batches in 16-bit words: the noised coordinates take f = 5, which the weight word (1024 x 2^5 >= 2^15)
    # could not; it travels at 2^4 and decodes to the agreed total exactly.
    agreed, dimension = (875.0, 98.0, 51.0), 109
    padded = distributed.padded_dimension(dimension)
    words = ring.Ring(16, 3, 2, 875.0, agreed)
    noise = distributed.training_noise(1.0, 1e-5, 0.8, 0.03, 200, padded, words)
    share = distributed.party_mu(noise.release.mu, 3, 1)
    plain = EncodingConfig(10.0, 875.0, 0, 16, weights=agreed)
    encoder = Encoder(noised_encoding(plain, noise, share, "federation", 1, dimension), 3)
    assert (noise.fractional_bits, encoder.weight_bits) == (5, 4)
    # The conditional rounding fails with the probability the delta add-on counts for it.
    assert encoder.config.noise is not None and encoder.config.noise.beta == distributed.ROUNDING_BETA
    # Unagreed, 60 parties of weight up to 875 cannot sum in 16-bit words even in whole units.
    with pytest.raises(ConfigError, match="does not fit 2\\^16 words; agree the weights"):
        weight_fractional_bits(EncodingConfig(10.0, 875.0, 5, 16), 60)
    total = np.zeros(padded + 1, dtype=np.uint16)
    for weight in agreed:
        total += encoder.encode(np.zeros(dimension), weight)
    assert encoder.decode(total, 3).total_weight == 1024.0
