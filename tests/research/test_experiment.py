"""The `fedfair simulate / reference` commands: results, JSON shape, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedfair.cli import main

FAST = ["--rounds", "300", "--dataset", "adult", "--partition", "race", "--clients", "3"]


def test_simulate_and_reference_agree_within_one_percent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's acceptance command pair, with fewer rounds to keep the suite fast."""
    flags = [*FAST, "--model", "logreg", "--epsilon", "0.1", "--rho", "0.3"]
    assert main(["simulate", *flags, "--json", str(tmp_path / "sim.json")]) == 0
    assert main(["reference", *flags, "--json", str(tmp_path / "ref.json")]) == 0
    simulated = json.loads((tmp_path / "sim.json").read_text())
    optimum = json.loads((tmp_path / "ref.json").read_text())
    for result in (simulated, optimum):
        assert set(result) >= {"config", "final", "history"}
        assert set(result["final"]) >= {"train_objective", "train_objective_smooth", "c", "test"}
        assert set(result["final"]["test"]) >= {
            "mean_risk", "worst_risk", "best_risk", "disparity", "accuracy", "worst_error"
        }
    gap = simulated["final"]["train_objective_smooth"] / optimum["final"]["train_objective_smooth"] - 1.0
    assert 0.0 <= gap <= 0.01
    assert len(simulated["history"]) == 20
    assert "worst_risk" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--rho", "0"], "rho must be in (0, 1]"),
        (["--rho", "1.2"], "rho must be in (0, 1]"),
        (["--epsilon", "-0.5"], "epsilon must be in [0, 1]"),
        (["--epsilon", "2"], "epsilon must be in [0, 1]"),
        (["--gamma", "0"], "gamma must be a positive number"),
        (["--bound", "-1"], "bound must be a positive number"),
        (["--dataset", "nosuch"], "unknown dataset 'nosuch'"),
        (["--partition", "planet"], "planet"),
    ],
)
def test_bad_flags_give_one_line_error_and_exit_2(
    flags: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--rounds", "1", *flags]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("fedfair: error: ") and fragment in error
    assert "\n" not in error


def test_csv_without_label_column_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "records.csv"
    table.write_text("age,site,outcome\n30,a,1\n40,b,0\n50,a,1\n60,b,0\n")
    assert main(["simulate", "--rounds", "1", "--data", str(table), "--label", "target", "--split-by", "site"]) == 2
    error = capsys.readouterr().err
    assert "target" in error and "outcome" in error


def test_user_csv_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An institution's own table: real Adult rows written as CSV, split by a site-like column."""
    from fedfair.datasets import load_dataset

    adult = load_dataset("adult")
    table = tmp_path / "records.csv"
    lines = ["age_std,hours_std,group,label"]
    for row, label, race in zip(adult.x_train[:400], adult.y_train[:400], adult.attributes_train["race"][:400]):
        lines.append(f"{row[0]},{row[1]},{'white' if race == 'White' else 'other'},{label}")
    table.write_text("\n".join(lines) + "\n")
    flags = ["--data", str(table), "--label", "label", "--split-by", "group", "--clients", "2", "--rounds", "30"]
    assert main(["simulate", *flags, "--batch-size", "32"]) == 0
    assert "white" in capsys.readouterr().out
