"""The `fedfair` command: every command in its table is the one its module registers, and a command
line imports only the module of the command it names, so `--help` answers at once.

The start-up test runs `fedfair --help` and every command's and sub-command's `--help` in a fresh
interpreter each and asserts that none of them imported PyTorch, Opacus, gRPC or pandas; it
prints each one's wall time (`pytest -s` shows them; the target is 0.5 s).
"""

from __future__ import annotations

import argparse
import ast
import itertools
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedfair import cli

HEAVY = ("torch", "opacus", "grpc", "pandas")


def subparsers_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def registered(module: str) -> dict[str, argparse.ArgumentParser]:
    """The commands `module` registers (the parser stubs every other command by its help line)."""
    parser = cli.build_parser((module,))
    return {name: sub for name, sub in subparsers_of(parser).items() if cli.COMMANDS[name][0] == module}


def test_the_command_table_names_exactly_what_each_module_registers_with_the_same_help() -> None:
    for module in cli.COMMAND_MODULES:
        parser = cli.build_parser((module,))
        (action,) = (action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
        helps = {choice.dest: choice.help for choice in action._choices_actions}
        owned = {name for name, (owner, _) in cli.COMMANDS.items() if owner == module}
        assert owned <= set(helps), module
        for name in owned:
            assert helps[name] == cli.COMMANDS[name][1], name


def test_a_command_line_needs_only_its_commands_module_and_help_alone_needs_none() -> None:
    assert cli.modules_for(["pki", "init", "--dir", "ca"]) == ("fedfair.cli.pki",)
    assert cli.modules_for(["--help"]) == ()
    assert cli.modules_for(["no-such-command"]) == ()


def help_lines() -> list[list[str]]:
    """`--help` of fedfair, of each command and of each sub-command (two levels deep)."""
    lines = [["--help"]]
    for name, (module, _) in cli.COMMANDS.items():
        lines.append([name, "--help"])
        for sub, parser in subparsers_of(registered(module)[name]).items():
            lines.append([name, sub, "--help"])
            lines += [[name, sub, deeper, "--help"] for deeper in subparsers_of(parser)]
    return lines


PROBE = (
    "import sys\n"
    "from fedfair.cli import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "except SystemExit as stop:\n"
    "    assert stop.code == 0, stop.code\n"
    f"print(sorted(name for name in {HEAVY!r} if name in sys.modules))\n"
)


def test_every_help_starts_without_pytorch_opacus_grpc_or_pandas() -> None:
    timings = []
    for words in help_lines():
        started = time.perf_counter()
        completed = subprocess.run(
            [sys.executable, "-c", PROBE, *words], capture_output=True, text=True, check=True, timeout=60
        )
        timings.append((time.perf_counter() - started, " ".join(words)))
        loaded = ast.literal_eval(completed.stdout.strip().splitlines()[-1])
        assert loaded == [], f"fedfair {' '.join(words)} imported {loaded}"
    for seconds, line in sorted(timings, reverse=True):
        print(f"{seconds:6.3f} s  fedfair {line}")


WALK = Path(__file__).resolve().parents[1] / "docs" / "first-federation.md"
LOOP = re.compile(r"for (\w+) in ([^;]+); do (.+?);? done")


def walk_commands() -> list[list[str]]:
    """The `fedfair` command lines of docs/first-federation.md's `$` lines, as words after `fedfair`: a loop's
    body once per value, redirections and `&` left out."""
    found = []
    for line in WALK.read_text().splitlines():
        if not line.startswith("    $ "):
            continue
        text = line[len("    $ ") :]
        loop = LOOP.fullmatch(text)
        bodies = (
            [loop.group(3).replace(f"${loop.group(1)}", value) for value in loop.group(2).split()] if loop else [text]
        )
        for body in bodies:
            for part in body.split(";"):
                words = shlex.split(part, comments=True)
                if words and words[0] == "fedfair":
                    found.append(list(itertools.takewhile(lambda word: word not in (">", "&", "2>&1"), words[1:])))
    return found


def test_every_fedfair_line_of_the_first_federation_walk_is_one_the_cli_accepts() -> None:
    """The walk runs as written (it was re-walked from a fresh clone); this keeps its command lines from
    drifting away from the CLI between walks: every one must parse, and every step of a federation is there."""
    lines = walk_commands()
    steps = {" ".join(words[:2]) for words in lines}
    assert {"init fed", "data check", "pki init", "pki request", "pki sign", "pki manifest", "plan pin"} <= steps
    assert {"aggregator start", "collaborator start", "plan renew"} <= steps
    parser = cli.build_parser(cli.COMMAND_MODULES)
    for words in lines:
        try:
            parser.parse_args(words)
        except SystemExit:
            pytest.fail(f"docs/first-federation.md runs `fedfair {shlex.join(words)}`, which the CLI refuses")


def test_a_full_disk_is_one_named_error_with_status_2_and_the_old_file_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pki issue` on a disk that fills while the new certificate is written: status 2, the file named, no
    traceback, and the folder as it was (every file fedfair keeps is replaced whole or not at all)."""
    import errno
    import os

    from fedfair.core import files

    assert cli.main(["pki", "init", "--dir", str(tmp_path)]) == 0
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    real_fsync = os.fsync

    def full(descriptor: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{descriptor}"):
            real_fsync(descriptor)
            return
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.readlink(f"/proc/self/fd/{descriptor}"))

    monkeypatch.setattr(files.os, "fsync", full)
    status = cli.main(["pki", "issue", "--dir", str(tmp_path), "--role", "collaborator", "--name", "site-a"])
    error = capsys.readouterr().err
    assert status == 2
    assert error.startswith("fedfair: error: the disk is full writing ") and "Traceback" not in error
    assert "run the same command again" in error
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before
