"""The report's derived figures: disparity is the worst group against the rest (0 at rho = 1); to_dict is flat JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.fairness.report import GroupRiskReport, SecureSumCertificate, disparity
from tests.fairness.strategies import loss_values, scale


def groups(values: np.ndarray, k: int) -> tuple[float, float, float, float]:
    """Mean of the k largest, of all, of the other n - k, and of the k smallest values, by sorting."""
    ordered = np.sort(values)[::-1]
    return float(ordered[:k].mean()), float(values.mean()), float(ordered[k:].mean()), float(ordered[-k:].mean())


@settings(max_examples=80, deadline=None)
@given(data=st.data(), losses=st.lists(loss_values, min_size=2, max_size=40))
def test_disparity_is_the_worst_groups_mean_minus_the_mean_of_everyone_else(
    data: st.DataObject, losses: list[float]
) -> None:
    values = np.array(losses, dtype=np.float64)
    hits = np.array(data.draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values))), dtype=np.float64)
    k = data.draw(st.integers(1, len(values) - 1))
    rho = k / len(values)
    worst, mean, rest, best = groups(values, k)
    worst_error, mean_error, rest_error, best_error = groups(1.0 - hits, k)
    report = GroupRiskReport.from_risks(
        rho=rho,
        mean_risk=mean,
        worst_risk=worst,
        best_risk=best,
        mean_error=mean_error,
        worst_error=worst_error,
        best_error=best_error,
    )
    # Means of at most 40 values carry about 40 ulps of their scale; dividing by 1 - rho >= 1/40 multiplies
    # that by at most 40, so 1e-10 of the scale is a wide margin that a wrong formula (e.g. / rho) cannot meet.
    tolerance = 1e-10 * scale(values)
    assert report.disparity == pytest.approx(worst - rest, abs=tolerance)
    assert report.error_disparity == pytest.approx(worst_error - rest_error, abs=1e-10)
    assert report.accuracy == pytest.approx(hits.mean(), abs=1e-12)
    assert report.disparity >= -tolerance, "the worst group is never better than the rest"
    # The best rho-fraction lies inside the rest when rho <= 1/2, and contains the rest when rho >= 1/2.
    if rho <= 0.5:
        assert report.worst_minus_best >= report.disparity - tolerance
    if rho >= 0.5:
        assert report.worst_minus_best <= report.disparity + tolerance


def test_at_rho_one_nothing_remains_so_disparity_is_zero_even_for_certified_bounds() -> None:
    """A report from secure sums may put the worst group's bound above the mean at rho = 1: still no disparity."""
    assert disparity(2.5, 2.0, 1.0) == 0.0
    report = GroupRiskReport.from_risks(
        rho=1.0, mean_risk=2.0, worst_risk=2.01, best_risk=1.99, mean_error=0.25, worst_error=0.25, best_error=0.25
    )
    assert report.disparity == 0.0 and report.error_disparity == 0.0
    assert report.worst_minus_best == pytest.approx(0.02), "the worst-minus-best gap still shows the bounds' width"


def test_a_certified_report_flattens_its_certificate_into_json_ready_numbers() -> None:
    certificate = SecureSumCertificate(
        samples=1234,
        worst_risk_gap=0.003,
        best_risk_gap=0.002,
        mean_error_bound=1e-6,
        error_rate_bound=0.01,
        disparity_bound=0.005,
        noise_std=2.5,
        confidence=0.95,
        loss_cap=3.0,
    )
    report = GroupRiskReport.from_risks(
        rho=0.2,
        mean_risk=0.5,
        worst_risk=1.3,
        best_risk=0.1,
        mean_error=0.2,
        worst_error=0.8,
        best_error=0.0,
        certificate=certificate,
    )
    flat = report.to_dict()
    assert all(type(value) in (int, float) for value in flat.values()), "flat numbers, no nested certificate"
    assert json.loads(json.dumps(flat)) == flat
    assert (flat["samples"], flat["worst_risk_gap"], flat["best_risk_gap"], flat["mean_error_bound"]) == (
        1234,
        0.003,
        0.002,
        1e-6,
    )
    assert (flat["noise_std"], flat["confidence"], flat["loss_cap"], flat["error_rate_bound"]) == (2.5, 0.95, 3.0, 0.01)
    assert flat["disparity"] == report.disparity and flat["rho"] == 0.2
    assert report.certificate is certificate, "flattening leaves the report as it was"
