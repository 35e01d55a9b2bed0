"""Distributed-DP accounting: the Skellam bound against the exact divergence, subsampling, conversion."""

from __future__ import annotations

import math

import numpy as np
import pytest
from opacus.accountants.analysis import rdp as opacus_rdp

from fedfair.core.errors import ConfigError
from fedfair.privacy import distributed, ring, rounding
from fedfair.privacy.distributed import Release

CASES = [(mu, shift, alpha) for mu in (2.0, 30.0, 400.0, 1e4) for shift in (1, 2, 7) for alpha in (2, 5, 16, 40)]


@pytest.mark.parametrize(("mu", "shift", "alpha"), CASES)
def test_skellam_bound_holds_against_the_exact_divergence(mu: float, shift: int, alpha: int) -> None:
    exact = distributed.skellam_rdp_exact(alpha, mu, shift)
    bound = distributed.skellam_rdp(alpha, mu, shift, shift)
    # The exact sum is accurate to a few ulps of its terms (float64 logs of the Bessel function).
    assert bound >= exact * (1 - 1e-9)
    if alpha * shift**2 <= mu / 100:
        # Near the Gaussian limit (variance 2 mu dwarfs alpha times the shift squared), both are
        # alpha shift^2 / (4 mu) to first order; the integrality term and the higher cumulants
        # (every one of Skellam's even cumulants is 2 mu) are relatively O(1 / mu) and O(alpha shift^2 / mu).
        assert bound - exact <= exact * (2.0 / mu + alpha * shift**2 / mu)


def test_exact_divergence_is_the_gaussian_one_in_the_limit() -> None:
    # Skellam(mu) tends to N(0, 2 mu), whose shift by s has D_alpha = alpha s^2 / (4 mu).
    mu, shift, alpha = 1e5, 3, 4
    assert distributed.skellam_rdp_exact(alpha, mu, shift) == pytest.approx(alpha * shift**2 / (4 * mu), rel=1e-4)


def gaussian(sigma: float):  # type: ignore[no-untyped-def]
    return lambda alpha: alpha / (2 * sigma**2)


@pytest.mark.parametrize(("sigma", "q"), [(0.8, 0.01), (1.1, 0.05), (4.0, 0.2), (1.0, 1.0)])
def test_subsampled_bounds_against_the_exact_sampled_gaussian(sigma: float, q: float) -> None:
    # Opacus' RDP of the sampled Gaussian is exact at integer orders (Mironov, Talwar and Zhang 2019):
    # sum_k C(alpha, k) q^k (1 - q)^(alpha - k) e^((k^2 - k) / (2 sigma^2)), which is Steinke's bound
    # with the Gaussian's curve k / (2 sigma^2) term by term, so the two must agree to rounding. Zhu and
    # Wang's bound must not be below it, and exceeds it by at most log(3) / (alpha - 1).
    orders = [2, 3, 5, 8, 16, 32, 64]
    exact = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=orders)
    for alpha, reference in zip(orders, exact, strict=True):
        assert distributed.subsampled_rdp(gaussian(sigma), q, alpha) == pytest.approx(
            min(reference, gaussian(sigma)(alpha)), rel=1e-9
        )
        conservative = distributed.subsampled_rdp(gaussian(sigma), q, alpha, "zhu_wang")
        assert reference * (1 - 1e-9) <= conservative <= reference + math.log(3) / (alpha - 1) + 1e-12
        assert conservative <= gaussian(sigma)(alpha) + 1e-12


def _exact_sampled_gaussian_rdp(sigma: float, q: float, alpha: int) -> float:
    """RDP of order alpha of one sampled Gaussian step, by its exact binomial sum in log space (no library)."""
    logs = [
        math.lgamma(alpha + 1) - math.lgamma(k + 1) - math.lgamma(alpha - k + 1)
        + k * math.log(q) + (alpha - k) * math.log1p(-q) + (k * k - k) / (2 * sigma * sigma)
        for k in range(alpha + 1)
    ]  # fmt: skip
    top = max(logs)
    return (top + math.log(math.fsum(math.exp(value - top) for value in logs))) / (alpha - 1)


def test_a_dp_sgd_step_is_the_exact_sampled_gaussian_in_the_ledgers_accounting() -> None:
    """Issue 93: the ledger composes a site's DP-SGD steps with its noised inputs as gaussian releases. At every
    integer order their RDP is the sampled Gaussian's exact binomial sum (Mironov, Talwar and Zhang 2019) for
    100 steps at sigma 1, q 0.01, so their epsilon (1.225 at delta 1e-5, by RDP; PRV: 0.728) is what that exact curve
    gives; a step without noise has no finite epsilon and is refused."""
    release = distributed.gaussian_release(1.0, 0.01, 100)
    assert (release.mechanism, release.mu, release.l1, release.l2) == ("gaussian", 0.5, 0.0, 1.0)
    exact = np.array([100 * _exact_sampled_gaussian_rdp(1.0, 0.01, alpha) for alpha in distributed.ORDERS])
    assert np.allclose(distributed.rdp_curve([release]), exact, rtol=1e-9, atol=0)
    assert distributed.epsilon([release], 1e-5) == pytest.approx(distributed.epsilon_from_rdp(exact, 1e-5), rel=1e-9)
    assert distributed.epsilon([release], 1e-5) == pytest.approx(1.225, abs=1e-3)
    with pytest.raises(ConfigError, match="noise multiplier 0.0 has no finite epsilon"):
        distributed.gaussian_release(0.0, 0.01, 1)
    with pytest.raises(ConfigError, match="l1 and rounding must be 0"):
        Release("gaussian", 0.5, 1.0, 1.0)


def test_conversion_matches_opacus_and_composition_adds_up() -> None:
    sigma, q, steps, delta = 1.1, 0.02, 500, 1e-5
    orders = distributed.ORDERS
    curve = steps * opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=orders)
    expected = opacus_rdp.get_privacy_spent(orders=orders, rdp=curve, delta=delta)[0]
    assert distributed.epsilon_from_rdp(curve, delta) == pytest.approx(expected, rel=1e-12)
    release = Release("skellam", mu=200.0, l1=20.0, l2=5.0, sampling_rate=0.01, steps=100)
    doubled = distributed.rdp_curve([release, release])
    assert np.allclose(doubled, distributed.rdp_curve([Release("skellam", 200.0, 20.0, 5.0, 0.01, 200)]))
    assert distributed.epsilon([], 1e-5) == 0.0
    # The cached, vectorised curve is the scalar definition at every order.
    scalar = [distributed.release_rdp(release, alpha) for alpha in distributed.ORDERS]
    assert np.allclose(distributed.rdp_curve([release]), scalar, rtol=1e-12, atol=0)


def test_calibrate_meets_the_target_from_below() -> None:
    shape = [Release("skellam", mu=1.0, l1=3000.0, l2=1000.0, sampling_rate=0.01, steps=2000)]
    for target in (1.0, 3.0, 8.0):
        mu = distributed.calibrate(target, 1e-5, shape)
        spent = distributed.epsilon([Release("skellam", mu, 3000.0, 1000.0, 0.01, 2000)], 1e-5)
        slightly_less = distributed.epsilon([Release("skellam", mu / 1.01, 3000.0, 1000.0, 0.01, 2000)], 1e-5)
        assert spent <= target < slightly_less


def test_rounding_inflation_and_l1() -> None:
    # Deterministic bound with beta = 0; the probabilistic one is below it for large norms.
    assert rounding.rounded_l2(100.0, 64, 0.0) == 108.0
    inflated = rounding.rounded_l2(1000.0, 100, 1e-10)
    assert 1000.0 < inflated < 1010.0
    assert inflated == pytest.approx(math.sqrt(1000.0**2 + 25 + math.sqrt(2 * math.log(1e10)) * 1005), rel=1e-12)
    assert rounding.rounded_l1(3.0, 100) == 9.0 and rounding.rounded_l1(30.0, 4) == 60.0


def test_rounded_l2_bounds_the_shift_of_a_rounded_sum() -> None:
    # Two neighbouring sums x and x + v rounded with the same uniforms differ by a stochastic rounding of v.
    rng = np.random.default_rng(5)
    dimension, norm, beta = 256, 40.0, 1e-3
    bound = rounding.rounded_l2(norm, dimension, beta)
    x = rng.normal(scale=1e3, size=dimension)
    v = rng.normal(size=dimension)
    v *= norm / np.linalg.norm(v)
    failures = 0
    for _ in range(2000):
        r = rng.random(dimension)
        shift = np.floor(x + v + r) - np.floor(x + r)
        failures += int(np.linalg.norm(shift) > bound)
    # At most beta of the draws may fail; 2000 beta = 2, so 12 failures would be a 1e-6 event.
    assert failures <= 12


def test_skellam_tail_bounds_the_exact_tail() -> None:
    from scipy import stats

    for mu, t in ((10.0, 15), (1e4, 400), (1e6, 8000)):
        assert rounding.skellam_tail(mu, t) >= stats.skellam(mu, mu).sf(t - 1)
    assert rounding.wrap_probability(1e6, 1e9, 32, 10**6) < 1e-100
    assert rounding.wrap_probability(1e12, 2.0**31, 32, 10) == 1.0


def test_delta_addon_counts_conditioning_and_wraps() -> None:
    addon = rounding.delta_addon(steps=100, parties=5, beta=1e-12, epsilon=1.0, wrap=1e-15)
    assert addon == pytest.approx(5 * 100 * 1e-12 * (1 + math.e) + 100e-15)


def test_party_mu_splits_over_the_shares_no_single_reader_knows() -> None:
    assert distributed.party_mu(120.0, floor=51, colluders=5) == pytest.approx(120.0 / 46)
    assert distributed.noise_excess(51, 51, 5) == pytest.approx(51 / 46)
    # No colluder: a survivor still knows its own share, so the floor less one carries the noise.
    assert distributed.party_mu(120.0, floor=2, colluders=0) == 120.0
    assert distributed.noise_excess(2, 2, 0) == 2.0
    assert distributed.noise_excess(3, 3, 0) == pytest.approx(1.5)
    assert distributed.noise_excess(3, 3, 1) == pytest.approx(1.5)
    # A lone party reads only the sum of itself: its share carries it all.
    assert distributed.party_mu(120.0, floor=1, colluders=0) == 120.0
    for floor, colluders in ((3, 3), (1, 1), (2, 2)):
        with pytest.raises(ConfigError, match="raise the floor .* or add sites"):
            distributed.party_mu(1.0, floor=floor, colluders=colluders)


def test_bad_releases_are_refused() -> None:
    with pytest.raises(ConfigError, match="mechanism"):
        Release("laplace", 1.0, 1.0, 1.0)
    with pytest.raises(ConfigError, match="mu="):
        Release("skellam", 0.0, 1.0, 1.0)
    with pytest.raises(ConfigError, match="sampling_rate"):
        Release("skellam", 1.0, 1.0, 1.0, sampling_rate=0.0)


@pytest.mark.parametrize("weight", [1.0, 10.0, 100.0])
def test_noise_fitted_to_16_bit_words_keeps_its_accounting_exact_at_the_bits_chosen(weight: float) -> None:
    dimension, steps, delta = 1 << 12, 200, 1e-5
    words = ring.Ring(16, 3, 3, weight)
    fitted = distributed.training_noise(1.0, delta, 0.1, 0.01, steps, dimension, words)
    bits = fitted.fractional_bits
    # The most precise f whose sum fits: one more bit and it could wrap more often than WRAP_FAILURE allows.
    assert words.wrap_probability(math.ldexp(0.1, bits), fitted.release.mu, dimension) <= distributed.WRAP_FAILURE
    finer = distributed.training_noise(1.0, delta, 0.1, 0.01, steps, dimension)
    assert bits < finer.fractional_bits
    # The release is the one of these bits: the shift at f before rounding, which is charged in expectation over
    # the m coordinates it rounds, mu calibrated to the target for them.
    units = math.ldexp(0.1, bits)
    assert (fitted.release.l2, fitted.release.l1) == (units, math.sqrt(dimension) * units)
    assert fitted.release.rounding == dimension
    assert fitted.epsilon(steps, delta) == pytest.approx(1.0, rel=2e-3)
    assert fitted.epsilon(steps, delta) <= 1.0 + 1e-9
    # The wrap probability is counted in delta, once per step.
    assert fitted.addon >= steps * distributed.WRAP_FAILURE


def test_a_ring_no_bits_fit_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="lower max_weight to the largest expected batch, or raise modulus_bits"):
        distributed.training_noise(1.0, 1e-5, 0.1, 0.01, 200, 128, ring.Ring(16, 3, 3, 1e6))
    with pytest.raises(ConfigError, match="modulus_bits=24"):
        ring.Ring(24, 3, 3, 1.0)
    with pytest.raises(ConfigError, match="honest=4"):
        ring.Ring(16, 3, 4, 1.0)
