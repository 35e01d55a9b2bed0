"""Each method's Pareto front of worst-group against mean risk, and one figure that compares two fronts.

Every grid point of every method already has a validation run judged at every rho the study judges
(`study.Study.selection_runs`): `fedfair reproduce` reads the fronts off those cached results, so drawing
them trains nothing. They are validation rows (the 20% of training rows the grid is chosen on), not the test
rows of the study's other tables. The stopped fronts (`benchmarks/fronts_study.py`) are test rows, each point
stopped by validation, and `dominance_rows` reads each at FedAvg's held-out mean risk (issue 96).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


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


def worst_at_mean(points: Sequence[tuple[float, float]], mean: float) -> float | None:
    """The lowest worst risk the front of `points` (mean, worst) reaches at a mean risk of at most `mean`.

    The front (`on_front`) in order of mean risk falls in worst risk: between two of its points the figure is on the
    segment joining them, past its last point its last point's (a lower mean risk is no cost). None where `mean` is
    below every point's mean risk: no point of the front is as good on the mean.
    """
    front = sorted(point for point, kept in zip(points, on_front(points), strict=True) if kept)
    if not front or mean < front[0][0]:
        return None
    for (low_mean, low_worst), (high_mean, high_worst) in zip(front, front[1:]):
        if low_mean <= mean < high_mean:
            return low_worst + (mean - low_mean) / (high_mean - low_mean) * (high_worst - low_worst)
    return front[-1][1]


def dominance_rows(points: Sequence[Mapping[str, Any]], reference: str, anchor: str) -> list[dict[str, Any]]:
    """Each method's front read at `anchor`'s mean risk, seed by seed, and its gap to `reference`'s, paired.

    `points` are ``fronts_stopped.csv``'s rows (``method``, ``seed``, ``held_out_mean_risk``,
    ``held_out_worst_risk``): on each seed a method's points make its front, `anchor`'s (FedAvg's) point on that
    seed gives the mean risk it is read at (`worst_at_mean`: the lowest worst risk at no higher a mean risk). A row per method: the mean over the seeds where both
    it and `reference` reach that mean risk, and its gap to `reference` with the gap's standard error over them
    (None with fewer than two such seeds).
    """
    by: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for row in points:
        key = (str(row["method"]), str(row["seed"]))
        by.setdefault(key, []).append((float(row["held_out_mean_risk"]), float(row["held_out_worst_risk"])))
    seeds = sorted({seed for method, seed in by if method == anchor})
    methods = list(dict.fromkeys(method for method, _ in by))
    rows = []
    for method in methods:
        read, gaps = [], []
        for seed in seeds:
            at = by[(anchor, seed)][0][0]
            mine = worst_at_mean(by.get((method, seed), []), at)
            theirs = worst_at_mean(by.get((reference, seed), []), at)
            if mine is not None and theirs is not None:
                read.append(mine)
                gaps.append(mine - theirs)
        spread = float(np.std(gaps, ddof=1) / math.sqrt(len(gaps))) if len(gaps) >= 2 else None
        rows.append(
            {
                "method": method,
                "seeds": len(gaps),
                "worst_at_anchor_mean": float(np.mean(read)) if read else None,
                "gap_to_reference": float(np.mean(gaps)) if gaps else None,
                "gap_standard_error": spread,
            }
        )
    return rows
