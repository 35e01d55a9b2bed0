"""Every method of a tuned study stopped by its own validation at one rho, its step re-chosen there, and tested.

Reads each method's point chosen by the tuning protocol from FOLDER/tuning.csv (the committed study), runs
`fedfair.research.stopped.choose` (stopping runs to 1,000 rounds, the ceiling raised by the edge rule, the
step ladder and, with --knob-runs, the method's own knob searched around the chosen point, with --prune-at a
point clearly worse early dropped) and the stopped test runs, and writes into FOLDER:
stopped.csv (`method,rho,seed,stop_round,max_rounds,held_out_worst_risk`), stopped_choice.csv (each method's
point, stop round, validation risk, points tried and pruned, limits and CPU seconds) and stopped_paired.csv (the paired
gaps to FedSRCVaR on the same test rows). With --retest (and --tables for an older table) it searches nothing and
trains a committed table's test runs again (`retest`). Runs are cached under --cache (resumable). E.g.

    python benchmarks/stopped_study.py --dataset adult --folder docs/figures/tuned_adult_all_rho \\
        --cache /tmp/stopped_adult --workers 2
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from fedfair.research import stopped, stopping
from fedfair.research.paper_splits import paper_split
from fedfair.research.profiles import PROFILES, TABLE_RHO
from fedfair.research.reproduce import read_csv, write_csv
from fedfair.research.study import Study

METHODS = ("fedsrcvar", "fedavg", "fedavgm", "propfair", "term", "deltafl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, help="e.g. adult, census-income, mnist")
    parser.add_argument("--partition", default=None, help="the client split's column (default: the paper split)")
    parser.add_argument("--clients", type=int, default=None, help="the clients (default: the paper split's)")
    parser.add_argument("--folder", type=Path, required=True, help="the tuned study's folder (tuning.csv)")
    parser.add_argument("--cache", type=Path, required=True, help="where the runs are cached")
    parser.add_argument("--rho", type=float, default=TABLE_RHO)
    parser.add_argument("--seeds", type=int, default=PROFILES["tuned"].seeds, help="test seeds (default 2)")
    parser.add_argument("--loss-rows", type=int, default=0, help="as the study's --loss-rows (TERM's losses)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--step-runs",
        type=int,
        default=stopped.STEP_EXTENSION_RUNS,
        help="steps tried past each chosen one at its stopped budget (0: the chosen step alone)",
    )
    parser.add_argument(
        "--knob-runs",
        type=int,
        default=stopped.KNOB_EXTENSION_RUNS,
        help="points tried along each method's own knob (epsilon, momentum, tilt...) too (0: the step alone)",
    )
    parser.add_argument(
        "--rechoose",
        default=None,
        help="the methods whose step and knob are searched (default: every one); the rest stop at their chosen point",
    )
    parser.add_argument(
        "--prune-at",
        type=int,
        default=0,
        help="train a new point this many rounds first and drop it if clearly worse than the choice so far (0: never)",
    )
    parser.add_argument(
        "--ceilings",
        default=",".join(str(rounds) for rounds in stopping.CEILINGS),
        help="the ladder of round ceilings (default 1000,2000,4000; a shorter one names its top where a stop reaches it)",
    )
    parser.add_argument(
        "--retest",
        action="store_true",
        help="no search: train the committed stopped choices' test runs of --methods again, for the held-out figures "
        "stopped.csv lacks (their worst risks must reproduce the committed ones)",
    )
    parser.add_argument(
        "--tables",
        default="",
        metavar="SUFFIX",
        help="with --retest, the committed tables read and filled: stopped{SUFFIX}.csv from stopped_choice{SUFFIX}.csv "
        "(e.g. _at_200_round_points; default: the current ones)",
    )
    args = parser.parse_args()
    profile = dataclasses.replace(PROFILES["tuned"], seeds=args.seeds)
    split = paper_split(args.dataset, args.partition, args.clients)
    study = Study(args.dataset, profile, tuple(args.methods.split(",")), loss_rows=args.loss_rows, split=split)
    ceilings = tuple(int(rounds) for rounds in args.ceilings.split(","))
    write_csv(args.folder / "references.csv", stopped.reference_rows(study))
    if args.retest:
        retest(args, study)
        return
    choices = stopped.committed_choices(read_csv(args.folder / "tuning.csv"), study, args.rho)
    chosen = stopped.choose(
        study,
        args.rho,
        choices,
        args.cache,
        args.workers,
        args.step_runs,
        ceilings,
        args.knob_runs,
        args.prune_at,
        None if args.rechoose is None else tuple(args.rechoose.split(",")),
    )
    rows, choice_rows, gaps = stopped.stopped_rows(study, args.rho, chosen, args.cache, args.workers)
    write_csv(args.folder / "stopped.csv", rows)
    write_csv(args.folder / "stopped_choice.csv", choice_rows)
    if gaps:  # none where FedSRCVaR is the one method run (a partial study, the rest still pending)
        write_csv(args.folder / "stopped_paired.csv", gaps)


def retest(args: argparse.Namespace, study: Study) -> None:
    """Fill stopped{SUFFIX}.csv's held-out figures for `study`'s methods from their committed choices, trained again.

    A row takes the figures only where the run trained again reads its committed worst risk (within `REPRODUCED`):
    otherwise they would mix two machines' runs, and the row is left as it was, said on stdout. A figure not
    measured is left empty; a table none of whose rows reproduced is not written. Every run trained again is written whole to stopped_retested{SUFFIX}.csv, its committed
    worst risk and its CPU seconds beside, and the paired gaps between them to stopped_paired_retested{SUFFIX}.csv,
    so a re-run that does not reproduce is kept as one, both figures shown.
    """
    stopped_csv = args.folder / f"stopped{args.tables}.csv"
    stops = stopped.committed_stops(
        read_csv(args.folder / f"stopped_choice{args.tables}.csv"),
        read_csv(args.folder / "tuning.csv"),
        study,
        args.rho,
    )
    committed = {(row["method"], row["seed"]): row for row in read_csv(stopped_csv)}
    retested, gaps = stopped.retested_rows(study, args.rho, stops, args.cache, args.workers)
    fresh = {(row["method"], str(row["seed"])): row for row in retested}
    write_csv(
        args.folder / f"stopped_retested{args.tables}.csv",
        [
            row | {"committed_worst_risk": committed[key]["held_out_worst_risk"] if key in committed else ""}
            for key, row in fresh.items()
        ],
    )
    if gaps:  # none where FedSRCVaR is not retested
        write_csv(args.folder / f"stopped_paired_retested{args.tables}.csv", gaps)
    rows, reproduced = [], 0
    for row in committed.values():
        again = fresh.get((row["method"], row["seed"]))
        if (
            again is not None
            and abs(float(again["held_out_worst_risk"]) - float(row["held_out_worst_risk"])) > REPRODUCED
        ):
            print(
                f"{row['method']} seed {row['seed']} reads {again['held_out_worst_risk']:.6f} again, "
                f"{row['held_out_worst_risk']} committed: left as it was"
            )
            again = None
        reproduced += again is not None
        figures = {
            f"held_out_{figure}": row.get(f"held_out_{figure}", "") if again is None else again[f"held_out_{figure}"]
            for figure in stopped.HELD_OUT_COLUMNS
        }
        rows.append(row | figures | {"held_out_worst_risk": row["held_out_worst_risk"]})
    if reproduced:  # else the committed table is left byte for byte as it was, no empty columns added
        write_csv(stopped_csv, rows)


REPRODUCED = 1e-4
"""How close a retested run's held-out worst risk must be to the committed one to fill in its other figures: the
last digit the tables print and the smallest paired error among them (Adult's TERM, 1e-4). The same flags on
another machine's float arithmetic read a few 1e-6 apart on Adult (FedSRCVaR's seed 0: 0.696493 against 0.696499),
up to 0.02 on MNIST (docs/paper.md)."""


if __name__ == "__main__":
    main()
