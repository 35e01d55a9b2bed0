"""Group risk metrics agree with brute force, and the secure-sum form with the exact one.

Synthetic loss vectors are used here only to test the math: the metrics are
functions of per-sample numbers, whatever model produced them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ConfigError
from fedfair.core.objective import cvar
from fedfair.fairness.pooled import (
    GroupRiskReport,
    best_group_risk,
    best_group_risk_from_queries,
    group_risk_report,
    local_threshold_query,
    mean_from_query,
    summed_query,
    worst_group_risk,
    worst_group_risk_from_queries,
)

# Losses with many ties (a few repeated values) as well as spread-out ones: ties are
# where the fractional boundary weight and the strict count l > c matter.
loss_values = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 3.0]), st.floats(0.0, 20.0, allow_nan=False))
loss_vectors = st.lists(loss_values, min_size=1, max_size=60).map(lambda values: np.array(values, dtype=np.float64))
rhos = st.one_of(st.sampled_from([1.0, 0.5, 0.1, 0.3]), st.floats(0.01, 1.0))


def brute_worst(values: np.ndarray, rho: float) -> float:
    """min over c of c + mean((l - c)+) / rho, over the kinks c = l_i where a minimum of this
    convex piecewise-linear function lies: independent of objective.cvar's sorting rule."""
    return min(c + np.maximum(values - c, 0.0).mean() / rho for c in values)


def brute_best(values: np.ndarray, rho: float) -> float:
    """max over c of c - mean((c - l)+) / rho: the mean of the lowest rho-fraction."""
    return max(c - np.maximum(c - values, 0.0).mean() / rho for c in values)


def scale(values: np.ndarray) -> float:
    return 1.0 + float(np.abs(values).max())


@given(loss_vectors, rhos)
def test_worst_and_best_group_match_brute_force(values: np.ndarray, rho: float) -> None:
    assert worst_group_risk(values, rho) == pytest.approx(brute_worst(values, rho), rel=1e-12, abs=1e-12)
    assert best_group_risk(values, rho) == pytest.approx(brute_best(values, rho), rel=1e-12, abs=1e-12)


@given(loss_vectors, rhos)
def test_worst_at_least_mean_at_least_best(values: np.ndarray, rho: float) -> None:
    slack = 1e-12 * scale(values)
    worst, best, mean = worst_group_risk(values, rho), best_group_risk(values, rho), float(values.mean())
    assert worst >= mean - slack
    assert mean >= best - slack


@given(loss_vectors)
def test_rho_one_gives_the_mean_for_all_three(values: np.ndarray) -> None:
    correct = values < 1.0
    report = group_risk_report(values, correct, 1.0)
    for value in (report.worst_risk, report.best_risk):
        assert value == pytest.approx(report.mean_risk, rel=1e-12, abs=1e-12)
    assert report.disparity == pytest.approx(0.0, abs=1e-12 * scale(values))
    for value in (report.worst_error, report.best_error):
        assert value == pytest.approx(report.mean_error, abs=1e-12)


def test_worst_group_of_an_exact_fraction_is_the_top_mean() -> None:
    values = np.array([4.0, 1.0, 3.0, 2.0, 0.0])
    assert worst_group_risk(values, 0.4) == pytest.approx(3.5)
    assert best_group_risk(values, 0.4) == pytest.approx(0.5)
    # rho n = 1.5: the whole top sample and half of the next.
    assert worst_group_risk(values, 0.3) == pytest.approx((4.0 + 0.5 * 3.0) / 1.5)


@given(st.lists(st.booleans(), min_size=1, max_size=60), rhos, st.randoms(use_true_random=False))
def test_error_groups_rank_by_their_own_error(hits: list[bool], rho: float, random) -> None:
    correct = np.array(hits)
    # Losses unrelated to correctness: the error groups must not follow the loss ranking.
    losses = np.array([random.uniform(0.0, 5.0) for _ in hits])
    report = group_risk_report(losses, correct, rho)
    n, wrong = correct.size, int((~correct).sum())
    # The worst rho n samples by 0-1 error hold min(wrong, rho n) errors; the best hold
    # the errors left over once the other (1 - rho) n samples have taken theirs.
    assert report.worst_error == pytest.approx(min(wrong, rho * n) / (rho * n), abs=1e-12)
    assert report.best_error == pytest.approx(max(wrong - (1.0 - rho) * n, 0.0) / (rho * n), abs=1e-12)
    assert report.error_disparity == pytest.approx(report.worst_error - report.best_error)
    assert report.accuracy == pytest.approx(1.0 - wrong / n)
    assert report.mean_error == pytest.approx(wrong / n)


def test_worst_error_differs_from_error_of_the_worst_loss_group() -> None:
    # Multi-class cross-entropy can be high on a correct sample: the two correct samples
    # have the highest losses, but the worst error group is the two wrong ones.
    report = group_risk_report(np.array([5.0, 4.0, 0.1, 0.2]), np.array([True, True, False, False]), 0.5)
    assert report.worst_risk == pytest.approx(4.5)
    assert report.worst_error == 1.0
    assert report.best_error == 0.0
    assert str(report.best_error) == "0.0", "no negative zero in reports"


def test_report_fields_and_dict() -> None:
    report = group_risk_report(np.array([1.0, 2.0, 3.0, 6.0]), np.array([1, 1, 0, 0]), 0.25)
    assert isinstance(report, GroupRiskReport)
    assert report.to_dict() == {
        "rho": 0.25,
        "mean_risk": 3.0,
        "worst_risk": 6.0,
        "best_risk": 1.0,
        "disparity": 5.0,
        "accuracy": 0.5,
        "mean_error": 0.5,
        "worst_error": 1.0,
        "best_error": 0.0,
        "error_disparity": 1.0,
    }
    with pytest.raises(AttributeError):
        report.rho = 0.5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("losses", "correct", "rho"),
    [
        (np.array([1.0, 2.0]), np.array([1, 0]), 0.0),
        (np.array([1.0, 2.0]), np.array([1, 0]), 1.5),
        (np.array([1.0, np.nan]), np.array([1, 0]), 0.5),
        (np.array([]), np.array([]), 0.5),
        (np.array([1.0, 2.0]), np.array([1, 0, 1]), 0.5),
        (np.array([1.0, 2.0]), np.array([1, 2]), 0.5),
    ],
)
def test_bad_inputs_are_refused(losses: np.ndarray, correct: np.ndarray, rho: float) -> None:
    with pytest.raises(ConfigError):
        group_risk_report(losses, correct, rho)


# The secure-sum form. Institutions are random splits of one loss vector; the
# federation's query sums their local answers as secure aggregation would.

institutions = st.lists(st.lists(loss_values, min_size=1, max_size=25), min_size=1, max_size=4).map(
    lambda parts: [np.array(part, dtype=np.float64) for part in parts]
)
tolerances = st.sampled_from([1e-3, 1e-6, 1e-9])


def rounding(parts: list[np.ndarray]) -> float:
    """float64 rounding in the summed (l - c)+ and in c: well under 1e-12 of the scale for these sizes."""
    return 1e-12 * scale(np.concatenate(parts))


@given(institutions, rhos, tolerances)
def test_secure_sum_worst_group_is_exact_cvar_within_tolerance(parts: list[np.ndarray], rho: float, tol: float) -> None:
    pooled = np.concatenate(parts)
    exact = cvar(pooled, rho)
    found = worst_group_risk_from_queries(summed_query(parts), rho, 0.0, float(pooled.max()) + 1.0, tol)
    # The bisection returns F(hi) >= min F = CVaR, at most tolerance above it.
    assert -rounding(parts) <= found - exact <= tol + rounding(parts)


@given(institutions, rhos, tolerances)
def test_secure_sum_best_group_within_tolerance(parts: list[np.ndarray], rho: float, tol: float) -> None:
    pooled = np.concatenate(parts)
    negated = summed_query([-part for part in parts])
    found = best_group_risk_from_queries(negated, rho, 0.0, float(pooled.max()) + 1.0, tol)
    exact = best_group_risk(pooled, rho)
    assert -tol - rounding(parts) <= found - exact <= rounding(parts)


@given(institutions)
def test_secure_sum_mean_is_one_query(parts: list[np.ndarray]) -> None:
    pooled = np.concatenate(parts)
    assert mean_from_query(summed_query(parts), 0.0) == pytest.approx(pooled.mean(), rel=1e-12, abs=1e-12)


@settings(max_examples=25)
@given(st.lists(st.booleans(), min_size=1, max_size=40), rhos)
def test_secure_sum_on_zero_one_errors(hits: list[bool], rho: float) -> None:
    # Heavy ties at 0 and 1 and the bracket's lower end on a tie: the contract still holds.
    errors = 1.0 - np.array(hits, dtype=np.float64)
    found = worst_group_risk_from_queries(summed_query([errors[::2], errors[1::2]]), rho, 0.0, 1.0, 1e-9)
    assert found == pytest.approx(cvar(errors, rho), abs=1e-9)


def test_query_answers_are_counts_and_excess() -> None:
    assert local_threshold_query(np.array([0.5, 1.0, 2.0, 4.0]), 1.0) == (2.0, 4.0, 4.0)


def test_queries_count_scales_with_tolerance() -> None:
    # Spread-out distinct losses (no early exit): about log2((upper - lower) / tol) rounds.
    calls = []
    inner = summed_query([np.linspace(0.0, 3.0, 101) ** 2])

    def counting(c: float) -> tuple[float, float, float]:
        calls.append(c)
        return inner(c)

    worst_group_risk_from_queries(counting, 0.37, 0.0, 10.0, 1e-6)
    assert len(calls) <= 2 + math.ceil(math.log2(10.0 / 1e-6))


def test_upper_below_the_quantile_is_refused() -> None:
    with pytest.raises(ConfigError, match="raise upper"):
        worst_group_risk_from_queries(summed_query([np.array([1.0, 5.0, 6.0])]), 0.5, 0.0, 2.0)
