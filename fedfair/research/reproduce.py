"""`fedfair reproduce`: the paper's study on one dataset, as CSV tables and PNG figures.

Every run is one set of `fedfair simulate` flags and a split, cached under ``OUT/cache/`` by the
SHA-256 of both: an interrupted reproduction resumes, a second call only redraws the figures.
Runs go to a process pool (``--workers``, every core by default), one compute thread each. The runs
are :mod:`fedfair.research.study`'s, each method's point chosen by :mod:`fedfair.research.selection`.

Why: docs/design.md, "Inside the research harness".
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedfair.datasets import load_dataset
from fedfair.research import convergence, fronts
from fedfair.research.methods import METHODS
from fedfair.research.paired import paired_rows
from fedfair.research.paper_splits import PaperSplit, paper_split
from fedfair.research.profiles import DEFAULT_EPSILON, TABLE_RHO, Profile
from fedfair.research.runs import Run, judged_at, run_all
from fedfair.research.selection import Selection, grid_rows, select, tuning_rows
from fedfair.research.study import METHOD_LABELS, Point, Study
from fedfair.research.study_options import STUDY_METHODS
from fedfair.research.worst_group import COMPOSITION_COLUMN, COMPOSITION_RHOS, composition_rows


FIGURE_METHODS = tuple(method for method in STUDY_METHODS if method != "fedminmax")
"""Figure 2's methods, in its legend's order; those this build lacks are left out and said so."""
TABLE_METHODS = ("fedminmax", "fedsrcvar", "fedavg")
METRICS = ("worst_risk", "mean_risk", "disparity", "accuracy")


def judged_points(
    study: Study, results: Mapping[Run, dict[str, Any]], selections: Mapping[tuple[str, float], Selection]
) -> list[fronts.Judged]:
    """Every study method's validation points at every rho the study judges, read off their cached `results`."""
    return [
        fronts.Judged(
            rho,
            METHOD_LABELS[method],
            point.describe(method),
            float(judged_at(results[run], rho)["mean_risk"]),
            float(judged_at(results[run], rho)["worst_risk"]),
            point == selections[(method, rho)].choice,
        )
        for rho in study.rhos
        for method in study.methods
        for point, run in zip(selections[(method, rho)].points, selections[(method, rho)].runs, strict=True)
    ]


def convergence_rows(
    study: Study,
    choice: Mapping[tuple[str, float], Point],
    rounds: Sequence[int],
    cache_folder: Path,
    workers: int,
    on_ray: bool = False,
) -> list[dict[str, Any]]:
    """Every study method's chosen point at every rho, traced at each of `rounds` (cached): a row per seed."""
    asked = {
        (method, rho, count): study.traced_runs(method, rho, choice[(method, rho)], count)
        for method in study.methods
        for rho in study.rhos
        for count in rounds
    }
    results = run_all([run for runs in asked.values() for run in runs], cache_folder, workers, "tracing", on_ray)
    return [
        {
            "method": METHOD_LABELS[method],
            "rho": rho,
            "rounds": count,
            "seed": seed,
            "point": choice[(method, rho)].describe(method),
            **convergence.trace_row(results[run], rho),
        }
        for (method, rho, count), runs in asked.items()
        for seed, run in enumerate(runs)
    ]


def summary(results: Sequence[Mapping[str, Any]], rho: float | None = None) -> dict[str, float]:
    """Mean and (population) standard deviation over seeds of each metric at `rho` (None: each run's own)."""
    row: dict[str, float] = {"seeds": float(len(results))}
    for metric in METRICS:
        values = np.array([result[metric] if rho is None else judged_at(result, rho)[metric] for result in results])
        row[f"{metric}_mean"] = float(values.mean())
        row[f"{metric}_std"] = float(values.std())
    return row


def reproduce(
    dataset: str,
    out: Path,
    profile: Profile,
    workers: int,
    device: str = "cpu",
    on_ray: bool = False,
    loss_rows: int = 0,
    split: PaperSplit | None = None,
    methods: Sequence[str] | None = None,
    long_rounds: int | None = None,
    paired: bool = False,
) -> dict[str, Path]:
    """Run the study (cached), write its CSV tables and PNG figures under `out`; return their paths.

    With `on_ray` the runs go to the connected Ray cluster (:func:`run_all`); `loss_rows` bounds the rows AFL,
    q-FedAvg and FedMinMax read for their per-round losses (0: all); `split` is the client split (None: the
    dataset's paper split, `paper_split`); `methods` narrows the figures' and the table's methods (None: all of
    them).

    Where the dataset has a race column, it also writes the paper's composition table
    (`composition_race.csv`): FedSRCVaR's worst group at rho 0.1 and 0.3 by race and label. Always each method's
    Pareto fronts (`fronts.csv`, `fronts.png`, from the validation runs); with `long_rounds`, `convergence_rows`;
    with `paired`, the chosen points' test runs keep every row's loss and `paired_rho.csv` holds each method's
    gap to FedSRCVaR on the same rows with its standard error (`paired.paired_rows`).
    """
    wanted = set(FIGURE_METHODS + TABLE_METHODS if methods is None else methods)
    available = tuple(method for method in FIGURE_METHODS if method in METHODS and method in wanted)
    missing = [METHOD_LABELS[method] for method in FIGURE_METHODS if method not in METHODS]
    if missing:
        print(f"fedfair reproduce: this build lacks {', '.join(missing)}; the figures leave them out")
    split = paper_split(dataset) if split is None else split
    study = Study(dataset, profile, available, device, loss_rows, split)
    cache_folder = out / "cache"

    # 1. Choose every method's hyperparameters on validation rows, for every rho.
    rhos = study.rhos
    # FedMinMax is told the groups of the split's column; a split by class or at random has none.
    group_columns = set(load_dataset(dataset).attributes_train)
    grouped = split.partition in group_columns
    table_methods = tuple(
        m for m in TABLE_METHODS if m in METHODS and m in wanted and (grouped or not METHODS[m].needs_groups)
    )
    wanted_pairs = [
        (method, rho)
        for method in dict.fromkeys((*available, *table_methods))
        for rho in (rhos if method in available else (TABLE_RHO,))
    ]
    selections, selected = select(study, wanted_pairs, cache_folder, workers, on_ray)
    choice = {pair: selection.choice for pair, selection in selections.items()}

    # 2. The chosen configurations over seeds on the test rows; the epsilon and tau sweeps take
    # FedSRCVaR's step (and under the tuning protocol its smoothing) chosen at the table's rho.
    def chosen_runs(method: str, rho: float) -> list[Run]:
        runs = study.test_runs(method, rho, choice[(method, rho)])
        return [dataclasses.replace(run, row_losses=True) for run in runs] if paired else runs

    testing = [run for method, rho in choice for run in chosen_runs(method, rho)]
    anchor = choice[("fedsrcvar", TABLE_RHO)]
    anchor = Point(anchor.scale, momentum=anchor.momentum, step=anchor.step, gamma=anchor.gamma)
    trade_off = {
        (rho, eps): study.test_runs("fedsrcvar", rho, dataclasses.replace(anchor, epsilon=eps))
        for rho in profile.trade_off_rhos
        for eps in profile.epsilons
    }
    taus = {
        (rho, tau): study.test_runs(
            "fedsrcvar", rho, dataclasses.replace(anchor, epsilon=DEFAULT_EPSILON, local_steps=tau)
        )
        for rho in profile.rhos
        for tau in profile.taus
    }
    # The paper's composition table: FedSRCVaR's worst group at each rho, by race and label.
    described = (COMPOSITION_COLUMN,) if COMPOSITION_COLUMN in group_columns else ()
    compositions = {
        rho: study.test_runs("fedsrcvar", rho, dataclasses.replace(anchor, epsilon=DEFAULT_EPSILON), described)
        for rho in (COMPOSITION_RHOS if described else ())
    }
    everything = testing + [
        run for runs in (*trade_off.values(), *taus.values(), *compositions.values()) for run in runs
    ]
    results = run_all(everything, cache_folder, workers, "training over seeds", on_ray)

    classes = next(iter(results.values()))["classes"]
    uniform = math.log(classes)

    def chosen_row(method: str, rho: float) -> dict[str, Any]:
        point = choice[(method, rho)]
        seeds = [results[run] for run in chosen_runs(method, rho)]
        row = {"method": METHOD_LABELS[method], "rho": rho, **summary(seeds, rho), "chosen": point.describe(method)}
        if profile.ladders:  # the budget each method used and the marks of its choice, beside it
            selection = selections[(method, rho)]
            row |= {"validation_runs": len(selection.points), "limits": "; ".join(selection.limits)}
        return row

    rho_rows = [chosen_row(method, rho) for method in available for rho in profile.rhos]
    epsilon_rows = [
        {"rho": rho, "epsilon": eps, **summary([results[run] for run in runs])}
        for (rho, eps), runs in trade_off.items()
    ]
    tau_rows = [
        {"method": f"FedSRCVaR tau={tau}", "rho": rho, **summary([results[run] for run in runs]), "chosen": ""}
        for (rho, tau), runs in taus.items()
    ] + [row for row in rho_rows if row["method"] == METHOD_LABELS["fedavg"]]
    table_rows = [chosen_row(method, TABLE_RHO) for method in table_methods]

    out.mkdir(parents=True, exist_ok=True)
    from fedfair.research import figures

    title = f"{dataset} {split.describe()}, {profile.name} profile ({profile.model}, {profile.rounds} rounds, {profile.seeds} seeds)"
    written = {"rho": write_csv(out / "fig2_rho.csv", rho_rows)}
    written["rho_png"] = figures.save(
        figures.risks_versus_rho(read_csv(written["rho"]), uniform, title), out / "fig2_rho.png"
    )
    if epsilon_rows:  # a profile may leave the sweeps out (the "table" profile)
        written["epsilon"] = write_csv(out / "fig3_epsilon.csv", epsilon_rows)
        written["epsilon_png"] = figures.save(
            figures.trade_off(read_csv(written["epsilon"]), title), out / "fig3_epsilon.png"
        )
    if taus:
        written["tau"] = write_csv(out / "fig4_tau.csv", tau_rows)
        written["tau_png"] = figures.save(
            figures.risks_versus_rho(read_csv(written["tau"]), uniform, title), out / "fig4_tau.png"
        )
    written["table"] = write_csv(out / f"table_rho{TABLE_RHO:g}.csv", table_rows)
    written["table_png"] = figures.save(figures.table(read_csv(written["table"]), title), out / "table.png")
    written["fronts"] = write_csv(out / "fronts.csv", fronts.front_rows(judged_points(study, selected, selections)))
    if profile.ladders:
        written["tuning"] = write_csv(out / "tuning.csv", tuning_rows(selections))
        written["grids"] = write_csv(out / "grids.csv", grid_rows(study))
    written["fronts_png"] = figures.save(
        figures.fronts(read_csv(written["fronts"]), uniform, title), out / "fronts.png"
    )
    if paired:
        by_choice = {(m, rho): [results[run] for run in chosen_runs(m, rho)] for m in available for rho in profile.rhos}
        written["paired"] = write_csv(out / "paired_rho.csv", paired_rows(by_choice, METHOD_LABELS))
    if long_rounds is not None:
        counts = sorted({profile.rounds, long_rounds})
        traced = convergence_rows(study, choice, counts, cache_folder, workers, on_ray)
        written["convergence"] = write_csv(out / "convergence.csv", traced)
    if compositions:
        by_rho = {rho: [results[run] for run in runs] for rho, runs in compositions.items()}
        rows = composition_rows(by_rho, COMPOSITION_COLUMN)
        written["composition"] = write_csv(out / f"composition_{COMPOSITION_COLUMN}.csv", rows)
        drawn = figures.composition(read_csv(written["composition"]), COMPOSITION_COLUMN, f"FedSRCVaR, {title}")
        written["composition_png"] = figures.save(drawn, out / f"composition_{COMPOSITION_COLUMN}.png")
    return written


# ---------------------------------------------------------------- files


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """`rows` as a CSV table with a header (the first row's keys)."""
    with path.open("w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    """A table written by :func:`write_csv`, as text (the figures plot exactly what the files say)."""
    with path.open(newline="") as stream:
        return list(csv.DictReader(stream))
