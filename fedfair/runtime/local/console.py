"""What ``fedfair launch`` prints at the end: the fairness table, each noised figure with its interval, and the privacy.

The federation's row comes from the aggregator's final evaluation record (``final_model.json``); a noised
one is read with :mod:`fedfair.runtime.report.verdicts`, so the console says what the report says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedfair.runtime.plan.privacy import PlanPrivacy


def format_fairness(
    fedsrcvar: Mapping[str, Any],
    baseline: tuple[str, Mapping[str, Any]] | None,
    rho: float,
    secure: bool,
    note: str = "",
) -> str:
    """The comparison table: the federation's row, the labelled `baseline` row when given, and what they mean.

    A noised federation's figures carry their 95% intervals (``+/-``), with the evaluation's verdict and
    warnings in words below (:mod:`fedfair.runtime.report.verdicts`). `note` says how the baseline's row
    was obtained.
    """
    from fedfair.runtime.report import verdicts  # numpy: not for `fedfair launch --help`

    keys = ("worst_risk", "mean_risk", "best_risk", "disparity", "accuracy", "worst_error")
    noised = verdicts.noised(fedsrcvar)
    width = 16 if noised else 12
    header = f"{'method':<34}" + "".join(f"{key:>{width}}" for key in keys)
    rows = [header, "-" * len(header)]
    label = "FedSRCVaR (federated, secure sums)" if secure else "FedSRCVaR (federated, plain sums)"
    rows.append(f"{label:<34}" + "".join(f"{cell:>{width}}" for cell in _federated_cells(fedsrcvar, keys)))
    if baseline is not None:
        other, report = baseline
        rows.append(f"{other:<34}" + "".join(f"{report[key]:>{width}.4f}" for key in keys))
    rows.append("")
    if noised:
        rows.append(
            f"Held-out cross-entropy over the worst / best {rho:.0%} of people (errors are 0-1); disparity is the "
            f"worst {rho:.0%}'s risk minus the other {1 - rho:.0%}'s. The federated row was computed by the "
            f"aggregator from secure sums of the institutions' noised answers only; each +/- is a 95% interval (the "
            f"noise's; the worst group's also allows for reading it at c-bar). The answers do not ask for the best group's risk: it is not measured (it lies between 0 "
            f"and the mean). {verdicts.describe(fedsrcvar)}." + (f" {note}" if note and baseline is not None else "")
        )
        warnings = [check(fedsrcvar) for check in verdicts.WARNINGS]
        rows.extend(f"Note: {warning}" for warning in warnings if warning)
    else:
        gap = max(fedsrcvar.get("worst_risk_gap", 0.0), fedsrcvar.get("best_risk_gap", 0.0))
        rows.append(
            f"Held-out cross-entropy over the worst / best {rho:.0%} of people (errors are 0-1); disparity is the "
            f"worst {rho:.0%}'s risk minus the other {1 - rho:.0%}'s. The federated row was computed by the "
            f"aggregator from exact secure sums of the institutions' threshold counts only "
            f"(certified within {gap:.1e})." + (f" {note}" if note and baseline is not None else "")
        )
    rows.append(
        "Secure aggregation was ON: the aggregator saw only masked updates and their sum."
        if secure
        else "Secure aggregation was OFF: the aggregator saw every update in the clear."
    )
    return "\n".join(rows)


NOISED_BOUNDS = {
    "mean_risk": "mean_error_bound",
    "disparity": "disparity_bound",
    "accuracy": "error_rate_bound",
    "worst_error": "group_error_bound",
}
"""The half-width of each noised figure's 95% interval, by the evaluation record's key (the worst's is its
interval's, :func:`fedfair.runtime.report.verdicts.worst_interval`; the best group's risk is not measured)."""

RAISED_BY_CAPPED_LOSSES = ("worst_risk", "mean_risk", "disparity")
"""The figures of clipped losses that the losses above the cap would raise (each lies in the worst group)."""

UNMEASURED = "not measured"
"""A noised row's cell for a figure its answers do not estimate (the best group's risk): no stand-in number."""


def _federated_cells(evaluation: Mapping[str, Any], keys: tuple[str, ...]) -> list[str]:
    """Each figure of the federation's row: bare when exact; noised, with its +/- or :data:`UNMEASURED`."""
    from fedfair.runtime.report import verdicts

    if not verdicts.noised(evaluation):
        return [f"{float(evaluation[key]):.4f}" for key in keys]
    low, high = verdicts.worst_interval(evaluation)
    bounds = {key: evaluation.get(bound) for key, bound in NOISED_BOUNDS.items()}
    bounds["worst_risk"] = (high - low) / 2
    capped = verdicts.above_cap(evaluation) is not None
    cells = []
    for key in keys:
        bound = bounds.get(key)
        if bound is None:
            cells.append(UNMEASURED)  # no estimate from the noised answers: no bare number either
            continue
        value = float(evaluation[key])
        if capped and key in RAISED_BY_CAPPED_LOSSES:
            # Losses above the cap count as the cap: the answers bound these from below only.
            cells.append(f"at least {low if key == 'worst_risk' else value - float(bound):.3f}")
        else:
            cells.append(f"{value:.3f}+/-{float(bound):.3f}")
    return cells


def describe_privacy(privacy: PlanPrivacy, tables: bool) -> str:
    """One line on what the launch's [privacy] noises (`tables`: with the statistics of a [schema]), or why none."""
    if not privacy.noised or privacy.report_epsilon is None:
        return (
            "no differential privacy (it adds its noise inside the secure sum, which --no-secure-aggregation turns "
            "off): every evaluation is an exact sum"
        )
    interim = privacy.interim_report_epsilon
    return (
        "privacy as `fedfair init` sets it: every evaluation answer"
        + (" and the table statistics before round 1" if tables else "")
        + f" noised inside the secure sum (the final evaluation at epsilon {privacy.report_epsilon:g}"
        + (f", earlier ones at {interim:g}" if interim is not None else "")
        + f"), each institution's budget {privacy.budget:g}"
    )
