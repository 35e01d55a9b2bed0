"""The `fedfair sweep` command: one CSV row per grid point, and grids it refuses."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import pytest

from fedfair.core.errors import ConfigError
from fedfair.cli.sweep import register_commands
from fedfair.research.sweep import parse_grid

FAST = ["--rounds", "20", "--dataset", "adult", "--partition", "race", "--clients", "3"]


def _run_sweep(argv: list[str]) -> int:
    """`fedfair sweep ARGV` through the command this module registers."""
    parser = argparse.ArgumentParser(prog="fedfair")
    register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["sweep", *argv])
    code: int = args.handler(args)
    return code


@pytest.mark.slow
def test_sweep_writes_one_row_per_grid_point_as_csv_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, as_json = tmp_path / "grid.csv", tmp_path / "grid.json"
    grid = ["--epsilons", "0.1,1", "--rhos", "0.2,0.5", "--jobs", "1", "--out", str(out), "--json", str(as_json)]
    assert _run_sweep([*FAST, *grid]) == 0
    rows = list(csv.DictReader(out.open()))
    assert {(row["epsilon"], row["rho"]) for row in rows} == {
        ("0.1", "0.2"),
        ("0.1", "0.5"),
        ("1.0", "0.2"),
        ("1.0", "0.5"),
    }
    written = json.loads(as_json.read_text())
    assert (written["epsilons"], written["rhos"]) == ([0.1, 1.0], [0.2, 0.5])
    for row, point in zip(rows, written["points"], strict=True):
        assert float(row["worst_risk"]) == pytest.approx(point["worst_risk"])
        assert (point["config"]["objective"]["epsilon"], point["config"]["objective"]["rho"]) == (
            point["epsilon"],
            point["rho"],
        )
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sweep: ")]
    assert progress[-1].startswith("sweep: 4/4 points (100%), done in ")


def test_grid_and_output_flags_have_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _run_sweep(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--epsilons EPSILONS comma-separated trade-offs epsilon to run" in text
    assert "--rhos RHOS comma-separated protected group fractions rho to run" in text
    assert "--out OUT CSV file, one row per grid point (default sweep.csv)" in text


def test_grid_flags_are_comma_separated_numbers() -> None:
    assert parse_grid("0.1, 0.5,,1", "epsilons") == (0.1, 0.5, 1.0)
    with pytest.raises(ConfigError, match="--rhos must be comma-separated numbers, got '0.1;0.2'"):
        parse_grid("0.1;0.2", "rhos")
