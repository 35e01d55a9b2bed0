"""Poisson and Skellam samples from the keystream against their exact laws, at a stated false-alarm rate.

Each statistical assertion fails a correct sampler with probability at most FALSE_ALARM (tests/false_alarm.py; the
chi-square p-values from the statistic's asymptotic law, accurate with every merged bin expecting 20 or more). At
200,000 samples a variance 2% off its law's still fails (the threshold is 5.73 x sqrt(2 / 200,000) = 1.8%)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from scipy import stats

from fedfair.core.errors import ConfigError
from fedfair.secagg import noise
from tests.false_alarm import FALSE_ALARM, Z

SAMPLES = 200_000


def chi_square_p_value(samples: np.ndarray, law: stats.rv_discrete) -> float:
    """Pearson's chi-square p-value of integer ``samples`` against the exact discrete ``law``: unit bins
    from its 1e-9 to its 1 - 1e-9 quantile, neighbours merged until each expects at least 20 samples (so
    the statistic's chi-square law is accurate), the mass beyond folded into the outermost bins."""
    low, high = int(law.ppf(1e-9)), int(law.isf(1e-9))
    edges = np.arange(low, high + 2) - 0.5  # unit bins around low .. high
    expected = np.diff(law.cdf(edges - 0.5)) * samples.size  # cdf at the integer below each edge
    expected[0] += law.cdf(low - 1) * samples.size
    expected[-1] += law.sf(high) * samples.size
    observed = np.histogram(np.clip(samples, low, high), bins=edges)[0].astype(np.float64)
    merged_observed, merged_expected, run_observed, run_expected = [], [], 0.0, 0.0
    for seen, wanted in zip(observed, expected, strict=True):
        run_observed, run_expected = run_observed + seen, run_expected + wanted
        if run_expected >= 20:
            merged_observed.append(run_observed)
            merged_expected.append(run_expected)
            run_observed = run_expected = 0.0
    merged_observed[-1] += run_observed
    merged_expected[-1] += run_expected
    seen_array, wanted_array = np.array(merged_observed), np.array(merged_expected)
    statistic = float(((seen_array - wanted_array) ** 2 / wanted_array).sum())
    return float(stats.chi2.sf(statistic, seen_array.size - 1))


@pytest.mark.parametrize("mu", [0.3, 4.0, 9.99, 10.0, 37.5, 2500.0, 1e7])
def test_poisson_samples_follow_the_exact_pmf(mu: float) -> None:
    # Both samplers (inversion below 10, PTRS from 10) and PTRS's two forms of the mass (k < 100, k >= 100).
    samples = noise.poisson(mu, SAMPLES, os.urandom(32))
    assert chi_square_p_value(samples, stats.poisson(mu)) > FALSE_ALARM


@pytest.mark.parametrize("mu", [0.7, 25.0, 4e4])
def test_skellam_samples_follow_the_exact_pmf(mu: float) -> None:
    samples = noise.skellam(mu, SAMPLES, os.urandom(32))
    assert chi_square_p_value(samples, stats.skellam(mu, mu)) > FALSE_ALARM


def test_summed_party_noise_has_the_calibrated_variance() -> None:
    """n parties each add Skellam(mu_i); the sum must be Skellam(sum mu_i): variance 2 sum mu_i and the
    exact pmf. The sample variance s^2 of N draws has standard deviation sqrt((mu_4 - V^2) / N), with
    V = 2 mu and mu_4 = 2 mu + 3 V^2 for Skellam(mu) (every even cumulant is 2 mu)."""
    shares = [3.0, 40.0, 0.5, 1200.0, 75.25]
    total = np.sum([noise.skellam(mu, SAMPLES, os.urandom(32)) for mu in shares], axis=0)
    mu = sum(shares)
    variance = 2.0 * mu
    fourth = 2.0 * mu + 3.0 * variance**2
    spread = math.sqrt((fourth - variance**2) / SAMPLES)
    assert abs(total.var(ddof=1) - variance) < Z * spread
    assert abs(total.mean()) < Z * math.sqrt(variance / SAMPLES)
    assert chi_square_p_value(total, stats.skellam(mu, mu)) > FALSE_ALARM


def test_a_key_reproduces_its_noise_and_keys_differ() -> None:
    key = os.urandom(32)
    assert np.array_equal(noise.skellam(1e5, 1000, key), noise.skellam(1e5, 1000, key))
    assert not np.array_equal(noise.skellam(1e5, 1000, key), noise.skellam(1e5, 1000, os.urandom(32)))
    assert not noise.skellam(0.0, 100, key).any()


@pytest.mark.parametrize("mu", [-1.0, math.inf, math.nan, 2.0**51])
def test_unusable_mu_is_refused(mu: float) -> None:
    with pytest.raises(ConfigError, match="mu="):
        noise.skellam(mu, 10, os.urandom(32))
