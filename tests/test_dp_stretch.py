"""benchmarks/dp_stretch.py's committed runs hold what docs/paper.md reads off them: each stretch starts from the
point its study chose, its rows are the runs its flags describe, the summary is theirs, every site's accountant
stayed within epsilon 1 at the study's delta, and a run on this tree lands where the committed runs did (a re-run
of the study's training, so marked `study`: `make test-studies`)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fedfair.research import tuning
from fedfair.research.study import Point, Study, ladder_point

ROOT = Path(__file__).resolve().parents[1]
STRETCH = ROOT / "docs" / "figures" / "baselines_dp_stretch"
TABLES = {
    "rand-hie": "baselines_rand_hie_all_rho",
    "adult": "baselines_adult",
    "census-income": "baselines_census",
    "census-income-51": "baselines_census_51",
    "mnist": "baselines_mnist",
}
"""Each stretch's baselines study, whose rho = 0.1 table names FedSRCVaR's chosen point."""

RERUN_TOLERANCE = 1e-8
"""Absolute, on a worst-decile risk near 0.7: the non-private rows re-run the table's test runs with the same flags
and seeds on another commit, which moves them by the summation order alone (Adult's came back within 4e-9)."""

DRAW_STDS = 6.0
"""A fresh DP run lies within this many of the committed runs' standard deviations of their mean. The run's risk
moves with the noise, a sum of many independent Skellam draws; taken as normal (RAND HIE's 20 committed runs span
0.715 to 0.718 at a std of 0.001), a run misses 6 sigma once in 5e8."""


@pytest.fixture(scope="module")
def dp_stretch() -> Iterator[ModuleType]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import dp_stretch

        yield dp_stretch
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def committed() -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(STRETCH.glob("*.json"))]


def fedsrcvar_row(name: str) -> dict[str, str]:
    with open(ROOT / "docs" / "figures" / TABLES[name] / "table_rho0.1.csv", newline="") as handle:
        return next(row for row in csv.DictReader(handle) if row["method"] == "FedSRCVaR" and row["rho"] == "0.1")


def test_every_stretch_starts_from_the_point_its_study_chose_on_validation_rows(dp_stretch: ModuleType) -> None:
    assert set(dp_stretch.CHOSEN) == set(TABLES) == set(dp_stretch.DELTAS)
    for name, point in dp_stretch.CHOSEN.items():
        assert point.describe() == fedsrcvar_row(name)["chosen"], name


def assert_the_runs_of(
    dp_stretch: ModuleType,
    document: dict[str, Any],
    study: Study,
    point: Point,
    chosen: Point | None,
    table_risk: float,
) -> None:
    """`document`'s rows are the test runs of `point` (as it is and at one local step), under DP, and of the point
    `chosen` under DP (None: none), by the flags `study` builds; its summary is theirs; its non-private re-run is
    `table_risk`; every DP run spent epsilon 1 at the study's delta."""
    name, rows = document["dataset"], document["rows"]
    one_step = dataclasses.replace(point, local_steps=1)
    expected = {"non-private": [tuple(run.flags) for run in study.test_runs("fedsrcvar", 0.1, point)]}
    if one_step != point:
        expected["non-private, one local step"] = [
            tuple(run.flags) for run in study.test_runs("fedsrcvar", 0.1, one_step)
        ]
    dp = dp_stretch.dp_flags(name)
    expected["distributed"] = [(*run.flags, *dp) for run in study.test_runs("fedsrcvar", 0.1, one_step)]
    # The same point chosen again under DP adds no rows.
    if chosen is not None and chosen != one_step:
        assert chosen.local_steps == 1
        expected["distributed, chosen under DP"] = [
            (*run.flags, *dp) for run in study.test_runs("fedsrcvar", 0.1, chosen)
        ]
    assert {row["kind"] for row in rows} == set(expected)
    for kind, flags in expected.items():
        assert sorted({tuple(row["flags"]) for row in rows if row["kind"] == kind}) == sorted(flags), kind
    # The summary is computed from these rows, not edited beside them.
    assert json.loads(json.dumps(dp_stretch.summary(rows))) == document["summary"]
    # The non-private re-run is the table's figure.
    assert document["summary"]["non-private"]["worst_risk_mean"] == pytest.approx(table_risk, abs=RERUN_TOLERANCE)
    for row in rows:
        if "distributed" in row["kind"]:
            assert row["delta"] == dp_stretch.DELTAS[name]
            # Calibrated to spend the budget, never more: within 1e-3 of epsilon 1 from below.
            assert 0.999 <= row["epsilon_spent"] <= 1.0, row
            assert row["noise_std"] > 0 and math.isfinite(row["worst_risk"])


@pytest.mark.parametrize("document", committed(), ids=lambda document: document["dataset"])
def test_a_committed_stretch_is_the_runs_its_flags_describe(dp_stretch: ModuleType, document: dict[str, Any]) -> None:
    name = document["dataset"]
    study = dp_stretch.study_of(name)
    # Without --select nothing was chosen under DP.
    described = document.get("chosen_under_dp")
    chosen = next((p for p in study.grid("fedsrcvar", 0.1) if p.describe() == described), None)
    table_risk = float(fedsrcvar_row(name)["worst_risk_mean"])
    assert_the_runs_of(dp_stretch, document, study, dp_stretch.CHOSEN[name], chosen, table_risk)


@pytest.mark.study
def test_a_dp_run_on_this_tree_lands_among_the_committed_runs(dp_stretch: ModuleType) -> None:
    from fedfair.research.experiment import load_federation, simulate
    from fedfair.research.flags import config_from_flags

    document = json.loads((STRETCH / "rand_hie.json").read_text())
    rows = [row for row in document["rows"] if row["kind"] == "distributed" and row["seed"] == 0]
    config = config_from_flags(rows[0]["flags"])
    row = dp_stretch.described(
        rows[0]["flags"], "distributed", simulate(config, load_federation(config), progress=False)
    )
    summary = document["summary"]["distributed"]
    assert abs(row["worst_risk"] - summary["worst_risk_mean"]) <= DRAW_STDS * summary["worst_risk_std"]
    assert 0.999 <= row["epsilon_spent"] <= 1.0
    assert row["noise_std"] == pytest.approx(summary["noise_std"], rel=1e-12)


TUNED_STRETCHES = sorted((ROOT / "benchmarks" / "results").glob("dp_stretch_*.json"))
"""`dp_stretch.py --profile tuned`'s committed runs: the stretch against the tuned studies (issue 64)."""


def tuned_document(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def tuned_fedsrcvar_row(dp_stretch: ModuleType, name: str) -> dict[str, str]:
    """FedSRCVaR's row at rho 0.1 in the tuned study's fig2_rho.csv (every method, every rho)."""
    with open(dp_stretch.tuned_table(name) / "fig2_rho.csv", newline="") as handle:
        return next(row for row in csv.DictReader(handle) if row["method"] == "FedSRCVaR" and row["rho"] == "0.1")


@pytest.mark.parametrize("path", TUNED_STRETCHES, ids=lambda path: path.stem)
def test_a_tuned_stretch_starts_from_the_tuned_studys_choice_and_is_the_runs_its_flags_describe(
    dp_stretch: ModuleType, path: Path
) -> None:
    document = tuned_document(path)
    name = document["dataset"]
    assert document["profile"] == "tuned"
    study = dp_stretch.study_of(name, "tuned")
    point = dp_stretch.tuned_choice(name, study)
    table = tuned_fedsrcvar_row(dp_stretch, name)
    assert point.describe() == table["chosen"] == document["non_private_point"]
    chosen = next(row for row in document["validation"] if row["chosen"])
    axes = tuple(axis for axis in study.search("fedsrcvar").axes if axis is not tuning.LOCAL_STEPS)
    chosen_point = ladder_point("fedsrcvar", axes, tuple(chosen["coordinates"]))
    assert chosen_point.describe() == document["chosen_under_dp"]
    assert_the_runs_of(dp_stretch, document, study, point, chosen_point, float(table["worst_risk_mean"]))
    assert document["baseline"] == dp_stretch.best_baseline(name)


def as_searched(today: tuple[tuning.Axis, ...], ladders: dict[str, str]) -> tuple[tuning.Axis, ...]:
    """Today's axes with the ladder and start the search ran on, as its JSON describes them (`Axis.describe`).

    Ladders are refined by adding rungs only (tuning.WIDEST_GAP), so a search replays on its own ladder, which must be
    today's less rungs added since, from the same start.
    """
    searched = []
    for axis in today:
        ladder_text, start_text = ladders[axis.name].split(" from ")
        ladder, start = (
            tuple(float(value) for value in text.strip("{}").split(", ")) for text in (ladder_text, start_text)
        )
        assert set(ladder) <= set(axis.ladder) and start == axis.start, (axis.name, ladders[axis.name])
        searched.append(dataclasses.replace(axis, ladder=ladder, start=start))
    return tuple(searched)


@pytest.mark.parametrize("path", TUNED_STRETCHES, ids=lambda path: path.stem)
def test_the_choice_under_dp_is_the_tuning_protocols_on_the_committed_validation_runs(
    dp_stretch: ModuleType, path: Path
) -> None:
    """Replaying the edge rule on the committed means tries the committed points in their order and rounds, and
    chooses and marks as the file says: the search ran the protocol, with local steps held at 1."""
    document = tuned_document(path)
    name, validation, search_figures = document["dataset"], document["validation"], document["search"]
    study = dp_stretch.study_of(name, "tuned")
    today = tuple(axis for axis in study.search("fedsrcvar").axes if axis is not tuning.LOCAL_STEPS)
    assert search_figures["axes"] == [axis.name for axis in today]
    axes = as_searched(today, search_figures["ladders"])
    committed = {tuple(row["coordinates"]): row for row in validation}
    for row in validation:
        # The value is the mean of the runs (NaN, a diverged run among them, never equals itself).
        assert len(row["worst_risks"]) == search_figures["repeats"]
        mean = sum(row["worst_risks"]) / len(row["worst_risks"])
        assert row["worst_risk"] == pytest.approx(mean, rel=1e-12) or not math.isfinite(mean)
        point = ladder_point("fedsrcvar", axes, tuple(row["coordinates"]))
        validation_flags = study.validation_run("fedsrcvar", 0.1, point).flags
        assert row["flags"] == [*validation_flags, *dp_stretch.dp_flags(name)]
    search = tuning.Search(axes, tuning.EXTENSION_RUNS)
    tuning.settle([search], lambda asked: [committed[point]["worst_risk"] for _, point in asked])
    assert list(search.tried) == list(committed)
    assert [search.round_of[point] for point in search.tried] == [row["round"] for row in validation]
    assert [row["chosen"] for row in validation] == [point == search.choice() for point in search.tried]
    assert search_figures["limits"] == [*search.limits(), dp_stretch.ONE_STEP_LIMIT]
    assert search_figures["settled"] == search.settled and search_figures["budget"] == search.budget


@pytest.mark.parametrize("name", ["rand-hie", "adult", "census-income", "mnist"])
def test_a_tuned_stretch_would_start_from_its_tuned_tables_choice_at_rho_0_1(dp_stretch: ModuleType, name: str) -> None:
    """Every dataset with a committed tuned study (its rho 0.1 folder, or else the four rhos') gives the stretch the
    FedSRCVaR point that study's table names at rho 0.1, and the best baseline is the lowest of the others there."""
    study = dp_stretch.study_of(name, "tuned")
    table = tuned_fedsrcvar_row(dp_stretch, name)
    assert dp_stretch.tuned_choice(name, study).describe() == table["chosen"]
    with open(dp_stretch.tuned_table(name) / "fig2_rho.csv", newline="") as handle:
        others = [row for row in csv.DictReader(handle) if row["method"] != "FedSRCVaR" and row["rho"] == "0.1"]
    assert dp_stretch.best_baseline(name)["worst_risk_mean"] == min(float(row["worst_risk_mean"]) for row in others)


def test_a_dataset_without_a_tuned_study_is_refused_with_the_command_that_makes_one(
    dp_stretch: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dp_stretch, "FIGURES", tmp_path)
    (tmp_path / "tuned_census_51").mkdir()  # a folder without tuning.csv is no study
    with pytest.raises(dp_stretch.ConfigError, match="fedfair reproduce --profile tuned --dataset census-income-51"):
        dp_stretch.tuned_table("census-income-51")


def validations_lowest_at_step_001_momentum_07(dp_stretch: ModuleType, monkeypatch: pytest.MonkeyPatch) -> list[Point]:
    """Stand in for the DP validation runs with a risk lowest at step 0.01 and momentum 0.7 (the search walks
    there from its start); returns the list the points asked for are appended to."""
    asked: list[Point] = []

    def fake_validation(
        name: str, study: Study, point: Point, repeats: int, method: str = "fedsrcvar"
    ) -> dict[str, Any]:
        asked.append(point)
        risk = abs(math.log10(point.step or 1.0) + 2.0) + abs((point.momentum or 0.0) - 0.7)
        return {"point": point.describe(method), "flags": [], "worst_risks": [risk] * repeats}

    monkeypatch.setattr(dp_stretch, "dp_validation", fake_validation)
    return asked


@pytest.mark.parametrize("baseline", ["fedavg", "fedavgm"])
def test_a_nested_baseline_under_dp_is_searched_at_fedsrcvars_limit_on_its_own_axes(
    dp_stretch: ModuleType, baseline: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FedAvg and FedAvgM under the same DP are FedSRCVaR's runs at epsilon 1 (FedAvg also at momentum 0): the
    search moves only the axes the baseline has, and every run it asks for carries those limit values."""
    asked = validations_lowest_at_step_001_momentum_07(dp_stretch, monkeypatch)
    study = dp_stretch.study_of("adult", "tuned")
    chosen, how = dp_stretch.baseline_under_dp("adult", study, 2, baseline)
    assert all(point.epsilon == 1.0 and point.local_steps == 1 for point in asked)
    if baseline == "fedavg":
        assert {point.momentum for point in asked} == {0.0} and how["search"]["axes"] == ["step"]
        assert (chosen.step, chosen.momentum) == (0.01, 0.0)
    else:
        assert how["search"]["axes"] == ["step", "server momentum"]
        assert (chosen.step, chosen.momentum) == (0.01, 0.7)
    assert dp_stretch.ONE_STEP_LIMIT in how["search"]["limits"]
    assert sum(row["chosen"] for row in how["validation"]) == 1


def test_a_baseline_search_cut_to_fewer_extension_runs_states_the_cut(
    dp_stretch: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--extension-runs 1`: FedAvgM's starting grid (3 steps x 2 momenta) and one extension point, no more, and the
    document says so: its extension runs, its budget, unsettled, and why in its limits."""
    asked = validations_lowest_at_step_001_momentum_07(dp_stretch, monkeypatch)
    study = dp_stretch.study_of("adult", "tuned")
    _, how = dp_stretch.baseline_under_dp("adult", study, 1, "fedavgm", extension_runs=1)
    assert len(asked) == 6 + 1 == len(how["validation"])
    search = how["search"]
    assert (search["extension_runs"], search["budget"], search["settled"]) == (1, 7, False)
    assert "unsettled: its 1 extension runs were spent" in search["limits"]


def test_term_under_dp_is_searched_on_its_own_axes_at_one_local_step(
    dp_stretch: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TERM under the same DP is its own run (`fedfair.research.term_dp`): the search moves its step, momentum and
    tilt from their starting grid (3 x 2 x 2), never its local steps, and asks for TERM's flags."""
    asked = validations_lowest_at_step_001_momentum_07(dp_stretch, monkeypatch)
    study = dp_stretch.study_of("adult", "tuned")
    chosen, how = dp_stretch.baseline_under_dp("adult", study, 1, "term", extension_runs=2)
    assert how["search"]["axes"] == ["step", "server momentum", "tilt"] and how["search"]["fixed"] == {}
    assert len(asked) == 12 + 2 and all(point.local_steps == 1 and point.epsilon is None for point in asked)
    assert {point.setting for point in asked[:12]} == {1.0, 100.0}
    assert chosen.step == 0.01 and chosen.momentum in (0.7, 0.9)  # the fake risk's low corner, as far as it got
    plan = dp_stretch.baseline_search(study, "term")
    flags = study.validation_run(plan.method, 0.1, chosen).flags
    assert ("--method", "term") == flags[flags.index("--method") : flags.index("--method") + 2]
