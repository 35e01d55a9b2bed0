"""A study's choices stopped by validation: each method's step and own knob re-chosen at its stopped budget, tested.

From each method's point chosen by the tuning protocol (its committed ``tuning.csv``), a search under the edge
rule, one rung along one axis at a time, over the step ladder and the method's own knob (`MAIN_KNOB`; bounded by
`STEP_EXTENSION_RUNS` + `KNOB_EXTENSION_RUNS` runs past the chosen point) judges every point by its stopped
validation risk: the lowest validation worst-rho risk of the checkpoints up to a ceiling, the ceiling raised
where the lowest is the ceiling (`stopping.choose_stops`). A point clearly worse than the choice so far after a
few rounds may be pruned there (`stopping.outrun`). The test runs of the chosen point train exactly its stop
round on the profile's seeds and keep every held-out row's loss, for the paired gaps. Why: docs/paper.md,
"Stopped by validation".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfair.core.errors import ConfigError
from fedfair.fairness.references import reference_reports
from fedfair.research import stopping, tuning
from fedfair.research.paired import paired_rows
from fedfair.research.runs import Run, federation_for, judged_at, run_all
from fedfair.research.study import METHOD_LABELS, OWN_SETTING_AXES, Point, Study, ladder_point

STEP_EXTENSION_RUNS = 4
"""The steps each method's stopped search may try past its chosen one, the same for every method."""

KNOB_EXTENSION_RUNS = 0
"""The runs each method's stopped search may add along its own knob (`MAIN_KNOB`; 0: the step alone)."""

MAIN_KNOB: dict[str, tuning.Axis] = {
    "fedsrcvar": tuning.EPSILON,
    "fedavg": tuning.LOCAL_STEPS,
    "fedavgm": tuning.MOMENTUM,
    "term": tuning.TILT,
    "propfair": tuning.CEILING,
    "deltafl": tuning.LEVEL,
    "fedminmax": tuning.ADVERSARY,
}
"""Each method's own main knob, re-chosen at its stopped budget beside the step: what sets the method apart
(FedAvg's local steps, FedAvgM's momentum, FedMinMax's adversary step), the axis whose choice the round budget moves
most."""

PRUNE_MARGIN = 0.1
"""How much worse (validation worst-rho risk, nats) than the incumbent a candidate must be at the pruning round to
be dropped there (`stopping.outrun`). A guess, set at twice the 0.05 by which FedSRCVaR's MNIST validation
risk at its stop moved between epsilon 0.2 and 0.5 (0.633 and 0.581): a knob's effect that large is kept."""


def knob_value(point: Point, axis: tuning.Axis) -> float:
    """`point`'s value on `axis`, one of `MAIN_KNOB`'s (the step's own axis too).

    Raises:
        ConfigError: `point` sets no value on `axis`.
    """
    value = {
        tuning.STEP.name: point.step,
        tuning.EPSILON.name: point.epsilon,
        tuning.LOCAL_STEPS.name: float(point.local_steps),
        tuning.MOMENTUM.name: point.momentum,
        tuning.ADVERSARY.name: point.adversary_lr,
    }.get(axis.name, point.setting if axis.name in OWN_SETTING_AXES else None)
    if value is None:
        raise ConfigError(f"the point {point.describe()} sets no {axis.name}: choose its knob from a tuned point")
    return value


def with_knob(point: Point, axis: tuning.Axis, value: float) -> Point:
    """`point` with `value` on `axis` (`knob_value`'s axes).

    Raises:
        ConfigError: `axis` is none of them.
    """
    name = axis.name
    if name == tuning.STEP.name:
        return dataclasses.replace(point, step=value)
    if name == tuning.EPSILON.name:
        return dataclasses.replace(point, epsilon=value)
    if name == tuning.MOMENTUM.name:
        return dataclasses.replace(point, momentum=value)
    if name == tuning.LOCAL_STEPS.name:
        return dataclasses.replace(point, local_steps=int(value))
    if name == tuning.ADVERSARY.name:
        return dataclasses.replace(point, adversary_lr=value)
    if name in OWN_SETTING_AXES:
        return dataclasses.replace(point, setting=value)
    raise ConfigError(f"{name} is no knob the stopped search moves: use one of MAIN_KNOB's axes or the step")


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
    """One method's stopped choice at one rho: its point (step and knob re-chosen), where it stops, what it cost."""

    point: Point
    stop: stopping.Stop
    search: tuning.Search
    """The one-axis search over the step (and the method's knob), each point's stopped validation risk."""
    cpu_seconds: float
    """The CPU seconds of every stopping run the choice read (the pruning runs too)."""
    rounds_trained: int
    """The rounds of every stopping run the choice read (the pruning runs too)."""
    pruned: Mapping[tuning.Coordinates, int] = dataclasses.field(default_factory=dict)
    """The points dropped at a pruning round (`stopping.outrun`), each with that round; their risk in `search`
    is their lowest up to it."""


def stopped_axes(method: str, point: Point, knob_runs: int) -> tuple[tuning.Axis, ...]:
    """The axes of `method`'s stopped search, each started at `point`'s value on it.

    The step, then the method's `MAIN_KNOB` where `knob_runs` > 0 (a method without one searches its step alone).
    """
    axes = (tuning.STEP, *((MAIN_KNOB[method],) if knob_runs and method in MAIN_KNOB else ()))
    return tuple(dataclasses.replace(axis, start=(knob_value(point, axis),)) for axis in axes)


def choose(
    study: Study,
    rho: float,
    choices: Mapping[str, Point],
    cache_folder: Path,
    workers: int,
    step_runs: int = STEP_EXTENSION_RUNS,
    ceilings: Sequence[int] = stopping.CEILINGS,
    knob_runs: int = KNOB_EXTENSION_RUNS,
    prune_at: int = 0,
    rechosen: Collection[str] | None = None,
) -> dict[str, Stopped]:
    """Each method's step (and own knob) re-chosen at its stopped validation risk, all methods' runs together.

    Each stop round is `stopping.choose_stops`'s over `ceilings`, every point at a rung trained together (a shorter
    ladder than `stopping.CEILINGS` ends sooner, its top then named in the stop's limits). The search starts at the
    chosen point and follows the edge rule one rung along one axis at a time; `step_runs` + `knob_runs` bound the
    points it tries past the chosen one (0: the chosen point alone, stopped; its search then says "unsettled").
    Where `prune_at` > 0, a point not yet run to the first ceiling is first trained `prune_at` rounds and dropped if
    `stopping.outrun` by the search's choice so far at that round (`PRUNE_MARGIN`): successive halving with one
    rung. Only the methods in `rechosen` (None: every method) are searched; the others are stopped at their chosen
    point alone.
    """
    methods = list(choices)

    def search_of(method: str) -> tuning.Search:
        if rechosen is not None and method not in rechosen:
            return tuning.Search(stopped_axes(method, choices[method], 0), 0)
        return tuning.Search(stopped_axes(method, choices[method], knob_runs), step_runs + knob_runs)

    searches = [search_of(method) for method in methods]
    stops: dict[tuple[str, tuning.Coordinates], stopping.Stop] = {}
    traces: dict[tuple[str, tuning.Coordinates], stopping.Trace] = {}
    pruned: dict[str, dict[tuning.Coordinates, int]] = {method: {} for method in methods}
    read: dict[str, dict[Run, dict[str, Any]]] = {method: {} for method in methods}

    def point_of(method: str, coordinates: tuning.Coordinates) -> Point:
        point = choices[method]
        for axis, value in zip(searches[methods.index(method)].axes, coordinates, strict=True):
            point = with_knob(point, axis, value)
        return point

    def runs_to(pairs: list[tuple[str, tuning.Coordinates]], rounds: int) -> list[stopping.Trace]:
        runs = [stopping_run(study, method, rho, point_of(method, point), rounds) for method, point in pairs]
        results = run_all(runs, cache_folder, workers, f"stopping at rho {rho:g} to {rounds} rounds")
        for (method, _), run in zip(pairs, runs, strict=True):
            read[method][run] = results[run]
        return [validation_trace(results[run], rho) for run in runs]

    def cached(method: str, point: tuning.Coordinates) -> bool:
        # A point whose first-ceiling run is cached already costs nothing to judge whole: never pruned.
        run = stopping_run(study, method, rho, point_of(method, point), ceilings[0])
        return (cache_folder / f"{run.key}.json").exists()  # run_all's cache file

    def incumbent(index: int) -> stopping.Trace | None:
        search = searches[index]
        return traces.get((methods[index], search.choice())) if search.tried else None

    def evaluate(asked: list[tuple[int, tuning.Coordinates]]) -> list[float]:
        pairs = [(methods[index], point) for index, point in asked]
        risks: dict[tuple[str, tuning.Coordinates], float] = {}
        ahead = [
            (index, point)
            for index, point in asked
            if prune_at and incumbent(index) is not None and not cached(methods[index], point)
        ]
        for (index, point), trace in zip(ahead, runs_to([(methods[i], p) for i, p in ahead], prune_at), strict=True):
            best = incumbent(index)
            assert best is not None  # ahead holds only points whose search has a choice
            if stopping.outrun(trace, best, prune_at, PRUNE_MARGIN):
                pruned[methods[index]][point] = prune_at
                risks[(methods[index], point)] = stopping.lowest_until(trace, prune_at)
        kept = [pair for pair in pairs if pair not in risks]

        def traces_to(ceiling: int, pending: list[tuple[str, tuning.Coordinates]]) -> list[stopping.Trace]:
            # Every pending point of a rung together (a pool trains them at once); a higher rung only at an edge.
            found = runs_to(pending, ceiling)
            traces.update(zip(pending, found, strict=True))
            return found

        stops.update(stopping.choose_stops(traces_to, kept, ceilings))
        risks.update((pair, stops[pair].risk) for pair in kept)
        return [risks[pair] for pair in pairs]

    tuning.settle(searches, evaluate)
    chosen: dict[str, Stopped] = {}
    for method, search in zip(methods, searches, strict=True):
        point = search.choice()
        mine = list(read[method].values())
        chosen[method] = Stopped(
            point_of(method, point),
            stops[(method, point)],
            search,
            sum(float(result.get("cpu_seconds", 0.0)) for result in mine),
            sum(int(result["checkpoints"][-1]["round"]) if result["checkpoints"] else 0 for result in mine),
            pruned[method],
        )
    return chosen


def coordinates(point: tuning.Coordinates) -> str:
    """A point of a stopped search in the choices' table, its axes' values joined by ``|``, e.g. ``0.1|0.2``."""
    return "|".join(f"{value:g}" for value in point)


HELD_OUT_COLUMNS = ("worst_risk", "mean_risk", "accuracy", "worst_error")
"""A test run's held-out figures in ``stopped.csv``, each as ``held_out_<figure>``: the worst-rho risk the table
ranks by, beside the mean risk, the accuracy and the worst-rho error that say what the ranking buys (issue 96)."""


def held_out_row(
    label: str, rho: float, seed: int, stop_round: int | None, ceiling: int, result: Mapping[str, Any]
) -> dict[str, Any]:
    """One test run's row of ``stopped.csv``: `method,rho,seed,stop_round,max_rounds` and `HELD_OUT_COLUMNS`."""
    report = judged_at(result, rho)
    return {
        "method": label,
        "rho": rho,
        "seed": seed,
        "stop_round": stop_round,
        "max_rounds": ceiling,
        **{f"held_out_{figure}": report[figure] for figure in HELD_OUT_COLUMNS},
    }


def stopped_rows(
    study: Study, rho: float, chosen: Mapping[str, Stopped], cache_folder: Path, workers: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The test runs of every stopped choice: ``stopped.csv``'s rows, the choices' rows, and the paired gaps.

    ``stopped.csv`` has a row per (method, seed), `held_out_row`'s.
    The choices' rows give each method's point, stop round, ceiling, validation risk, the axes searched, the points
    tried (``step|knob:risk``, space-separated), those pruned (``step|knob@round``), limits and costs.
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
        rows += [
            held_out_row(METHOD_LABELS[method], rho, seed, stopped.stop.round, stopped.stop.ceiling, result)
            for seed, result in enumerate(tested)
        ]
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
                "axes": " | ".join(axis.name for axis in search.axes),
                "points_tried": " ".join(f"{coordinates(point)}:{risk:.5f}" for point, risk in search.tried.items()),
                "pruned": " ".join(f"{coordinates(point)}@{rounds}" for point, rounds in stopped.pruned.items()),
                "limits": "; ".join(limits),
                "stopping_cpu_seconds": round(stopped.cpu_seconds, 1),
                "stopping_rounds": stopped.rounds_trained,
                "test_cpu_seconds": round(sum(float(result.get("cpu_seconds", 0.0)) for result in tested), 1),
            }
        )
    by_method = {(method, rho): [results[run] for run in listed] for method, listed in runs.items()}
    return rows, choice_rows, paired_rows(by_method, METHOD_LABELS)


def committed_stops(
    choice_rows: Sequence[Mapping[str, str]], tuning_csv: Sequence[Mapping[str, str]], study: Study, rho: float
) -> dict[str, tuple[Point, int, int]]:
    """Each study method's stopped choice at `rho` read back from a committed ``stopped_choice.csv``.

    Each is (point, stop round, ceiling): the point rebuilt from the tuned point its search started at
    (`committed_choices`) moved to the point tried whose description is the row's ``chosen``, so a test run of it
    has the flags the committed test runs had. A table written before the knob search, with ``steps_tried`` in
    place of ``axes`` and ``points_tried`` (``stopped_choice_at_200_round_points.csv``), searched the step alone.

    Raises:
        ConfigError: a method has no row at `rho`, or no point it tried is the one the row names.
    """
    labels = {label: method for method, label in METHOD_LABELS.items()}
    starts = committed_choices(tuning_csv, study, rho)
    found: dict[str, tuple[Point, int, int]] = {}
    for row in choice_rows:
        method = labels[row["method"]]
        if float(row["rho"]) != rho or method not in study.methods:
            continue
        knob_axes = len(row["axes"].split(" | ")) - 1 if "axes" in row else 0
        axes = stopped_axes(method, starts[method], knob_axes)
        for tried in row.get("points_tried", row.get("steps_tried", "")).split():
            point = starts[method]
            for axis, value in zip(axes, tried.split(":")[0].split("|"), strict=True):
                point = with_knob(point, axis, float(value))
            if point.describe(method) == row["chosen"]:
                found[method] = (point, int(row["stop_round"]), int(row["max_rounds"]))
                break
        else:
            raise ConfigError(f"no point {row['method']} tried is its choice {row['chosen']!r}: is the table whole?")
    missing = [method for method in study.methods if method not in found]
    if missing:
        raise ConfigError(f"the stopped choices hold no row at rho {rho:g} for {missing}: run their stopped search")
    return found


def retested_rows(
    study: Study, rho: float, stops: Mapping[str, tuple[Point, int, int]], cache_folder: Path, workers: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The test runs of committed stopped choices (`committed_stops`) trained again: their rows and paired gaps.

    The rows are ``stopped.csv``'s, each with the run's ``cpu_seconds`` too (the cache's, as first trained); the
    gaps are ``stopped_paired.csv``'s, between the runs trained again (none where FedSRCVaR is not among them).
    """
    runs = {method: stopped_test_runs(study, method, rho, point, stop) for method, (point, stop, _) in stops.items()}
    results = run_all([run for listed in runs.values() for run in listed], cache_folder, workers, "testing again")
    rows = [
        held_out_row(METHOD_LABELS[method], rho, seed, stops[method][1], stops[method][2], results[run])
        | {"cpu_seconds": round(float(results[run].get("cpu_seconds", 0.0)), 1)}
        for method, listed in runs.items()
        for seed, run in enumerate(listed)
    ]
    by_method = {(method, rho): [results[run] for run in listed] for method, listed in runs.items()}
    return rows, paired_rows(by_method, METHOD_LABELS)


def reference_rows(study: Study) -> list[dict[str, Any]]:
    """h̄'s and the base rate's figures on the study's test rows at each of its rhos (``references.csv``): exact.

    No training: the base rate's shares are those of the pooled training rows every test run trains on.
    """
    federation = federation_for(study.test_runs(study.methods[0], study.rhos[0], Point(1.0))[0].flags, "test")
    train, test = federation.pooled("train").labels.numpy(), federation.pooled("test").labels.numpy()
    return [
        {"predictor": name, "rho": rho, "held_out_rows": test.size}
        | {f"held_out_{figure}": getattr(report, figure) for figure in HELD_OUT_COLUMNS}
        for rho in study.rhos
        for name, report in reference_reports(train, test, federation.num_classes, rho).items()
    ]
