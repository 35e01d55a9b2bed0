"""The `fedfair` command: one module per command in this package, assembled here.

Each command module exposes ``register_commands(subparsers)``, which adds its command and sets
``handler(args) -> int`` on it; the handler is a thin wrapper over the library function that does
the work, imported when the command runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from importlib import metadata

import fedfair
from fedfair.core.errors import DISK_FULL, FedfairError

COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("fedfair.cli.simulate", "run a federation in process and report fairness"),
    "reference": ("fedfair.cli.reference", "the centralized optimum the federation must reach"),
    "sweep": ("fedfair.cli.sweep", "run an epsilon x rho grid to CSV"),
    "reproduce": ("fedfair.cli.reproduce", "the paper's study on one dataset: CSV tables and PNG figures"),
    "data": ("fedfair.cli.data", "list and fetch the built-in datasets; draft and check a federation schema"),
    "secagg-demo": (
        "fedfair.cli.secagg_demo",
        "run one secure-aggregation round in-process and show what the server sees",
    ),
    "privacy": ("fedfair.cli.privacy", "DP-SGD accounting: epsilon of a run, noise for a target epsilon"),
    "pki": ("fedfair.cli.pki", "certificates: a CA per federation, one certificate per participant"),
    "aggregator": ("fedfair.cli.aggregator", "run the federation's aggregator"),
    "collaborator": ("fedfair.cli.collaborator", "take part in a federation as one institution"),
    "auditor": ("fedfair.cli.auditor", "verify every site's input bound as the plan's auditor institution"),
    "plan": ("fedfair.cli.plan", "pin the agreed plan in the manifest; compare two plans"),
    "launch": (
        "fedfair.cli.launch",
        "run a whole local federation as separate processes over mutual TLS (a deployment rehearsal)",
    ),
    "predict": ("fedfair.cli.predict", "predict each row of a table with a model bundle"),
    "evaluate": (
        "fedfair.cli.evaluate",
        "group risks of a model bundle on a labelled table: worst rho-fraction, mean, disparity",
    ),
    "report": ("fedfair.cli.report", "draw an aggregator's run as one self-contained HTML page"),
    "status": ("fedfair.cli.status", "a federation's state on one screen, from its aggregator's output folder"),
    "stop": ("fedfair.cli.stop", "stop a running aggregator, from its output folder, as Ctrl-C at its console would"),
    "logs": (
        "fedfair.cli.logs",
        "filter or follow a party's structured log (events.jsonl, or a NAME.log), as text or JSON",
    ),
    "init": (
        "fedfair.cli.init",
        "write a federation folder: the plan, one collaborator config per site, the next commands",
    ),
}
"""Each command: the module that registers it, and its one line for ``fedfair --help``. A command
line naming a command imports only that command's module; ``fedfair --help`` imports none of them
(each module's own ``help=`` must read the same: tests/test_cli.py compares them). Each command
module keeps its heavy imports (torch, Opacus, gRPC, pandas) inside its handlers, so a command's
``--help`` starts at once too."""

EXIT_CLOSED_PIPE = 141
"""The status when the reader of the output closed its pipe first (128 + SIGPIPE, as a shell tool gives)."""

DISTRIBUTION = "fedfair-rcvar"
"""The name pip installs fedfair under (``pip install fedfair-rcvar``); the import and command are ``fedfair``."""

COMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(module for module, _ in COMMANDS.values()))


def installed_version() -> str:
    """The installed distribution's version (what pip installed), or the source's when run uninstalled."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return f"{fedfair.__version__} (not installed: run from a source tree)"


def build_parser(modules: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The `fedfair` parser: the commands of `modules` in full, every other command by its help line only."""
    parser = argparse.ArgumentParser(
        prog="fedfair",
        description="Federated learning that protects every large enough subgroup (RCVaR).",
    )
    parser.add_argument("--version", action="version", version=f"fedfair {installed_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in modules:
        importlib.import_module(module_name).register_commands(subparsers)
    for command, (module_name, help_line) in COMMANDS.items():
        if module_name not in modules:
            subparsers.add_parser(command, help=help_line)
    return parser


def modules_for(argv: Sequence[str]) -> Sequence[str]:
    """The command module a command line needs: the one of the command it names, else none."""
    command = next((word for word in argv if not word.startswith("-")), None)
    return (COMMANDS[command][0],) if command in COMMANDS else ()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `fedfair` command line `argv` (default: sys.argv[1:]); return the exit status.

    A :class:`FedfairError` is printed as one ``fedfair: error:`` line on stderr and gives status 2, and so is
    a full disk (`disk_full`); argparse exits with status 2 itself on a bad command line. Output into a pipe its
    reader closed ends quietly with :data:`EXIT_CLOSED_PIPE`.
    """
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(modules_for(words))
    args = parser.parse_args(words)
    # Before any command loads gRPC, in every process: the launch parent, the processes it starts (they inherit
    # the variable) and commands that never configure logging; gRPC's own lines would otherwise reach the console.
    from fedfair.runtime.observe.logs import quiet_grpc

    quiet_grpc()
    try:
        status = int(args.handler(args) or 0)
        sys.stdout.flush()  # here, not at exit: a reader that closed the pipe is met below, not in a traceback
        return status
    except BrokenPipeError:
        # `fedfair status DIR | head`: the reader has what it wanted. Python's own recipe: point stdout at
        # /dev/null so that the interpreter's last flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_PIPE
    except FedfairError as error:
        print(f"fedfair: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        if error.errno not in DISK_FULL:
            raise
        print(f"fedfair: error: {disk_full(error)}", file=sys.stderr)
        return 2


def disk_full(error: OSError) -> str:
    """What a full disk stopped, and the fix, for a write that failed with ENOSPC or EDQUOT.

    Every file fedfair keeps between runs (the privacy ledger, checkpoints, the round log, bundles) is
    written to a temporary file and renamed over the old one, so a failed write leaves the old one whole.
    """
    where = f" writing {error.filename}" if error.filename else ""
    return (
        f"the disk is full{where} ({error.strerror or 'no space left on device'}); free space there, then run "
        "the same command again: files written before are intact (each is replaced whole or not at all)"
    )
