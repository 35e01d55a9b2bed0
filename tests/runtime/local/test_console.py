"""What `fedfair launch` prints at the end: no noised figure without its interval."""

from __future__ import annotations

from fedfair.runtime.local.console import format_fairness
from fedfair.runtime.report.verdicts import progress_note


NOISED_EVALUATION = {
    "worst_risk": 1.0938, "worst_risk_low": 0.8848, "worst_risk_high": 1.3028, "worst_risk_gap": 0.209,
    "mean_risk": 0.2576, "mean_error_bound": 0.1408,
    "disparity": 1.1945, "disparity_bound": 0.3761, "accuracy": 0.883, "error_rate_bound": 0.0934,
    "worst_error": 0.39, "group_error_bound": 0.3113, "noise_std": 4.96, "loss_cap": 3.0, "above_cap": 18.2, "above_cap_bound": 18.2,
    "report_epsilon": 1.0, "samples": 739, "rho": 0.3, "confidence": 0.95, "prior_worst_risk": 1.12,
}  # fmt: skip
"""A final evaluation of three small tables under init's privacy, as final_model.json records it."""


def test_the_console_table_shows_no_noised_figure_without_its_interval() -> None:
    table = format_fairness(NOISED_EVALUATION, None, 0.3, True)
    federated = next(line for line in table.splitlines() if line.startswith("FedSRCVaR"))
    cells = federated.split(")", 1)[1].split()
    assert len(cells) == 7 and all("+/-" in cell for cell in cells[:2] + cells[4:]), cells
    # The best group's risk is not queried under noise: said in words, with no stand-in number.
    assert cells[2:4] == ["not", "measured"] and "between 0 and the mean" in table
    assert "0.390+/-0.311" in federated  # the worst group's error: min(error, rho) / rho, its bound over rho
    assert "1.094+/-0.209" in federated and "95% interval [0.8848, 1.3028]" in table
    assert "the noise leaves the worst-group risk +/- 0.21" in table  # the warning names the noise
    assert "certified within" not in table
    exact = {key: value for key, value in NOISED_EVALUATION.items() if key != "noise_std"} | {
        "worst_risk_gap": 0.0,
        "best_risk": 0.1288,  # exact sums measure the best group
    }
    assert "1.0938" in format_fairness(exact, None, 0.3, True) and "+/-" not in format_fairness(exact, None, 0.3, True)


def test_a_worst_group_risk_bounded_below_only_is_said_so_not_centred() -> None:
    """Losses clear of the cap's noise lie above it: the interval reaches the cap, and no +/- is centred on it."""
    capped = NOISED_EVALUATION | {"above_cap": 60.0, "above_cap_bound": 18.2}
    federated = next(line for line in format_fairness(capped, None, 0.3, True).splitlines() if "FedSRCVaR" in line)
    assert "at least 0.885" in federated and "1.094+/-" not in federated
    # The mean and the disparity are of clipped losses too: their low ends, and nothing above them.
    assert "at least 0.117" in federated and "at least 0.818" in federated and federated.count("+/-") == 2
    # The progress line is one form whatever the count above the cap (fedfair.runtime.report.verdicts).
    assert (
        progress_note(capped)
        == progress_note(NOISED_EVALUATION)
        == "worst 1.09 (0.88 to 1.30), mean 0.26 (0.12 to 0.40)"
    )
