"""The `fedfair simulate / reference` commands: results, JSON shape, and bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedfair.cli import main


def test_simulate_and_reference_agree_within_one_percent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's acceptance command pair, with fewer rounds to keep the suite fast."""
    flags = ["--dataset", "adult", "--partition", "race", "--clients", "3", "--model", "logreg", "--epsilon", "0.1"]
    flags += ["--rho", "0.3"]
    assert main(["simulate", *flags, "--rounds", "300", "--json", str(tmp_path / "sim.json")]) == 0
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


def test_piped_simulate_prints_progress_lines_with_an_eta_and_the_epsilon_spent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """stderr is not a terminal under capsys: whole lines, no bar; DP on: epsilon once per collaborator."""
    flags = ["--rounds", "10", "--clients", "2", "--dp-noise-multiplier", "1.0", "--dp-accountant", "rdp"]
    assert main(["simulate", *flags]) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err
    progress = [line for line in captured.err.splitlines() if line.startswith("fedsrcvar: ")]
    assert len(progress) == 10
    assert "ETA 00:" in progress[0] and "done in" in progress[-1]
    spent = [line for line in captured.out.splitlines() if "private rounds" in line]
    assert len(spent) == 2
    assert all(re.search(r"epsilon \d+\.\d{3} at delta 1e-05 after 10 private rounds", line) for line in spent)


def test_reference_does_not_offer_federated_training_flags(capsys: pytest.CaptureFixture[str]) -> None:
    for flags in (["--rounds", "5"], ["--dp-noise-multiplier", "1"], ["--secure-aggregation"], ["--lr", "0.1"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["reference", *flags])
        assert exit_info.value.code == 2
        assert f"unrecognized arguments: {' '.join(flags)}" in capsys.readouterr().err


def test_features_pick_the_columns_of_a_users_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record-id column cannot be one-hot encoded; the error suggests --features, which then works."""
    table = tmp_path / "records.csv"
    lines = ["record,age,site,outcome"]
    lines += [f"r{row},{20 + row % 50},{'ab'[row % 2]},{(row // 2) % 2}" for row in range(120)]
    table.write_text("\n".join(lines) + "\n")
    flags = ["--rounds", "2", "--data", str(table), "--label", "outcome", "--split-by", "site", "--clients", "2"]
    flags += ["--batch-size", "16"]
    assert main(["simulate", *flags]) == 2
    assert "passing --features without it" in capsys.readouterr().err
    assert main(["simulate", *flags, "--features", "age,site", "--json", str(tmp_path / "run.json")]) == 0
    assert json.loads((tmp_path / "run.json").read_text())["config"]["features"] == ["age", "site"]


def test_features_need_a_users_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--rounds", "1", "--features", "age"]) == 2
    assert "--features picks columns of your own table; pass it with --data FILE --label COLUMN" in capsys.readouterr().err
