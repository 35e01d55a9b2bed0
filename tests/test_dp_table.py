"""DP against DP (issue 78): each committed dp.csv is the DP test runs of its study's committed dp_stretch.py
documents, each baseline under DP was FedSRCVaR's run at that baseline's limit with the same DP flags, chosen by
the protocol's search on its committed validation runs, and FedSRCVaR's rows are there at rho 0.1."""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fedfair.research import tuning

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DP_TABLES = {"tuned_adult_dp": "adult", "tuned_census_dp": "census-income"}
"""Each dp.csv's folder under docs/figures and the study its documents ran (benchmarks/results/dp_*_<study>.json)."""

COMMITTED = sorted(folder for folder in DP_TABLES if (ROOT / "docs" / "figures" / folder / "dp.csv").is_file())


@pytest.fixture(scope="module")
def benchmarks() -> Iterator[tuple[ModuleType, ModuleType]]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import dp_stretch
        import dp_table

        yield dp_stretch, dp_table
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def documents(name: str) -> dict[str, dict[str, Any]]:
    """The committed documents of study `name`: FedSRCVaR's stretch and each baseline's, by method."""
    stem = name.replace("-", "_")
    found = {"fedsrcvar": json.loads((RESULTS / f"dp_stretch_{stem}.json").read_text())}
    for path in sorted(RESULTS.glob(f"dp_*_{stem}.json")):
        document = json.loads(path.read_text())
        if "method" in document:
            found[document["method"]] = document
    return found


def test_the_dp_table_of_adult_is_committed() -> None:
    assert "tuned_adult_dp" in COMMITTED


@pytest.mark.parametrize("folder", COMMITTED)
def test_a_dp_table_is_its_studys_dp_test_runs_with_fedsrcvar_among_them(
    benchmarks: tuple[ModuleType, ModuleType], folder: str
) -> None:
    _, dp_table = benchmarks
    with open(ROOT / "docs" / "figures" / folder / "dp.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == list(dp_table.DP_COLUMNS)
    expected = dp_table.dp_rows(list(documents(DP_TABLES[folder]).values()))
    assert [row["method"] for row in rows] == [row["method"] for row in expected]
    for row, wanted in zip(rows, expected, strict=True):
        for figure in ("held_out_worst_risk", "held_out_mean_risk", "held_out_accuracy"):
            assert float(row[figure]) == wanted[figure]
        assert (float(row["rho"]), float(row["epsilon"]), int(row["seed"])) == (
            wanted["rho"],
            wanted["epsilon"],
            wanted["seed"],
        )
    fedsrcvar = [row for row in rows if row["method"] == "FedSRCVaR"]
    assert fedsrcvar and {(row["rho"], row["epsilon"]) for row in fedsrcvar} == {("0.1", "1.0")}
    assert all(math.isfinite(float(row["held_out_worst_risk"])) for row in rows)
    # Log loss bounds the error: a row misclassified has its true class at or below one half, so loses ln 2 or
    # more (two classes), and the mean risk is at least ln 2 times the error rate.
    for row in rows:
        assert float(row["held_out_mean_risk"]) >= math.log(2) * (1.0 - float(row["held_out_accuracy"]))


@pytest.mark.parametrize("folder", COMMITTED)
def test_each_baseline_under_dp_is_fedsrcvar_at_its_limit_chosen_by_the_protocol(
    benchmarks: tuple[ModuleType, ModuleType], folder: str
) -> None:
    """Replaying the edge rule on a baseline's committed validation means chooses its point; every run of it, the
    validation runs and the test runs, is FedSRCVaR's flags at the baseline's limit (TERM: its own flags, one local
    step) plus the study's DP flags, and every site's accountant spent epsilon 1 at the study's delta."""
    dp_stretch, _ = benchmarks
    name = DP_TABLES[folder]
    study = dp_stretch.study_of(name, "tuned")
    baselines = {method: doc for method, doc in documents(name).items() if method != "fedsrcvar"}
    for method, document in baselines.items():
        # A search cut for the machine states the axes it held (`--plain-server-step`) among its fixed values.
        plan = dp_stretch.baseline_search(study, method, document["search"].get("fixed"))
        assert document["search"]["axes"] == [axis.name for axis in plan.free]
        committed = {tuple(row["coordinates"]): row for row in document["validation"]}
        for coordinates, row in committed.items():
            validation_flags = study.validation_run(plan.method, 0.1, plan.point_of(coordinates)).flags
            assert row["flags"] == [*validation_flags, *dp_stretch.dp_flags(name)], method
        # A search cut for the machine states its extension runs; one that does not ran the protocol's.
        search = tuning.Search(plan.free, document["search"].get("extension_runs", tuning.EXTENSION_RUNS))
        tuning.settle([search], lambda asked: [committed[point]["worst_risk"] for _, point in asked])
        assert list(search.tried) == list(committed), method
        chosen = plan.point_of(search.choice())
        assert chosen.describe(plan.method) == document["chosen_under_dp"] and chosen.local_steps == 1
        test_runs = study.test_runs(plan.method, 0.1, chosen)
        test_flags = {(*run.flags, *dp_stretch.dp_flags(name)) for run in test_runs}
        assert {tuple(row["flags"]) for row in document["rows"]} == test_flags, method
        for row in document["rows"]:
            assert row["delta"] == dp_stretch.DELTAS[name] and 0.999 <= row["epsilon_spent"] <= 1.0, row


def test_a_document_without_runs_chosen_under_dp_is_refused_with_the_fix(
    benchmarks: tuple[ModuleType, ModuleType],
) -> None:
    _, dp_table = benchmarks
    document = {"dataset": "adult", "rho": 0.1, "rows": [{"kind": "non-private", "flags": [], "seed": 0}]}
    with pytest.raises(dp_table.ConfigError, match="--select R"):
        dp_table.dp_rows([document])


def test_a_resumed_study_takes_its_kept_draws_first_and_keeps_each_new_one(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from dp_draws import Draws
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    trained = iter(range(100))

    def train() -> dict[str, Any]:
        return {"worst_risk": float(next(trained))}

    first = Draws()
    first.open(tmp_path / "draws.jsonl")
    assert first.take("validation", ("--seed", "0"), 2, train) == [{"worst_risk": 0.0}, {"worst_risk": 1.0}]
    # Interrupted, then resumed from the file: the two kept draws come back and only the third is trained.
    resumed = Draws()
    resumed.open(tmp_path / "draws.jsonl")
    assert resumed.take("validation", ("--seed", "0"), 3, train) == [{"worst_risk": w} for w in (0.0, 1.0, 2.0)]
    # The split is part of the key: the same flags on the test rows are other runs.
    assert resumed.take("test", ("--seed", "0"), 1, train) == [{"worst_risk": 3.0}]
    again = Draws()
    again.open(tmp_path / "draws.jsonl")
    assert again.take("validation", ("--seed", "0"), 3, train) == [{"worst_risk": w} for w in (0.0, 1.0, 2.0)]
    assert next(trained) == 4
