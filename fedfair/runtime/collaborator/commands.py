"""``fedfair collaborator start --config collaborator/collaborator.toml``: the collaborator's command line."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedfair.runtime.logs import configure_logging


def _start_command(args: argparse.Namespace) -> int:
    # PyTorch, gRPC and pandas come with the collaborator's modules: imported to run, not for --help.
    from fedfair.runtime.collaborator.client import Collaborator
    from fedfair.runtime.collaborator.config import load_collaborator_config

    config = load_collaborator_config(args.config)
    # The console shows a progress bar and what needs a person; every line goes to NAME.log beside the config.
    configure_logging(file=config.source.parent / f"{config.name}.log", label=config.name, verbose=args.verbose)
    collaborator = Collaborator(config, reset_state=args.reset_state)
    try:
        return collaborator.run()
    except KeyboardInterrupt:
        collaborator.stop()
        return 130


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair collaborator start`."""
    group = subparsers.add_parser("collaborator", help="take part in a federation as one institution")
    commands = group.add_subparsers(dest="collaborator_command", required=True, metavar="COMMAND")
    start = commands.add_parser("start", help="connect to the aggregator and train on local data")
    start.add_argument("--config", type=Path, required=True, help="this institution's collaborator.toml")
    start.add_argument(
        "--reset-state",
        action="store_true",
        help="start this institution's record of the federation (and its privacy budget) again when it was lost; "
        "without it a collaborator with no record refuses to join a federation past its first round",
    )
    start.add_argument(
        "--verbose", action="store_true", help="print every per-round line on the console too, not only in the log file"
    )
    start.set_defaults(handler=_start_command)
