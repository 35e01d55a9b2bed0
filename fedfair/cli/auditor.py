"""``fedfair auditor start``: the auditor's command line, the second verifier of a two-verifier input bound."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from fedfair.runtime.observe.logs import configure_logging
from fedfair.runtime.process_facts import process_started

logger = logging.getLogger("fedfair.auditor")

HELP = "verify every site's input bound as the plan's auditor institution"


def _start_command(args: argparse.Namespace) -> int:
    # gRPC and the bounded sum's code come with the auditor's modules: imported to run, not for --help.
    from fedfair.core.errors import ConfigError
    from fedfair.runtime.auditor.config import auditor_config_from_flags, load_auditor_config
    from fedfair.runtime.auditor.process import AuditorProcess
    from fedfair.runtime.stops import say_stopped, stop_on_signals

    flags = {"cert": args.cert, "key": args.key, "manifest": args.manifest, "aggregator": args.aggregator}
    if args.config is not None:
        given = [f"--{name}" for name, value in flags.items() if value is not None]
        if given or args.ca is not None or args.folder is not None:
            raise ConfigError(f"give --config or the flags, not both ({', '.join(given or ['--ca/--folder'])})")
        config = load_auditor_config(args.config)
    else:
        missing = [f"--{name}" for name, value in flags.items() if value is None]
        if missing:
            raise ConfigError(f"missing {', '.join(missing)}: give them, or --config auditor.toml")
        config = auditor_config_from_flags(
            cert=args.cert,
            key=args.key,
            ca=args.ca,
            manifest=args.manifest,
            aggregator=args.aggregator,
            folder=args.folder or Path("."),
        )
    # The console shows what needs a person; every line goes to NAME.log in the auditor's folder.
    config.folder.mkdir(parents=True, exist_ok=True)
    configure_logging(file=config.folder / f"{config.name}.log", label=config.name, verbose=args.verbose)
    # The wait for a first answer counts from the command, as a site's: the operator waits through imports too.
    auditor = AuditorProcess(config, started=process_started())
    try:
        # auditor.stop also ends its waits where a library dropped the interrupt (stop_on_signals).
        with stop_on_signals(on_stop=auditor.stop):
            return auditor.run()
    except KeyboardInterrupt as stop:
        auditor.stop()  # its stream cancelled: the aggregator sees it leave at once
        kept = f"what it keeps of the federation (totals.json, noise.secret) is in {config.folder}"
        return say_stopped(
            stop, config.name, f"{kept}: start it again with the same command and folder to go on verifying", logger
        )


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair auditor start`."""
    group = subparsers.add_parser("auditor", help=HELP)
    commands = group.add_subparsers(dest="auditor_command", required=True, metavar="COMMAND")
    start = commands.add_parser(
        "start",
        help="connect to the aggregator with the auditor's certificate and verify each round's bounded sum",
        description="Connect to the aggregator as the auditor the plan names ([secure_aggregation] input_bound = "
        '"two_verifiers", auditor = NAME) and take the bounded sum\'s auditor stages round after round, until the '
        "federation finishes. Its settings come from --config auditor.toml ([auditor] name, aggregator, manifest, "
        "folder, idle_timeout_seconds; [certificates] dir or ca, cert, key; [retry]; `fedfair init ... --auditor "
        "NAME` writes one with every key explained) or from the flags; the manifest must list it with role "
        '"auditor" and pin its certificate.',
    )
    start.add_argument("--config", type=Path, help="the auditor's auditor.toml (instead of the flags below)")
    start.add_argument("--cert", type=Path, help="the auditor's certificate (role auditor); its name is the auditor's")
    start.add_argument("--key", type=Path, help="the auditor's private key, made with that certificate's request")
    start.add_argument("--ca", type=Path, help="the federation's CA certificate (default: ca.crt beside --cert)")
    start.add_argument("--manifest", type=Path, help="the federation's manifest, which lists and pins the auditor")
    start.add_argument("--aggregator", help="the aggregator's address, host:port")
    start.add_argument(
        "--folder",
        type=Path,
        help="where the auditor keeps its log (NAME.log), totals.json (the sites each round's inputs were first "
        "totalled over) and noise.secret (what each round's noise key derives from): keep it across restarts and "
        "back it up, since a restarted auditor resumes from both (default: here)",
    )
    start.add_argument(
        "--verbose", action="store_true", help="print every per-round line on the console too, not only in the log file"
    )
    start.set_defaults(handler=_start_command)
