"""``fedfair secagg-demo``: one secure-aggregation round in process (:mod:`fedfair.secagg.demo`)."""

from __future__ import annotations

import argparse

from fedfair.secagg.demo import add_arguments, handle


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair secagg-demo`, with the options of ``examples/secagg_demo.py``."""
    parser = subparsers.add_parser(
        "secagg-demo",
        help="run one secure-aggregation round in-process and show what the server sees",
        description="Run one secure-aggregation round in this process, with dropouts, and show what the server sees.",
    )
    add_arguments(parser)
    parser.set_defaults(handler=handle)
