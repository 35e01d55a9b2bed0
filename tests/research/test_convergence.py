"""Rounds to within 1% of the final value, on hand-made traces, and a traced run's row."""

from __future__ import annotations

import math

from fedfair.research.convergence import settled_round, trace_row

NAN = math.nan


def trace(*values: float) -> list[tuple[int, float]]:
    """`values` recorded every 5 rounds, from round 5."""
    return [(5 * (index + 1), value) for index, value in enumerate(values)]


def test_a_monotone_trace_settles_where_it_enters_the_band() -> None:
    assert settled_round(trace(2.0, 1.5, 1.1, 1.02, 1.005, 1.0)) == 25
    assert settled_round(trace(0.5, 0.9, 0.995, 1.0)) == 15  # rising as well as falling


def test_an_oscillating_trace_settles_when_it_stops_leaving_the_band() -> None:
    assert settled_round(trace(1.2, 0.8, 1.05, 0.995, 1.008, 0.992, 1.0)) == 20


def test_a_trace_that_leaves_the_band_late_settles_after_its_last_excursion() -> None:
    assert settled_round(trace(1.0, 1.0, 1.0, 1.0, 1.02, 1.0)) == 30
    assert settled_round(trace(1.0, 1.0, 1.0, 1.0, 0.98, 1.0)) == 30


def test_a_final_value_of_zero_leaves_a_band_of_width_zero() -> None:
    assert settled_round(trace(0.1, 0.0, 1e-9, 0.0, 0.0)) == 20


def test_the_band_is_relative_inclusive_and_nan_is_outside() -> None:
    assert settled_round(trace(12.0, 10.5, 10.0)) == 15  # 1% of 10 is 0.1: 10.5 is out at 1% ...
    assert settled_round(trace(12.0, 10.5, 10.0), tolerance=0.05) == 10  # ... and in at 5% (exactly its edge)
    assert settled_round(trace(12.0, 10.5, 10.0), tolerance=0.04) == 15
    assert settled_round(trace(1.0, NAN, 1.0)) == 15
    assert settled_round(trace(1.0, 1.0, NAN)) is None
    assert settled_round([]) is None
    assert settled_round([(200, 0.7)]) == 200


def test_a_traced_runs_row_reads_its_rho_and_a_diverged_run_has_none() -> None:
    history = [
        {"round": 5, "mean_loss": 0.60, "worst_risk": {"0.1": 1.00, "0.3": 0.80}},
        {"round": 10, "mean_loss": 0.55, "worst_risk": {"0.1": 0.95, "0.3": 0.70}},
        {"round": 12, "mean_loss": 0.551, "worst_risk": {"0.1": 0.90, "0.3": 0.70}},
    ]
    at_03 = {"worst_risk": 0.75, "mean_risk": 0.58}
    result = {"rho": 0.1, "worst_risk": 0.97, "mean_risk": 0.58, "at_rho": {"0.3": at_03}, "history": history}
    assert trace_row(result, 0.3) == {
        "final_worst_risk": 0.70,
        "worst_risk_round": 10,
        "final_mean_loss": 0.551,
        "mean_loss_round": 10,
        "held_out_worst_risk": 0.75,
        "held_out_mean_risk": 0.58,
    }
    at_01 = trace_row(result, 0.1)
    assert at_01["worst_risk_round"] == 12 and at_01["held_out_worst_risk"] == 0.97
    diverged = {"rho": 0.1, "worst_risk": NAN, "mean_risk": NAN, "history": history[:1], "diverged": "lower --lr"}
    row = trace_row(diverged, 0.3)
    assert math.isnan(row["final_worst_risk"]) and row["worst_risk_round"] is None and row["mean_loss_round"] is None
    assert math.isnan(row["held_out_worst_risk"])
