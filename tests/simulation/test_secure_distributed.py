"""SecureSum with distributed DP: each party's share of the calibrated noise, the noised aggregate, and
that summing encodings directly decodes what the masking protocol decodes."""

from __future__ import annotations

import math
import os
from dataclasses import replace

import numpy as np
import pytest
import torch

from fedfair.core.config import LocalConfig, ObjectiveConfig, TrainingConfig
from fedfair.core.errors import ConfigError
from fedfair.core.server import Aggregate
from fedfair.core.update import Update
from fedfair.privacy.config import PrivacyConfig
from fedfair.privacy.distributed import party_mu
from fedfair.secagg import EncodingConfig, SecAggConfig, simulate_round
from fedfair.secagg.noise import NoiseConfig
from fedfair.secagg.rotation import rotation_key
from fedfair.simulation.federation import Federation
from fedfair.simulation.secure import DistributedDP, SecureSum, federation_dp, plan_sample_rate
from tests.false_alarm import Z

ENCODING = EncodingConfig(clip=10.0, max_weight=400.0, fractional_bits=20, modulus_bits=64)
PRIVACY = PrivacyConfig(enabled=True, target_epsilon=1.0, max_grad_norm=2.0, mode="distributed", sample_rate=0.02)


def updates(count: int, dimension: int) -> list[Update]:
    generator = torch.Generator().manual_seed(3)
    return [
        Update(
            delta=torch.randn(dimension, generator=generator, dtype=torch.float64) * 1e-3,
            delta_c=0.01 * index,
            weight=float(100 + 50 * index),
        )
        for index in range(count)
    ]


@pytest.mark.parametrize("masked", [True, False])
def test_the_noised_aggregate_is_the_plain_one_plus_noise_carried_by_the_honest_parties(masked: bool) -> None:
    parties, colluders, dimension = 6, 2, 600
    plan = DistributedDP(
        PRIVACY, LocalConfig(lr=0.1, threshold_lr=0.1), ObjectiveConfig(epsilon=0.1, rho=0.3), 0.02, 200, colluders
    )
    secure = SecureSum(ENCODING, "federation", plan, masked=masked)
    batch = updates(parties, dimension)
    summed = secure(batch)
    plain = Aggregate.of(batch)
    noise = secure.training_noise
    assert noise is not None and noise == plan.noise(dimension + 1)
    # Every party adds mu / (n - colluders): the decoded sum carries n / (n - c) times the calibrated mu.
    scale = math.ldexp(1.0, -noise.fractional_bits)
    assert secure.noise_stds[0] == pytest.approx(
        math.sqrt(2 * noise.release.mu * parties / (parties - colluders)) * scale
    )
    error = torch.cat(
        [summed.weighted_delta - plain.weighted_delta, torch.tensor([summed.weighted_delta_c - plain.weighted_delta_c])]
    ).numpy()
    assert np.max(np.abs(error)) <= secure.error_bounds[0]
    # The sample variance of d + 1 nearly Gaussian coordinates, within Z sqrt(2 / d) of the noise's (rounding adds
    # at most parties / 4 units^2).
    variance = secure.noise_stds[0] ** 2
    assert abs(error.var() - variance) <= Z * math.sqrt(2 / error.size) * variance + parties / 4 * scale**2
    assert summed.total_weight == pytest.approx(plain.total_weight, abs=parties * 2.0**-noise.fractional_bits)


def test_adding_encodings_directly_decodes_what_the_masking_protocol_decodes() -> None:
    dimension, parties = 300, 4
    noise = NoiseConfig(mu=1e6, norm_clip=1.0, dimension=dimension, rotation_key=rotation_key("f", 1, "training"))
    encoding = EncodingConfig(clip=10.0, max_weight=100.0, fractional_bits=16, modulus_bits=64, noise=noise)
    config = SecAggConfig("f", 1, tuple(f"p{index}" for index in range(parties)), dimension=512, encoding=encoding)
    rng = np.random.default_rng(0)
    encoded = [config.encoder.encode(rng.normal(size=dimension) * 0.01, 50.0, os.urandom(32)) for _ in range(parties)]
    # First: a party masks its encoding in place.
    direct = config.encoder.decode(np.sum(encoded, axis=0, dtype=np.uint64), parties)
    masked = simulate_round(config, lambda party: encoded[party - 1]).result.decoded
    assert np.array_equal(masked.weighted_sum, direct.weighted_sum)
    assert masked.total_weight == direct.total_weight


def test_distributed_noise_needs_distributed_privacy() -> None:
    with pytest.raises(ConfigError, match="mode = distributed"):
        DistributedDP(PrivacyConfig(), LocalConfig(), None, 0.02, 10)
    assert party_mu(10.0, 6, 2) == 2.5


def test_every_site_samples_at_the_plans_batch_fraction(small_adult_federation: Federation) -> None:
    sizes = [client.size for client in small_adult_federation.train]
    assert plan_sample_rate(TrainingConfig(batch_size=64), sizes) == 64 / sum(sizes)
    assert plan_sample_rate(TrainingConfig(batch_size=0), sizes) == 1.0
    assert plan_sample_rate(TrainingConfig(batch_fraction=0.1), sizes) == 0.1
    training = TrainingConfig(rounds=30, batch_size=64)
    plan = federation_dp(
        small_adult_federation, training, ObjectiveConfig(rho=0.1), replace(PRIVACY, sample_rate=None), 1
    )
    # The learners read the rate from the privacy settings, the secure sum from the plan: one rate for both.
    assert plan.privacy.sample_rate == plan.sample_rate == 64 / sum(sizes)
    assert (plan.rounds, plan.colluders, plan.local) == (30, 1, training.local)


def test_each_rounds_decoded_sum_carries_fresh_noise_and_the_report_says_how_much() -> None:
    """The noise comes from the OS's CSPRNG, not the run's seed: the same updates decode differently each round."""
    parties, colluders, dimension = 5, 1, 500
    plan = DistributedDP(
        PRIVACY, LocalConfig(lr=0.1, threshold_lr=0.1), ObjectiveConfig(epsilon=0.1, rho=0.3), 0.02, 200, colluders
    )
    secure = SecureSum(ENCODING, "federation", plan, masked=False)
    batch = updates(parties, dimension)
    plain = Aggregate.of(batch).weighted_delta.numpy()
    first, second = (secure(batch).weighted_delta.numpy() - plain for _ in range(2))
    std = secure.noise_stds[-1]
    noise = secure.training_noise
    assert noise is not None
    # Two independent draws: their difference has twice the noise's variance (its sample std within 20%, six of
    # its standard errors over 500 coordinates), and the noise is far above the fixed point's resolution.
    assert np.std(first - second) == pytest.approx(math.sqrt(2) * std, rel=0.2)
    assert std > 100 * 2.0**-noise.fractional_bits
    report = secure.noise_report()
    assert report["noise_std"] == std and report["noise_multiplier"] == pytest.approx(std / noise.sensitivity)
    assert (report["parties"], report["colluders"], report["rounds"]) == (parties, colluders, 2)
    assert report["noise_excess"] == pytest.approx(parties / (parties - colluders))
    # Two of the 200 planned rounds spend a small part of the target, by the sum's own accounting.
    assert 0.0 < report["epsilon"] < 0.5  # of the target 1
    assert SecureSum(ENCODING).noise_report() == {}
