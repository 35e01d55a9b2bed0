"""The Pareto fronts: the dominance rule and the table's rows, on hand-made points."""

from __future__ import annotations

import math

import pytest

from fedfair.research.fronts import DIVERGED_RISK, Judged, diverged, dominance_rows, front_rows, on_front, worst_at_mean

NAN = math.nan


def test_a_point_is_on_the_front_unless_another_is_no_worse_in_both_and_better_in_one() -> None:
    points = [
        (1.0, 3.0),  # the lowest mean risk: on
        (2.0, 2.0),  # on
        (2.0, 2.0),  # its equal: neither dominates the other, both on
        (2.0, 2.5),  # the same mean as (2, 2), a higher worst: off
        (2.5, 2.0),  # the same worst as (2, 2), a higher mean: off
        (3.0, 1.0),  # the lowest worst risk: on
        (3.0, 3.0),  # above every other: off
        (NAN, 0.1),  # diverged: off, and dominates nothing though its worst risk is the lowest
        (0.5, 2 * DIVERGED_RISK),  # diverged by size: off, though its mean risk is the lowest
    ]
    assert on_front(points) == [True, True, True, False, False, True, False, False, False]


def test_edge_cases_of_the_front() -> None:
    assert on_front([]) == []
    assert on_front([(0.7, 0.9)]) == [True]
    assert on_front([(NAN, NAN), (math.inf, 1.0)]) == [False, False]
    assert on_front([(1.0, 1.0), (1.0, 1.0), (1.0, 1.0)]) == [True, True, True]
    assert not diverged(0.5, DIVERGED_RISK) and diverged(0.5, DIVERGED_RISK * 1.01) and diverged(NAN, 0.5)


def test_each_methods_front_at_each_rho_is_its_own() -> None:
    """The rows keep their order; a point is judged against its own method at its own rho only."""
    points = [
        Judged(0.1, "A", "a1", 0.5, 1.0, chosen=True),
        Judged(0.1, "B", "b1", 0.4, 0.9, chosen=True),  # below A's point in both: no matter, another method
        Judged(0.1, "A", "a2", 0.6, 1.1, chosen=False),  # below a1 in neither: dominated by it
        Judged(0.3, "A", "a2", 0.6, 0.7, chosen=True),  # A at another rho: on its own front
        Judged(0.3, "A", "a1", 0.5, NAN, chosen=False),
    ]
    rows = front_rows(points)
    assert [row["point"] for row in rows] == ["a1", "b1", "a2", "a2", "a1"]
    assert [row["on_front"] for row in rows] == [True, True, False, True, False]
    assert [row["diverged"] for row in rows] == [False, False, False, False, True]
    assert [row["chosen"] for row in rows] == [True, True, False, True, False]
    assert list(rows[0]) == ["rho", "method", "point", "mean_risk", "worst_risk", "diverged", "on_front", "chosen"]


def test_a_front_is_read_on_the_segment_between_its_points_and_at_its_end_past_them() -> None:
    # Three points on the front, one dominated: at mean 0.35, halfway between (0.3, 0.9) and (0.4, 0.7), 0.8.
    points = [(0.3, 0.9), (0.4, 0.7), (0.6, 0.65), (0.5, 0.95)]
    assert worst_at_mean(points, 0.35) == pytest.approx(0.8)
    assert worst_at_mean(points, 0.4) == pytest.approx(0.7)
    assert worst_at_mean(points, 0.5) == pytest.approx(0.675)  # the dominated (0.5, 0.95) is no part of it
    # Past its last point the front's lowest worst risk (a lower mean is no cost); before its first, nothing.
    assert worst_at_mean(points, 0.7) == pytest.approx(0.65) and worst_at_mean(points, 0.2) is None
    assert worst_at_mean([(0.3, 0.9)], 0.3) == pytest.approx(0.9) and worst_at_mean([], 0.3) is None


def test_each_front_is_read_at_fedavgs_mean_seed_by_seed_and_paired_against_the_reference() -> None:
    rows = []
    for seed, shift in ((0, 0.0), (1, 0.01), (2, 0.02)):
        rows += [
            {"method": "FedAvg", "seed": seed, "held_out_mean_risk": 0.4, "held_out_worst_risk": 0.9 + shift},
            {"method": "FedSRCVaR", "seed": seed, "held_out_mean_risk": 0.3, "held_out_worst_risk": 0.9 + shift},
            {"method": "FedSRCVaR", "seed": seed, "held_out_mean_risk": 0.5, "held_out_worst_risk": 0.7 + shift},
            # TERM's front starts above FedAvg's mean on seed 2: that seed reads nothing for it.
            {
                "method": "TERM",
                "seed": seed,
                "held_out_mean_risk": 0.3 if seed < 2 else 0.45,
                "held_out_worst_risk": 0.95,
            },
            {
                "method": "TERM",
                "seed": seed,
                "held_out_mean_risk": 0.5,
                "held_out_worst_risk": 0.75,
            },
        ]
    by = {row["method"]: row for row in dominance_rows(rows, "FedSRCVaR", "FedAvg")}
    # FedSRCVaR at mean 0.4: 0.8, 0.81, 0.82; TERM 0.85 on seeds 0 and 1: gaps 0.05 and 0.04.
    assert by["FedSRCVaR"]["worst_at_anchor_mean"] == pytest.approx(0.81)
    assert by["FedSRCVaR"]["gap_to_reference"] == pytest.approx(0.0) and by["FedSRCVaR"]["seeds"] == 3
    assert by["TERM"]["seeds"] == 2 and by["TERM"]["gap_to_reference"] == pytest.approx(0.045)
    assert by["TERM"]["gap_standard_error"] == pytest.approx(0.005)
    assert by["FedAvg"]["gap_to_reference"] == pytest.approx(0.9 + 0.01 - 0.81)
