"""Known groups held out: each stopped method's risk on every race and sex group of the test rows (issue 96).

Reads the committed stopped choices (FOLDER/stopped_choice.csv, FOLDER/tuning.csv), finds their test runs in
--cache (as `benchmarks/stopped_study.py --retest` leaves them, each with its rows' losses) and writes
FOLDER/known_groups.csv: a row per (method, seed, column, group) with the group's held-out rows, mean loss and error
rate (read off the kept losses where the model has two classes, `runs.row_errors`; empty otherwise), its worst group
marked, h̄ and the base rate on the same rows. No group column was used in training (the sites are the
partition's, which may be one of the columns: Adult's and Census-Income's sites are its race groups). Trains
nothing for the stopped methods: one whose test runs are not in the cache keeps the rows FOLDER/known_groups.csv
had, said on stdout, as does every column not in --columns.

With --fedminmax N, FedMinMax told each column's groups is the reference that knows them: its step and adversary
step searched (at most N points past FedAvg's stopped step with adversary step 0.1) and stopped on validation as
every other row's method was (`known_groups.fedminmax_reference`), then tested; its held-out rows go to
FOLDER/fedminmax.csv, its choices and CPU seconds to FOLDER/fedminmax_choice.csv, its groups' risks to
known_groups.csv. E.g.

    python benchmarks/known_groups.py --dataset adult --folder docs/figures/tuned_adult_all_rho \\
        --cache /tmp/stopped_adult --columns race,sex --fedminmax 4
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from fedfair.fairness.references import BASE_RATE, UNIFORM, base_rate_losses, uniform_report
from fedfair.research import stopped, stopping
from fedfair.research.experiment import held_out_columns
from fedfair.research.flags import config_from_flags
from fedfair.research.known_groups import fedminmax_label, fedminmax_reference, known_group_rows
from fedfair.research.paper_splits import paper_split
from fedfair.research.profiles import PROFILES, TABLE_RHO
from fedfair.research.reproduce import read_csv, write_csv
from fedfair.research.runs import federation_for, row_errors, row_losses, run_all
from fedfair.research.study import METHOD_LABELS, Study

METHODS = ("fedsrcvar", "fedavg", "fedavgm", "propfair", "term", "deltafl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--folder", type=Path, required=True, help="the stopped study's folder")
    parser.add_argument("--cache", type=Path, required=True, help="where its test runs are cached")
    parser.add_argument("--columns", required=True, help="the held-out group columns, e.g. race,sex")
    parser.add_argument("--loss-rows", type=int, default=0, help="as the study's --loss-rows")
    parser.add_argument("--rho", type=float, default=TABLE_RHO)
    parser.add_argument(
        "--fedminmax",
        type=int,
        default=None,
        metavar="N",
        help="stop and test FedMinMax told each column, searching at most N points past its start (default: not run; "
        "its rows in FOLDER/known_groups.csv are kept)",
    )
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--ceilings",
        default=",".join(str(rounds) for rounds in stopping.CEILINGS),
        help="FedMinMax's ladder of round ceilings, as the stopped study's",
    )
    args = parser.parse_args()
    study = Study(args.dataset, PROFILES["tuned"], METHODS, loss_rows=args.loss_rows, split=paper_split(args.dataset))
    stops = stopped.committed_stops(
        read_csv(args.folder / "stopped_choice.csv"), read_csv(args.folder / "tuning.csv"), study, args.rho
    )
    names = args.columns.split(",")
    # The test rows are the same for every run and seed: FedSRCVaR's seed 0 names them.
    first = stopped.stopped_test_runs(study, "fedsrcvar", args.rho, stops["fedsrcvar"][0], stops["fedsrcvar"][1])[0]
    columns = groups_of(first.flags, names)
    committed = read_csv(args.folder / "known_groups.csv") if (args.folder / "known_groups.csv").exists() else []
    rows, read = [], set()
    for method, (point, stop, _) in stops.items():
        runs = stopped.stopped_test_runs(study, method, args.rho, point, stop)
        if not all((args.cache / f"{run.key}.json").exists() for run in runs):
            print(f"{METHOD_LABELS[method]}: its test runs are not in {args.cache}; its rows in known_groups.csv kept")
            continue
        results = run_all(runs, args.cache, 1, f"reading {METHOD_LABELS[method]}")
        for seed, run in enumerate(runs):
            rows += known_group_rows(
                METHOD_LABELS[method], seed, row_losses(results[run]), columns, row_errors(results[run])
            )
        read.add(METHOD_LABELS[method])
    if args.fedminmax is not None:
        ceilings = tuple(int(rounds) for rounds in args.ceilings.split(","))
        # FedMinMax is FedAvg with its adversary's weights: its search starts at FedAvg's stopped step.
        start = dataclasses.replace(stops["fedavg"][0], adversary_lr=0.1)
        held_out, choices = [], []
        for name in names:
            reference = fedminmax_reference(
                study, name, args.rho, start, args.cache, args.workers, args.fedminmax, ceilings
            )
            held_out += reference.held_out
            choices.append(reference.choice)
            for seed, (losses, errors) in enumerate(zip(reference.losses, reference.errors, strict=True)):
                rows += known_group_rows(fedminmax_label(name), seed, losses, columns, errors)
            read.add(fedminmax_label(name))
        told = {fedminmax_label(name) for name in names}
        for name, fresh in (("fedminmax.csv", held_out), ("fedminmax_choice.csv", choices)):
            # Another column's FedMinMax, told it in an earlier call, stays.
            kept = (
                [row for row in read_csv(args.folder / name) if row["method"] not in told]
                if (args.folder / name).exists()
                else []
            )
            write_csv(args.folder / name, fresh + kept)
    # A committed row not measured again stays: another method's, or another column's (its error empty if it had none).
    measured = read | {UNIFORM, BASE_RATE}
    rows += [
        row | {"error": row.get("error", "")}
        for row in committed
        if row["method"] not in measured or row["column"] not in names
    ]
    # The constants on the same rows.
    federation = federation_for(first.flags, "test")
    labels = federation.pooled("test").labels.numpy()
    uniform = uniform_report(federation.num_classes, args.rho)
    rows += known_group_rows(
        UNIFORM,
        "",
        np.full(labels.size, uniform.mean_risk),
        columns,
        np.full(labels.size, uniform.mean_error),  # a random pick among its tied classes
    )
    base, correct = base_rate_losses(federation.pooled("train").labels.numpy(), labels, federation.num_classes)
    rows += known_group_rows(BASE_RATE, "", base, columns, ~correct)
    write_csv(args.folder / "known_groups.csv", rows)


def groups_of(flags: tuple[str, ...], names: list[str]) -> dict[str, np.ndarray]:
    """Each of the columns `names` for every test row of the run of `flags`, in its losses' order."""
    held = held_out_columns(config_from_flags(flags), names)
    return {name: held[name] for name in names}  # not the label column it adds


if __name__ == "__main__":
    main()
