"""The Pareto fronts: the dominance rule and the table's rows, on hand-made points."""

from __future__ import annotations

import math

from fedfair.research.fronts import DIVERGED_RISK, Judged, diverged, front_rows, on_front

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
