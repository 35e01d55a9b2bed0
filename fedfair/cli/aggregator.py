"""``fedfair aggregator start``: the aggregator's command line.

The flags override the plan's values (``--rounds``, ``--address``, ...) and pass the
same checks as the file, but a bad value is blamed on its flag, not on the plan
file (:func:`check_flags`); without ``--plan`` the flags alone make the plan. The
process itself is :func:`fedfair.runtime.aggregator.start.run_aggregator`.

``--resume --readmit NAME`` lets a collaborator that the run excluded (a proven fault
in secure aggregation) back in: :func:`readmit` records it in the round log before the
aggregator starts, where every later resume reads it
(:func:`fedfair.runtime.aggregator.loop.excluded_in`).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from fedfair.core.errors import ConfigError
from fedfair.core.files import atomic_write
from fedfair.pki import validate_name
from fedfair.pki.names import FEDERATION_ID_RE
from fedfair.runtime.failures import finished_exit
from fedfair.runtime.observe.logs import CLOSING_LINE, LOG_LEVELS, configure_logging, quiet_grpc
from fedfair.core.tables import Table, shown

if TYPE_CHECKING:
    from fedfair.runtime.plan.aggregator_plan import AggregatorPlan

# The aggregator's own modules (PyTorch, gRPC, pandas) are imported inside the handlers, where they
# run: `fedfair aggregator start --help` then answers at once.

logger = logging.getLogger("fedfair.aggregator")

LOG_NAME = "aggregator.log"
"""The log file in the output folder, where every line goes (the console shows a progress bar instead of
the per-round lines)."""


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


class _Flag(Table):
    """The plan's check of one value, with its message blaming the command-line flag."""

    def __init__(self, flag: str, key: str, value: object) -> None:
        super().__init__("the command line", "", {key: value}, (key,))
        self.flag = flag

    def bad(self, key: str, value: object, expected: str) -> NoReturn:
        raise ConfigError(f"{self.flag} must be {expected}, got {shown(value)}; fix the flag")


def check_flags(args: argparse.Namespace) -> None:
    """Check each plan-overriding flag that was given with the plan's own check for its key.

    Raises:
        ConfigError: a bad value, reported against the flag ("--rounds must be an integer >= 1, got -3").
    """
    if args.rounds is not None:
        _Flag("--rounds", "rounds", args.rounds).integer("rounds", low=1)
    if args.address is not None:
        _Flag("--address", "address", args.address).address("address")
    if args.federation_id is not None:
        _Flag("--federation-id", "id", args.federation_id).string(
            "id", pattern=FEDERATION_ID_RE, expected="letters, digits, '.', '_' or '-'"
        )
    names = [("--name", args.name)] if args.name is not None else []
    names += [("--collaborators", name.strip()) for name in (args.collaborators or "").split(",") if name.strip()]
    for flag, name in names:
        try:
            validate_name(name)
        except ConfigError as error:
            raise ConfigError(f"{flag}: {error}") from None


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= 0.0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0 (0: no deadline), got {text!r}")
    return value


def plan_from_args(args: argparse.Namespace) -> AggregatorPlan:
    """The plan file with the flags applied, or (without --plan) a plan from the flags alone."""
    check_flags(args)
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
    from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan

    return load_aggregator_plan(args.plan, overrides)


def readmit(plan: AggregatorPlan, names: Sequence[str]) -> dict[str, str]:
    """Let the excluded collaborators `names` back into the run in the plan's output folder.

    Under the folder's lock (so never beside a live aggregator), each name must be excluded
    as of the checkpoint, or nothing is recorded and ConfigError blames ``--readmit``. The
    names are added to the ``readmitted`` list of the checkpointed round's record in
    ``rounds.jsonl`` (rewritten atomically), where
    :func:`~fedfair.runtime.aggregator.loop.excluded_in` lifts their exclusion after that
    round's own, so every later ``--resume`` keeps them in. Each one is logged and emitted
    as a ``readmission`` event. Returns name -> the reason it had been excluded for.
    """
    from fedfair.runtime.output_folder import ROUND_LOG_NAME
    from fedfair.runtime.aggregator.checkpoint import load_checkpoint, read_round_log, trim_round_log
    from fedfair.runtime.observe.events import EventLog
    from fedfair.runtime.aggregator.lock import output_lock
    from fedfair.runtime.aggregator.loop import excluded_in
    from fedfair.runtime.plan.aggregator_plan import plan_content, plan_digest

    output = plan.aggregator.output
    with output_lock(output):
        checkpoint = load_checkpoint(output, plan_digest(plan), plan_content(plan))
        # As the resume itself will: records past the checkpoint (and a torn last line) belong to a
        # round the resumed run does again.
        trim_round_log(output, checkpoint.round)
        records = read_round_log(output)
        excluded = excluded_in(records)
        unknown = sorted(set(names) - excluded.keys())
        if unknown:
            now = ", ".join(sorted(excluded)) or "nobody"
            raise ConfigError(
                f"--readmit {', '.join(unknown)}: not excluded in the run in {output} as of its checkpoint of "
                f"round {checkpoint.round} (excluded now: {now}); correct the name or drop --readmit"
            )
        last = records[-1]  # exists: someone was excluded, so some round was logged
        last["readmitted"] = sorted({*(last.get("readmitted") or ()), *names})
        text = "".join(json.dumps(record, sort_keys=True, allow_nan=False) + "\n" for record in records)
        atomic_write(output / ROUND_LOG_NAME, lambda stream: stream.write(text.encode()))
        events = EventLog(output)
        lifted = {name: excluded[name] for name in sorted(set(names))}
        for name, why in lifted.items():
            logger.warning(
                "%s re-admitted by --readmit after round %d (it had been excluded: %s); it takes part again "
                "from round %d",
                name,
                last["round"],
                why,
                last["round"] + 1,
            )
            events.emit("readmission", round=last["round"], name=name, reason=why)
    return lifted


def _start_command(args: argparse.Namespace) -> int:
    quiet_grpc()
    plan = plan_from_args(args)
    log_file = args.log_file if args.log_file is not None else plan.aggregator.output / LOG_NAME
    configure_logging(args.log_level, log_file, label="aggregator", verbose=args.verbose)
    from fedfair.runtime.aggregator.start import run_aggregator, stopped_line
    from fedfair.runtime.stops import stop_on_signals, stop_status

    if args.readmit:
        if not args.resume:
            raise ConfigError(
                "--readmit lifts an exclusion of the run being resumed and needs --resume; a fresh start "
                "excludes nobody, so drop --readmit (or add --resume)"
            )
        readmit(plan, args.readmit)
    try:
        with stop_on_signals():
            summary = run_aggregator(plan, resume=args.resume, startup_timeout=args.startup_timeout)
    except KeyboardInterrupt as stop:
        logger.warning("%s", stopped_line(plan, stop), extra=CLOSING_LINE)
        return stop_status(stop)
    return finished_exit(int(summary.get("aborted_rounds") or 0), plan.quorum.aborted_rounds_allowed)


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair aggregator start`."""
    group = subparsers.add_parser("aggregator", help="run the federation's aggregator")
    commands = group.add_subparsers(dest="aggregator_command", required=True, metavar="COMMAND")
    start = commands.add_parser("start", help="serve the plan's rounds over mutual TLS")
    start.add_argument("--plan", type=Path, help="the federation plan (aggregator/plan.toml)")
    start.add_argument("--resume", action="store_true", help="continue from the checkpoint in the output folder")
    start.add_argument(
        "--readmit",
        action="append",
        metavar="NAME",
        help="with --resume: let NAME, excluded for misbehaving in secure aggregation, take part again "
        "(repeatable; recorded in rounds.jsonl, so later resumes keep it in)",
    )
    start.add_argument("--address", help="host:port to listen on (overrides [aggregator] address)")
    start.add_argument("--certs", help="folder with ca.crt and the aggregator's certificate and key")
    start.add_argument("--collaborators", help="comma-separated allowed collaborator names")
    start.add_argument("--rounds", type=int, help="number of rounds (overrides [training] rounds)")
    start.add_argument("--output", help="folder for checkpoints, the round log and the final model")
    start.add_argument("--federation-id", dest="federation_id", help="the federation's id")
    start.add_argument("--name", help="the aggregator's certificate name (default aggregator)")
    start.add_argument(
        "--startup-timeout",
        dest="startup_timeout",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="stop if the quorum of collaborators has not connected this long after start-up "
        "(default 0: wait for them without a deadline, naming who is missing every 10 s)",
    )
    start.add_argument(
        "--log-level",
        dest="log_level",
        choices=LOG_LEVELS,
        default="INFO",
        type=str.upper,
        help="the quietest lines to log (default INFO: connections, refusals, progress, rounds)",
    )
    start.add_argument(
        "--log-file",
        dest="log_file",
        type=Path,
        metavar="PATH",
        help=f"append the whole log to PATH (default: {LOG_NAME} in the output folder; events.jsonl there is the "
        "machine-readable stream)",
    )
    start.add_argument(
        "--verbose",
        action="store_true",
        help="print every round's lines on the console too (by default they go to the log file and the console "
        "shows a progress bar)",
    )
    start.set_defaults(handler=_start_command)
