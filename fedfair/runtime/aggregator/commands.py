"""``fedfair aggregator start``: the aggregator's command line.

The flags override the plan's values (``--rounds``, ``--address``, ...) and pass the
same checks as the file; without ``--plan`` the flags alone make the plan. The
process itself is :func:`fedfair.runtime.aggregator.loop.run_aggregator`.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from fedfair.core.errors import ConfigError
from fedfair.runtime.aggregator.loop import run_aggregator
from fedfair.runtime.logs import configure_logging
from fedfair.runtime.plan import AggregatorPlan, load_aggregator_plan

logger = logging.getLogger("fedfair.aggregator")


def _overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The flags that were given, as plan section -> key -> value."""
    overrides: dict[str, dict[str, Any]] = {}

    def put(section: str, key: str, value: Any) -> None:
        if value is not None:
            overrides.setdefault(section, {})[key] = value

    put("federation", "id", args.federation_id)
    if args.collaborators is not None:
        put("federation", "collaborators", [name.strip() for name in args.collaborators.split(",") if name.strip()])
    put("aggregator", "address", args.address)
    put("aggregator", "certs", str(Path(args.certs).resolve()) if args.certs else None)
    put("aggregator", "output", str(Path(args.output).resolve()) if args.output else None)
    put("aggregator", "name", args.name)
    put("training", "rounds", args.rounds)
    return overrides


def plan_from_args(args: argparse.Namespace) -> AggregatorPlan:
    """The plan file with the flags applied, or (without --plan) a plan from the flags alone."""
    overrides = _overrides(args)
    if args.plan is None:
        missing = [
            flag
            for flag, value in (
                ("--certs", args.certs),
                ("--collaborators", args.collaborators),
                ("--address", args.address),
            )
            if value is None
        ]
        if missing:
            raise ConfigError(f"without --plan the aggregator needs {', '.join(missing)}; or pass --plan plan.toml")
        overrides.setdefault("federation", {}).setdefault("id", "fedfair")
    return load_aggregator_plan(args.plan, overrides)


def _start_command(args: argparse.Namespace) -> int:
    configure_logging()
    plan = plan_from_args(args)
    try:
        run_aggregator(plan, resume=args.resume)
    except KeyboardInterrupt:
        logger.warning("interrupted; the last checkpoint is in %s (continue with --resume)", plan.aggregator.output)
        return 130
    return 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair aggregator start`."""
    group = subparsers.add_parser("aggregator", help="run the federation's aggregator")
    commands = group.add_subparsers(dest="aggregator_command", required=True, metavar="COMMAND")
    start = commands.add_parser("start", help="serve the plan's rounds over mutual TLS")
    start.add_argument("--plan", type=Path, help="the federation plan (aggregator/plan.toml)")
    start.add_argument("--resume", action="store_true", help="continue from the checkpoint in the output folder")
    start.add_argument("--address", help="host:port to listen on (overrides [aggregator] address)")
    start.add_argument("--certs", help="folder with ca.crt and the aggregator's certificate and key")
    start.add_argument("--collaborators", help="comma-separated allowed collaborator names")
    start.add_argument("--rounds", type=int, help="number of rounds (overrides [training] rounds)")
    start.add_argument("--output", help="folder for checkpoints, the round log and the final model")
    start.add_argument("--federation-id", dest="federation_id", help="the federation's id")
    start.add_argument("--name", help="the aggregator's certificate name (default aggregator)")
    start.set_defaults(handler=_start_command)
