"""Federated group risk from secure sums (`fedfair.fairness.sums`) against the exact report.

The exact numbers come from `metrics.group_risk_report` on the pooled losses; the
federated ones only from the sum of the institutions' threshold answers. They must
agree within the certified gap the evaluation reports (plus float64 rounding), and
that gap must itself respect the worst-case bound g(hi) (hi - lo) <= grid spacing.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedfair.core.errors import ConfigError
from fedfair.fairness import pooled as metrics
from fedfair.fairness import sums as evaluation

ROUNDING = 1e-9


def institutions(seed: int, sizes: tuple[int, ...] = (13946, 1561, 774)) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Held-out cross-entropy-like losses (a heavy tail, many near 0) and 0/1 errors per institution."""
    rng = np.random.default_rng(seed)
    losses = [rng.exponential(0.4, size) * rng.choice([0.2, 1.0, 4.0], size) for size in sizes]
    errors = [(rng.random(size) < 0.1 + 0.2 * index).astype(float) for index, size in enumerate(sizes)]
    return losses, errors


def federated(
    losses: list[np.ndarray], errors: list[np.ndarray], center: float, rho: float, sum_error: float = 0.0
) -> evaluation.FederatedRiskReport:
    grid = evaluation.threshold_grid(center)
    summed = np.sum([evaluation.local_answers(loss, error, grid) for loss, error in zip(losses, errors)], axis=0)
    return evaluation.report_from_sums(summed, center, rho, sum_error=sum_error)


@pytest.mark.parametrize("rho", [0.05, 0.1, 0.3, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("center_shift", [1.0, 0.7, 1.6])
def test_secure_sums_give_the_exact_group_risks_within_the_certified_gap(rho: float, center_shift: float) -> None:
    losses, errors = institutions(seed=int(rho * 100))
    pooled, pooled_errors = np.concatenate(losses), np.concatenate(errors)
    exact = metrics.group_risk_report(pooled, 1.0 - pooled_errors, rho)
    # The evaluated model's c approximates the (1 - rho)-quantile; here it is also off by a factor.
    center = float(np.quantile(pooled, 1.0 - rho)) * center_shift
    report = federated(losses, errors, center, rho)
    assert report.samples == pooled.size
    assert -ROUNDING <= report.worst_risk - exact.worst_risk <= report.worst_risk_gap + ROUNDING
    assert -ROUNDING <= exact.best_risk - report.best_risk <= report.best_risk_gap + ROUNDING
    assert report.mean_risk == pytest.approx(exact.mean_risk, abs=ROUNDING)
    for key in ("accuracy", "mean_error", "worst_error", "best_error", "error_disparity"):
        assert getattr(report, key) == pytest.approx(getattr(exact, key), abs=1e-12)
    # Dense grid where the worst group's boundary is: the gap is tiny there.
    if center_shift == 1.0:
        assert report.worst_risk_gap < 1e-5


def test_the_gap_respects_the_worst_case_bound() -> None:
    losses, errors = institutions(seed=3)
    pooled = np.concatenate(losses)
    rho = 0.3
    grid = evaluation.threshold_grid(1.0)
    summed = np.sum([evaluation.local_answers(loss, error, grid) for loss, error in zip(losses, errors)], axis=0)
    k = grid.size
    counts, excess = summed[:k], summed[k : 2 * k]
    bound = evaluation.cvar_from_sums(grid, counts, excess, pooled.size, rho, values_at_least_first=True)
    high = int(np.flatnonzero(counts <= rho * pooled.size)[0])
    slope = 1.0 - counts[high] / (rho * pooled.size)
    assert 0.0 <= bound.gap <= slope * (grid[high] - grid[high - 1]) + ROUNDING
    assert abs(bound.value - metrics.worst_group_risk(pooled, rho)) <= bound.gap + ROUNDING


def test_the_encoding_error_widens_the_gap_and_counts_stay_exact() -> None:
    losses, errors = institutions(seed=5)
    rho, sum_error = 0.3, 3 * 2.0**-20  # three parties' stochastic rounding, as the secure sum reports it
    plain = federated(losses, errors, 1.0, rho)
    rounded = federated(losses, errors, 1.0, rho, sum_error=sum_error)
    total = sum(loss.size for loss in losses)
    assert rounded.worst_risk_gap == pytest.approx(plain.worst_risk_gap + 2 * sum_error / (rho * total))
    assert rounded.mean_error_bound == pytest.approx(sum_error / total)


def test_one_institution_answers_only_fixed_size_sums() -> None:
    grid = evaluation.threshold_grid(0.8)
    assert grid.size == evaluation.THRESHOLDS and grid[0] == 0.0 and np.all(np.diff(grid) > 0)
    assert np.array_equal(grid, evaluation.threshold_grid(0.8))  # both sides compute the same thresholds
    small, large = np.array([0.1, 2.0]), np.random.default_rng(0).exponential(1.0, 50_000)
    for losses in (small, large):
        answers = evaluation.local_answers(losses, np.zeros(losses.size), grid)
        assert answers.shape == (evaluation.vector_length(),)
    answers = evaluation.local_answers(small, np.array([1.0, 0.0]), grid)
    k = grid.size
    # At threshold 0 both losses are above it, with excess 2.1; n, the loss sum and the error count at the end.
    assert answers[0] == 2 and answers[k] == pytest.approx(2.1) and answers[-3:].tolist() == [2.0, 2.1, 1.0]
    # And these match the generic per-institution query in metrics.
    for j in (0, 1000, 3000):
        count, excess, total = metrics.local_threshold_query(small, grid[j])
        assert (answers[j], answers[k + j]) == pytest.approx((count, excess)) and total == 2


def test_edge_cases() -> None:
    # More than (1 - rho) of the losses are exactly 0: the worst group holds every positive loss.
    losses = [np.concatenate([np.zeros(90), np.linspace(1, 2, 10)])]
    errors = [np.zeros(100)]
    report = federated(losses, errors, 0.0, 0.3)
    exact = metrics.group_risk_report(losses[0], np.ones(100), 0.3)
    assert report.worst_risk == pytest.approx(exact.worst_risk) and report.best_risk == pytest.approx(0.0)
    with pytest.raises(ConfigError, match="diverged"):
        evaluation.local_answers(np.array([np.nan]), np.zeros(1), evaluation.threshold_grid(1.0))
    with pytest.raises(ConfigError, match="diverged"):
        federated([np.full(10, 1e6)], [np.zeros(10)], 1.0, 0.3)
    with pytest.raises(ConfigError, match="no held-out samples"):
        evaluation.report_from_sums(np.zeros(evaluation.vector_length()), 1.0, 0.3)
    with pytest.raises(ConfigError, match="expected"):
        evaluation.report_from_sums(np.zeros(evaluation.vector_length() + 1), 1.0, 0.3)
