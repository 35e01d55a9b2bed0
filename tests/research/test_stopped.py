"""A study's choices stopped by validation: the step re-chosen at its stopped risk, the ceiling raised at an edge."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from fedfair.core.errors import ConfigError
from fedfair.fairness.references import BASE_RATE, UNIFORM
from fedfair.research import stopped, stopping, tuning
from fedfair.research.paper_splits import paper_split
from fedfair.research.profiles import PROFILES
from fedfair.research.reproduce import read_csv
from fedfair.research.runs import Run
from fedfair.research.study import Study, ladder_point

FIGURES = Path(__file__).resolve().parents[2] / "docs" / "figures"


def adult() -> Study:
    return Study("adult", PROFILES["tuned"], ("fedsrcvar", "term"), split=paper_split("adult"))


def test_the_committed_choices_are_read_as_the_points_the_study_chose() -> None:
    study = adult()
    choices = stopped.committed_choices(read_csv(FIGURES / "tuned_adult_all_rho" / "tuning.csv"), study, 0.1)
    rows = read_csv(FIGURES / "tuned_adult_all_rho" / "fig2_rho.csv")
    table = {row["method"]: row["chosen"] for row in rows if row["rho"] == "0.1"}
    assert choices["fedsrcvar"].describe("fedsrcvar") == table["FedSRCVaR"]
    assert choices["term"].describe("term") == table["TERM"]


def test_each_step_is_judged_by_its_stopped_risk_and_a_stop_at_the_ceiling_raises_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A fake validation curve per step: its lowest point at round 300 / step x 0.01, 0.5 + |log10(step / 0.003)|
    # deep. Step 0.003 is lowest (0.5) but stops at round 1,000, the first ceiling: its run is raised to 2,000.
    def curve(step: float, ceiling: int) -> list[dict[str, Any]]:
        best = 300 * 0.01 / step
        depth = 0.5 + abs(math.log10(step / 0.003))
        return [
            {"round": r, "worst_risk": {"0.1": depth + ((r - best) / 1e4) ** 2}}
            for r in range(stopping.CHECK_EVERY, ceiling + 1, stopping.CHECK_EVERY)
        ]

    trained: list[Run] = []

    def run_all(runs: list[Run], *_: Any, **__: Any) -> dict[Run, dict[str, Any]]:
        trained.extend(runs)
        out = {}
        for run in runs:
            flags = run.flags
            step, rounds = float(flags[flags.index("--lr") + 1]), int(flags[flags.index("--rounds") + 1])
            out[run] = {"checkpoints": curve(step, rounds), "cpu_seconds": 1.0}
        return out

    monkeypatch.setattr(stopped, "run_all", run_all)
    study = adult()
    choices = stopped.committed_choices(read_csv(FIGURES / "tuned_adult_all_rho" / "tuning.csv"), study, 0.1)
    # FedSRCVaR's point is at momentum 0.97, whose effective step is s x 0.075: the fake reads --lr, so a point of
    # momentum 0 is taken, with the committed step 0.01.
    plain = {"fedsrcvar": dataclasses.replace(choices["fedsrcvar"], momentum=0.0)}
    chosen = stopped.choose(study, 0.1, plain, tmp_path, workers=1)["fedsrcvar"]
    assert chosen.point.step == 0.003
    assert chosen.stop == stopping.Stop(1000, 0.5, 2000)  # 300 x 0.01 / 0.003 = 1,000: the ceiling, raised
    assert chosen.search.tried[(0.01,)] == pytest.approx(0.5 + math.log10(0.01 / 0.003))
    assert chosen.search.settled  # 0.001 and 0.01 beside it were tried, both higher
    assert all(run.split == "validation" and run.validation_every == stopping.CHECK_EVERY for run in trained)
    # Every distinct run read once: the 4 steps to 1,000 rounds, 0.003 to 2,000, 0.001 (lowest at 3,000) to 2,000
    # and 4,000, whose stop is then at the ladder's top.
    assert chosen.cpu_seconds == len(set(trained)) == 7
    assert chosen.rounds_trained == 4 * 1000 + 2000 + 2000 + 4000


def test_a_shorter_ceiling_ladder_names_its_top_where_a_stop_reaches_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Validation still falling at round 1,000 on a one-rung ladder: the stop is the ceiling, and says so.
    def run_all(runs: list[Run], *_: Any, **__: Any) -> dict[Run, dict[str, Any]]:
        every = range(stopping.CHECK_EVERY, 1001, stopping.CHECK_EVERY)
        return {
            run: {"checkpoints": [{"round": r, "worst_risk": {"0.1": 1.0 - r / 1e4}} for r in every]} for run in runs
        }

    monkeypatch.setattr(stopped, "run_all", run_all)
    study = adult()
    choices = stopped.committed_choices(read_csv(FIGURES / "tuned_adult_all_rho" / "tuning.csv"), study, 0.1)
    chosen = stopped.choose(study, 0.1, {"term": choices["term"]}, tmp_path, 1, step_runs=0, ceilings=(1000,))
    assert chosen["term"].stop == stopping.Stop(
        1000, 0.9, 1000, ("rounds 1000 is its ladder's end: the curve was still falling there",)
    )


def test_every_main_knob_is_read_from_and_set_on_a_tuned_point() -> None:
    study = Study("adult", PROFILES["tuned"], tuple(stopped.MAIN_KNOB), split=paper_split("adult"))
    for method, knob in stopped.MAIN_KNOB.items():
        axes = study.search(method).axes
        point = ladder_point(method, axes, tuple(axis.ladder[1] for axis in axes))
        assert stopped.knob_value(point, knob) == knob.ladder[1], method
        moved = stopped.with_knob(point, knob, knob.ladder[2])
        assert stopped.knob_value(moved, knob) == knob.ladder[2], method
        assert moved.flags(method, 0.1) != point.flags(method, 0.1), method  # the run trains the new value
    with pytest.raises(ConfigError, match="gamma is no knob the stopped search moves"):
        stopped.with_knob(point, tuning.GAMMA, 0.03)


def test_the_knob_is_rechosen_beside_the_step_and_a_point_clearly_worse_early_is_pruned(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Adult's TERM point: step 0.001 under momentum 0.7 (--lr 0.001 x 0.75), tilt 100. A fake validation U-curve
    # bottoming at round 500, depth 0.5 + 0.3 |log10(lr / 0.00075)| + 0.03 |log10(tilt / 300)| / log10(3): tilt 300
    # is lowest (0.5); each step neighbour, a factor 3.33 away in --lr, is 0.157 deeper, more than the margin 0.1;
    # tilt 30 and 300 are within it.
    def curve(lr: float, tilt: float, ceiling: int) -> list[dict[str, Any]]:
        depth = 0.5 + 0.3 * abs(math.log10(lr / 0.00075)) + 0.03 * abs(math.log10(tilt / 300)) / math.log10(3)
        every = range(stopping.CHECK_EVERY, ceiling + 1, stopping.CHECK_EVERY)
        return [{"round": r, "worst_risk": {"0.1": depth + ((r - 500) / 1e4) ** 2}} for r in every]

    trained: list[Run] = []

    def run_all(runs: list[Run], *_: Any, **__: Any) -> dict[Run, dict[str, Any]]:
        trained.extend(runs)

        def flag(run: Run, name: str) -> float:
            return float(run.flags[run.flags.index(name) + 1])

        return {
            run: {
                "checkpoints": curve(flag(run, "--lr"), flag(run, "--tilt"), int(flag(run, "--rounds"))),
                "cpu_seconds": 1.0,
            }
            for run in runs
        }

    monkeypatch.setattr(stopped, "run_all", run_all)
    study = adult()
    choices = stopped.committed_choices(read_csv(FIGURES / "tuned_adult_all_rho" / "tuning.csv"), study, 0.1)
    assert (choices["term"].step, choices["term"].setting, choices["term"].momentum) == (0.001, 100.0, 0.7)
    chosen = stopped.choose(
        study, 0.1, {"term": choices["term"]}, tmp_path, 1, step_runs=2, ceilings=(1000,), knob_runs=2, prune_at=250
    )["term"]
    assert [axis.name for axis in chosen.search.axes] == ["step", "tilt"]
    assert (chosen.point.step, chosen.point.setting) == (0.001, 300.0)
    assert chosen.stop == stopping.Stop(500, pytest.approx(0.5), 1000)
    # Both step neighbours were dropped at round 250, their risk there their lowest so far (round 250's).
    assert chosen.pruned == {(0.0003, 100.0): 250, (0.003, 100.0): 250}
    step_penalty = 0.3 * math.log10(0.001 / 0.0003)
    tilt_100 = 0.03 * math.log10(3) / math.log10(3)
    assert chosen.search.tried[(0.0003, 100.0)] == pytest.approx(0.5 + step_penalty + tilt_100 + (250 / 1e4) ** 2)
    assert chosen.search.tried[(0.001, 30.0)] == pytest.approx(0.5 + 0.03 / math.log10(3))
    # Tilt 1,000 beside the new choice is untried: the 4 extension runs went to the first point's 4 neighbours.
    assert "unsettled: its 4 extension runs were spent" in chosen.search.limits()
    # The start and the two tilts each trained to 1,000 rounds, the four new points first to 250 (each run read again
    # from the cache is not trained twice).
    assert sorted(int(run.flags[run.flags.index("--rounds") + 1]) for run in set(trained)) == [250] * 4 + [1000] * 3
    assert chosen.rounds_trained == 4 * 250 + 3 * 1000 and chosen.cpu_seconds == 7


def test_a_method_not_rechosen_is_stopped_at_its_chosen_point_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A flat validation curve: every point tried reads the same, so only the budgets decide what is tried.
    def run_all(runs: list[Run], *_: Any, **__: Any) -> dict[Run, dict[str, Any]]:
        every = range(stopping.CHECK_EVERY, 1001, stopping.CHECK_EVERY)
        return {run: {"checkpoints": [{"round": r, "worst_risk": {"0.1": 0.7}} for r in every]} for run in runs}

    monkeypatch.setattr(stopped, "run_all", run_all)
    study = adult()
    choices = stopped.committed_choices(read_csv(FIGURES / "tuned_adult_all_rho" / "tuning.csv"), study, 0.1)
    chosen = stopped.choose(
        study, 0.1, choices, tmp_path, 1, step_runs=2, ceilings=(1000,), knob_runs=2, rechosen=("term",)
    )
    assert len(chosen["term"].search.tried) == 5  # its start and the 4 neighbours, step and tilt
    assert list(chosen["fedsrcvar"].search.tried) == [(choices["fedsrcvar"].step,)]
    assert chosen["fedsrcvar"].point == choices["fedsrcvar"]


def test_the_committed_stopped_choices_are_read_back_as_the_points_tested() -> None:
    # Every method of the Adult table, its point rebuilt from its tuned start and the point tried that the row names.
    methods = ("fedsrcvar", "fedavg", "fedavgm", "propfair", "term", "deltafl")
    study = Study("adult", PROFILES["tuned"], methods, split=paper_split("adult"))
    folder = FIGURES / "tuned_adult_all_rho"
    stops = stopped.committed_stops(
        read_csv(folder / "stopped_choice.csv"), read_csv(folder / "tuning.csv"), study, 0.1
    )
    assert set(stops) == set(study.methods)
    point, stop, ceiling = stops["fedsrcvar"]
    assert (point.step, point.epsilon, stop, ceiling) == (0.003, 0.0, 1220, 2000)
    assert (stops["term"][0].step, stops["term"][0].setting) == (0.0003, 300.0)
    # A row naming a point its search never tried is refused, naming the method.
    rows = [row | {"chosen": "step 7"} for row in read_csv(folder / "stopped_choice.csv")]
    with pytest.raises(ConfigError, match="no point FedSRCVaR tried is its choice 'step 7'"):
        stopped.committed_stops(rows, read_csv(folder / "tuning.csv"), study, 0.1)


def test_a_stopped_choices_table_from_before_the_knob_search_is_read_back_as_its_tuned_points() -> None:
    # MNIST's 200-round-points table searched no knob and tried its chosen step alone (``steps_tried``): each
    # method is its tuned point, stopped at the row's round, the test runs of `--retest --tables` train again.
    methods = ("fedsrcvar", "fedavg", "fedavgm", "propfair", "term", "deltafl")
    study = Study("mnist", PROFILES["tuned"], methods, split=paper_split("mnist"))
    folder = FIGURES / "tuned_mnist_all_rho"
    rows = read_csv(folder / "stopped_choice_at_200_round_points.csv")
    assert "axes" not in rows[0] and "steps_tried" in rows[0]
    stops = stopped.committed_stops(rows, read_csv(folder / "tuning.csv"), study, 0.1)
    tuned = stopped.committed_choices(read_csv(folder / "tuning.csv"), study, 0.1)
    assert {method: (point, ceiling) for method, (point, _, ceiling) in stops.items()} == {
        method: (tuned[method], 1000) for method in methods
    }
    assert {method: stop for method, (_, stop, _) in stops.items()} == {
        "fedsrcvar": 420,
        "fedavg": 1000,
        "fedavgm": 780,
        "propfair": 480,
        "term": 900,
        "deltafl": 470,
    }
    # A step the row never tried is refused as in the current table.
    moved = [row | {"steps_tried": "0.3:0.7"} if row["method"] == "FedSRCVaR" else row for row in rows]
    with pytest.raises(ConfigError, match="no point FedSRCVaR tried is its choice"):
        stopped.committed_stops(moved, read_csv(folder / "tuning.csv"), study, 0.1)


def test_the_constants_rows_are_those_of_the_test_rows_every_run_is_judged_on() -> None:
    every = stopped.reference_rows(adult())
    assert sorted({row["rho"] for row in every}) == [0.1, 0.3, 0.5, 0.7]  # each rho the study judges
    rows = {row["predictor"]: row for row in every if row["rho"] == 0.1}
    assert rows[UNIFORM]["held_out_worst_risk"] == pytest.approx(math.log(2.0), abs=1e-12)
    # Adult's 16,281 test rows, 23.6% above 50K: the base rate's worst tenth is all of them, each -ln 0.24 or so.
    base = rows[BASE_RATE]
    assert base["held_out_rows"] == 16281 and base["held_out_accuracy"] == pytest.approx(0.7638, abs=1e-4)
    assert base["held_out_worst_error"] == 1.0 and base["held_out_worst_risk"] == pytest.approx(1.42, abs=0.01)


@pytest.mark.study  # about 20 CPU-seconds: `make test-studies`
def test_a_committed_stopped_choice_trained_again_reads_its_committed_figures(tmp_path: Path) -> None:
    # FedAvg's two Adult test runs, the cheapest of the table: the worst risk to the last digit, and the figures
    # the table now carries beside it.
    study = Study("adult", PROFILES["tuned"], ("fedavg",), split=paper_split("adult"))
    folder = FIGURES / "tuned_adult_all_rho"
    stops = stopped.committed_stops(
        read_csv(folder / "stopped_choice.csv"), read_csv(folder / "tuning.csv"), study, 0.1
    )
    again, gaps = stopped.retested_rows(study, 0.1, stops, tmp_path, 1)
    assert gaps == []  # FedSRCVaR, every gap's reference, not retested
    committed = [row for row in read_csv(folder / "stopped.csv") if row["method"] == "FedAvg"]
    assert [row["seed"] for row in again] == [0, 1] and len(committed) == 2
    for fresh, row in zip(again, committed, strict=True):
        for figure in stopped.HELD_OUT_COLUMNS:
            assert fresh[f"held_out_{figure}"] == pytest.approx(float(row[f"held_out_{figure}"]), abs=1e-6), figure


def test_the_committed_epsilon_probe_reads_the_stopped_tables_runs_at_its_chosen_point() -> None:
    # benchmarks/epsilon_at_stop.py trains the stopped study's own runs: at the point the MNIST study chose (step 0.1,
    # epsilon 0.5) its stop and held-out figures are stopped.csv's FedSRCVaR rows, on one machine, to every digit.
    folder = FIGURES / "tuned_mnist_all_rho"
    chosen = next(row for row in read_csv(folder / "stopped_choice.csv") if row["method"] == "FedSRCVaR")
    probe = [row for row in read_csv(folder / "epsilon_at_stop.csv") if row["point"] == chosen["chosen"]]
    validation = [row for row in probe if row["split"] == "validation"]
    assert len(validation) == 1 and validation[0]["stop_round"] == chosen["stop_round"]
    assert float(validation[0]["validation_worst_risk"]) == float(chosen["validation_worst_risk"])
    table = {row["seed"]: row for row in read_csv(folder / "stopped.csv") if row["method"] == "FedSRCVaR"}
    tested = [row for row in probe if row["split"] == "test"]
    assert sorted(row["seed"] for row in tested) == sorted(table)
    for row in tested:
        for figure in stopped.HELD_OUT_COLUMNS:
            assert float(row[f"held_out_{figure}"]) == float(table[row["seed"]][f"held_out_{figure}"]), figure
