"""Each method's Pareto front of worst-group against mean risk, from the study's validation runs.

Every grid point of every method already has a validation run judged at every rho the study judges
(`study.Study.selection_runs`): `fedfair reproduce` reads the fronts off those cached results, so drawing
them trains nothing. They are validation rows (the 20% of training rows the grid is chosen on), not the test
rows of the study's other tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


DIVERGED_RISK = 1e3
"""A worst-group risk above this (or not finite) is a diverged point: left off the front and the figure,
kept in the table marked as such (the baselines section calls a validation risk above 1e3 diverged)."""


def diverged(mean_risk: float, worst_risk: float) -> bool:
    """Whether a point's risks say its run diverged: either is NaN or infinite, or the worst is above `DIVERGED_RISK`."""
    return not (math.isfinite(mean_risk) and math.isfinite(worst_risk)) or worst_risk > DIVERGED_RISK


def on_front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For each (mean risk, worst risk), whether no other point is at or below it in both and strictly below in one.

    A diverged point (`diverged`) is never on the front and dominates nothing; two equal points do not dominate
    each other, so both stay on it.
    """
    kept = [not diverged(mean, worst) for mean, worst in points]

    def dominates(other: tuple[float, float], point: tuple[float, float]) -> bool:
        return other[0] <= point[0] and other[1] <= point[1] and other != point

    return [
        keep and not any(dominates(other, point) for other, other_kept in zip(points, kept, strict=True) if other_kept)
        for point, keep in zip(points, kept, strict=True)
    ]


@dataclass(frozen=True)
class Judged:
    """One grid point of one method at one rho, as its validation run reported it."""

    rho: float
    method: str
    """The method's label."""
    point: str
    """The point's settings in words (`Point.describe`)."""
    mean_risk: float
    worst_risk: float
    chosen: bool
    """Whether the study takes this point to the test rows (the lowest validation worst-group risk)."""


def front_rows(points: Sequence[Judged]) -> list[dict[str, Any]]:
    """`points` as the fronts table's rows, in their order, each marked diverged and on_front.

    A point is on the front against the points of the same method at the same rho (`on_front`).
    """
    marks = [False] * len(points)
    groups: dict[tuple[float, str], list[int]] = {}
    for index, judged in enumerate(points):
        groups.setdefault((judged.rho, judged.method), []).append(index)
    for indices in groups.values():
        risks = [(points[index].mean_risk, points[index].worst_risk) for index in indices]
        for index, kept in zip(indices, on_front(risks), strict=True):
            marks[index] = kept
    return [
        {
            "rho": judged.rho,
            "method": judged.method,
            "point": judged.point,
            "mean_risk": judged.mean_risk,
            "worst_risk": judged.worst_risk,
            "diverged": diverged(judged.mean_risk, judged.worst_risk),
            "on_front": kept,
            "chosen": judged.chosen,
        }
        for judged, kept in zip(points, marks, strict=True)
    ]
