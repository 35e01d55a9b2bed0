"""``fedfair status OUTPUT_DIR``: a federation's state on one screen (:mod:`fedfair.runtime.observe.status`)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

from fedfair.runtime.report.data import CELLS, input_bound_words
from fedfair.runtime.observe.status import FederationState, federation_state


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _epsilon(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _phase(state: FederationState) -> str:
    if state.running:
        return "running"
    if state.finished:
        return "finished"
    if state.stopped is not None:
        return f"stopped (exit {state.exit_status})"
    return "not running"


def describe(state: FederationState) -> str:
    """`state` as one screen of text: the federation, the last round, the estimate, then one line per site."""
    phase = _phase(state)
    lines = [
        f"federation {state.federation_id or '(unknown: no start event)'}: {phase}, round {state.last_round or 0} "
        f"of {state.rounds_planned or '?'} ({state.rounds_completed} applied, {state.rounds_aborted} aborted); "
        f"{'a checkpoint is kept' if state.checkpoint else 'no checkpoint yet'}",
        f"  plan digest {(state.plan_digest or '?')[:16]}, started {_when(state.started)}, "
        f"last event {_when(state.updated)}",
        f"  {input_bound_words(state.auditor)}",
    ]
    if state.waiting is not None:
        lines.append(f"  {state.waiting.line()}")
    if state.stopped is not None:
        lines.append(f"  stopped: {state.stopped}")
    if state.monitoring_url and state.running:
        lines.append(f"  monitoring: {state.monitoring_url}/metrics, status page {state.monitoring_url}/")
    elif state.monitoring_url:
        lines.append(f"  monitoring was served at {state.monitoring_url} while the aggregator ran")
    if state.last_round is not None:
        held = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in state.held_up_by.items()) or "nobody"
        reason = f" ({state.last_reason})" if state.last_reason else ""
        seconds = f" in {state.last_seconds:.2f} s" if state.last_seconds is not None else ""
        lines.append(f"  last round {state.last_round}: {state.last_status}{reason}{seconds}; held up by {held}")
    estimate = state.estimate
    if estimate is None:
        lines.append("  estimate: no federated evaluation yet")
    else:
        lines.append(f"  estimate: {estimate.text()}")
    width = max([4, *(len(name) for name in state.sites)])
    lines.append(f"  {'site':<{width}}  connected  contributed  dropped  epsilon shared  last round")
    for name, site in state.sites.items():
        lines.append(
            f"  {name:<{width}}  {'yes' if site.connected else 'no':<9}  {site.contributions:>11}  {site.dropouts:>7}  "
            f"{_epsilon(site.epsilon):>14}  {CELLS.get(site.last, ('', site.last))[1]}"
        )
    for name, why in state.excluded.items():
        lines.append(f"  excluded: {name} ({why})")
    return "\n".join(lines)


def _status_command(args: argparse.Namespace) -> int:
    state = federation_state(args.output_dir)
    if args.json:
        document: dict[str, Any] = state.to_json()
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        print(describe(state))
    return 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair status OUTPUT_DIR [--json]`."""
    parser = subparsers.add_parser(
        "status",
        help="a federation's state on one screen, from its aggregator's output folder",
        description="The federation's state from the aggregator's output folder (events.jsonl, rounds.jsonl, the "
        "checkpoint): rounds applied and aborted, who is connected, who held the last round up, the latest "
        "estimate with its interval, the epsilon each site shared. Works while the aggregator runs and after.",
    )
    parser.add_argument("output_dir", type=Path, metavar="OUTPUT_DIR", help="the aggregator's output folder")
    parser.add_argument("--json", action="store_true", help="print the state as one JSON object")
    parser.set_defaults(handler=_status_command)
