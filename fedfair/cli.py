"""The `fedfair` command.

Each feature module that offers commands exposes ``register_commands(subparsers)``,
which adds its sub-commands and sets ``handler(args) -> int`` on them. This file
only assembles them, so a command lives beside the code it drives.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib import metadata

import fedfair
from fedfair.core.errors import FedfairError

COMMAND_MODULES: tuple[str, ...] = (
    "fedfair.research.flags",
    "fedfair.research.sweep",
    "fedfair.research.commands",
    "fedfair.datasets.commands",
    "fedfair.secagg.demo",
    "fedfair.privacy.commands",
    "fedfair.pki.commands",
    "fedfair.runtime.aggregator.commands",
    "fedfair.runtime.collaborator.commands",
    "fedfair.runtime.plan_commands",
    "fedfair.research.launch",
    "fedfair.bundle.commands",
)


def installed_version() -> str:
    """The installed distribution's version (what pip installed), or the source's when run uninstalled."""
    try:
        return metadata.version("fedfair")
    except metadata.PackageNotFoundError:
        return f"{fedfair.__version__} (not installed: run from a source tree)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedfair",
        description="Federated learning that protects every large enough subgroup (RCVaR).",
    )
    parser.add_argument("--version", action="version", version=f"fedfair {installed_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register_commands(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except FedfairError as error:
        print(f"fedfair: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
