"""What `fedfair launch` prints at the end: the exact comparison first, short lines, no noised figure bare."""

from __future__ import annotations

import unicodedata
from pathlib import Path

from fedfair.fairness.references import BASE_RATE, UNIFORM, uniform_report
from fedfair.runtime.local.console import MOST_LINES, WIDTH, closing_lines
from fedfair.runtime.report import verdicts

NOISED_EVALUATION = {
    "worst_risk": 1.0938, "worst_risk_low": 0.8848, "worst_risk_high": 1.3028, "worst_risk_gap": 0.209,
    "mean_risk": 0.2576, "mean_error_bound": 0.1408,
    "disparity": 1.1945, "disparity_bound": 0.3761, "accuracy": 0.883, "error_rate_bound": 0.0934,
    "worst_error": 0.39, "group_error_bound": 0.3113, "noise_std": 4.96, "loss_cap": 3.0, "above_cap": 18.2, "above_cap_bound": 18.2,
    "report_epsilon": 1.0, "samples": 739, "rho": 0.3, "confidence": 0.95, "prior_worst_risk": 1.12,
    "worst_risk_noise": 0.2, "worst_risk_threshold_gap": 0.09, "cap_share_high": 0.3,
}  # fmt: skip
"""A final evaluation of three small tables under init's privacy, as final_model.json records it: wide enough
that every warning fires."""

EXACT = {
    "FedSRCVaR": {"worst_risk": 0.7743, "mean_risk": 0.3995, "disparity": 0.5354, "accuracy": 0.844, "worst_error": 0.52},
    "FedAvg": {"worst_risk": 0.9409, "mean_risk": 0.328, "disparity": 0.8755, "accuracy": 0.845, "worst_error": 0.5168},
    UNIFORM: uniform_report(2, 0.3).to_dict(),
    BASE_RATE: {"worst_risk": 1.1969, "mean_risk": 0.5522, "disparity": 0.9210, "accuracy": 0.7638, "worst_error": 0.7867},
}  # fmt: skip
"""Two models' exact reports on the same held-out rows, then the constants', as
:mod:`fedfair.research.launch_baseline` gives them (the demo's, Adult by race at rho 0.3)."""


def on_screen(line: str) -> int:
    """The columns `line` takes on a terminal: a combining mark takes none."""
    return sum(1 for character in line if not unicodedata.combining(character))


def _exact(rows: int) -> dict[str, dict[str, float]]:
    return {name: report | {"rows": float(rows)} for name, report in EXACT.items()}


def test_the_closing_console_leads_with_the_exact_comparison_in_at_most_fifteen_short_lines() -> None:
    report = Path("/tmp/fedfair-launch-x/aggregator/output/report.html")
    lines = closing_lines(NOISED_EVALUATION, _exact(8140), rho=0.3, secure=True, seconds=39.2, report=report)
    assert len(lines) <= MOST_LINES and all(len(line) <= WIDTH for line in lines), lines
    # Both models above h̄'s ln 2: the first line says so, and the second what the ranking buys in errors.
    assert lines[0] == (
        "Worst-off 30%'s risk: FedSRCVaR 0.774, FedAvg 0.941; every model is above the uniform classifier h̄'s 0.693"
    )
    assert lines[1].startswith(
        "Worst-off 30%'s error: 0.520, 0.517; accuracy 0.844, 0.845 (exact, all on the same 8,140"
    )
    rows = {line.split("  ")[1].strip(): line.split()[-5:] for line in lines[3:7]}
    assert list(rows) == ["FedSRCVaR", "FedAvg", UNIFORM, BASE_RATE]
    assert rows["FedSRCVaR"] == ["0.7743", "0.3995", "0.5354", "0.8440", "0.5200"]
    assert rows[UNIFORM] == ["0.6931", "0.6931", "0.0000", "0.5000", "0.5000"]
    # Every row as wide on screen as the heading, h̄'s combining bar taking no column: the figures line up.
    assert {on_screen(line) for line in lines[2:7]} == {len(lines[2])}
    # What the federation saw is labelled as such, said as the report says it, with its interval.
    seen = next(index for index, line in enumerate(lines) if line.startswith("What the federation saw"))
    assert "private estimate from noised secure sums at epsilon 1" in lines[seen]
    assert lines[seen + 1] == verdicts.headline(NOISED_EVALUATION)
    assert lines[-1] == f"Finished in 39 s. Report: {report}"
    assert lines[-2].startswith("Secure aggregation was ON")


def test_warnings_past_the_twelfth_line_are_left_to_the_report() -> None:
    warnings = verdicts.warning_lines(NOISED_EVALUATION)
    lines = closing_lines(NOISED_EVALUATION, _exact(739), rho=0.3, secure=True, seconds=1.0, report=None)
    notes = [line for line in lines if line.startswith("Note: ")]
    room = MOST_LINES - (len(lines) - len(notes))
    assert len(lines) == min(MOST_LINES, len(lines) - len(notes) + len(warnings))
    if len(warnings) > room:
        assert notes[-1] == f"Note: {len(warnings) - room + 1} more in the report's warnings."
    assert lines[-1] == "Finished in 1 s. The workspace is removed now (--no-keep)."


def test_without_a_comparison_the_federations_own_figures_lead() -> None:
    exact = {key: value for key, value in NOISED_EVALUATION.items() if key != "noise_std"} | {"worst_risk_gap": 0.0}
    lines = closing_lines(exact, None, rho=0.3, secure=False, seconds=2.0, report=None)
    assert lines[:2] == ["What the federation saw, its own evaluation from exact plain sums:", verdicts.headline(exact)]
    assert "+/-" not in lines[1] and lines[2].startswith("Secure aggregation was OFF")


def test_a_model_below_the_uniform_classifier_is_not_said_to_be_above_it() -> None:
    exact = _exact(8140) | {"FedSRCVaR": EXACT["FedSRCVaR"] | {"worst_risk": 0.6500, "rows": 8140.0}}
    lines = closing_lines(NOISED_EVALUATION, exact, rho=0.3, secure=True, seconds=1.0, report=None)
    assert lines[0] == (
        "Worst-off 30%'s risk: FedSRCVaR 0.650, FedAvg 0.941, the uniform classifier h̄ 0.693 (lower is better)"
    )
