"""The tuning protocol: the edge rule on synthetic validation surfaces, ladders alike, and the committed tables."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from fedfair.core.errors import ConfigError
from fedfair.fairness.references import BASE_RATE, UNIFORM
from fedfair.research import selection, stopped, stopping, tuning
from fedfair.research.flags import config_from_flags
from fedfair.research.paper_splits import paper_split
from fedfair.research.profiles import PROFILES, TABLE_RHO
from fedfair.research.reproduce import read_csv
from fedfair.research.runs import Run
from fedfair.research.study import METHOD_LABELS, Study
from fedfair.research.tuning import Axis, Coordinates, Search

STEPS = Axis("step", (0.001, 0.01, 0.1, 1.0, 10.0), (0.01, 0.1), below="the floor", above="the cap")
KNOB = Axis("knob", (0.0, 1.0, 2.0, 3.0), (0.0,), below="none of it", above="all of it")


def surface(best: Coordinates) -> Callable[[Coordinates], float]:
    """A separable bowl over (log10 step, knob) with its lowest point at `best`."""
    return lambda point: (math.log10(point[0]) - math.log10(best[0])) ** 2 + (point[1] - best[1]) ** 2


def searched(risk: Callable[[Coordinates], float], extension_runs: int = 24) -> Search:
    search = Search((STEPS, KNOB), extension_runs)
    tuning.settle([search], lambda asked: [risk(point) for _, point in asked])
    return search


def test_a_choice_at_the_edge_of_the_start_extends_the_grid_until_it_is_interior() -> None:
    # The start holds steps 0.01 and 0.1 at knob 0; the bowl's bottom is at step 1, knob 2, off both edges.
    search = searched(surface((1.0, 2.0)))
    assert search.choice() == (1.0, 2.0)
    assert search.settled and search.limits() == []
    # Every ladder neighbour of the choice was tried, so it sits on no edge of what was tried.
    for neighbour in [(0.1, 2.0), (10.0, 2.0), (1.0, 1.0), (1.0, 3.0)]:
        assert neighbour in search.tried
    assert search.rounds >= 2 and search.round_of[(0.01, 0.0)] == 0 and search.round_of[(1.0, 2.0)] > 0
    # Coordinate steps only: far fewer runs than the 20-point lattice.
    assert len(search.tried) < len(STEPS.ladder) * len(KNOB.ladder)


def test_an_interior_start_choice_still_tries_its_ladder_neighbours() -> None:
    search = searched(surface((0.01, 0.0)))
    assert search.choice() == (0.01, 0.0)
    assert (0.001, 0.0) in search.tried and (0.01, 1.0) in search.tried
    # Knob 0 is its ladder's floor: a stated limit, said in the table, not a neighbour to try.
    assert search.limits() == ["knob 0 is its ladder's end (none of it)"]


def test_a_ladder_end_stops_the_extension_and_is_marked() -> None:
    # The bowl's bottom lies below the ladder: the search walks down to its floor and stops there.
    search = searched(lambda point: math.log10(point[0]) + (point[1] - 1.0) ** 2)
    assert search.choice() == (0.001, 1.0)
    assert search.settled
    assert search.limits() == ["step 0.001 is its ladder's end (the floor)"]


def test_a_diverged_neighbour_stops_the_extension_and_is_marked() -> None:
    # Better with every larger step until step 1 diverges: the choice is 0.1, interior to what was tried.
    search = searched(lambda point: math.nan if point[0] >= 1.0 else -math.log10(point[0]) + point[1])
    assert search.choice() == (0.1, 0.0)
    assert math.isnan(search.tried[(1.0, 0.0)])
    assert search.limits() == ["step 1 diverged", "knob 0 is its ladder's end (none of it)"]


def test_the_extension_runs_bound_the_search_and_an_unsettled_choice_says_so() -> None:
    search = searched(surface((10.0, 3.0)), extension_runs=2)
    assert len(search.tried) == search.budget == len(search.start()) + 2
    assert not search.settled
    assert search.limits()[-1] == "unsettled: its 2 extension runs were spent"


def test_a_search_where_every_point_diverged_stops_at_its_start_and_says_so() -> None:
    search = searched(lambda point: math.inf)
    assert list(search.tried) == search.start()
    assert search.limits() == ["every one of its 2 points diverged"]


def test_ties_go_to_the_first_point_tried_and_a_point_is_not_tried_twice() -> None:
    search = searched(lambda point: 1.0)
    assert search.choice() == search.start()[0]
    with pytest.raises(ConfigError, match="tried already"):
        search.record({search.start()[0]: 0.5})
    with pytest.raises(ConfigError, match="strictly ascending"):
        Axis("bad", (1.0, 1.0), (1.0,), below="", above="")
    with pytest.raises(ConfigError, match="values of the ladder"):
        Axis("bad", (1.0, 2.0), (3.0,), below="", above="")


def test_a_seed_is_tried_next_adds_a_run_to_the_budget_and_wins_only_if_lower() -> None:
    search = searched(surface((0.01, 0.0)), extension_runs=0)
    budget = search.budget
    assert not search.seed((0.01, 0.0), "a start point")  # tried already: nothing to add
    assert search.seed((10.0, 3.0), "the inner method's choice")
    assert search.budget == budget + 1 and search.wanted() == [(10.0, 3.0)]
    tuning.settle([search], lambda asked: [-1.0 for _ in asked])
    assert search.choice() == (10.0, 3.0) and search.seeds == {(10.0, 3.0): "the inner method's choice"}
    with pytest.raises(ConfigError, match="not on its ladder"):
        search.seed((0.5, 0.0), "somewhere off the ladder")


def test_a_nested_point_is_the_inner_choice_at_the_outer_methods_limit() -> None:
    nesting = tuning.NESTED["fedsrcvar"][0]
    outer = tuning.axes_of("fedsrcvar", local_steps=True, momentum=True)
    inner = tuning.axes_of("fedavg", local_steps=True, momentum=False)
    assert tuning.nested_point(outer, inner, (0.3, 15.0), nesting) == (0.3, 15.0, 0.0, 1.0, tuning.GAMMA.start[0])
    with pytest.raises(ConfigError, match="no value for the axes"):
        tuning.nested_point(outer, inner[:1], (0.3,), nesting)


# ---------------------------------------------------------------- the study's ladders

BASELINES = ("fedsrcvar", "fedavg", "fedavgm", "propfair", "term", "deltafl")


def tuned_study(dataset: str = "adult") -> Study:
    split = paper_split(dataset)
    profile = PROFILES["tuned"]
    return Study(dataset, profile, BASELINES, split=split)


def test_the_knobs_every_method_shares_span_the_same_absolute_ladders() -> None:
    study = tuned_study()
    for method in BASELINES:
        axes = study.search(method).axes
        shared = [axis for axis in axes if axis.name in ("step", "local steps", "server momentum")]
        assert shared == [tuning.STEP, tuning.LOCAL_STEPS, *([tuning.MOMENTUM] if method != "fedavg" else [])]
    # The same step gives the same --lr to every method at every rho, FedSRCVaR's curvature notwithstanding.
    for rho in (0.1, 0.7):
        learning_rates = {
            method: {
                (point.step, point.momentum or 0.0): config_from_flags(
                    study.validation_run(method, rho, point).flags
                ).training.local.lr
                for point in study.grid(method, rho)
            }
            for method in BASELINES
        }
        reference = learning_rates["fedsrcvar"]
        for method, rates in learning_rates.items():
            assert set(rates) <= set(reference), method
            assert all(rate == pytest.approx(reference[key], rel=1e-6) for key, rate in rates.items()), method
    assert {point.step for point in study.grid("term", TABLE_RHO)} == set(tuning.STEP.start)


def test_each_methods_own_knobs_reach_their_limit_cases() -> None:
    assert tuning.EPSILON.ladder[-1] == 1.0 and 1.0 in tuning.EPSILON.start  # ERM, tried from the start
    assert tuning.EPSILON.ladder[0] == 0.0  # CVaR alone
    assert tuning.GAMMA.ladder[0] <= 0.01 < tuning.GAMMA.ladder[-1]
    assert tuning.LEVEL.ladder[-1] == 1.0  # Delta-FL at level 1 is FedAvg
    # At the largest tilt the tilted risk is within ln(n) / t of the largest loss: 0.01 for Adult's 32,561 rows.
    assert math.log(32561) / tuning.TILT.ladder[-1] < 0.011 and max(tuning.TILT.start) >= 100.0
    study = tuned_study()
    flags = study.validation_run("fedsrcvar", TABLE_RHO, study.grid("fedsrcvar", TABLE_RHO)[0]).flags
    assert flags[flags.index("--gamma") + 1] == "0.01"


def test_every_ladder_is_as_fine_as_the_steps() -> None:
    # Adjacent positive rungs at most 10/3 apart (the step ladder's 0.3 to 1), a ladder in [0, 1] on 1 - w too.
    axes = [axis for axis in vars(tuning).values() if isinstance(axis, Axis)]
    assert tuning.STEP in axes and tuning.EPSILON in axes and len(axes) == 9
    for axis in axes:
        assert axis.widest_gap() <= tuning.WIDEST_GAP * (1 + 1e-12), (axis.name, axis.widest_gap())
    assert tuning.STEP.widest_gap() == pytest.approx(tuning.WIDEST_GAP)
    # The ladders before issue 78's rule break it: epsilon's 0.01 to 0.05 and 0.2 to 1, the adversary's x10.
    coarse_epsilon = Axis("epsilon", (0.0, 0.01, 0.05, 0.2, 1.0), (0.01,), below="", above="")
    assert coarse_epsilon.widest_gap() == pytest.approx(5.0)
    coarse_adversary = Axis("adversary", (0.01, 0.1, 1.0, 10.0, 100.0), (0.1,), below="", above="")
    assert coarse_adversary.widest_gap() == pytest.approx(10.0)
    # On 1 - w: a weight ladder fine near 0 but with one rung below 1 far from it breaks the rule too.
    near_one = Axis("weight", (0.1, 0.2, 0.3, 0.5, 0.7, 0.99), (0.1,), below="", above="")
    assert near_one.widest_gap() == pytest.approx(0.3 / 0.01)


def test_each_methods_starting_grid_and_extension_budget_are_fixed_in_advance() -> None:
    study = tuned_study()
    sizes = {method: len(study.grid(method, TABLE_RHO)) for method in BASELINES}
    assert sizes == {"fedsrcvar": 24, "fedavg": 6, "fedavgm": 12, "propfair": 24, "term": 24, "deltafl": 24}
    assert {study.search(method).extension_runs for method in BASELINES} == {tuning.EXTENSION_RUNS}


Knobs = Mapping[str, float]
"""A run's --lr and --local-steps, as the fake runs read them."""


def fake_results(risk: Callable[[Knobs], float]) -> Callable[..., dict[Run, dict[str, Any]]]:
    """A `run_all` that trains nothing: each run's worst risk is `risk` of the point its flags describe."""

    def run_all(runs: list[Run], *_: Any, **__: Any) -> dict[Run, dict[str, Any]]:
        out = {}
        for run in runs:
            flags = run.flags
            value = {name: float(flags[flags.index(name) + 1]) for name in ("--lr", "--local-steps")}
            worst = risk(value)
            out[run] = {"rho": TABLE_RHO, "worst_risk": worst, "mean_risk": worst / 2}
        return out

    return run_all


def test_the_study_records_each_methods_budget_tried_points_and_marks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Lowest at the largest --lr with one local step: every method's search walks up the step ladder until the
    # lr passes 0.5, where the fake runs diverge.
    def risk(point: Knobs) -> float:
        return math.nan if point["--lr"] > 0.5 else 1.0 - point["--lr"] + point["--local-steps"]

    monkeypatch.setattr(selection, "run_all", fake_results(risk))
    study = tuned_study()
    wanted = [("term", TABLE_RHO), ("fedavg", TABLE_RHO)]
    selections, _ = selection.select(study, wanted, tmp_path, workers=1)
    for method, rho in wanted:
        chosen = selections[(method, rho)]
        assert chosen.search is not None and chosen.search.settled
        assert len(chosen.points) == len(chosen.runs) <= chosen.search.budget
        assert chosen.choice.step == 0.3 and chosen.choice.local_steps == 1
        assert "step 1 diverged" in chosen.limits
        assert "local steps 1 is its ladder's end (one local step a round)" in chosen.limits
    rows = selection.tuning_rows(selections)
    assert len(rows) == sum(len(chosen.points) for chosen in selections.values())
    assert [row["point"] for row in rows if row["chosen"]] == [
        selections[pair].choice.describe(pair[0]) for pair in wanted
    ]


def test_a_method_is_never_worse_on_validation_than_a_method_it_holds_as_a_limit_case(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Best at a large effective step, many local steps and epsilon 1 (ERM): FedSRCVaR's
    # five-axis search spends its 6 extension runs on every axis, while FedAvg's two-axis one walks there.
    def risk(flags: tuple[str, ...]) -> float:
        knobs = {name: float(flags[flags.index(name) + 1]) for name in ("--lr", "--local-steps")}
        epsilon = float(flags[flags.index("--epsilon") + 1]) if "--epsilon" in flags else 1.0
        penalty = 0.0 if epsilon == 1.0 else 0.05
        return (math.log10(knobs["--lr"]) - math.log10(0.25)) ** 2 + 0.1 * (15 - knobs["--local-steps"]) + penalty

    def run_all(runs: list[Run], *_: Any, **__: Any) -> dict[Run, dict[str, Any]]:
        return {run: {"rho": TABLE_RHO, "worst_risk": risk(run.flags), "mean_risk": 0.0} for run in runs}

    monkeypatch.setattr(selection, "run_all", run_all)
    monkeypatch.setattr(tuning, "EXTENSION_RUNS", 6)
    wanted = [("fedsrcvar", TABLE_RHO), ("fedavg", TABLE_RHO), ("fedavgm", TABLE_RHO)]
    selections, _ = selection.select(tuned_study(), wanted, tmp_path, workers=1)
    chosen = {method: selections[(method, TABLE_RHO)].search for method, _ in wanted}
    best = {method: search.tried[search.choice()] for method, search in chosen.items() if search is not None}
    assert best["fedsrcvar"] <= best["fedavgm"] <= best["fedavg"]
    rows = selection.tuning_rows(selections)
    seeded = [row for row in rows if row["seeded_from"]]
    # The seeds were needed: FedSRCVaR's own search ended above FedAvg's choice, and a seed won.
    assert seeded and any(row["chosen"] for row in seeded if row["method"] == "FedSRCVaR")
    search = chosen["fedsrcvar"]
    assert search is not None and search.budget == 24 + 6 + len(search.seeds)


# ---------------------------------------------------------------- the committed tables

FIGURES = Path(__file__).resolve().parents[2] / "docs" / "figures"
TUNED = sorted(path.parent.name for path in FIGURES.glob("tuned_*/tuning.csv"))


def test_some_committed_study_was_tuned_by_the_protocol() -> None:
    assert "tuned_rand_hie" in TUNED


@pytest.mark.parametrize("folder", TUNED)
def test_no_committed_choice_sits_on_an_unmarked_edge(folder: str) -> None:
    # From the committed CSVs alone: each table row's chosen point is the lowest validation risk its method tried
    # at that rho, and every ladder neighbour of it on every axis was tried, or the row's limits name why not.
    # Each table is replayed against the ladders it was run on (its grids.csv), not today's: a table run before a
    # ladder gained rungs keeps its choice, settled on the ladder it had.
    tried = read_csv(FIGURES / folder / "tuning.csv")
    ladders = recorded_ladders(FIGURES / folder)
    for row in read_csv(FIGURES / folder / "fig2_rho.csv"):
        points = [point for point in tried if point["method"] == row["method"] and point["rho"] == row["rho"]]
        assert len(points) == int(row["validation_runs"]), row["method"]
        values = {point["coordinates"]: float(point["worst_risk"]) for point in points}
        choice = next(point for point in points if point["chosen"] == "True")
        assert choice["point"] == row["chosen"]
        finite = [risk for risk in values.values() if not tuning.diverged(risk)]
        assert float(choice["worst_risk"]) == min(finite), row["method"]
        names = choice["axes"].split(" | ")
        chosen = [float(value) for value in choice["coordinates"].split(" | ")]
        for index, name in enumerate(names):
            for neighbour in ladders[(row["method"], name)].neighbours(chosen[index]):
                if neighbour is None:
                    assert f"{name} {chosen[index]:g} is its ladder's end" in row["limits"], (row["method"], name)
                    continue
                key = " | ".join(f"{value:g}" for value in (*chosen[:index], neighbour, *chosen[index + 1 :]))
                assert key in values or "unsettled" in row["limits"], (row["method"], name, neighbour)
                if key in values and tuning.diverged(values[key]):
                    assert f"{name} {neighbour:g} diverged" in row["limits"], (row["method"], name)
        assert row["method"] in {METHOD_LABELS[method] for method in BASELINES}


def recorded_ladders(folder: Path) -> dict[tuple[str, str], Axis]:
    """Each (method, axis) of a tuned table's ``grids.csv``: the ladder and start its study ran on."""
    return {
        (row["method"], row["axis"]): Axis(
            row["axis"],
            tuple(float(value) for value in row["ladder"].split()),
            tuple(float(value) for value in row["start"].split()),
            below=row["below"],
            above=row["above"],
        )
        for row in read_csv(folder / "grids.csv")
    }


@pytest.mark.parametrize("folder", TUNED)
def test_a_tables_ladders_are_todays_or_todays_less_rungs_added_since(folder: str) -> None:
    # Ladders are refined by adding rungs only, so that every committed choice and cached run stays on today's
    # ladder; its start never moves, so the starting grids stay the same runs.
    today = {axis.name: axis for axis in vars(tuning).values() if isinstance(axis, Axis)}
    for (method, name), recorded in recorded_ladders(FIGURES / folder).items():
        assert set(recorded.ladder) <= set(today[name].ladder), (method, name)
        assert recorded.start == today[name].start, (method, name)


SUPERSEDED = (
    "Chosen on a grid of multiples of each method's default step whose edges were neither checked nor extended: "
    'a choice in this folder may sit on an edge of its grid, unmarked (docs/paper.md, "Tuned alike, provably").'
)
"""The first line of `superseded.txt`, the mark every committed table of choices not made by the protocol carries."""


def columns(path: Path) -> list[str]:
    """The CSV's header."""
    with path.open() as table:
        return table.readline().rstrip().split(",")


CHOSEN_TABLES = sorted({path.parent.name for path in FIGURES.glob("*/*.csv") if "chosen" in columns(path)})


def test_the_committed_tables_of_choices_are_found() -> None:
    assert {"tuned_adult", "baselines_adult", "figure1_rand_hie"} <= set(CHOSEN_TABLES)


@pytest.mark.parametrize("folder", CHOSEN_TABLES)
def test_every_committed_table_of_choices_is_the_protocols_or_marked_superseded(folder: str) -> None:
    # A table whose choices the edge rule did not make says so in its folder, and names the protocol's table that
    # replaces it (which must exist) or that its replacement is pending.
    if folder in TUNED:
        assert not (FIGURES / folder / "superseded.txt").exists()
        return
    mark = (FIGURES / folder / "superseded.txt").read_text().splitlines()
    assert mark[0] == SUPERSEDED
    if mark[1].startswith("Replaced by: pending"):
        return
    at, replaced = mark[1].split(" by: ")
    assert at in ("Replaced at rho 0.1", "Replaced at every rho"), mark[1]
    assert replaced in TUNED, replaced
    # The replacement judges every rho the superseded folder does, or at least rho 0.1 where the mark says so.
    covered = {row["rho"] for row in read_csv(FIGURES / replaced / "fig2_rho.csv")}
    wanted = {"0.1"} if at == "Replaced at rho 0.1" else rhos_judged(FIGURES / folder)
    assert wanted <= covered, (replaced, sorted(wanted - covered))


def rhos_judged(folder: Path) -> set[str]:
    """Every rho a row of the folder's CSVs names."""
    return {row["rho"] for path in folder.glob("*.csv") if "rho" in columns(path) for row in read_csv(path)}


# ---------------------------------------------------------------- the committed stopped tables (issue 78)

STOPPED = sorted(path.parent.name for path in FIGURES.glob("tuned_*/stopped.csv"))


def test_some_committed_study_was_stopped_by_validation() -> None:
    assert {"tuned_adult_all_rho", "tuned_census_all_rho"} <= set(STOPPED)


@pytest.mark.parametrize("folder", STOPPED)
def test_every_committed_stop_is_inside_its_ceiling_or_says_why(folder: str) -> None:
    # From the committed CSVs alone: every method stops at a checkpoint inside a ceiling of at least 1,000 rounds
    # (or at the ceiling ladder's top, named), its chosen point is the lowest stopped validation risk it tried, its
    # test seeds all ran that stop round, and the paired gaps are those of the same methods.
    rows = read_csv(FIGURES / folder / "stopped.csv")
    assert list(rows[0])[:6] == ["method", "rho", "seed", "stop_round", "max_rounds", "held_out_worst_risk"]
    choices = {row["method"]: row for row in read_csv(FIGURES / folder / "stopped_choice.csv")}
    assert {row["method"] for row in rows} == set(choices)
    for method, choice in choices.items():
        stop, ceiling = int(choice["stop_round"]), int(choice["max_rounds"])
        assert ceiling in stopping.CEILINGS and stop % stopping.CHECK_EVERY == 0
        assert stop < ceiling or "ladder's end" in choice["limits"], method
        # Each point tried (its axes' values joined by "|") with its stopped risk, a pruned one's its lowest before.
        tried = dict(pair.split(":") for pair in choice["points_tried"].split())
        assert float(choice["validation_worst_risk"]) == pytest.approx(min(map(float, tried.values())), abs=1e-5)
        seeds = [row for row in rows if row["method"] == method]
        assert len(seeds) >= 2 and {(row["stop_round"], row["max_rounds"]) for row in seeds} == {
            (choice["stop_round"], choice["max_rounds"])
        }
        assert all(math.isfinite(float(row["held_out_worst_risk"])) for row in seeds)
    # A study of FedSRCVaR alone (its baselines pending) has no gaps and so no stopped_paired.csv.
    gaps = FIGURES / folder / "stopped_paired.csv"
    paired = {row["method"] for row in read_csv(gaps)} if gaps.exists() else set()
    assert "FedSRCVaR" in choices and paired == set(choices) - {"FedSRCVaR"}
    # Each gap is the baseline's held-out worst risk less FedSRCVaR's, averaged over the same seeds: a gap left
    # over from an earlier stopped.csv (a method re-chosen, its rows replaced) fails here.
    held_out = {
        method: [float(row["held_out_worst_risk"]) for row in rows if row["method"] == method] for method in choices
    }
    for gap in read_csv(gaps) if gaps.exists() else []:
        mine, theirs = held_out["FedSRCVaR"], held_out[gap["method"]]
        assert int(gap["seeds"]) == len(mine) == len(theirs), gap["method"]
        expected = sum(theirs) / len(theirs) - sum(mine) / len(mine)
        assert float(gap["gap_to_fedsrcvar"]) == pytest.approx(expected, abs=1e-9), gap["method"]


@pytest.mark.parametrize("folder", STOPPED)
def test_every_point_a_stopped_search_tried_is_on_todays_ladders(folder: str) -> None:
    # A stopped search re-chose every method's step and its own main knob (``step|knob``), each point on today's
    # ladders (which only gain rungs): a point off them was not the protocol's.
    today = {axis.name: axis for axis in vars(tuning).values() if isinstance(axis, Axis)}
    methods = {label: method for method, label in METHOD_LABELS.items()}
    for choice in read_csv(FIGURES / folder / "stopped_choice.csv"):
        names = choice["axes"].split(" | ")
        assert names == [tuning.STEP.name, stopped.MAIN_KNOB[methods[choice["method"]]].name], choice["method"]
        tried = choice["points_tried"].split()
        assert tried, choice["method"]
        for pair in tried:
            values = [float(value) for value in pair.split(":")[0].split("|")]
            assert len(values) == len(names), (choice["method"], pair)
            for name, value in zip(names, values, strict=True):
                assert value in today[name].ladder, (choice["method"], name, value)


@pytest.mark.parametrize("folder", STOPPED)
def test_every_stopped_table_carries_the_constants_and_what_each_method_buys(folder: str) -> None:
    # Issue 96: h̄ and the base rate on the same test rows, and each method's mean risk, accuracy and worst-rho
    # error beside its worst-rho risk wherever measured (empty where the committed run was not trained again).
    rows = read_csv(FIGURES / folder / "references.csv")
    references = {row["predictor"]: row for row in rows if float(row["rho"]) == TABLE_RHO}
    assert list(references) == [UNIFORM, BASE_RATE]
    assert {float(row["rho"]) for row in rows} == set(PROFILES["tuned"].rhos) | {TABLE_RHO}
    uniform, base = references[UNIFORM], references[BASE_RATE]
    assert float(uniform["held_out_worst_risk"]) == float(uniform["held_out_mean_risk"]) in (math.log(2), math.log(10))
    assert float(base["held_out_mean_risk"]) <= float(uniform["held_out_mean_risk"]) + 1e-3  # near the entropy
    assert float(base["held_out_worst_risk"]) >= float(base["held_out_mean_risk"])
    for row in read_csv(FIGURES / folder / "stopped.csv"):
        if row.get("held_out_accuracy"):
            assert 0.0 < float(row["held_out_accuracy"]) <= 1.0 and 0.0 <= float(row["held_out_worst_error"]) <= 1.0
            assert float(row["held_out_mean_risk"]) <= float(row["held_out_worst_risk"])
