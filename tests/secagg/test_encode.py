"""Fixed-point encoding: exact modular sums, the derived error bound, the wraparound check."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedfair.core.errors import ConfigError
from fedfair.secagg import encode, prg
from fedfair.secagg.encode import (
    Encoder,
    EncodingConfig,
    check_no_wraparound,
    largest_party_value,
    largest_safe_fractional_bits,
)
from fedfair.secagg.rounder import ROUNDING_BYTES_PER_COORDINATE

SMALL_BLOCK = 1 << 10
"""Block size for the tests that compare with an exact reference in Python integers."""

KEY = bytes(range(32))

T = TypeVar("T")


def traced_peak(run: Callable[[], T]) -> tuple[T, int]:
    """What `run` returns, and the most memory numpy and Python held at once while it ran (tracemalloc)."""
    tracemalloc.start()
    try:
        return run(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def encode_sum(encoder: Encoder, inputs: list[tuple[np.ndarray, float]]) -> np.ndarray:
    total = np.zeros(inputs[0][0].size + 1, dtype=encoder.dtype)
    for index, (vector, weight) in enumerate(inputs):
        total += encoder.encode(vector, weight, randomness_key=bytes([index]) * 32)
    return total


@st.composite
def encoding_cases(draw: st.DrawFn) -> tuple[EncodingConfig, list[tuple[np.ndarray, float]]]:
    modulus_bits = draw(st.sampled_from([16, 32, 64]))
    parties = draw(st.integers(1, 10))
    clip = draw(st.sampled_from([0.01, 0.5, 1.0, 3.0]))
    max_weight = draw(st.sampled_from([1.0, 7.5, 100.0]))
    best = largest_safe_fractional_bits(clip, modulus_bits, parties, max_weight)
    fractional_bits = draw(st.integers(max(0, best - 12), best))
    dimension = draw(st.integers(1, 8))
    inputs = []
    for _ in range(parties):
        weight = draw(st.floats(0.0, max_weight))
        # Coordinates of delta up to twice the clip range, so clipping is exercised too.
        delta = draw(arrays(np.float64, dimension, elements=st.floats(-2 * clip, 2 * clip)))
        inputs.append((weight * delta, weight))
    return EncodingConfig(clip, max_weight, fractional_bits, modulus_bits), inputs


@settings(max_examples=150, deadline=None)
@given(encoding_cases())
def test_decoded_sum_stays_within_the_derived_bound(
    case: tuple[EncodingConfig, list[tuple[np.ndarray, float]]],
) -> None:
    config, inputs = case
    encoder = Encoder(config, len(inputs))
    decoded = encoder.decode(encode_sum(encoder, inputs), len(inputs))
    clipped = sum(np.clip(vector, -config.clip * weight, config.clip * weight) for vector, weight in inputs)
    total_weight = sum(weight for _, weight in inputs)
    # The reference sums are float64 too; allow their own rounding on top of the bound.
    slack = 1e-12 * (1 + float(np.max(np.abs(clipped))) + total_weight)
    assert np.all(np.abs(decoded.weighted_sum - clipped) <= decoded.error_bound + slack)
    assert abs(decoded.total_weight - total_weight) <= decoded.error_bound + slack
    # One step per summand; 64-bit sums beyond 2^53 add float64 conversion rounding.
    step_bound = len(inputs) * 2.0**-config.fractional_bits
    assert decoded.error_bound == step_bound if config.modulus_bits < 64 else decoded.error_bound >= step_bound


def test_bound_is_the_number_of_summands_times_the_step() -> None:
    encoder = Encoder(EncodingConfig(1.0, 10.0, 16, 32), 7)
    assert encoder.error_bound(7) == 7 * 2**-16
    assert encoder.error_bound(3) == 3 * 2**-16


def test_grid_values_encode_exactly() -> None:
    encoder = Encoder(EncodingConfig(1.0, 4.0, 10, 32), 3)
    vector = np.array([0.5, -0.25, 3 * 2**-10, -1.0])
    encoded = encoder.encode(vector, 2.0, randomness_key=KEY)
    assert encoded.view(np.int32).tolist() == [512, -256, 3, -1024, 2048]


def test_stochastic_rounding_is_unbiased() -> None:
    encoder = Encoder(EncodingConfig(1.0, 1.0, 4, 32), 1)
    value = 0.3 * 2**-4  # 0.3 of one step: rounds up with probability 0.3 (to within 2^-32)
    encoded = encoder.encode(np.full(40_000, value), 1.0, randomness_key=KEY)
    ups = encoded[:-1].view(np.int32)
    assert set(np.unique(ups).tolist()) == {0, 1}
    # Binomial(40000, 0.3): standard deviation 92; allow 5 of them.
    assert abs(int(ups.sum()) - 12_000) < 5 * 92


def test_randomness_key_makes_encoding_reproducible() -> None:
    encoder = Encoder(EncodingConfig(1.0, 1.0, 8, 64), 2)
    vector = np.linspace(-0.9, 0.9, 101) * 0.7
    first = encoder.encode(vector, 0.7, randomness_key=KEY)
    np.testing.assert_array_equal(first, encoder.encode(vector, 0.7, randomness_key=KEY))
    assert not np.array_equal(first, encoder.encode(vector, 0.7, randomness_key=bytes(32)))
    assert first.dtype == np.uint64


@pytest.mark.parametrize("modulus_bits", [16, 32, 64])
def test_worst_case_sums_at_the_largest_safe_setting_do_not_wrap(modulus_bits: int) -> None:
    parties, clip, max_weight = 9, 2.0, 50.0
    bits = largest_safe_fractional_bits(clip, modulus_bits, parties, max_weight)
    encoder = Encoder(EncodingConfig(clip, max_weight, bits, modulus_bits), parties)
    for sign in (1.0, -1.0):
        inputs = [(np.full(3, sign * 10 * clip * max_weight), max_weight)] * parties
        decoded = encoder.decode(encode_sum(encoder, inputs), parties)
        expected = sign * parties * clip * max_weight
        assert np.all(np.abs(decoded.weighted_sum - expected) <= decoded.error_bound * (1 + 1e-9))
        assert abs(decoded.total_weight - parties * max_weight) <= decoded.error_bound


def test_wraparound_check_is_tight_and_names_the_knob() -> None:
    parties, clip, max_weight = 10, 1.0, 100.0
    best = largest_safe_fractional_bits(clip, 32, parties, max_weight)
    check_no_wraparound(clip, best, 32, parties, max_weight)
    assert parties * largest_party_value(clip, best, max_weight) < 2**31
    assert parties * largest_party_value(clip, best + 1, max_weight) >= 2**31
    with pytest.raises(ConfigError, match=rf"fractional_bits to at most {best} or set modulus_bits=64"):
        check_no_wraparound(clip, best + 1, 32, parties, max_weight)
    with pytest.raises(ConfigError, match="modulus_bits") as raised:
        Encoder(EncodingConfig(clip, max_weight, best + 1, 32), parties)
    assert "\n" not in str(raised.value)
    # With 64-bit words the same setting fits; past float64 precision it does not.
    check_no_wraparound(clip, best + 1, 64, parties, max_weight)
    with pytest.raises(ConfigError, match="fractional_bits"):
        check_no_wraparound(clip, 60, 64, parties, max_weight)


def test_no_fractional_bits_fit_suggests_shrinking_the_range() -> None:
    with pytest.raises(ConfigError, match="lower clip or max_weight or set modulus_bits=64"):
        check_no_wraparound(1.0, 0, 32, 1000, 1e7)
    assert largest_safe_fractional_bits(1.0, 32, 1000, 1e7) == -1


@pytest.mark.parametrize(
    ("clip", "bits", "modulus", "parties", "weight", "message"),
    [
        (1.0, 8, 24, 3, 1.0, "modulus_bits"),
        (1.0, -1, 32, 3, 1.0, "fractional_bits"),
        (1.0, 1.5, 32, 3, 1.0, "fractional_bits"),
        (0.0, 8, 32, 3, 1.0, "clip"),
        (math.inf, 8, 32, 3, 1.0, "clip"),
        (1.0, 8, 32, 3, -2.0, "max_weight"),
        (1.0, 8, 32, 0, 1.0, "parties"),
    ],
)
def test_bad_knobs_are_refused(clip: float, bits: int, modulus: int, parties: int, weight: float, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_no_wraparound(clip, bits, modulus, parties, weight)  # type: ignore[arg-type]


def test_bad_inputs_are_refused() -> None:
    encoder = Encoder(EncodingConfig(1.0, 10.0, 8, 32), 3)
    with pytest.raises(ConfigError, match="NaN"):
        encoder.encode(np.array([1.0, np.nan]), 1.0)
    with pytest.raises(ConfigError, match="max_weight"):
        encoder.encode(np.zeros(2), 11.0)
    with pytest.raises(ConfigError, match="max_weight"):
        encoder.encode(np.zeros(2), -1.0)
    with pytest.raises(ConfigError, match="1-D"):
        encoder.encode(np.zeros((2, 2)), 1.0)
    with pytest.raises(ConfigError, match="summands"):
        encoder.decode(np.zeros(3, dtype=np.uint32), 4)


def test_mean_and_its_bound() -> None:
    encoder = Encoder(EncodingConfig(1.0, 10.0, 6, 32), 3)
    deltas = [np.array([0.9, -0.3]), np.array([-0.5, 0.2]), np.array([0.1, 0.7])]
    weights = [2.0, 5.0, 9.0]
    decoded = encoder.decode(encode_sum(encoder, [(w * d, w) for d, w in zip(deltas, weights, strict=True)]), 3)
    exact = sum(w * d for d, w in zip(deltas, weights, strict=True)) / sum(weights)
    assert np.all(np.abs(decoded.mean() - exact) <= decoded.mean_error_bound())
    zero = encoder.decode(np.zeros(3, dtype=np.uint32), 1)
    with pytest.raises(ConfigError, match="total weight"):
        zero.mean()


def reference_encoding(encoder: Encoder, vector: np.ndarray, weight: float, key: bytes) -> np.ndarray:
    """The encoding spelled out over whole vectors: clip, scale by 2^(f+K), truncate, add K random bits, shift, wrap."""
    bits = encoder.rounding_bits
    bound = encoder.config.clip * weight
    values = np.append(np.clip(vector, -bound, bound), weight)
    fixed = np.trunc(values * 2.0 ** (encoder.config.fractional_bits + bits)).astype(np.int64)
    random = prg.words(key, values.size, np.uint32).astype(np.int64) >> (32 - bits)
    return ((fixed + random) >> bits).astype(encoder.dtype)


def exact_encoding(encoder: Encoder, vector: np.ndarray, weight: float, key: bytes) -> list[int]:
    """The same formula in exact rational and integer arithmetic, one coordinate at a time."""
    config, bits = encoder.config, encoder.rounding_bits
    bound = config.clip * weight
    values = [min(max(value, -bound), bound) for value in vector.tolist()] + [weight]
    words = prg.words(key, len(values), np.uint32).tolist()
    encoded = []
    for value, word in zip(values, words, strict=True):
        fixed = int(Fraction(value) * 2 ** (config.fractional_bits + bits))  # int() truncates toward zero
        # Python's >> on negative integers is floor division, like the encoder's arithmetic shift.
        encoded.append(((fixed + (word >> (32 - bits))) >> bits) % 2**config.modulus_bits)
    return encoded


@pytest.mark.parametrize("modulus_bits", [32, 64])
@pytest.mark.parametrize("dimension", [1, 7, SMALL_BLOCK - 1, SMALL_BLOCK, SMALL_BLOCK + 1, 2 * SMALL_BLOCK + 300])
def test_blockwise_encoding_equals_the_whole_vector_formula(
    modulus_bits: int, dimension: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Same draws as the formula: coordinate i rounds with 32-bit word i of the key's stream,
    # across block boundaries, with clipping, negative values and the weight coordinate last.
    # Small blocks keep the exact reference quick; the loop is the one real blocks take.
    monkeypatch.setattr(encode, "_BLOCK", SMALL_BLOCK)
    rng = np.random.default_rng(dimension + modulus_bits)
    parties, clip, max_weight = 5, 0.5, 20.0
    bits = largest_safe_fractional_bits(clip, modulus_bits, parties, max_weight)
    encoder = Encoder(EncodingConfig(clip, max_weight, bits, modulus_bits), parties)
    weight = 13.37
    vector = rng.uniform(-2 * clip, 2 * clip, size=dimension) * weight
    vector[:3] = [-0.0, -(2.0**-bits), 1e300][:dimension]  # minus zero, a grid point, a huge clipped value
    key = bytes([dimension % 251]) * 32
    np.testing.assert_array_equal(encoder.encode(vector, weight, key), reference_encoding(encoder, vector, weight, key))


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9, 1 - 2**-20, 2**-40, 1 - 2**-40])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_rounding_is_unbiased_at_several_fractions_of_a_step(fraction: float, sign: float) -> None:
    encoder = Encoder(EncodingConfig(1000.0, 1.0, 8, 32), 1)
    assert encoder.rounding_bits == 32
    samples = 100_000
    value = sign * (37 + fraction)  # in steps of 2^-8
    encoded = encoder.encode(np.full(samples, value * 2**-8), 1.0, randomness_key=bytes([int(fraction * 100)]) * 32)
    rounded = encoded[:-1].view(np.int32)
    assert set(np.unique(rounded).tolist()) <= {math.floor(value), math.floor(value) + 1}
    # Each coordinate rounds up independently with probability p = frac(value) up to the
    # truncation bias below 2^-K (K = 32), so the mean of the rounded values lies within
    # 2^-32 of the value plus sampling noise of standard deviation sqrt(p (1 - p) / samples).
    # Fractions finer than 2^-32 (2^-40 here) are truncated toward zero: the rounding is then
    # deterministic and the bias alone, below 2^-32, separates the mean from the value.
    up = value - math.floor(value)
    assert abs(float(np.mean(rounded)) - value) <= 5 * math.sqrt(up * (1 - up) / samples) + 2.0**-32


@pytest.mark.parametrize("modulus_bits", [16, 32, 64])
def test_packing_round_trips_negative_values_up_to_the_largest_the_modulus_allows(modulus_bits: int) -> None:
    clip, max_weight, weight = 1.0, 1.9, 1.875  # the weight is on the grid, so it encodes exactly
    bits = largest_safe_fractional_bits(clip, modulus_bits, 1, max_weight)
    encoder = Encoder(EncodingConfig(clip, max_weight, bits, modulus_bits), 1)
    largest = math.floor(clip * weight * 2**bits)  # the largest grid value the clip allows
    steps = [largest, -largest, -1, 1, 0, -(largest // 3)]
    if modulus_bits < 64:
        assert largest > 2 ** (modulus_bits - 2)  # close to the 2^(k-1) edge of the signed words
    encoded = encoder.encode(np.array(steps, dtype=np.float64) * 2.0**-bits, weight, randomness_key=KEY)
    # Two's complement modulo 2^k: -1 is the all-ones word, -largest is 2^k - largest.
    assert encoded[:-1].tolist() == [step % 2**modulus_bits for step in steps]
    decoded = encoder.decode(encoded, 1)
    np.testing.assert_array_equal(decoded.weighted_sum, np.array(steps) * 2.0**-bits)
    assert decoded.total_weight == weight


def test_non_finite_coordinates_in_a_later_block_are_refused_and_huge_finite_ones_clipped() -> None:
    encoder = Encoder(EncodingConfig(1.0, 10.0, 8, 32), 3)
    for bad in (np.nan, np.inf, -np.inf):
        vector = np.zeros(2 * encode._BLOCK)
        vector[encode._BLOCK + 10] = bad
        with pytest.raises(ConfigError, match="NaN or infinite"):
            encoder.encode(vector, 1.0)
    # Their sum overflows, but every coordinate is finite: clipped, not refused.
    huge = np.full(4, 1.5e308)
    assert encoder.encode(huge, 2.0, randomness_key=KEY).view(np.int32).tolist() == [512] * 4 + [512]


def test_encoding_allocates_little_beyond_its_output() -> None:
    encoder = Encoder(EncodingConfig(1.0, 10.0, 16, 32), 3)
    vector = np.random.default_rng(0).uniform(-1, 1, size=1_000_000)
    encoded, peak = traced_peak(lambda: encoder.encode(vector, 1.0, randomness_key=KEY))
    # The output plus one block of random words (1 MiB) and small change; one whole-vector
    # float64 temporary of a naive encoding would need 8 MB.
    assert peak < encoded.nbytes + ROUNDING_BYTES_PER_COORDINATE * encode._BLOCK + (1 << 18)


def test_a_second_encoding_into_the_same_buffer_allocates_next_to_nothing() -> None:
    # What a collaborator does every round: the output buffer and this thread's block of random
    # words are both reused, so no page of either has to be faulted in again.
    encoder = Encoder(EncodingConfig(1.0, 10.0, 16, 32), 3)
    vector = np.random.default_rng(1).uniform(-1, 1, size=1_000_000)
    buffer = np.empty(vector.size + 1, dtype=encoder.dtype)
    encoder.encode(-vector, 2.0, randomness_key=bytes(32), out=buffer)  # last round's words, overwritten
    returned, peak = traced_peak(lambda: encoder.encode(vector, 1.0, randomness_key=KEY, out=buffer))
    assert returned is buffer
    np.testing.assert_array_equal(buffer, encoder.encode(vector, 1.0, randomness_key=KEY))
    assert peak < 1 << 16


def test_threads_encoding_at_once_each_get_their_own_random_words() -> None:
    encoder = Encoder(EncodingConfig(1.0, 10.0, 16, 32), 3)
    vectors = [np.random.default_rng(seed).uniform(-1, 1, size=3 * encode._BLOCK + 7) for seed in range(4)]
    keys = [bytes([seed]) * 32 for seed in range(4)]
    expected = [encoder.encode(vector, 1.0, randomness_key=key) for vector, key in zip(vectors, keys)]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            got = list(pool.map(lambda i: encoder.encode(vectors[i], 1.0, randomness_key=keys[i]), range(4)))
            for words, reference in zip(got, expected):
                np.testing.assert_array_equal(words, reference)


def test_an_output_buffer_of_the_wrong_shape_or_type_is_refused() -> None:
    encoder = Encoder(EncodingConfig(1.0, 10.0, 8, 32), 3)
    vector = np.zeros(4)
    read_only = np.empty(5, dtype=np.uint32)
    read_only.flags.writeable = False
    for wrong, why in (
        (np.empty(4, dtype=np.uint32), r"of shape \(4,\)"),
        (np.empty(5, dtype=np.uint64), "of uint64"),
        (np.empty(10, dtype=np.uint32)[::2], "not contiguous"),
        (np.empty((5, 1), dtype=np.uint32), r"of shape \(5, 1\)"),
        (read_only, "read-only"),
    ):
        with pytest.raises(ConfigError, match="5 contiguous, writable uint32 words") as refusal:
            encoder.encode(vector, 1.0, out=wrong)
        assert refusal.match(f"but it is {why};")


@st.composite
def rounding_cases(draw: st.DrawFn) -> tuple[Encoder, np.ndarray, float, bytes]:
    modulus_bits = draw(st.sampled_from([32, 64]))
    parties = draw(st.integers(1, 20))
    clip = draw(st.sampled_from([2.0**-20, 0.01, 1.0, 3.0, 1e6]))
    max_weight = draw(st.sampled_from([1.0, 7.5, 1000.0]))
    best = largest_safe_fractional_bits(clip, modulus_bits, parties, max_weight)
    if best < 0:
        parties, best = 1, largest_safe_fractional_bits(clip, modulus_bits, 1, max_weight)
    # Near the largest safe f a 64-bit modulus leaves fewer than 32 rounding bits.
    fractional_bits = draw(st.integers(max(0, best - 40), best))
    weight = draw(st.floats(0.0, max_weight))
    bound = 2 * clip * max(weight, 1.0)
    vector = draw(arrays(np.float64, draw(st.integers(1, 12)), elements=st.floats(-bound, bound)))
    key = draw(st.binary(min_size=32, max_size=32))
    encoder = Encoder(EncodingConfig(clip, max_weight, fractional_bits, modulus_bits), parties)
    return encoder, vector, weight, key


@settings(max_examples=200, deadline=None)
@given(rounding_cases())
def test_integer_rounding_equals_the_exact_formula(case: tuple[Encoder, np.ndarray, float, bytes]) -> None:
    encoder, vector, weight, key = case
    config, bits = encoder.config, encoder.rounding_bits
    assert encoder.encode(vector, weight, key).tolist() == exact_encoding(encoder, vector, weight, key)
    # K leaves room in int64 for every scaled value plus its random offset, and is 32 unless
    # a 64-bit modulus with values near the float64 limit needs the room.
    largest = largest_party_value(config.clip, config.fractional_bits, config.max_weight)
    assert (largest + 1) * 2**bits <= 2**63
    assert bits == 32 or (config.modulus_bits == 64 and 10 <= bits < 32 and (largest + 1) * 2 ** (bits + 1) > 2**63)


@pytest.mark.parametrize("modulus_bits", [32, 64])
def test_rounding_at_the_int64_edge_stays_exact(modulus_bits: int) -> None:
    # The largest safe setting puts the clip bound (times 2^K) right below 2^63; every
    # random offset must still add up without overflow, for either sign.
    clip, max_weight = 1.0, 1.0
    bits = largest_safe_fractional_bits(clip, modulus_bits, 1, max_weight)
    encoder = Encoder(EncodingConfig(clip, max_weight, bits, modulus_bits), 1)
    largest = largest_party_value(clip, bits, max_weight)
    assert 2**62 < (largest + 1) * 2**encoder.rounding_bits <= 2**63
    vector = np.array([1.0, -1.0, 1 - 2.0**-52, -(1 - 2.0**-52), 1e300, -1e300] * 1000)
    key = bytes([modulus_bits]) * 32
    encoded = encoder.encode(vector, max_weight, key)
    assert encoded.tolist() == exact_encoding(encoder, vector, max_weight, key)
    signed = encoded.view(np.int32 if modulus_bits == 32 else np.int64)
    assert set(np.abs(signed[:-1]).tolist()) <= {2**bits, 2**bits - 1}


@pytest.mark.parametrize("modulus_bits", [16, 32])
def test_a_float32_update_encodes_as_its_float64_widening_without_a_float64_copy(modulus_bits: int) -> None:
    # A float32 model's update (4 bytes a coordinate) must not cost a float64 copy (8 more) on the way to
    # 16-bit words: the words are those of the exactly widened values, and the peak is the output's.
    encoder = Encoder(EncodingConfig(1.0, 1.0, 8, modulus_bits), 3)
    vector = np.random.default_rng(4).uniform(-1.5, 1.5, size=1_000_000).astype(np.float32)
    expected = encoder.encode(vector.astype(np.float64), 0.75, randomness_key=KEY)
    encoder.encode(vector[:10], 0.75)  # compiles (or loads) the float32 kernel outside the measurement
    encoded, peak = traced_peak(lambda: encoder.encode(vector, 0.75, randomness_key=KEY))
    np.testing.assert_array_equal(encoded, expected)
    assert peak < encoded.nbytes + ROUNDING_BYTES_PER_COORDINATE * encode._BLOCK + (1 << 18)


def test_decoding_holds_one_float64_vector_at_a_time() -> None:
    encoder = Encoder(EncodingConfig(1.0, 1.0, 8, 16), 3)
    encoded = encoder.encode(np.full(1_000_000, 0.5), 1.0, randomness_key=KEY)
    decoded, peak = traced_peak(lambda: encoder.decode(encoded, 1))
    assert np.all(decoded.weighted_sum == 0.5) and decoded.total_weight == 1.0
    assert peak < decoded.weighted_sum.nbytes + (1 << 18)


@settings(max_examples=100, deadline=None)
@given(encoding_cases(), st.data())
def test_a_slice_of_a_sum_decodes_to_the_bits_of_the_whole_ones_slice(
    case: tuple[EncodingConfig, list[tuple[np.ndarray, float]]], data: st.DataObject
) -> None:
    config, inputs = case
    encoder = Encoder(config, len(inputs))
    total = encode_sum(encoder, inputs)
    whole = encoder.decode(total, len(inputs)).weighted_sum
    start = data.draw(st.integers(0, whole.size))
    stop = data.draw(st.integers(start, whole.size))
    assert encoder.decodes_by_slice
    assert encoder.decode_slice(total, start, stop).tobytes() == whole[start:stop].tobytes()
    with pytest.raises(ConfigError, match="not within"):
        encoder.decode_slice(total, start, whole.size + 1)  # the weight's word is not the sum's
