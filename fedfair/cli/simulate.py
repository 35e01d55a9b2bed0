"""``fedfair simulate``: a federation in process and its fairness report (:mod:`fedfair.research.flags`).

The flags come from :mod:`fedfair.research.arguments` (no PyTorch); the simulation is imported when
the command runs, so ``fedfair simulate --help`` answers at once.
"""

from __future__ import annotations

import argparse

from fedfair.research.arguments import add_experiment_arguments


def _simulate_command(args: argparse.Namespace) -> int:
    from fedfair.research.experiment import load_federation, simulate
    from fedfair.research.flags import config_from_args, format_report, write_json

    config = config_from_args(args)
    result = simulate(config, load_federation(config))
    print(format_report(result))
    write_json(args.json, result)
    return 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair simulate`, taking the experiment flags."""
    simulate_parser = subparsers.add_parser("simulate", help="run a federation in process and report fairness")
    add_experiment_arguments(simulate_parser)
    simulate_parser.set_defaults(handler=_simulate_command)
