"""Pooled group risk metrics (`fedfair.fairness.pooled`) agree with brute force.

The secure-sum form is checked against these in `test_sums.py`.
"""

from __future__ import annotations

from random import Random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedfair.core.errors import ConfigError
from fedfair.fairness.pooled import best_group_risk, group_risk_report, worst_group_risk
from fedfair.fairness.report import GroupRiskReport
from tests.fairness.strategies import loss_vectors, rhos, scale


def brute_worst(values: np.ndarray, rho: float) -> float:
    """min over c of c + mean((l - c)+) / rho, over the kinks c = l_i where a minimum of this
    convex piecewise-linear function lies: independent of objective.cvar's sorting rule."""
    return float(min(c + np.maximum(values - c, 0.0).mean() / rho for c in values))


def brute_best(values: np.ndarray, rho: float) -> float:
    """max over c of c - mean((c - l)+) / rho: the mean of the lowest rho-fraction."""
    return float(max(c - np.maximum(c - values, 0.0).mean() / rho for c in values))


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
    assert report.disparity == 0.0 and report.worst_minus_best == pytest.approx(0.0, abs=1e-12 * scale(values))
    for value in (report.worst_error, report.best_error):
        assert value == pytest.approx(report.mean_error, abs=1e-12)


@given(loss_vectors, rhos)
def test_disparity_is_the_worst_group_against_the_rest_of_the_samples(values: np.ndarray, rho: float) -> None:
    """The paper's disparity, checked where the groups are whole samples: rho n an integer."""
    count = max(1, int(rho * values.size))
    if count == values.size:
        return  # nothing remains outside the worst group
    exact_rho = count / values.size
    ranked = np.sort(values)[::-1]
    report = group_risk_report(values, values < 1.0, exact_rho)
    expected = ranked[:count].mean() - ranked[count:].mean()
    assert report.disparity == pytest.approx(expected, rel=1e-9, abs=1e-9 * scale(values))
    assert report.worst_minus_best == pytest.approx(report.worst_risk - report.best_risk)


def test_worst_group_of_an_exact_fraction_is_the_top_mean() -> None:
    values = np.array([4.0, 1.0, 3.0, 2.0, 0.0])
    assert worst_group_risk(values, 0.4) == pytest.approx(3.5)
    assert best_group_risk(values, 0.4) == pytest.approx(0.5)
    # rho n = 1.5: the whole top sample and half of the next.
    assert worst_group_risk(values, 0.3) == pytest.approx((4.0 + 0.5 * 3.0) / 1.5)


@given(st.lists(st.booleans(), min_size=1, max_size=60), rhos, st.randoms(use_true_random=False))
def test_error_groups_rank_by_their_own_error(hits: list[bool], rho: float, random: Random) -> None:
    correct = np.array(hits)
    # Losses unrelated to correctness: the error groups must not follow the loss ranking.
    losses = np.array([random.uniform(0.0, 5.0) for _ in hits])
    report = group_risk_report(losses, correct, rho)
    n, wrong = correct.size, int((~correct).sum())
    # The worst rho n samples by 0-1 error hold min(wrong, rho n) errors; the best hold
    # the errors left over once the other (1 - rho) n samples have taken theirs.
    assert report.worst_error == pytest.approx(min(wrong, rho * n) / (rho * n), abs=1e-12)
    assert report.best_error == pytest.approx(max(wrong - (1.0 - rho) * n, 0.0) / (rho * n), abs=1e-12)
    assert report.error_worst_minus_best == pytest.approx(report.worst_error - report.best_error)
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
    assert isinstance(report, GroupRiskReport) and report.certificate is None, "exact, so no certificate"
    assert report.to_dict() == {
        "rho": 0.25,
        "mean_risk": 3.0,
        "worst_risk": 6.0,
        "best_risk": 1.0,
        # The worst quarter (6) against the other three quarters (mean 2): the paper's disparity.
        "disparity": 4.0,
        "worst_minus_best": 5.0,
        "accuracy": 0.5,
        "mean_error": 0.5,
        "worst_error": 1.0,
        "best_error": 0.0,
        "error_disparity": (1.0 - 0.5) / 0.75,  # the all-wrong worst quarter against the rest
        "error_worst_minus_best": 1.0,
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
