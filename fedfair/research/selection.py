"""How `fedfair reproduce` chooses each method's point on validation rows, and the tuned profile's tables of it.

On a fixed grid every point is trained once and the lowest validation worst-group risk wins (`chosen`);
under the tuning protocol (`Profile.ladders`) each method's `tuning.Search` runs to its end, the points of
every search trained together each round (`select`). `tuning_rows` and `grid_rows` are the tuned profile's
`tuning.csv` and `grids.csv`: every point tried and every method's axes, so that a reader can check the
edge rule from the tables alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfair.research import tuning
from fedfair.research.runs import Run, judged_at, run_all
from fedfair.research.study import METHOD_LABELS, Point, Study, ladder_point


def chosen(study: Study, method: str, rho: float, results: Mapping[Run, dict[str, Any]]) -> Point:
    """The grid point with the lowest validation worst-group risk (ties: the first; a diverged run's NaN never wins)."""
    runs = study.selection_runs(method, rho)
    risks = [judged_at(results[run], rho)["worst_risk"] for run in runs]
    best = min(range(len(runs)), key=lambda index: risks[index] if math.isfinite(risks[index]) else math.inf)
    return study.grid(method, rho)[best]


@dataclass(frozen=True)
class Selection:
    """How one method's point at one rho was chosen: every validation point tried, the choice, and its marks."""

    points: tuple[Point, ...]
    runs: tuple[Run, ...]
    choice: Point
    limits: tuple[str, ...] = ()
    """Why the choice is not strictly inside finite neighbours on every axis (`tuning.Search.limits`)."""
    search: tuning.Search | None = None
    """The tuning protocol's search (None: a fixed grid)."""


def select(
    study: Study, wanted: Sequence[tuple[str, float]], cache_folder: Path, workers: int, on_ray: bool = False
) -> tuple[dict[tuple[str, float], Selection], dict[Run, dict[str, Any]]]:
    """Each (method, rho) of `wanted` chosen on validation rows, with every validation result it read.

    On a fixed grid: every point, then `chosen`. Under the tuning protocol (`Profile.ladders`): each one's
    `tuning.Search` run to its end, the points of every search trained together each round.
    """
    if not study.profile.ladders:
        runs = [run for method, rho in wanted for run in study.selection_runs(method, rho)]
        fixed = run_all(runs, cache_folder, workers, "choosing hyperparameters", on_ray)
        return {
            (method, rho): Selection(
                tuple(study.grid(method, rho)),
                tuple(study.selection_runs(method, rho)),
                chosen(study, method, rho, fixed),
            )
            for method, rho in wanted
        }, fixed
    searches = [study.search(method) for method, _ in wanted]
    results: dict[Run, dict[str, Any]] = {}

    def evaluate(asked: list[tuple[int, tuning.Coordinates]]) -> list[float]:
        runs = [study.validation_run(*pair(index, point)) for index, point in asked]
        results.update(run_all(runs, cache_folder, workers, "choosing hyperparameters", on_ray))
        pairs = zip(runs, asked, strict=True)
        return [float(judged_at(results[run], wanted[index][1])["worst_risk"]) for run, (index, _) in pairs]

    def pair(index: int, point: tuning.Coordinates) -> tuple[str, float, Point]:
        method, rho = wanted[index]
        return method, rho, ladder_point(method, searches[index].axes, point)

    tuning.settle(searches, evaluate)
    while seed_nested(wanted, searches):
        tuning.settle(searches, evaluate)
    selections = {}
    for (method, rho), search in zip(wanted, searches, strict=True):
        points = tuple(ladder_point(method, search.axes, point) for point in search.tried)
        selections[(method, rho)] = Selection(
            points,
            tuple(study.validation_run(method, rho, point) for point in points),
            ladder_point(method, search.axes, search.choice()),
            tuple(search.limits()),
            search,
        )
    return selections, results


def seed_nested(wanted: Sequence[tuple[str, float]], searches: Sequence[tuning.Search]) -> bool:
    """Seed each search with the current choice of every method it holds as a limit case (`tuning.NESTED`).

    Whether any search got a point it has not tried: then the searches go on, and are seeded again once they
    end, until no choice yields a new seed (each inner method's final choice is tried by its outer methods).
    """
    index_of = {pair: index for index, pair in enumerate(wanted)}
    fresh = False
    for (method, rho), search in zip(wanted, searches, strict=True):
        for nesting in tuning.NESTED.get(method, ()):
            inner = index_of.get((nesting.inner, rho))
            if inner is None:
                continue
            point = tuning.nested_point(search.axes, searches[inner].axes, searches[inner].choice(), nesting)
            fresh |= search.seed(point, f"{METHOD_LABELS[nesting.inner]}'s choice")
    return fresh


def tuning_rows(selections: Mapping[tuple[str, float], Selection]) -> list[dict[str, Any]]:
    """Every point the tuning protocol tried, a row each: where it sits on its method's axes and what it read.

    `coordinates` lists the point's value on each of `axes` (both joined by " | "), so that a reader can check
    the edge rule against the ladders (`tuning`) from this table alone.
    """
    rows = []
    for (method, rho), selection in selections.items():
        search = selection.search
        if search is None:
            continue
        choice = search.choice()
        for point, (coordinates, risk) in zip(selection.points, search.tried.items(), strict=True):
            rows.append(
                {
                    "method": METHOD_LABELS[method],
                    "rho": rho,
                    "axes": " | ".join(axis.name for axis in search.axes),
                    "coordinates": " | ".join(f"{value:g}" for value in coordinates),
                    "point": point.describe(method),
                    "round": search.round_of[coordinates],
                    "seeded_from": search.seeds.get(coordinates, ""),
                    "worst_risk": risk,
                    "chosen": coordinates == choice,
                }
            )
    return rows


def grid_rows(study: Study) -> list[dict[str, Any]]:
    """The tuning protocol's axes of every study method: its ladder, where it starts, what its ends are."""
    return [
        {
            "method": METHOD_LABELS[method],
            "axis": axis.name,
            "ladder": " ".join(f"{value:g}" for value in axis.ladder),
            "start": " ".join(f"{value:g}" for value in axis.start),
            "below": axis.below,
            "above": axis.above,
            "starting_points": len(search.start()),
            "budget": search.budget,
        }
        for method in study.methods
        for search in (study.search(method),)
        for axis in search.axes
    ]
