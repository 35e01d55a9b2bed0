"""The `fedfair sweep` command: one CSV row per grid point, and grids it refuses."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import pytest

from fedfair.core.errors import ConfigError
from fedfair.research.sweep import parse_grid, register_commands

FAST = ["--rounds", "20", "--dataset", "adult", "--partition", "race", "--clients", "3"]


def _run_sweep(argv: list[str]) -> int:
    """`fedfair sweep ARGV` through the command this module registers."""
    parser = argparse.ArgumentParser(prog="fedfair")
    register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["sweep", *argv])
    code: int = args.handler(args)
    return code


def test_sweep_writes_one_row_per_grid_point(tmp_path: Path) -> None:
    out = tmp_path / "grid.csv"
    assert _run_sweep([*FAST, "--epsilons", "0.1,1", "--rhos", "0.2,0.5", "--jobs", "1", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert {(row["epsilon"], row["rho"]) for row in rows} == {("0.1", "0.2"), ("0.1", "0.5"), ("1.0", "0.2"), ("1.0", "0.5")}


def test_grid_flags_are_comma_separated_numbers() -> None:
    assert parse_grid("0.1, 0.5,,1", "epsilons") == (0.1, 0.5, 1.0)
    with pytest.raises(ConfigError, match="--rhos must be comma-separated numbers, got '0.1;0.2'"):
        parse_grid("0.1;0.2", "rhos")
