"""`fedfair reproduce --study drift` on a tiny profile: the budgets, the runs, the tables and figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfair.cli import main as cli_main
from fedfair.research.drift import DriftProfile, DriftStudy, drift_study
from fedfair.research.flags import config_from_flags
from fedfair.research.reproduce import read_csv

TINY = DriftProfile("tiny", rounds=3, seeds=2, rhos=(0.3,), taus=(1, 2), model="logreg")


def test_equal_steps_give_every_tau_the_same_number_of_local_steps() -> None:
    profile = DriftProfile("p", rounds=100, seeds=1, rhos=(0.1,), taus=(1, 5, 10), model="mlp")
    assert [profile.rounds_for(tau, "steps") * tau for tau in profile.taus] == [1000, 1000, 1000]
    assert [profile.rounds_for(tau, "rounds") for tau in profile.taus] == [100, 100, 100]


def test_runs_are_fedsrcvar_at_algorithm_1s_bound_with_the_split_and_the_correction_asked_for() -> None:
    study = DriftStudy("adult", TINY, ("--partition", "dirichlet", "--alpha", "0.1", "--clients", "4"))
    corrected = study.runs(0.3, 2, "scaffold", "steps")
    assert [run.flags[-1] for run in corrected] == ["0", "1"]  # one run per seed
    config = config_from_flags(corrected[0].flags)
    assert config.method == "fedsrcvar" and config.partition == "dirichlet" and config.alpha == 0.1
    assert config.clients == 4 and config.training.rounds == 3 and config.training.local.local_steps == 2
    assert config.objective.bound == 1.0
    assert config.training.local.drift_correction == "scaffold"
    plain = config_from_flags(study.runs(0.3, 2, "none", "steps")[0].flags)
    assert plain.training.local.drift_correction == "none"
    assert study.runs(0.3, 1, "scaffold", "steps") == study.runs(0.3, 1, "none", "steps")  # nothing to correct


@pytest.mark.slow
def test_the_study_writes_a_table_and_a_figure_per_budget(tmp_path: Path) -> None:
    written = drift_study("adult", tmp_path, TINY, workers=1)
    for budget in ("rounds", "steps"):
        assert written[f"{budget}_png"].stat().st_size > 0
        rows = read_csv(written[budget])
        assert {(row["tau"], row["correction"]) for row in rows} == {
            (str(tau), correction) for tau in TINY.taus for correction in ("none", "scaffold")
        }
        rounds = {row["tau"]: int(row["rounds"]) for row in rows}
        assert rounds == ({"1": 3, "2": 3} if budget == "rounds" else {"1": 6, "2": 3})
        assert all(float(row["seeds"]) == TINY.seeds for row in rows)
    # The correction changes training once a round has more than one local step.
    rows = read_csv(written["rounds"])
    worst = {(row["tau"], row["correction"]): row["worst_risk_mean"] for row in rows}
    assert worst[("2", "scaffold")] != worst[("2", "none")]


def test_the_command_keeps_the_dirichlet_flag_to_the_drift_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["reproduce", "--out", str(tmp_path), "--partition", "dirichlet", "--alpha", "0.1"]) == 2
    assert "--study drift" in capsys.readouterr().err
    assert cli_main(["reproduce", "--study", "drift", "--out", str(tmp_path), "--loss-rows", "10"]) == 2
    assert "does not run" in capsys.readouterr().err
    # figure1 is a profile of the paper study only: named, not a KeyError's traceback.
    assert cli_main(["reproduce", "--study", "drift", "--profile", "figure1", "--out", str(tmp_path)]) == 2
    assert "the drift study has no profile 'figure1'" in capsys.readouterr().err
