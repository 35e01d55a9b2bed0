"""Group risks from a noised evaluation sum (`fedfair.fairness.noisy` through `sums.report_from_sums`).

The exact figures are `pooled` on the held-out losses clipped at the report's cap; the noised
ones come only from the summed histogram trees plus noise of a stated standard deviation on
every coordinate, Gaussian or Skellam (the project's sampler, on the encoding's 2^-20 lattice,
as the secure sum would decode it). The report claims every bound holds at once with
probability at least 1 - failure; over T independent trials the number of trials where one
fails is then at most Binomial(T, failure), and the test allows up to that law's quantile of
1 - FALSE_ALARM (tests/false_alarm.py: 1e-8 if the claim is exactly tight; the union bound makes
it looser still).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from scipy import stats

from fedfair.fairness import noisy, pooled, sums
from fedfair.fairness.report import GroupRiskReport, SecureSumCertificate
from fedfair.secagg.noise import skellam
from tests.false_alarm import FALSE_ALARM

LATTICE = 2.0**-sums.ENCODING.fractional_bits
"""The decoded sum's step: Skellam noise in encoded units, divided by 2^f."""

TRIALS = 60


def held_out(seed: int, sizes: tuple[int, ...] = (6000, 2500, 1500)) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Cross-entropy-like losses with a heavy tail past the cap, and 0/1 errors, per institution."""
    rng = np.random.default_rng(seed)
    losses = [rng.exponential(0.5, size) * rng.choice([0.3, 1.0, 5.0], size) for size in sizes]
    errors = [(rng.random(size) < 0.15).astype(float) for size in sizes]
    return losses, errors


def summed(losses: list[np.ndarray], errors: list[np.ndarray], grid: np.ndarray) -> np.ndarray:
    total: np.ndarray = np.sum([sums.local_answers(loss, error, grid) for loss, error in zip(losses, errors)], axis=0)
    return total


def exact_clipped(losses: list[np.ndarray], errors: list[np.ndarray], cap: float, rho: float) -> GroupRiskReport:
    clipped = np.minimum(np.concatenate(losses), cap)
    return pooled.group_risk_report(clipped, 1.0 - np.concatenate(errors), rho)


def certificate_of(report: GroupRiskReport) -> SecureSumCertificate:
    assert report.certificate is not None
    return report.certificate


def misses(report: GroupRiskReport, exact: GroupRiskReport, rho: float) -> list[str]:
    """The figures of `report` farther from `exact` than its certificate allows."""
    certificate = certificate_of(report)
    rounding = 1e-9
    bounds = {
        "worst_risk": certificate.worst_risk_gap,
        "best_risk": certificate.best_risk_gap,
        "mean_risk": certificate.mean_error_bound,
        "mean_error": certificate.error_rate_bound,
        "worst_error": certificate.error_rate_bound / rho,
        "best_error": certificate.error_rate_bound / rho,
        "disparity": certificate.disparity_bound,
    }
    return [key for key, bound in bounds.items() if abs(getattr(report, key) - getattr(exact, key)) > bound + rounding]


def gaussian(size: int, std: float, rng: np.random.Generator) -> np.ndarray:
    noise: np.ndarray = rng.normal(0.0, std, size)
    return noise


def skellam_noise(size: int, std: float, rng: np.random.Generator) -> np.ndarray:
    # Skellam(mu) has variance 2 mu in lattice units; the key is fresh entropy, as a party's would be.
    mu = (std / LATTICE) ** 2 / 2.0
    return skellam(mu, size, os.urandom(32)).astype(np.float64) * LATTICE


@pytest.mark.parametrize("draw", [gaussian, skellam_noise], ids=["gaussian", "skellam"])
@pytest.mark.parametrize(("rho", "std"), [(0.1, 2.0), (0.3, 10.0)])
def test_every_noised_figure_is_within_its_bound_in_at_least_the_stated_fraction_of_trials(
    draw: object, rho: float, std: float
) -> None:
    losses, errors = held_out(seed=int(rho * 10))
    grid = sums.threshold_grid()
    clean = summed(losses, errors, grid)
    rng = np.random.default_rng(int(std))
    failed = 0
    for _ in range(TRIALS):
        noise = draw(clean.size, std, rng)  # type: ignore[operator]
        report = sums.report_from_sums(clean + noise, grid, rho, noise_std=std)
        certificate = certificate_of(report)
        exact = exact_clipped(losses, errors, certificate.loss_cap, rho)
        failed += bool(misses(report, exact, rho))
    allowed = int(stats.binom.isf(FALSE_ALARM, TRIALS, 1.0 - certificate.confidence))
    assert certificate.loss_cap == sums.LOSS_RANGE[1] and certificate.confidence == 1.0 - noisy.NOISE_FAILURE
    assert failed <= allowed


def test_the_bounds_grow_with_the_noise_and_shrink_to_the_grid_without_it() -> None:
    losses, errors = held_out(seed=3)
    grid = sums.threshold_grid()
    clean = summed(losses, errors, grid)
    rho = 0.2
    exact = exact_clipped(losses, errors, sums.LOSS_RANGE[1], rho)
    rng = np.random.default_rng(0)
    gaps = {}
    for std in (1e-9, 1.0, 10.0):
        report = sums.report_from_sums(clean + gaussian(clean.size, std, rng), grid, rho, noise_std=std)
        gaps[std] = certificate_of(report).worst_risk_gap
        assert not misses(report, exact, rho)
    # The noise terms scale with sigma; near sigma = 0 only half the finest candidate spacing below the cap is left.
    finest = float(np.diff(grid[grid <= sums.LOSS_RANGE[1]]).max()) / 2.0
    assert gaps[1e-9] <= finest + 1e-6
    assert 5.0 * gaps[1.0] <= gaps[10.0] <= 15.0 * gaps[1.0]
    # 10,000 samples at rho = 0.2 and sigma = 1: the worst group's risk to within a few hundredths.
    assert gaps[1.0] < 0.05


def test_a_noised_report_is_never_refused_and_stays_in_range() -> None:
    grid = sums.threshold_grid()
    clean = summed([np.array([0.5, 1.0, 2.0])], [np.array([0.0, 1.0, 0.0])], grid)
    rng = np.random.default_rng(1)
    for std in (0.5, 5.0, 50.0):
        report = sums.report_from_sums(clean + gaussian(clean.size, std, rng), grid, 0.3, noise_std=std)
        certificate = certificate_of(report)
        cap = certificate.loss_cap
        for figure, bound in (
            (report.worst_risk, certificate.worst_risk_gap),
            (report.best_risk, certificate.best_risk_gap),
            (report.mean_risk, certificate.mean_error_bound),
        ):
            # Within [0, cap], and the interval never claims more than the range itself.
            assert 0.0 <= figure - bound and figure + bound <= cap + 1e-12
        assert 0.0 <= report.mean_error <= 1.0 and certificate.samples >= 0
    # Exact sums of three samples are refused (min_bucket_count); noised ones are reported, with wide bounds.
    with pytest.raises(Exception, match="fewer than min_bucket_count"):
        sums.report_from_sums(clean, grid, 0.3)
    assert certificate.worst_risk_gap > 0.5


def test_a_higher_cap_reports_more_of_the_tail_at_a_wider_bound() -> None:
    losses, errors = held_out(seed=5)
    grid = sums.threshold_grid()
    clean = summed(losses, errors, grid)
    noise = gaussian(clean.size, 2.0, np.random.default_rng(2))
    low = sums.report_from_sums(clean + noise, grid, 0.1, noise_std=2.0, loss_cap=3.0)
    high = sums.report_from_sums(clean + noise, grid, 0.1, noise_std=2.0, loss_cap=30.0)
    cap = certificate_of(high).loss_cap
    assert cap >= 30.0 and cap in grid  # rounded up to a threshold of the grid
    assert certificate_of(high).worst_risk_gap > certificate_of(low).worst_risk_gap
    assert not misses(high, exact_clipped(losses, errors, cap, 0.1), 0.1)
    assert high.worst_risk > low.worst_risk  # the tail beyond 3 counts now


def test_a_report_told_a_tenth_of_the_noise_misses_its_bounds_often() -> None:
    """The coverage test above can fail: bounds computed for sigma / 10 miss in far more than 5% of trials."""
    losses, errors = held_out(seed=1)
    grid = sums.threshold_grid()
    clean = summed(losses, errors, grid)
    rng = np.random.default_rng(4)
    exact = exact_clipped(losses, errors, sums.LOSS_RANGE[1], 0.1)
    failed = sum(
        bool(
            misses(sums.report_from_sums(clean + gaussian(clean.size, 2.0, rng), grid, 0.1, noise_std=0.2), exact, 0.1)
        )
        for _ in range(TRIALS)
    )
    assert failed > stats.binom.isf(FALSE_ALARM, TRIALS, noisy.NOISE_FAILURE)
