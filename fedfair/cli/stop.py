"""``fedfair stop OUTPUT_DIR``: stop the aggregator that writes to OUTPUT_DIR, as Ctrl-C at its console would."""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

STOP_SECONDS = 60.0
"""How long ``fedfair stop`` waits for the aggregator to close up (its network, its last events) by default."""


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    return True


def _stop_command(args: argparse.Namespace) -> int:
    from fedfair.core.errors import ConfigError
    from fedfair.runtime.observe.status import federation_state

    state = federation_state(args.output_dir)
    if not state.running or state.pid is None:
        phase = "finished" if state.finished else "stopped" if state.stopped is not None else "not running"
        raise ConfigError(
            f"no aggregator runs for {args.output_dir} (it is {phase}; `fedfair status {args.output_dir}` says "
            "more): nothing to stop. Give the output folder of a running aggregator"
        )
    os.kill(state.pid, signal.SIGTERM)  # the aggregator's stop: its closing line, the checkpoint kept
    deadline = time.monotonic() + args.timeout
    while (alive := _exists(state.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive:
        raise ConfigError(
            f"the aggregator (PID {state.pid}) did not stop within {args.timeout:g} s of SIGTERM; its log in "
            f"{args.output_dir} says what it is doing. Wait longer (--timeout), or end it with kill -9 {state.pid} "
            "(its last checkpoint still resumes with --resume)"
        )
    stopped = federation_state(args.output_dir).stopped
    print(f"stopped the aggregator (PID {state.pid}): {stopped or 'it ended without a stop line'}")
    return 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair stop OUTPUT_DIR [--timeout SECONDS]`."""
    parser = subparsers.add_parser(
        "stop",
        help="stop a running aggregator, from its output folder, as Ctrl-C at its console would",
        description="Send SIGTERM to the aggregator that writes to OUTPUT_DIR (its PID is in events.jsonl) and "
        "wait for it to stop: it ends the round in flight, keeps its last checkpoint (continue with `fedfair "
        "aggregator start --resume`), closes the sites' task streams, and exits 143 with its closing line.",
    )
    parser.add_argument("output_dir", type=Path, metavar="OUTPUT_DIR", help="the aggregator's output folder")
    parser.add_argument(
        "--timeout",
        type=float,
        default=STOP_SECONDS,
        metavar="SECONDS",
        help=f"how long to wait for it to stop (default {STOP_SECONDS:g})",
    )
    parser.set_defaults(handler=_stop_command)
