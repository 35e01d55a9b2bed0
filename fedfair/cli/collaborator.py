"""``fedfair collaborator start --config collaborator/collaborator.toml``: the collaborator's command line."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from fedfair.runtime.observe.logs import configure_logging
from fedfair.runtime.process_facts import process_started

logger = logging.getLogger("fedfair.collaborator")


def _start_command(args: argparse.Namespace) -> int:
    # PyTorch, gRPC and pandas come with the collaborator's modules: imported to run, not for --help.
    from fedfair.core.errors import PermanentFailureError
    from fedfair.runtime.collaborator.client import Collaborator
    from fedfair.runtime.collaborator.config import load_collaborator_config
    from fedfair.runtime.collaborator.metrics import start_site_monitoring
    from fedfair.runtime.failures import AUDITOR_REFUSED, EXIT_REFUSED
    from fedfair.runtime.stops import say_stopped, stop_on_signals

    config = load_collaborator_config(args.config)
    # The console shows a progress bar and what needs a person; every line goes to NAME.log beside the config.
    configure_logging(file=config.source.parent / f"{config.name}.log", label=config.name, verbose=args.verbose)
    # The wait for a first answer counts from the command: the operator waits through imports and the table too.
    collaborator = Collaborator(config, reset_state=args.reset_state, started=process_started())
    monitor = start_site_monitoring(config)  # its own privacy metrics, when its config has [monitoring]
    try:
        # collaborator.stop also ends its waits where a library dropped the interrupt (stop_on_signals).
        with stop_on_signals(on_stop=collaborator.stop):
            status = collaborator.run()
        if monitor is not None:
            monitor.final_scrape()
        return status
    except KeyboardInterrupt as stop:
        collaborator.stop()  # its stream cancelled: the aggregator sees it leave at once
        kept = "what it holds of the federation is kept beside its config"
        return say_stopped(
            stop, config.name, f"{kept}: start it again with the same command to rejoin from the next round", logger
        )
    except PermanentFailureError as error:
        if error.failure is not AUDITOR_REFUSED:
            raise
        # This institution's own choice, not a fault: a status of its own, so that a script can tell the two apart.
        print(f"fedfair: error: {error}", file=sys.stderr)
        return EXIT_REFUSED
    finally:
        if monitor is not None:
            monitor.stop()


def _ledger_command(args: argparse.Namespace) -> int:
    from fedfair.runtime.collaborator.charges import describe_accountant, describe_ledger, open_ledger
    from fedfair.runtime.collaborator.config import load_collaborator_config

    config = load_collaborator_config(args.config)
    print(describe_ledger(open_ledger(config), args.delta))
    own = describe_accountant(config, args.delta)
    if own is not None:
        print(own)
    return 0


def _reset_ledger_command(args: argparse.Namespace) -> int:
    from fedfair.core.errors import ConfigError
    from fedfair.runtime.collaborator.charges import describe_ledger, open_ledger
    from fedfair.runtime.collaborator.config import load_collaborator_config

    config = load_collaborator_config(args.config)
    # Not checked against this folder's link: a reset is how an operator starts again where that check refuses.
    ledger = open_ledger(config, starting_over=True)
    if not args.confirm:
        print(describe_ledger(ledger))
        raise ConfigError(
            f"nothing reset: starting {ledger.path} again forgets, for every later budget check, what the releases "
            "above spent of these people's privacy; if that is what you mean, run this again with --confirm"
        )
    # The reset is an entry of the ledger itself, and a line of the collaborator's log beside its config.
    configure_logging(file=config.source.parent / f"{config.name}.log", label=config.name)
    spent = ledger.reset(args.reason)
    logger.warning(
        "%s: privacy ledger %s reset by its operator (%s); epsilon %.4g spent before it no longer counts",
        config.name,
        ledger.path,
        args.reason,
        spent,
    )
    print(f"{ledger.path}: reset (epsilon {spent:.4g} spent before it is kept, and no longer counted)")
    return 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair collaborator start`, `fedfair collaborator ledger` and `fedfair collaborator reset-ledger`."""
    group = subparsers.add_parser("collaborator", help="take part in a federation as one institution")
    commands = group.add_subparsers(dest="collaborator_command", required=True, metavar="COMMAND")
    start = commands.add_parser("start", help="connect to the aggregator and train on local data")
    start.add_argument("--config", type=Path, required=True, help="this institution's collaborator.toml")
    start.add_argument(
        "--reset-state",
        action="store_true",
        help="start this institution's record of the federation again when it was lost (its privacy ledger is "
        "kept: only `reset-ledger` starts that again); without it a collaborator with no record refuses to join a "
        "federation past its first round",
    )
    start.add_argument(
        "--verbose", action="store_true", help="print every per-round line on the console too, not only in the log file"
    )
    start.set_defaults(handler=_start_command)
    ledger = commands.add_parser(
        "ledger",
        help="what this institution's noised inputs have spent of its data's budget, in every federation (the "
        "ledger of its table's rows, in $FEDFAIR_LEDGER_DIR or ~/.local/state/fedfair/ledgers)",
    )
    ledger.add_argument("--config", type=Path, required=True, help="this institution's collaborator.toml")
    ledger.add_argument("--delta", type=float, help="report epsilon at this delta (default: the plan's)")
    ledger.set_defaults(handler=_ledger_command)
    reset = commands.add_parser(
        "reset-ledger",
        help="start this institution's privacy ledger for its data again (the operator's decision; kept in the "
        "ledger and the log)",
    )
    reset.add_argument("--config", type=Path, required=True, help="this institution's collaborator.toml")
    reset.add_argument("--reason", required=True, help="why, kept in the ledger (e.g. 'new cohort, new records')")
    reset.add_argument(
        "--confirm", action="store_true", help="do reset it (without it the command shows the ledger and stops)"
    )
    reset.set_defaults(handler=_reset_ledger_command)
