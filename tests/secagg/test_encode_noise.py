"""The encoder's distributed-DP step: rotate, round conditionally, add Skellam noise; decode and unrotate."""

from __future__ import annotations

import json
import math
import os
import warnings

import numpy as np
import pytest
from scipy import stats

from fedfair.core.errors import ConfigError
from fedfair.privacy import distributed, ring, rounding
from fedfair.secagg import DropOut, SecAggConfig, noise, rotation, simulate_round
from fedfair.secagg.encode import Encoder, EncodingConfig
from fedfair.secagg.security import SecurityParameters
from fedfair.secagg.training_noise import noised_encoding
from fedfair.secagg.noise import NoiseConfig, NoisyEncoding
from fedfair.secagg.wire import Stage
from tests.false_alarm import FALSE_ALARM, Z


def noised_encoder(
    dimension: int, mu: float, parties: int, *, rotate: bool = True, bits: int = 64, fractional_bits: int = 16
) -> Encoder:
    key = rotation.rotation_key("federation", 1, "training") if rotate else None
    noise = NoiseConfig(mu=mu, norm_clip=2.0, dimension=dimension, rotation_key=key)
    return Encoder(EncodingConfig(1.0, 100.0, fractional_bits, bits, noise=noise), parties)


def summed(encoder: Encoder, vectors: list[np.ndarray], weights: list[float]) -> np.ndarray:
    total = np.zeros(encoder.encoded_dimension(vectors[0].size) + 1, dtype=encoder.dtype)
    for vector, weight in zip(vectors, weights, strict=True):
        total += encoder.encode(vector, weight)
    return total


@pytest.mark.parametrize("rotate", [True, False])
def test_a_configuration_read_back_from_its_json_decodes_a_sum_bit_for_bit(rotate: bool) -> None:
    """What a site's model chain logs beside each verified sum, to decode it again after a restart."""
    encoder = noised_encoder(300, 2.0e6, 3, rotate=rotate)
    again = Encoder(EncodingConfig.of_document(json.loads(json.dumps(encoder.config.to_document()))), 3)
    assert again.config == encoder.config
    rng = np.random.default_rng(3)
    words = summed(encoder, [rng.uniform(-1.0, 1.0, 300) for _ in range(3)], [1.0, 2.0, 3.0])
    first, second = encoder.decode(words, 3), again.decode(words, 3)
    assert first.weighted_sum.tobytes() == second.weighted_sum.tobytes() and first.total_weight == second.total_weight


@pytest.mark.parametrize("rotate", [True, False])
def test_decoded_sum_is_the_true_sum_plus_noise_of_the_calibrated_variance(rotate: bool) -> None:
    dimension, parties, mu = 3000, 4, 2.0e6
    encoder = noised_encoder(dimension, mu, parties, rotate=rotate)
    rng = np.random.default_rng(0)
    vectors = [rng.normal(scale=0.01, size=dimension) * 30.0 for _ in range(parties)]
    decoded = encoder.decode(summed(encoder, vectors, [30.0] * parties), parties)
    assert decoded.total_weight == pytest.approx(120.0, abs=parties * 2.0**-16)
    error = decoded.weighted_sum - np.sum(vectors, axis=0)
    assert np.max(np.abs(error)) <= decoded.error_bound
    # Noise variance 2 parties mu / 4^f per coordinate, plus rounding's (below parties / 4 units^2, with
    # or without rotation, which keeps the total); the sample variance of d nearly Gaussian values has
    # relative standard deviation sqrt(2 / d).
    variance = decoded.noise_std**2
    assert decoded.noise_std == pytest.approx(math.sqrt(2 * parties * mu) / 2**16)
    rounding = parties / 4 / 4.0**16
    assert abs(error.var() - variance) <= Z * math.sqrt(2.0 / dimension) * variance + rounding
    assert abs(error.mean()) <= Z * math.sqrt((variance + rounding) / dimension)


def test_conditional_rounding_keeps_the_rounded_norm_within_its_bound() -> None:
    dimension, weight = 500, 10.0
    encoder = noised_encoder(dimension, 0.0 + 1e-300, 2)
    noisy = NoisyEncoding(NoiseConfig(1e-300, 2.0, dimension, os.urandom(32)), 1.0, 100.0, 16, 64, 2)
    vector = np.full(dimension, 1.0)  # norm sqrt(500) > 2 * 10: projected onto the ball of radius 20
    words = np.empty(noisy.size, dtype=np.uint64)
    noisy.encode_into(vector, weight, os.urandom(32), words)
    values = words.view(np.int64)
    bound = rounding.rounded_l2(2.0 * weight * 2**16, noisy.size, noisy.noise.beta)
    assert np.linalg.norm(values) <= bound
    assert np.linalg.norm(values) == pytest.approx(20.0 * 2**16, rel=1e-3)
    assert encoder.encoded_dimension(dimension) == 512


def test_a_key_reproduces_the_noised_encoding() -> None:
    encoder = noised_encoder(100, 1e4, 3)
    vector, key = np.linspace(-1, 1, 100), os.urandom(32)
    assert np.array_equal(encoder.encode(vector, 3.0, key), encoder.encode(vector, 3.0, key))
    assert not np.array_equal(encoder.encode(vector, 3.0, key), encoder.encode(vector, 3.0, os.urandom(32)))


def test_a_secure_round_decodes_the_noised_sum() -> None:
    dimension, parties = 300, 4
    encoding = noised_encoder(dimension, 1e6, parties).config
    config = SecAggConfig(
        "federation",
        1,
        tuple(f"p{index}" for index in range(parties)),
        dimension=Encoder(encoding, parties).encoded_dimension(dimension),
        encoding=encoding,
    )
    rng = np.random.default_rng(1)
    vectors = [rng.normal(scale=0.1, size=dimension) * 5.0 for _ in range(parties)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = simulate_round(config, lambda party: config.encoder.encode(vectors[party - 1], 5.0))
    decoded = trace.result.decoded
    assert np.max(np.abs(decoded.weighted_sum - np.sum(vectors, axis=0))) <= decoded.error_bound
    assert decoded.total_weight == pytest.approx(20.0, abs=parties * 2.0**-16)


def test_a_sum_that_could_wrap_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="modulus_bits=64"):
        noised_encoder(1000, 1e6, 10, bits=32, fractional_bits=24)
    with pytest.raises(ConfigError, match="wraps modulo 2\\^32 with probability"):
        noised_encoder(1000, 2.0**50, 100, bits=32, fractional_bits=8)
    assert noised_encoder(1000, 1e6, 10, bits=32, fractional_bits=8).dtype is np.uint32


def test_a_noised_sum_decodes_whole_only() -> None:
    encoder = noised_encoder(100, 1e4, 3)
    total = summed(encoder, [np.zeros(100)], [1.0])
    assert not encoder.decodes_by_slice and encoder.decode(total, 1).weighted_sum.size == 100
    with pytest.raises(ConfigError, match="call decode"):
        encoder.decode_slice(total, 0, 10)


def test_updates_of_the_wrong_length_or_not_finite_are_refused() -> None:
    encoder = noised_encoder(100, 1e4, 3)
    with pytest.raises(ConfigError, match="configured for updates of 100 coordinates"):
        encoder.encode(np.zeros(99), 1.0)
    with pytest.raises(ConfigError, match="NaN"):
        encoder.encode(np.full(100, np.nan), 1.0)
    with pytest.raises(ConfigError, match="norm_clip"):
        NoiseConfig(1.0, 0.0, 10)


def test_a_training_round_in_16_bit_words_decodes_the_noised_sum_within_its_bound() -> None:
    # The plan's noise fitted to 16-bit words (fewer fractional bits than 64-bit words would take), through the
    # masking protocol with one colluder allowed and one party dropping: the survivors' sum plus noise.
    dimension, parties, weight, colluders = 2000, 5, 4.0, 1
    words = ring.Ring(16, parties, parties - colluders, weight)
    fitted = distributed.training_noise(1.0, 1e-5, 0.05, 0.05, 100, rotation.padded_dimension(dimension), words)
    wide = distributed.training_noise(1.0, 1e-5, 0.05, 0.05, 100, rotation.padded_dimension(dimension))
    assert fitted.fractional_bits < wide.fractional_bits
    share = distributed.party_mu(fitted.release.mu, parties, colluders)
    plain = EncodingConfig(clip=1.0, max_weight=weight, fractional_bits=0, modulus_bits=16)
    encoding = noised_encoding(plain, fitted, share, "federation", 3, dimension)
    config = SecAggConfig(
        "federation",
        3,
        tuple(f"p{index}" for index in range(parties)),
        dimension=encoding.noise.encoded_dimension if encoding.noise else dimension,
        encoding=encoding,
        security=SecurityParameters(max_colluding=colluders),
    )
    assert config.encoder.dtype is np.uint16
    rng = np.random.default_rng(2)
    # Each party's weighted update at the norm the encoder allows it (a Poisson batch's clipped sum of `weight` records).
    radius = rounding.batch_radius(weight) * 0.05
    vectors = [v * (radius / np.linalg.norm(v)) for v in rng.normal(size=(parties, dimension))]
    trace = simulate_round(
        config, lambda party: config.encoder.encode(vectors[party - 1], weight), DropOut({Stage.MASK: [parties]})
    )
    decoded = trace.result.decoded
    assert decoded.total_weight == pytest.approx(weight * (parties - 1), abs=parties * 2.0**-fitted.fractional_bits)
    error = decoded.weighted_sum - np.sum(vectors[:-1], axis=0)
    assert np.max(np.abs(error)) <= decoded.error_bound
    # The noise of 4 parties' shares, each 1/(n - c) of the calibrated total, in units of 2^-f.
    assert decoded.noise_std == pytest.approx(math.sqrt(2 * (parties - 1) * share) * 2.0**-fitted.fractional_bits)
    assert (
        abs(error.std() - decoded.noise_std)
        <= Z * math.sqrt(0.5 / dimension) * decoded.noise_std + 2.0**-fitted.fractional_bits
    )


def test_the_rotated_wrap_bound_holds_and_is_far_below_the_unrotated_one() -> None:
    # 8-bit words, m = 64, three parties at the bound's norm, so the bound is not negligible: it must sit above
    # the measured rate of sums with a coordinate outside [-2^7, 2^7), rotated, rounded and noised as the encoder
    # does it; without the rotation's spread (a whole norm per coordinate) nothing would fit.
    size, parties, mu, norm, trials = 64, 3, 20.0, 60.0, 300
    bound = rounding.rotated_wrap_probability(parties * mu, norm, parties, 8, size)
    assert bound < 0.5 and rounding.wrap_probability(parties * mu, parties * norm, 8, size) == 1.0
    assert rounding.rotated_wrap_probability(parties * mu, 0.0, parties, 8, size) <= bound
    rng = np.random.default_rng(3)
    wraps = 0
    for trial in range(trials):
        key = rotation.rotation_key("federation", trial, "training")
        total = np.zeros(size)
        for _ in range(parties):
            vector = rng.normal(size=size)
            rotated = rotation.rotate(vector * (norm / np.linalg.norm(vector)), key)
            total += np.floor(rotated + rng.uniform(size=size))
        total += noise.skellam(parties * mu, size, os.urandom(32))
        wraps += bool(np.any(np.abs(total) >= 2**7))
    # One-sided: the measured rate may exceed the bound only by sampling error, the count's exact binomial law's
    # (a normal approximation's 5.7-sigma tail is not the binomial's). The measured rate is 0 in 20,000 trials.
    assert wraps <= stats.binom.isf(FALSE_ALARM, trials, bound)
