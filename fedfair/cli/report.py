"""``fedfair report OUTPUT_DIR``: an aggregator's run as one HTML page (:mod:`fedfair.runtime.report`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedfair.runtime.output_folder import REPORT_NAME
from fedfair.runtime.report.page import write_report


def _report_command(args: argparse.Namespace) -> int:
    path = write_report(args.output_dir, args.out)
    print(f"wrote {path}")
    return 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair report OUTPUT_DIR`."""
    parser = subparsers.add_parser(
        "report",
        help="draw an aggregator's run as one self-contained HTML page",
        description="Draw the run in an aggregator's output folder (rounds.jsonl, events.jsonl, the model bundle) "
        "as one HTML page: risks, the worst group's composition, threshold, who took part, DP epsilon, stage "
        "times. No network needed to view it.",
    )
    parser.add_argument("output_dir", type=Path, metavar="OUTPUT_DIR", help="the aggregator's output folder")
    parser.add_argument("--out", type=Path, help=f"where to write the page (default OUTPUT_DIR/{REPORT_NAME})")
    parser.set_defaults(handler=_report_command)
