"""A study's choices stopped by validation: each method's step re-chosen at its stopped budget, then tested.

From each method's point chosen by the tuning protocol (its committed ``tuning.csv``), a one-axis search over
the step ladder (the edge rule, `STEP_EXTENSION_RUNS` runs past the chosen step) judges every step by its
stopped validation risk: the lowest validation worst-rho risk of the checkpoints up to a ceiling, the ceiling
raised where the lowest is the ceiling (`stopping.choose_stop`). The test runs of the chosen step train exactly
its stop round on the profile's seeds and keep every held-out row's loss, for the paired gaps. Why: docs/paper.md,
"Stopped by validation".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfair.core.errors import ConfigError
from fedfair.research import stopping, tuning
from fedfair.research.paired import paired_rows
from fedfair.research.runs import Run, judged_at, run_all
from fedfair.research.study import METHOD_LABELS, Point, Study, ladder_point

STEP_EXTENSION_RUNS = 4
"""The steps each method's stopped search may try past its chosen one, the same for every method."""


def committed_choices(tuning_csv: Sequence[Mapping[str, str]], study: Study, rho: float) -> dict[str, Point]:
    """Each study method's point chosen at `rho`, read from the rows of a committed ``tuning.csv``.

    Raises:
        ConfigError: a method of the study has no chosen row at `rho`.
    """
    labels = {label: method for method, label in METHOD_LABELS.items()}
    found: dict[str, Point] = {}
    for row in tuning_csv:
        if row["chosen"] == "True" and float(row["rho"]) == rho and labels[row["method"]] in study.methods:
            method = labels[row["method"]]
            coordinates = tuple(float(value) for value in row["coordinates"].split(" | "))
            found[method] = ladder_point(method, study.search(method).axes, coordinates)
    missing = [method for method in study.methods if method not in found]
    if missing:
        raise ConfigError(f"the tuning table chose no point at rho {rho:g} for {missing}: run their search first")
    return found


def stopping_run(study: Study, method: str, rho: float, point: Point, ceiling: int) -> Run:
    """The validation run (seed 0) of `point` to `ceiling` rounds, keeping its checkpoints' validation risks."""
    lasting = dataclasses.replace(study, profile=dataclasses.replace(study.profile, rounds=ceiling))
    run = lasting.validation_run(method, rho, point)
    return dataclasses.replace(run, validation_every=stopping.CHECK_EVERY)


def stopped_test_runs(study: Study, method: str, rho: float, point: Point, stop_round: int) -> list[Run]:
    """The test runs of `point` trained exactly `stop_round` rounds, one per seed, keeping their rows' losses."""
    stopped = dataclasses.replace(study, profile=dataclasses.replace(study.profile, rounds=stop_round))
    return [dataclasses.replace(run, row_losses=True) for run in stopped.test_runs(method, rho, point)]


def validation_trace(result: Mapping[str, Any], rho: float) -> stopping.Trace:
    """A stopping run's (round, validation worst-rho risk) checkpoints."""
    return [(int(point["round"]), float(point["worst_risk"][f"{rho:g}"])) for point in result["checkpoints"]]


@dataclass(frozen=True)
class Stopped:
    """One method's stopped choice at one rho: its point (step re-chosen), where it stops, and what that cost."""

    point: Point
    stop: stopping.Stop
    search: tuning.Search
    """The one-axis search over the step, each step's stopped validation risk."""
    cpu_seconds: float
    """The CPU seconds of every stopping run the choice read."""
    rounds_trained: int
    """The rounds of every stopping run the choice read."""


def choose(
    study: Study,
    rho: float,
    choices: Mapping[str, Point],
    cache_folder: Path,
    workers: int,
    step_runs: int = STEP_EXTENSION_RUNS,
    ceilings: Sequence[int] = stopping.CEILINGS,
) -> dict[str, Stopped]:
    """Each method's step re-chosen at its stopped validation risk, all methods' runs trained together.

    Each stop round is `stopping.choose_stop`'s over `ceilings` (a shorter ladder than `stopping.CEILINGS` ends
    sooner, its top then named in the stop's limits); `step_runs` bounds the steps tried past
    the chosen one (0: the chosen step alone, stopped; its search then says "unsettled").
    """
    methods = list(choices)
    searches = [
        tuning.Search((dataclasses.replace(tuning.STEP, start=(choices[method].step or 0.0,)),), step_runs)
        for method in methods
    ]
    stops: dict[tuple[str, float], stopping.Stop] = {}
    read: dict[str, dict[Run, dict[str, Any]]] = {method: {} for method in methods}

    def point_of(method: str, step: float) -> Point:
        return dataclasses.replace(choices[method], step=step)

    def evaluate(asked: list[tuple[int, tuning.Coordinates]]) -> list[float]:
        pairs = [(methods[index], point[0]) for index, point in asked]
        # The first rung of every asked step together (a pool trains them at once); a higher rung only at an edge.
        first = [stopping_run(study, method, rho, point_of(method, step), ceilings[0]) for method, step in pairs]
        run_all(first, cache_folder, workers, f"stopping at rho {rho:g}")
        for method, step in pairs:

            def trace_to(ceiling: int, method: str = method, step: float = step) -> stopping.Trace:
                run = stopping_run(study, method, rho, point_of(method, step), ceiling)
                read[method].update(run_all([run], cache_folder, workers, f"stopping at {ceiling} rounds"))
                return validation_trace(read[method][run], rho)

            stops[(method, step)] = stopping.choose_stop(trace_to, ceilings)
        return [stops[pair].risk for pair in pairs]

    tuning.settle(searches, evaluate)
    chosen: dict[str, Stopped] = {}
    for method, search in zip(methods, searches, strict=True):
        step = search.choice()[0]
        mine = list(read[method].values())
        chosen[method] = Stopped(
            point_of(method, step),
            stops[(method, step)],
            search,
            sum(float(result.get("cpu_seconds", 0.0)) for result in mine),
            sum(int(result["checkpoints"][-1]["round"]) if result["checkpoints"] else 0 for result in mine),
        )
    return chosen


def stopped_rows(
    study: Study, rho: float, chosen: Mapping[str, Stopped], cache_folder: Path, workers: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The test runs of every stopped choice: ``stopped.csv``'s rows, the choices' rows, and the paired gaps.

    ``stopped.csv`` has a row per (method, seed): `method,rho,seed,stop_round,max_rounds,held_out_worst_risk`.
    The choices' rows give each method's point, stop round, ceiling, validation risk, limits and costs.
    """
    runs = {
        method: stopped_test_runs(study, method, rho, stopped.point, stopped.stop.round)
        for method, stopped in chosen.items()
        if stopped.stop.round is not None
    }
    results = run_all([run for listed in runs.values() for run in listed], cache_folder, workers, "testing stopped")
    rows, choice_rows = [], []
    for method, stopped in chosen.items():
        tested = [results[run] for run in runs.get(method, [])]
        for seed, result in enumerate(tested):
            rows.append(
                {
                    "method": METHOD_LABELS[method],
                    "rho": rho,
                    "seed": seed,
                    "stop_round": stopped.stop.round,
                    "max_rounds": stopped.stop.ceiling,
                    "held_out_worst_risk": judged_at(result, rho)["worst_risk"],
                }
            )
        search = stopped.search
        limits = [*search.limits(), *stopped.stop.limits]
        choice_rows.append(
            {
                "method": METHOD_LABELS[method],
                "rho": rho,
                "chosen": stopped.point.describe(method),
                "stop_round": stopped.stop.round,
                "max_rounds": stopped.stop.ceiling,
                "validation_worst_risk": stopped.stop.risk,
                "steps_tried": " ".join(f"{point[0]:g}:{risk:.5f}" for point, risk in search.tried.items()),
                "limits": "; ".join(limits),
                "stopping_cpu_seconds": round(stopped.cpu_seconds, 1),
                "stopping_rounds": stopped.rounds_trained,
                "test_cpu_seconds": round(sum(float(result.get("cpu_seconds", 0.0)) for result in tested), 1),
            }
        )
    by_method = {(method, rho): [results[run] for run in listed] for method, listed in runs.items()}
    return rows, choice_rows, paired_rows(by_method, METHOD_LABELS)
