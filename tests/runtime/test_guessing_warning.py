"""The warnings of a finished evaluation, said once in `fedfair.runtime.report.verdicts` (by the report page and
by the aggregator's closing lines): "worse than guessing" against the class-prior classifier, only when the
whole interval of the worst-group risk lies above it, and the noise named when the budget cannot resolve it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

import pytest

from fedfair.fairness import tail
from fedfair.runtime.report import page as report
from fedfair.runtime.report import verdicts
from fedfair.runtime.report.data import read_run
from tests.runtime.test_report import evaluation, write_run


def noised(worst: float, low: float, high: float, prior: float | None, **extra: Any) -> dict[str, Any]:
    """A noised evaluation record as `federated_evaluation` writes it (2,000 rows, answers at epsilon 1)."""
    return {
        **evaluation(50, worst, 0.39),
        "samples": 2000, "noise_std": 4.0, "worst_risk_gap": (high - low) / 2, "worst_risk_low": low,
        "worst_risk_high": high, "prior_worst_risk": prior, "report_epsilon": 1.0, "loss_cap": 3.0,
        "error_rate_bound": 0.01, "mean_error_bound": 0.01, "above_cap": 0.0, "above_cap_bound": 30.0, **extra,
    }  # fmt: skip


def test_a_worst_group_interval_above_the_class_prior_is_warned_with_the_likely_causes() -> None:
    warning = verdicts.guessing_warning(noised(1.40, 1.35, 1.45, prior=1.20))
    assert warning is not None and "1.2000, the class-prior classifier's" in warning
    assert "[1.3500, 1.4500]" in warning
    for cause in ("[training] rounds", "lr", "server_momentum", "[objective] rho"):
        assert cause in warning


@pytest.mark.parametrize(
    ("worst", "low", "high", "prior"),
    [
        (0.85, 0.80, 0.90, 1.20),  # the model, beating the class prior at 24% positives: no warning
        (1.25, 1.15, 1.35, 1.20),  # the interval straddles the baseline: the noise cannot tell, so nothing is said
        (0.80, 0.75, 0.85, None),  # no label counts (exact sums): no baseline, no warning
    ],
)
def test_nothing_is_said_unless_the_whole_interval_lies_above_the_class_prior(
    worst: float, low: float, high: float, prior: float | None
) -> None:
    assert verdicts.guessing_warning(noised(worst, low, high, prior)) is None


def test_a_wide_interval_names_the_noise_and_what_would_resolve_it() -> None:
    wide = noised(1.0, 0.6, 1.4, prior=1.2)
    warning = verdicts.noise_warning(wide)
    assert warning is not None
    assert "cannot resolve the worst-group risk: +/- 0.40" in warning and "from the evaluation's noise" in warning
    # The half-width falls as 1 / rows and about as 1 / epsilon: 8 times the rows or the epsilon for +/- 0.05.
    assert f"About {tail.rows_for(0.4, 2000):,.0f} held-out rows or report_epsilon 8 would give +/- 0.05" in warning
    assert verdicts.noise_warning(noised(0.85, 0.81, 0.89, prior=1.2)) is None
    assert verdicts.noise_warning(evaluation(5, 0.69, 0.66)) is None  # exact sums carry no noise


def test_losses_above_the_cap_leave_the_worst_group_risk_bounded_below_only() -> None:
    capped = noised(1.0, 0.9, 1.1, prior=1.2, above_cap=35.0, above_cap_bound=12.0)
    said = verdicts.describe(capped)
    assert said.startswith("worst-group risk at least 0.9000 (95%): about 35 held-out losses lie above the loss cap 3")
    assert verdicts.worst_interval(capped) == (0.9, 3.0)  # open above: the bar reaches the cap
    warning = verdicts.cap_warning(capped)
    assert warning is not None and "Raise the top of [evaluation] loss_range" in warning
    # A count within its noise of none: the interval stands, and nothing is said.
    within = noised(1.0, 0.9, 1.1, prior=1.2, above_cap=8.0, above_cap_bound=12.0)
    assert verdicts.cap_warning(within) is None and verdicts.worst_interval(within) == (0.9, 1.1)
    assert "(about 8 +/- 12 of them above it, each counted as 3" in verdicts.describe(within)


def test_the_page_shows_the_final_interval_and_warns_from_the_last_finished_evaluation_only(tmp_path: Path) -> None:
    folder = tmp_path / "output"
    write_run(folder)
    run = read_run(folder)
    last = run.rounds[-1]
    fine = {**last, "evaluation": {**noised(0.85, 0.81, 0.89, prior=1.2), "round": 5}}
    page = report.render(dataclasses.replace(run, rounds=[*run.rounds[:-1], fine]))
    assert 'class="warning"' not in page
    assert "worst-group risk 0.8500 +/- 0.0400 (95% interval [0.8100, 0.8900])" in page
    worse = {**last, "evaluation": {**noised(1.4, 1.0, 1.8, prior=0.9), "round": 5}}
    page = report.render(dataclasses.replace(run, rounds=[*run.rounds[:-1], worse]))
    assert page.count('class="warning"') == 2 and "the class-prior classifier" in page and "cannot resolve" in page


def test_a_count_above_the_cap_the_noise_cannot_resolve_is_said_with_the_share_it_may_be() -> None:
    # The rehearsal: 31 of 700 held-out losses above the cap, counted +/- 40; the clipped figure reads
    # 1.06 where the losses' own worst-group risk is 1.63.
    rehearsal = noised(1.06, 0.87, 1.25, prior=1.2, samples=700, above_cap=31.0, above_cap_bound=40.0)
    figures = {**rehearsal, "cap_share_high": 0.34}
    said = verdicts.describe(figures)
    assert "(95% interval [0.8700, 1.2500])" in said and "the unclipped figures are at least these" in said
    assert "up to 34% of the worst group may lie above the cap, and each unit of loss beyond it adds up to 0.34" in said
    # The noise that hides the count is the one the noise warning names: it says both, and once.
    noise = verdicts.noise_warning(figures)
    assert noise is not None and verdicts.cap_warning(figures) is None
    assert "cannot tell whether up to 34% of the worst group lies above the loss cap 3" in noise
    # A narrow interval whose count the noise still cannot resolve: the cap warning says it.
    narrow = {**figures, "worst_risk_low": 1.03, "worst_risk_high": 1.09, "cap_share_high": 0.08}
    warning = verdicts.cap_warning(narrow) or ""
    assert verdicts.noise_warning(narrow) is None
    assert "cannot tell how many held-out losses exceed the loss cap 3 (about 31 +/- 40)" in warning
    assert "only bounded below (at least 1.0300)" in warning and "adds up to 0.08" in warning
    # A share too small for a unit of excess loss to move the figure by the resolved +/- 0.05 is not warned of.
    assert verdicts.cap_warning({**narrow, "cap_share_high": 0.04}) is None
    assert "cannot tell whether" not in (verdicts.noise_warning({**figures, "cap_share_high": 0.04}) or "")
    assert verdicts.cap_warning(rehearsal) is None and "may lie above" not in verdicts.describe(rehearsal)


def test_the_noised_report_records_the_share_of_the_worst_group_at_the_cap() -> None:
    query = tail.TailQuery(3.0)
    losses = np.concatenate([np.linspace(0.0, 2.0, 900), np.full(100, 5.0)])
    answers = tail.tail_answers(query, losses, np.zeros(1000), np.zeros(1000, dtype=np.int64), 1.5)
    record = tail.tail_report(query, answers, 1.5, 0.3, noise_std=0.5).report(0.3, 0.5, 3.0).to_dict()
    assert record["cap_share_high"] > 100 / 300 > 0.0 and verdicts.cap_share({**record, "noise_std": 0.5}) is not None


def test_a_final_model_answered_before_names_the_evaluation_whose_answers_it_reports() -> None:
    repeated = noised(1.0, 0.6, 1.4, prior=1.2, answers_of_round=1, report_epsilon=0.2)
    assert "answers noised at epsilon 0.2, given at round 1's evaluation of the same model" in verdicts.describe(
        repeated
    )
    warning = verdicts.noise_warning(repeated) or ""
    assert "(epsilon 0.2, given at round 1's evaluation of the same model over about 2,000" in warning
    assert "interim_report_epsilon 1.6 would give +/- 0.05" in warning  # the epsilon that made these answers
    assert "or report_epsilon" in (verdicts.noise_warning(noised(1.0, 0.6, 1.4, prior=1.2)) or "")


def test_an_interval_widened_by_the_threshold_is_not_blamed_on_the_noise() -> None:
    """c-bar far above the worst group's boundary on 20,000 rows: the noise gives about +/- 0.005, the gap the rest."""
    rng = np.random.default_rng(11)
    losses = rng.exponential(0.4, 20_000)
    errors, labels = (losses > 0.69).astype(np.float64), (rng.random(losses.size) < 0.24).astype(np.int64)
    query = tail.TailQuery(3.0)
    c_bar = float(np.quantile(losses, 0.7)) + 1.2  # a threshold still coming down from its bound
    release = tail.answer_release(1.0, 1e-5, 1e-12, (0.0, 0.0, 0))
    sigma = float(np.sqrt(2.0 * release.mu)) / 2.0**20
    answers = tail.tail_answers(query, losses, errors, labels, c_bar)
    answers = answers + rng.normal(0.0, sigma, answers.size)
    figures = tail.tail_report(query, answers, c_bar, 0.3, noise_std=sigma, classes=2)
    record = {**figures.report(0.3, sigma, 3.0).to_dict(), "report_epsilon": 1.0}
    assert record["worst_risk_noise"] < 0.01 < tail.RESOLVED < record["worst_risk_threshold_gap"]
    assert verdicts.noise_warning(record) is None  # the noise resolves it: more rows or epsilon would not help
    warning = verdicts.threshold_warning(record)
    assert warning is not None and f"up to {record['worst_risk_threshold_gap']:.2f} of room below" in warning
    assert "more held-out rows or epsilon would not narrow that part" in warning
    # An exact record, or one from before the gap was stated, gets no such warning.
    assert verdicts.threshold_warning({**record, "noise_std": 0.0}) is None
    assert verdicts.threshold_warning({k: v for k, v in record.items() if k != "worst_risk_threshold_gap"}) is None
