"""`fedfair reproduce`.

The paper's study (fedfair.research.reproduce) and the drift study (fedfair.research.drift) behind one command,
so that neither study module imports the other's CLI.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from fedfair.core.config import MODEL_NAMES
from fedfair.core.errors import ConfigError
from fedfair.datasets import DATASETS
from fedfair.research.paper_splits import paper_split
from fedfair.research.study_options import (
    LONG_ROUNDS,
    PROFILE_NAMES,
    RAY_INSTALL_HINT,
    STUDY_METHODS,
    STUDY_SUMMARY,
)


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair reproduce`."""
    parser = subparsers.add_parser(
        "reproduce",
        help="the paper's study on one dataset: CSV tables and PNG figures",
        description=STUDY_SUMMARY,
    )
    parser.add_argument("--dataset", default="adult", help=f"one of: {', '.join(DATASETS)} (default adult)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the tables, figures and the run cache")
    parser.add_argument("--quick", action="store_true", help="the quick profile (Adult: minutes on 2 cores)")
    parser.add_argument(
        "--profile",
        choices=PROFILE_NAMES,
        default="full",
        help="full (the paper's grids, default), quick (as --quick), table (only rho = 0.1, epsilon = 0.05, MLP), "
        "figure1 (every method over rho = 0.1 to 0.7 on a smaller grid) or tuned (figure1's runs, every method "
        "tuned by one protocol: the same absolute ladders, grids extended until no choice sits on an edge)",
    )
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="processes to train in (default: every core)"
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="where each run trains: cpu, cuda, cuda:N or auto (a GPU when present; then use --workers 1)",
    )
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="train the runs as Ray tasks (one CPU each) instead of local processes: 'auto' or HOST:PORT "
        "joins an existing cluster (every node needs fedfair and the data), 'local' starts a private "
        f"instance on this machine; --workers is then unused. Needs Ray: {RAY_INSTALL_HINT}",
    )
    parser.add_argument(
        "--study",
        choices=("paper", "drift"),
        default="paper",
        help="paper (default): the paper's figures and table; drift: FedSRCVaR with tau local steps with and "
        "without --drift-correction, at equal rounds and at equal local steps (fig5_drift_*)",
    )
    split = parser.add_argument_group("the client split and model (default: the dataset's split in the paper)")
    split.add_argument(
        "--partition",
        help="a column, class, dirichlet or iid (as for `fedfair simulate`), e.g. previous_state with "
        "--clients 51 for Census-Income's 51 sites",
    )
    split.add_argument("--alpha", type=float, help="drift study: Dirichlet concentration for --partition dirichlet")
    split.add_argument("--clients", type=int, help="number of collaborators")
    split.add_argument(
        "--model",
        choices=MODEL_NAMES,
        help="the model every run trains (default: the paper's for the dataset, else the profile's)",
    )
    parser.add_argument(
        "--loss-rows",
        type=int,
        default=0,
        help="AFL, q-FedAvg and FedMinMax read each round's losses from this many rows per collaborator "
        "(default 0: every row, as published; e.g. 8192 on Census-Income, where the exact losses cost more "
        "than the training)",
    )
    narrow = parser.add_argument_group("a part of the study (the same runs, cached alike)")
    narrow.add_argument(
        "--methods",
        help="comma-separated methods to run, FedSRCVaR among them, e.g. fedsrcvar,fedavg,central-erm "
        f"(default: all of {', '.join(STUDY_METHODS)})",
    )
    narrow.add_argument(
        "--rhos",
        help="comma-separated rhos to choose and judge at, e.g. 0.3 (default: the profile's; 0.1 is always in)",
    )
    traced = parser.add_argument_group("convergence (the paper study; adds runs of its own)")
    traced.add_argument(
        "--convergence",
        action="store_true",
        help="also re-run every method's chosen points on the test seeds keeping their training traces, at the "
        "profile's rounds and at --long-rounds, and write convergence.csv: the round each settles within 1%% "
        "of its final value",
    )
    traced.add_argument(
        "--long-rounds",
        type=int,
        help=f"the convergence table's longer run, in rounds (default {LONG_ROUNDS}); needs --convergence",
    )
    parser.add_argument(
        "--paired",
        action="store_true",
        help="keep every test row's loss of the chosen points' runs and write paired_rho.csv: each method's "
        "worst-group gap to FedSRCVaR on the same rows and its standard error over them (the seeds vary the "
        "training, never the rows)",
    )
    parser.set_defaults(handler=_reproduce_command)


def _reproduce_command(args: argparse.Namespace) -> int:
    # The study (PyTorch) is imported to run, not for --help.
    from fedfair.research import baselines
    from fedfair.research.profiles import PROFILES
    from fedfair.research.reproduce import reproduce
    from fedfair.research.runs import ray_connection

    if args.dataset not in DATASETS:
        raise ConfigError(f"unknown dataset '{args.dataset}'; choose one of: {', '.join(DATASETS)}")
    if args.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {args.workers}")
    baselines.LossRows.check(args.loss_rows)
    name = "quick" if args.quick else args.profile
    split: list[str] = []
    if args.partition is not None:
        split += ["--partition", args.partition]
    if args.alpha is not None:
        split += ["--alpha", f"{args.alpha:g}"]
    if args.clients is not None:
        split += ["--clients", str(args.clients)]
    long_rounds = _long_rounds(args)
    if args.study == "drift":
        if args.convergence:
            raise ConfigError("--convergence traces the paper study's chosen points; the drift study has none")
        if args.paired:
            raise ConfigError("--paired compares the paper study's chosen points; the drift study has none")
        if args.model is not None:
            raise ConfigError("--model sets the paper study's model; the drift study's profile names its own")
        return _drift_command(args, name, tuple(split))
    if args.alpha is not None:
        raise ConfigError(
            "--alpha sets the drift study's Dirichlet split; the paper study splits by a column or "
            "class (drop it, or add --study drift)"
        )
    paper = paper_split(args.dataset, args.partition, args.clients)
    model = args.model or paper.model
    profile = PROFILES[name] if model is None else dataclasses.replace(PROFILES[name], model=model)
    methods = _methods(args.methods)
    if args.rhos is not None:
        profile = dataclasses.replace(profile, rhos=_rhos(args.rhos))
    if args.ray is None:
        written = reproduce(
            args.dataset,
            args.out,
            profile,
            args.workers,
            args.device,
            loss_rows=args.loss_rows,
            split=paper,
            methods=methods,
            long_rounds=long_rounds,
            paired=args.paired,
        )
    else:
        with ray_connection(args.ray):
            written = reproduce(
                args.dataset,
                args.out,
                profile,
                args.workers,
                args.device,
                True,
                args.loss_rows,
                paper,
                methods,
                long_rounds,
                args.paired,
            )
    return _print_written(written)


def _long_rounds(args: argparse.Namespace) -> int | None:
    """The convergence table's longer run (None: no convergence table), --long-rounds checked."""
    if args.long_rounds is not None and not args.convergence:
        raise ConfigError("--long-rounds sets the convergence table's longer run; add --convergence")
    if args.long_rounds is not None and args.long_rounds < 1:
        raise ConfigError(f"--long-rounds must be at least 1, got {args.long_rounds}; e.g. --long-rounds 1000")
    if not args.convergence:
        return None
    return LONG_ROUNDS if args.long_rounds is None else int(args.long_rounds)


def _methods(text: str | None) -> tuple[str, ...] | None:
    """--methods as a tuple of known method names with FedSRCVaR among them (None: every method)."""
    if text is None:
        return None
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in STUDY_METHODS]
    if unknown:
        raise ConfigError(f"--methods: unknown {', '.join(unknown)}; choose from {', '.join(STUDY_METHODS)}")
    if "fedsrcvar" not in names:
        raise ConfigError("--methods must include fedsrcvar: the study's other figures are drawn at its choice")
    return names


def _rhos(text: str) -> tuple[float, ...]:
    """--rhos as a sorted tuple of numbers in (0, 1]."""
    try:
        rhos = tuple(sorted({float(value) for value in text.split(",") if value.strip()}))
    except ValueError:
        raise ConfigError(f"--rhos takes comma-separated numbers, e.g. 0.1,0.3; got '{text}'") from None
    if not rhos or not all(0.0 < rho <= 1.0 for rho in rhos):
        raise ConfigError(f"--rhos must be numbers in (0, 1], e.g. 0.1,0.3; got '{text}'")
    return rhos


def _print_written(written: Mapping[str, Path]) -> int:
    """List the files a study wrote, one per line; the command's exit status."""
    for name, path in written.items():
        print(f"{name:>12}  {path}")
    return 0


def _drift_command(args: argparse.Namespace, name: str, split: tuple[str, ...]) -> int:
    from fedfair.research.drift import DRIFT_PROFILES, drift_study
    from fedfair.research.runs import ray_connection

    if args.loss_rows:
        raise ConfigError("--loss-rows concerns AFL, q-FedAvg and FedMinMax, which the drift study does not run")
    if name not in DRIFT_PROFILES:
        raise ConfigError(
            f"the drift study has no profile '{name}' (that one is the paper study's); "
            f"use --profile {', '.join(sorted(DRIFT_PROFILES))}"
        )
    profile = DRIFT_PROFILES[name]
    if args.ray is None:
        written = drift_study(args.dataset, args.out, profile, args.workers, split, args.device)
    else:
        with ray_connection(args.ray):
            written = drift_study(args.dataset, args.out, profile, args.workers, split, args.device, on_ray=True)
    return _print_written(written)
