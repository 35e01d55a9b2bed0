"""What ``fedfair launch`` prints at the end: at most :data:`MOST_LINES` lines of at most :data:`WIDTH` characters.

First the headline, measured alike: FedSRCVaR's final model and FedAvg's, each evaluated exactly on the same
held-out rows (:mod:`fedfair.research.launch_baseline`), beside the uniform classifier h̄ and the base rate. Then, labelled as such, what the federation itself saw:
its private estimate from noised secure sums, with its 95% interval, said by
:mod:`fedfair.runtime.report.verdicts` as the report says it. Then where the report is.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from pathlib import Path

from fedfair.runtime.output_folder import COMPARISON_COLUMNS
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedfair.runtime.plan.privacy import PlanPrivacy

WIDTH = 120
"""The longest line the closing console prints."""

MOST_LINES = 15
"""The most lines the closing console prints (warnings past it are left to the report)."""


NAME_WIDTH = 13
"""The exact table's model column, wide enough for every name it holds (``uniform (h̄)``)."""


def exact_table(exact: Mapping[str, Mapping[str, float]], rho: float) -> list[str]:
    """Two headline lines, then one row per model of its exact report on the same held-out rows (each report's "rows").

    The models are the trained ones, then the constants every figure is read against
    (:mod:`fedfair.fairness.references`: the uniform classifier h̄ and the base rate). The first line gives the
    trained models' worst-group risks beside h̄'s and, where every one is above h̄'s, says so: the ranking is then of
    who comes closest to a model that learnt nothing. The second gives their worst-group errors and accuracies.
    """
    from fedfair.fairness.references import UNIFORM
    from fedfair.runtime.report import verdicts  # numpy: not for `fedfair launch --help`

    models = verdicts.trained(exact)
    uniform = exact[UNIFORM]["worst_risk"]
    group, rows = f"Worst-off {rho:.0%}'s", int(exact[UNIFORM]["rows"])
    risks = ", ".join(f"{name} {report['worst_risk']:.3f}" for name, report in models.items())
    if verdicts.above_uniform(exact):
        verdict = f"; every model is above the uniform classifier h̄'s {uniform:.3f}"
    else:
        verdict = f", the uniform classifier h̄ {uniform:.3f} (lower is better)"
    errors = ", ".join(f"{report['worst_error']:.3f}" for report in models.values())
    accuracies = ", ".join(f"{report['accuracy']:.3f}" for report in models.values())
    lines = [
        f"{group} risk: {risks}{verdict}",
        f"{group} error: {errors}; accuracy {accuracies} (exact, all on the same {rows:,} held-out rows)",
        f"  {_padded('model')}" + "".join(f"{heading:>18}" for _, heading in COMPARISON_COLUMNS),
    ]
    lines += [
        f"  {_padded(name)}" + "".join(f"{report[key]:>18.4f}" for key, _ in COMPARISON_COLUMNS)
        for name, report in exact.items()
    ]
    return lines


def _padded(name: str) -> str:
    """`name` padded to :data:`NAME_WIDTH` columns on screen: a combining mark (h̄'s bar) takes none."""
    marks = sum(1 for character in name if unicodedata.combining(character))
    return name.ljust(NAME_WIDTH + marks)


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
