"""Known groups held out: each model's risk on every group of a sensitive column no method trained with.

FedSRCVaR's claim is about groups nobody labelled: its worst-rho risk bounds the risk of every group of at least
rho of the rows. Its paper checks it against groups that *are* known (race, sex), where a method that knows them
(FedMinMax) is the reference. Here each stopped test run's kept per-row losses (`Run.row_losses`) are read by the
group columns of the same test rows, so the table costs no training beyond the runs already kept; h̄ and the base
rate get the same rows (issue 96). FedMinMax, told one column's groups, is stopped and tested as every other method
of the table (`fedminmax_reference`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.research import stopped, stopping
from fedfair.research.runs import row_errors, row_losses, run_all
from fedfair.research.study import Point, Study


def group_risks(losses: np.ndarray, groups: np.ndarray) -> dict[str, tuple[int, float]]:
    """Each group's (row count, mean loss) over rows whose group is `groups`' entry, in the groups' sorted order.

    Raises:
        ConfigError: the two arrays do not have one entry per row.
    """
    losses, groups = np.asarray(losses, dtype=np.float64), np.asarray(groups)
    if losses.shape != groups.shape or losses.ndim != 1:
        raise ConfigError(f"one group per loss is needed, got {groups.shape} groups for {losses.shape} losses")
    return {
        str(group): (int((groups == group).sum()), float(losses[groups == group].mean())) for group in np.unique(groups)
    }


def known_group_rows(
    label: str,
    seed: int | str,
    losses: np.ndarray,
    columns: Mapping[str, np.ndarray],
    errors: np.ndarray | None = None,
) -> list[dict[str, Any]]:
    """``known_groups.csv``'s rows of one model: a row per (column, group), and its worst group's row marked.

    The worst group is the one of highest mean loss. `errors` holds each row's 0-1 error (or its expected error, for
    a constant that breaks ties at random); each group's ``error`` is their mean over its rows, empty without them.
    """
    rows: list[dict[str, Any]] = []
    for column, groups in columns.items():
        risks = group_risks(losses, groups)
        group_errors = {} if errors is None else group_risks(errors, groups)
        worst = max(risks, key=lambda group: risks[group][1])
        rows += [
            {
                "method": label,
                "seed": seed,
                "column": column,
                "group": group,
                "held_out_rows": count,
                "risk": risk,
                "error": group_errors[group][1] if group_errors else "",
                "worst": group == worst,
            }
            for group, (count, risk) in risks.items()
        ]
    return rows


def fedminmax_label(column: str) -> str:
    """FedMinMax's name in the tables when told `column`'s groups, e.g. ``FedMinMax (knows race)``."""
    return f"FedMinMax (knows {column})"


@dataclass(frozen=True)
class Reference:
    """FedMinMax told one column's groups, stopped and tested (`fedminmax_reference`)."""

    held_out: list[dict[str, Any]]
    """Its test runs' ``stopped.csv`` rows (`stopped.held_out_row`), one per seed."""
    choice: dict[str, Any]
    """Its ``stopped_choice.csv`` row: the point chosen, its stop, the points tried, the CPU seconds."""
    losses: list[np.ndarray]
    """Each test seed's held-out row losses, in the test rows' order."""
    errors: list[np.ndarray | None]
    """Each test seed's held-out row errors (`runs.row_errors`: None where the losses cannot say them)."""


def fedminmax_reference(
    study: Study,
    column: str,
    rho: float,
    start: Point,
    cache_folder: Path,
    workers: int,
    search_runs: int,
    ceilings: Sequence[int] = stopping.CEILINGS,
) -> Reference:
    """FedMinMax told `column`'s groups, stopped and tested as the stopped study does every method.

    Its step and adversary step (`stopped.MAIN_KNOB`) are searched from `start` under the edge rule, one rung along
    one axis at a time, at most `search_runs` points past it on the two axes together (`stopped.choose`: the step's
    rungs come first, so 2 runs try the steps either side alone), each judged by its stopped validation worst-`rho`
    risk, the criterion every other row of the known-groups table was chosen by; then the chosen point trains
    exactly its stop round on the study's test seeds. Its rows are labelled `fedminmax_label`.

    Raises:
        ConfigError: every checkpoint of the chosen point diverged (no stop round to test).
    """
    told = dataclasses.replace(study, methods=("fedminmax",), groups=column)
    knob_runs = search_runs // 2
    chosen = stopped.choose(
        told, rho, {"fedminmax": start}, cache_folder, workers, search_runs - knob_runs, ceilings, knob_runs
    )
    stop = chosen["fedminmax"].stop.round
    if stop is None:
        raise ConfigError(f"FedMinMax told {column} diverged at every point tried from {start.describe('fedminmax')}")
    held_out, choices, _ = stopped.stopped_rows(told, rho, chosen, cache_folder, workers)
    runs = stopped.stopped_test_runs(told, "fedminmax", rho, chosen["fedminmax"].point, stop)
    results = run_all(runs, cache_folder, workers, f"reading {fedminmax_label(column)}")  # trained just above
    label = {"method": fedminmax_label(column)}
    return Reference(
        [row | label for row in held_out],
        choices[0] | label,
        [row_losses(results[run]) for run in runs],
        [row_errors(results[run]) for run in runs],
    )


@dataclass(frozen=True)
class WorstGroup:
    """One model's worst known group on one column, over its seeds (`worst_group`)."""

    risk: float
    """The worst group's mean loss, each seed's worst group (highest mean loss), averaged over the seeds."""
    groups: tuple[str, ...]
    """Those worst groups, each once, in the seeds' order (every group where they tie, as h̄'s do)."""
    error: float | None
    """The highest group error rate, each seed's, averaged over the seeds; None where a seed's errors are unknown."""


def worst_group(rows: Sequence[Mapping[str, Any]], method: str, column: str) -> WorstGroup | None:
    """`method`'s worst known group on `column` from ``known_groups.csv``'s `rows` (as read: text); None if absent.

    The worst group by risk and the worst by error may differ (a nearly flat model errs most on the group of the
    minority label, not where its loss is highest): the error is the highest group error rate whatever its group.
    """
    mine = [row for row in rows if row["method"] == method and row["column"] == column]
    seeds = sorted({str(row["seed"]) for row in mine})
    if not seeds:
        return None
    risks, groups, errors = [], [], []
    for seed in seeds:
        of_seed = [row for row in mine if str(row["seed"]) == seed]
        top = max(float(row["risk"]) for row in of_seed)
        risks.append(top)
        # h̄ ties every group (its group means differ only by summation's rounding).
        groups += [str(row["group"]) for row in of_seed if math.isclose(float(row["risk"]), top, rel_tol=1e-12)]
        known = [float(row["error"]) for row in of_seed if row.get("error", "") != ""]
        errors.append(max(known) if len(known) == len(of_seed) else None)
    error = None if None in errors else float(np.mean([value for value in errors if value is not None]))
    return WorstGroup(float(np.mean(risks)), tuple(dict.fromkeys(groups)), error)
