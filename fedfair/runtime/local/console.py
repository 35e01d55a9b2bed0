"""What ``fedfair launch`` prints at the end: at most :data:`MOST_LINES` lines of at most :data:`WIDTH` characters.

First the headline, measured alike: FedSRCVaR's final model and FedAvg's, each evaluated exactly on the same
held-out rows (:mod:`fedfair.research.launch_baseline`). Then, labelled as such, what the federation itself saw:
its private estimate from noised secure sums, with its 95% interval, said by
:mod:`fedfair.runtime.report.verdicts` as the report says it. Then where the report is.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fedfair.runtime.output_folder import COMPARISON_COLUMNS
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedfair.runtime.plan.privacy import PlanPrivacy

WIDTH = 120
"""The longest line the closing console prints."""

MOST_LINES = 12
"""The most lines the closing console prints (warnings past it are left to the report)."""


def exact_table(exact: Mapping[str, Mapping[str, float]], rho: float) -> list[str]:
    """The headline, then one row per model of its exact report on the same held-out rows (each report's "rows").

    The headline names the first two models' worst-group risks, so a reader sees the comparison in one line.
    """
    (first, ours), (second, theirs) = list(exact.items())[:2]
    lines = [
        f"Worst-off {rho:.0%}'s risk: {first} {ours['worst_risk']:.3f}, {second} {theirs['worst_risk']:.3f} "
        f"(exact, both on the same {int(ours['rows']):,} held-out rows; lower is better)",
        f"  {'model':<11}" + "".join(f"{heading:>18}" for _, heading in COMPARISON_COLUMNS),
    ]
    lines += [
        f"  {name:<11}" + "".join(f"{report[key]:>18.4f}" for key, _ in COMPARISON_COLUMNS)
        for name, report in exact.items()
    ]
    return lines


def private_lines(evaluation: Mapping[str, Any], secure: bool) -> list[str]:
    """What the federation itself saw: its own evaluation's headline and one line per warning it calls for."""
    from fedfair.runtime.report import verdicts  # numpy: not for `fedfair launch --help`

    if verdicts.noised(evaluation):
        label = f"its private estimate from noised secure sums at epsilon {float(evaluation['report_epsilon']):g}"
    else:
        label = "its own evaluation from exact secure sums" if secure else "its own evaluation from exact plain sums"
    return [f"What the federation saw, {label}:", verdicts.headline(evaluation)] + [
        f"Note: {warning}" for warning in verdicts.warning_lines(evaluation)
    ]


def closing_lines(
    evaluation: Mapping[str, Any],
    exact: Mapping[str, Mapping[str, float]] | None,
    *,
    rho: float,
    secure: bool,
    seconds: float,
    report: Path | None,
    auditor: str | None = None,
) -> list[str]:
    """The whole closing console, headline first, at most :data:`MOST_LINES` lines (warnings past it are left out).

    `exact` maps each model to its exact report on the sites' held-out rows (None: no comparison was run);
    `report` is the kept report's path (None: the workspace is being removed); `auditor` the auditor institution of
    the two-verifier input bound, which the closing then names (None: no input bound).
    """
    lines = [] if exact is None else exact_table(exact, rho)
    own = private_lines(evaluation, secure)
    lines += own[:2]
    closing = [
        "Secure aggregation was ON: the aggregator saw only masked updates and their sum."
        if secure
        else "Secure aggregation was OFF: the aggregator saw every update in the clear.",
        *(() if auditor is None else (input_bound_words(auditor),)),
        f"Finished in {seconds:.0f} s. "
        + (f"Report: {report}" if report is not None else "The workspace is removed now (--no-keep)."),
    ]
    room = MOST_LINES - len(lines) - len(closing)
    warnings = own[2:]
    if len(warnings) > room:
        warnings = warnings[: room - 1] + [f"Note: {len(warnings) - room + 1} more in the report's warnings."]
    return lines + warnings + closing


def input_bound_words(auditor: str) -> str:
    """The line that says the input bound was on, and who verified it with the aggregator."""
    return f"Input bound ON: every training update was proven within its bound to the aggregator and the auditor {auditor}."


def describe_privacy(privacy: PlanPrivacy, tables: bool) -> str:
    """A few words on what the launch's [privacy] noises (`tables`: with the statistics of a [schema]), or why none."""
    if not privacy.noised or privacy.report_epsilon is None:
        return "no differential privacy (it is added inside the secure sum): evaluations are exact sums"
    interim = privacy.interim_report_epsilon
    return (
        "init's privacy: answers"
        + (" and statistics" if tables else "")
        + f" noised (epsilon {privacy.report_epsilon:g} final"
        + (f", {interim:g} earlier" if interim is not None else "")
        + f"), budget {privacy.budget:g} a site"
    )
