"""``fedfair simulate``: a federation in process and its fairness report (:mod:`fedfair.research.flags`).

The flags come from :mod:`fedfair.research.arguments` (no PyTorch); the simulation is imported when
the command runs, so ``fedfair simulate --help`` answers at once.
"""

from __future__ import annotations

import argparse

from fedfair.research.arguments import add_experiment_arguments

DEFAULT_THREADS = 1
"""PyTorch threads a simulation runs on unless ``--threads`` says otherwise. Its steps are small (a few
thousand rows, a model of a few hundred parameters), so torch's thread pool costs more in hand-offs than it
saves: with its default (one thread per core) on a loaded 2-core machine a 51-client Adult run made 31 to 57
rounds a second, against about 460 on one thread, the setting simulation_speed, reproduce and sweep use."""


def _threads(value: str) -> int:
    """``--threads``: a whole number >= 0 (0 leaves torch's default, one thread per core)."""
    try:
        threads = int(value)
    except ValueError:
        threads = -1
    if threads < 0:
        raise argparse.ArgumentTypeError(f"--threads takes a whole number >= 0, got {value!r}")
    return threads


def _simulate_command(args: argparse.Namespace) -> int:
    import torch

    from fedfair.research.experiment import load_federation, simulate
    from fedfair.research.flags import config_from_args, format_report, write_json

    if args.threads:
        torch.set_num_threads(args.threads)
    config = config_from_args(args)
    result = simulate(config, load_federation(config))
    print(format_report(result))
    write_json(args.json, result)
    return 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair simulate`, taking the experiment flags and --threads."""
    simulate_parser = subparsers.add_parser("simulate", help="run a federation in process and report fairness")
    add_experiment_arguments(simulate_parser)
    simulate_parser.add_argument(
        "--threads",
        type=_threads,
        default=DEFAULT_THREADS,
        help=f"PyTorch threads (default {DEFAULT_THREADS}, fastest for the small steps of a simulation; "
        "0 for torch's default of one per core, which a large model may want)",
    )
    simulate_parser.set_defaults(handler=_simulate_command)
