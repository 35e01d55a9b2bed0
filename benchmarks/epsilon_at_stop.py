"""FedSRCVaR stopped by its own validation at a few (step, epsilon) points around its tuned choice, and tested.

The stopped study's one-method probe behind docs/paper.md's "Why, and what fixes it": FedSRCVaR's point chosen by
the tuning protocol (FOLDER/tuning.csv) with its step and epsilon moved to each of --points, each trained on the
validation split to --ceiling rounds (checkpoints every `stopping.CHECK_EVERY`), stopped at its checkpoint of lowest
validation worst-rho risk, and its test runs trained exactly that many rounds on the test seeds. Writes
FOLDER/epsilon_at_stop.csv: a validation row per point (its stop round and validation worst-rho risk) and a test row
per point and seed (its held-out worst-rho risk, mean risk, accuracy and worst-rho error), each with its CPU seconds.
Runs are cached under --cache (resumable), under the same keys as the stopped study's. E.g.

    python benchmarks/epsilon_at_stop.py --dataset mnist --loss-rows 512 \\
        --folder docs/figures/tuned_mnist_all_rho --cache /tmp/stopped_mnist --workers 2
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from fedfair.research import stopped, stopping, tuning
from fedfair.research.paper_splits import paper_split
from fedfair.research.profiles import PROFILES, TABLE_RHO
from fedfair.research.reproduce import read_csv, write_csv
from fedfair.research.runs import judged_at, run_all
from fedfair.research.study import Point, Study

METHOD = "fedsrcvar"

COLUMNS = (
    "method",
    "rho",
    "point",
    "split",
    "seed",
    "rounds",
    "stop_round",
    "validation_worst_risk",
    *(f"held_out_{figure}" for figure in stopped.HELD_OUT_COLUMNS),
    "cpu_seconds",
)
"""``epsilon_at_stop.csv``'s columns; a row leaves empty what its split does not measure."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, help="e.g. mnist")
    parser.add_argument("--folder", type=Path, required=True, help="the tuned study's folder (tuning.csv)")
    parser.add_argument("--cache", type=Path, required=True, help="where the runs are cached")
    parser.add_argument("--rho", type=float, default=TABLE_RHO)
    parser.add_argument("--seeds", type=int, default=PROFILES["tuned"].seeds, help="test seeds (default 2)")
    parser.add_argument("--loss-rows", type=int, default=0, help="as the study's --loss-rows")
    parser.add_argument("--ceiling", type=int, default=stopping.CEILINGS[0], help="the stopping runs' rounds")
    parser.add_argument("--points", default="0.1:0.2,0.1:0.5,0.3:0.2", help="step:epsilon points, comma-separated")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    profile = dataclasses.replace(PROFILES["tuned"], seeds=args.seeds)
    study = Study(args.dataset, profile, (METHOD,), loss_rows=args.loss_rows, split=paper_split(args.dataset))
    start = stopped.committed_choices(read_csv(args.folder / "tuning.csv"), study, args.rho)[METHOD]
    points = []
    for pair in args.points.split(","):
        step, epsilon = (float(value) for value in pair.split(":"))
        points.append(stopped.with_knob(stopped.with_knob(start, tuning.STEP, step), tuning.EPSILON, epsilon))
    stopping_runs = [stopped.stopping_run(study, METHOD, args.rho, point, args.ceiling) for point in points]
    traced = run_all(stopping_runs, args.cache, args.workers, "stopping")
    rows: list[dict[str, Any]] = []
    tests = []
    for point, run in zip(points, stopping_runs, strict=True):
        trace = dict(stopped.validation_trace(traced[run], args.rho))
        stop = stopping.stop_round(list(trace.items()))
        rows.append(
            described(point, args.rho, "validation", 0, args.ceiling, stop)
            | {"validation_worst_risk": "" if stop is None else trace[stop], "cpu_seconds": traced[run]["cpu_seconds"]}
        )
        if stop is not None:
            tested = stopped.stopped_test_runs(study, METHOD, args.rho, point, stop)
            tests += [(point, seed, stop, test) for seed, test in enumerate(tested)]
    results = run_all([test for *_, test in tests], args.cache, args.workers, "testing stopped")
    for point, seed, stop, test in tests:
        report = judged_at(results[test], args.rho)
        rows.append(
            described(point, args.rho, "test", seed, stop, stop)
            | {f"held_out_{figure}": report[figure] for figure in stopped.HELD_OUT_COLUMNS}
            | {"cpu_seconds": results[test]["cpu_seconds"]}
        )
    write_csv(
        args.folder / "epsilon_at_stop.csv", [{column: row.get(column, "") for column in COLUMNS} for row in rows]
    )


def described(point: Point, rho: float, split: str, seed: int, rounds: int, stop: int | None) -> dict[str, Any]:
    """The columns naming one run of ``epsilon_at_stop.csv``: the point, the split and seed, the rounds and stop."""
    return {
        "method": "FedSRCVaR",
        "rho": rho,
        "point": point.describe(METHOD),
        "split": split,
        "seed": seed,
        "rounds": rounds,
        "stop_round": "" if stop is None else stop,
    }


if __name__ == "__main__":
    main()
