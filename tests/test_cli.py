"""The `fedfair` command: every command in its table is the one its module registers, and a command
line imports only the module of the command it names, so light commands start at once."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys

from fedfair import cli


def registered(module: str) -> set[str]:
    parser = cli.build_parser((module,))
    (subparsers,) = (action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return set(subparsers.choices)


def test_the_command_table_names_exactly_what_each_module_registers() -> None:
    for module in cli.COMMAND_MODULES:
        assert registered(module) == {name for name, owner in cli.COMMANDS.items() if owner == module}, module


def test_a_command_line_needs_only_its_commands_module_and_help_alone_needs_all() -> None:
    assert cli.modules_for(["pki", "init", "--dir", "ca"]) == ("fedfair.pki.commands",)
    assert cli.modules_for(["--help"]) == cli.COMMAND_MODULES
    assert cli.modules_for(["no-such-command"]) == cli.COMMAND_MODULES


def loaded_after_help(commands: list[list[str]], modules: tuple[str, ...]) -> list[str]:
    """Which of `modules` a fresh interpreter has imported once it has printed each command's --help."""
    probe = (
        "import sys\n"
        "from fedfair.cli import main\n"
        f"for command in {commands!r}:\n"
        "    try:\n"
        "        main(command)\n"
        "    except SystemExit as stop:\n"
        "        assert stop.code == 0, stop.code\n"
        f"print(sorted(name for name in {modules!r} if name in sys.modules))\n"
    )
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    return list(ast.literal_eval(completed.stdout.strip().splitlines()[-1]))


def test_pki_and_plan_commands_start_without_loading_pytorch_or_opacus() -> None:
    assert loaded_after_help([["pki", "--help"], ["plan", "--help"]], ("torch", "opacus", "matplotlib")) == []


def test_init_starts_without_loading_pytorch_grpc_or_pandas() -> None:
    assert loaded_after_help([["init", "--help"]], ("torch", "grpc", "pandas", "opacus")) == []
