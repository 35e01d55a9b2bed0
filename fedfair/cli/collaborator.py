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


def _ledger_command(args: argparse.Namespace) -> int:
    from fedfair.core.errors import ConfigError
    from fedfair.runtime.collaborator.charges import describe_ledger
    from fedfair.runtime.collaborator.config import load_collaborator_config
    from fedfair.runtime.collaborator.input_record import InputRecord

    config = load_collaborator_config(args.config)
    pattern = f"{config.name}.{args.federation or '*'}.bindings.json"
    paths = sorted(config.source.parent.glob(pattern))
    if not paths:
        raise ConfigError(
            f"no record {pattern} beside {config.source}: this institution has answered nothing in "
            f"{'federation ' + args.federation if args.federation else 'any federation'} yet"
        )
    for path in paths:
        federation = path.name.removeprefix(f"{config.name}.").removesuffix(".bindings.json")
        print(describe_ledger(InputRecord(path, federation), args.delta))
    return 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair collaborator start` and `fedfair collaborator ledger`."""
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
    ledger = commands.add_parser("ledger", help="what this institution's noised inputs have spent, per federation")
    ledger.add_argument("--config", type=Path, required=True, help="this institution's collaborator.toml")
    ledger.add_argument("--federation", help="one federation id (default: every federation it has a record of)")
    ledger.add_argument("--delta", type=float, help="report epsilon at this delta (default: the plan's)")
    ledger.set_defaults(handler=_ledger_command)
