"""The warning for a model that serves its worst group worse than the uniform classifier: said once, in
`fedfair.runtime.report.page.guessing_warning`, by the report page and by the aggregator's closing line."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from fedfair.runtime.report import page as report
from fedfair.runtime.report.data import read_run
from tests.runtime.test_report import write_run


@pytest.mark.parametrize(("worst", "classes"), [(0.70, 2), (2.31, 10)])
def test_a_worst_risk_above_ln_k_is_warned_with_the_likely_causes(worst: float, classes: int) -> None:
    warning = report.guessing_warning(worst, classes)
    assert warning is not None
    assert f"ln K = {math.log(classes):.4f}" in warning and f"{worst:.4f}" in warning
    for cause in ("[training] rounds", "lr", "server_momentum", "[objective] rho"):
        assert cause in warning


@pytest.mark.parametrize(("worst", "classes"), [(0.69, 2), (math.log(2), 2), (2.30, 10)])
def test_at_or_below_ln_k_nothing_is_said(worst: float, classes: int) -> None:
    assert report.guessing_warning(worst, classes) is None


def test_the_page_warns_from_the_last_finished_evaluation_only(tmp_path: Path) -> None:
    folder = tmp_path / "output"
    write_run(folder)  # evaluations at rounds 2, 4, 5: worst 0.71 and 0.70 above ln 2, then 0.69 below
    run = dataclasses.replace(read_run(folder), classes=2, classes_note="from a test")
    assert 'class="warning"' not in report.render(run)
    last = run.rounds[-1]
    worse = {**last, "evaluation": {**last["evaluation"], "worst_risk": 0.75}}
    page = report.render(dataclasses.replace(run, rounds=[*run.rounds[:-1], worse]))
    assert 'class="warning"' in page and "0.7500 is above the uniform classifier" in page
