"""A committed tuned table's searches resumed on today's ladders: the new rungs next to each choice, tried.

Reads FOLDER/tuning.csv (every point each method's search tried, with its validation risk) and replays each
search of the named methods at --rho on today's ladders (`fedfair.research.tuning`): the points it tried and its
seeds, recorded as tried, then the edge rule goes on from its choice under the same budget, training only the
points a rung added since makes wanted (200-round validation runs, seed 0, as the table's). The committed choice
is trained again too, as a check that these runs read as the table's did. A search that spent its extension runs
on the old ladders wants nothing more under the same budget (its row says "unsettled"); --extra-runs lifts its
budget, for a diagnostic that is no protocol choice (the baselines get no such runs). Writes FOLDER/new_rungs.csv: a row per
point trained (method, rho, coordinates, point, worst_risk, committed_risk where the table has it, chosen_now).
The test runs are not redone: where the choice moves, the table is pending its re-run. E.g.

    python benchmarks/new_rungs.py --dataset mnist --loss-rows 512 --folder docs/figures/tuned_mnist_all_rho \\
        --cache /tmp/rungs_mnist
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fedfair.research import tuning
from fedfair.research.paper_splits import paper_split
from fedfair.research.profiles import PROFILES, TABLE_RHO
from fedfair.research.reproduce import read_csv, write_csv
from fedfair.research.runs import judged_at, run_all
from fedfair.research.study import METHOD_LABELS, Study, ladder_point


FOLDER_HELP = "the tuned study's folder (its tuning.csv)"


def replayed(study: Study, method: str, rho: float, rows: list[dict[str, str]]) -> tuning.Search:
    """`method`'s search at `rho` on today's ladders with the committed table's points and seeds recorded."""
    search = study.search(method)
    mine = [row for row in rows if row["method"] == METHOD_LABELS[method] and float(row["rho"]) == rho]
    if not mine:
        raise SystemExit(f"{FOLDER_HELP}: no rows for {method} at rho {rho:g}")

    def coordinates(row: dict[str, str]) -> tuning.Coordinates:
        return tuple(float(value) for value in row["coordinates"].split(" | "))

    for row in mine:
        if row["seeded_from"]:
            search.seed(coordinates(row), row["seeded_from"])
    search.record({coordinates(row): float(row["worst_risk"]) for row in mine})
    return search


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, help="e.g. adult, census-income, mnist")
    parser.add_argument("--partition", default=None, help="the client split's column (default: the paper split)")
    parser.add_argument("--clients", type=int, default=None, help="the clients (default: the paper split's)")
    parser.add_argument("--folder", type=Path, required=True, help=FOLDER_HELP)
    parser.add_argument("--cache", type=Path, required=True, help="where the runs are cached")
    parser.add_argument("--rho", type=float, default=TABLE_RHO)
    parser.add_argument("--loss-rows", type=int, default=0, help="as the study's --loss-rows")
    parser.add_argument("--methods", default="fedsrcvar", help="the methods whose ladders gained rungs")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--extra-runs", type=int, default=0, help="runs past each search's budget (a diagnostic)")
    args = parser.parse_args()
    split = paper_split(args.dataset, args.partition, args.clients)
    methods = tuple(args.methods.split(","))
    study = Study(args.dataset, PROFILES["tuned"], methods, loss_rows=args.loss_rows, split=split)
    rows = read_csv(args.folder / "tuning.csv")
    searches = [replayed(study, method, args.rho, rows) for method in methods]
    for search in searches:
        search.extension_runs += args.extra_runs
    committed = {index: dict(search.tried) for index, search in enumerate(searches)}
    trained: list[tuple[int, tuning.Coordinates, float]] = []

    def evaluate(asked: list[tuple[int, tuning.Coordinates]]) -> list[float]:
        runs = [
            study.validation_run(methods[index], args.rho, ladder_point(methods[index], searches[index].axes, point))
            for index, point in asked
        ]
        results = run_all(runs, args.cache, args.workers, "new rungs")
        risks = [float(judged_at(results[run], args.rho)["worst_risk"]) for run in runs]
        trained.extend((index, point, risk) for (index, point), risk in zip(asked, risks, strict=True))
        return risks

    checks = [(index, search.choice()) for index, search in enumerate(searches)]
    check_risks = evaluate(checks)
    trained.clear()
    tuning.settle(searches, evaluate)
    out: list[dict[str, Any]] = []
    for (index, point), risk in zip(checks, check_risks, strict=True):
        out.append(row_of(methods[index], args.rho, searches[index], point, risk, committed[index].get(point)))
    out.extend(row_of(methods[index], args.rho, searches[index], point, risk, None) for index, point, risk in trained)
    write_csv(args.folder / "new_rungs.csv", out)
    for row in out:
        print(row)


def row_of(
    method: str, rho: float, search: tuning.Search, point: tuning.Coordinates, risk: float, committed: float | None
) -> dict[str, Any]:
    """One row of ``new_rungs.csv``."""
    return {
        "method": METHOD_LABELS[method],
        "rho": rho,
        "coordinates": " | ".join(f"{value:g}" for value in point),
        "point": ladder_point(method, search.axes, point).describe(method),
        "worst_risk": risk,
        "committed_risk": "" if committed is None else committed,
        "chosen_now": point == search.choice(),
        "limits": "; ".join(search.limits()) if point == search.choice() else "",
        "extension_runs": search.extension_runs,
    }


if __name__ == "__main__":
    main()
