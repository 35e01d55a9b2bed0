"""benchmarks/stopped_study.py --retest --tables: an older stopped table's test runs trained again, kept apart.

The training is `stopped.retested_rows`'s (tests/research/test_stopped.py trains it); here it is replaced by rows
whose worst risks are set, one reproducing its committed figure and one not, so what is written where is exact.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from fedfair.research import stopped
from fedfair.research.paper_splits import paper_split
from fedfair.research.profiles import PROFILES
from fedfair.research.reproduce import read_csv
from fedfair.research.study import Study

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import stopped_study  # noqa: E402 -- benchmarks/ is not a package

FOLDER = Path(__file__).resolve().parents[1] / "docs" / "figures" / "tuned_mnist_all_rho"
TABLES = "_at_200_round_points"


def test_retest_of_the_200_round_table_fills_only_reproduced_rows_and_keeps_every_rerun(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("tuning.csv", f"stopped{TABLES}.csv", f"stopped_choice{TABLES}.csv"):
        shutil.copy(FOLDER / name, tmp_path / name)
    committed = {row["seed"]: row for row in read_csv(FOLDER / f"stopped{TABLES}.csv") if row["method"] == "PropFair"}
    asked: list[Any] = []
    offset = [5e-5]  # seed 0's distance from its committed worst risk, moved below

    def retested_rows(study: Study, rho: float, stops: Any, *_: Any) -> tuple[list[dict[str, Any]], list[Any]]:
        asked.append(stops)
        # Seed 0 reads its committed worst risk within `REPRODUCED`; seed 1 reads 0.02 below, as another machine's.
        worst = {
            0: float(committed["0"]["held_out_worst_risk"]) + offset[0],
            1: float(committed["1"]["held_out_worst_risk"]) - 0.02,
        }
        rows = [
            {"method": "PropFair", "rho": rho, "seed": seed, "stop_round": 480, "max_rounds": 1000}
            | {"held_out_worst_risk": worst[seed], "held_out_mean_risk": 0.07, "held_out_accuracy": 0.98}
            | {"held_out_worst_error": 0.2, "cpu_seconds": 30.0}
            for seed in (0, 1)
        ]
        return rows, [{"rho": rho, "method": "PropFair", "seeds": 2, "gap_to_fedsrcvar": 0.08}]

    monkeypatch.setattr(stopped, "retested_rows", retested_rows)
    study = Study("mnist", PROFILES["tuned"], ("propfair",), loss_rows=512, split=paper_split("mnist"))
    args = argparse.Namespace(folder=tmp_path, tables=TABLES, rho=0.1, cache=tmp_path / "cache", workers=1)
    stopped_study.retest(args, study)
    # The point trained again is the one the old table names: PropFair's tuned point, stopped at its round 480.
    (point, stop, ceiling) = asked[0]["propfair"]
    assert point.describe("propfair").startswith("step 0.3, 3 local steps, ceiling 1") and (stop, ceiling) == (
        480,
        1000,
    )
    rerun = read_csv(tmp_path / f"stopped_retested{TABLES}.csv")
    assert [row["gap_to_fedsrcvar"] for row in read_csv(tmp_path / f"stopped_paired_retested{TABLES}.csv")] == ["0.08"]
    assert [(row["seed"], row["committed_worst_risk"]) for row in rerun] == [
        ("0", committed["0"]["held_out_worst_risk"]),
        ("1", committed["1"]["held_out_worst_risk"]),
    ]
    table = {(row["method"], row["seed"]): row for row in read_csv(tmp_path / f"stopped{TABLES}.csv")}
    assert len(table) == 12  # every method's rows kept, the five not asked as they were
    # Seed 0 reproduced: it takes the re-run's figures beside its committed worst risk, never the re-run's.
    assert table[("PropFair", "0")]["held_out_accuracy"] == "0.98"
    assert table[("PropFair", "0")]["held_out_worst_risk"] == committed["0"]["held_out_worst_risk"]
    # Seed 1 did not: its row is left as it was, the re-run's figures only in the retested table.
    assert table[("PropFair", "1")]["held_out_accuracy"] == ""
    assert table[("PropFair", "1")]["held_out_worst_risk"] == committed["1"]["held_out_worst_risk"]
    assert float(rerun[1]["held_out_worst_risk"]) == pytest.approx(float(committed["1"]["held_out_worst_risk"]) - 0.02)
    # Where no row reproduces, the committed table is left byte for byte, the re-run kept beside it all the same.
    shutil.copy(FOLDER / f"stopped{TABLES}.csv", tmp_path / f"stopped{TABLES}.csv")
    (tmp_path / f"stopped_retested{TABLES}.csv").unlink()
    offset[0] = 0.03
    stopped_study.retest(args, study)
    assert (tmp_path / f"stopped{TABLES}.csv").read_bytes() == (FOLDER / f"stopped{TABLES}.csv").read_bytes()
    assert len(read_csv(tmp_path / f"stopped_retested{TABLES}.csv")) == 2
