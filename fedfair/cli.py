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

COMMANDS: dict[str, str] = {
    "simulate": "fedfair.research.flags",
    "reference": "fedfair.research.flags",
    "sweep": "fedfair.research.sweep",
    "reproduce": "fedfair.research.commands",
    "data": "fedfair.datasets.commands",
    "secagg-demo": "fedfair.secagg.demo",
    "privacy": "fedfair.privacy.commands",
    "pki": "fedfair.pki.commands",
    "aggregator": "fedfair.runtime.aggregator.commands",
    "collaborator": "fedfair.runtime.collaborator.commands",
    "plan": "fedfair.runtime.plan_commands",
    "launch": "fedfair.research.launch",
    "predict": "fedfair.bundle.commands",
    "evaluate": "fedfair.bundle.commands",
    "report": "fedfair.runtime.report",
    "init": "fedfair.runtime.scaffold",
}
"""Each command and the module that registers it. A command line naming one imports only that
module (PyTorch and Opacus are not loaded for `fedfair pki`, say); `--help` alone imports them all."""

COMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(COMMANDS.values()))


def installed_version() -> str:
    """The installed distribution's version (what pip installed), or the source's when run uninstalled."""
    try:
        return metadata.version("fedfair")
    except metadata.PackageNotFoundError:
        return f"{fedfair.__version__} (not installed: run from a source tree)"


def build_parser(modules: Sequence[str] = COMMAND_MODULES) -> argparse.ArgumentParser:
    """The `fedfair` parser with the commands of `modules` (by default every command)."""
    parser = argparse.ArgumentParser(
        prog="fedfair",
        description="Federated learning that protects every large enough subgroup (RCVaR).",
    )
    parser.add_argument("--version", action="version", version=f"fedfair {installed_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in modules:
        importlib.import_module(module_name).register_commands(subparsers)
    return parser


def modules_for(argv: Sequence[str]) -> Sequence[str]:
    """The command modules a command line needs: the one of the command it names, else every one."""
    command = next((word for word in argv if not word.startswith("-")), None)
    return (COMMANDS[command],) if command in COMMANDS else COMMAND_MODULES


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(modules_for(words))
    args = parser.parse_args(words)
    try:
        return int(args.handler(args) or 0)
    except FedfairError as error:
        print(f"fedfair: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
