"""What an evaluation record says in words: its headline, its figures with their intervals, and its warnings.

Said once here, by the report page, the closing lines and the progress bar. An evaluation record is
the ``evaluation`` of a round record or of ``final_model.json``: the report's fields, and for a noised
report its 95% interval, the epsilon of its answers and the class-prior worst-group risk.

A noised figure is always an estimate with its 95% interval, of the losses clipped at the plan's loss
cap; one whose interval spans more than :data:`UNRESOLVED_SPAN` of the range [0, cap] is "not resolved"
(the headline then says so and what would resolve it, the progress line "not resolved yet"). Every line
for people (:func:`headline`, :func:`warning_lines`, :func:`progress_note`) is at most :data:`LINE`
characters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedfair.fairness.references import BASE_RATE, UNIFORM
from fedfair.fairness.tail import RESOLVED, epsilon_for, count_margin, noise_at_zero, rows_for

LINE = 120
"""The most characters a line for people holds."""

UNRESOLVED_SPAN = 0.5
"""A noised figure whose 95% interval is wider than this share of [0, cap] is not resolved: it cannot tell a model
that serves its worst group from one that does not."""


def noised(evaluation: Mapping[str, Any]) -> bool:
    """Whether the record is of a noised evaluation (its figures are estimates with an interval)."""
    return float(evaluation.get("noise_std") or 0.0) > 0.0


def above_cap(evaluation: Mapping[str, Any]) -> float | None:
    """The held-out rows a noised report finds above its loss cap, when its 95% interval excludes none (else None).

    Each such loss counts as the cap in every figure: the figures are of the clipped losses.
    """
    count, bound = evaluation.get("above_cap"), evaluation.get("above_cap_bound")
    if count is None or bound is None or not float(count) - float(bound) > 0.0:
        return None
    return float(count)


def cap_share(evaluation: Mapping[str, Any]) -> float | None:
    """At most this share of the worst group has losses above a noised report's cap (one-sided 97.5%), else None.

    Each unit of loss beyond the cap that those rows carry adds up to this much to the worst-group risk the
    losses themselves have (:meth:`fedfair.fairness.tail.TailReport.unclipped_high`); None for exact sums or a
    record from before it was stated.
    """
    share = evaluation.get("cap_share_high")
    return None if share is None or not noised(evaluation) else float(share)


def worst_interval(evaluation: Mapping[str, Any]) -> tuple[float, float]:
    """The worst-group risk's interval: the noised report's 95% one, or the exact sums' certified bracket."""
    worst = float(evaluation["worst_risk"])
    if evaluation.get("worst_risk_low") is not None:
        return float(evaluation["worst_risk_low"]), float(evaluation["worst_risk_high"])
    gap = float(evaluation.get("worst_risk_gap") or 0.0)
    return (worst - gap, worst + gap) if noised(evaluation) else (worst - gap, worst)


def mean_interval(evaluation: Mapping[str, Any]) -> tuple[float, float]:
    """The mean risk's 95% interval for a noised record, kept at or above 0 (no loss is negative); exact: a point."""
    mean = float(evaluation["mean_risk"])
    if not noised(evaluation):
        return mean, mean
    bound = float(evaluation.get("mean_error_bound") or 0.0)
    return max(mean - bound, 0.0), mean + bound


def _cap(evaluation: Mapping[str, Any]) -> float:
    """The record's loss cap: the top of the range its noised figures lie in."""
    return float(evaluation.get("loss_cap") or 0.0)


def resolved(evaluation: Mapping[str, Any], interval: tuple[float, float] | None = None) -> bool:
    """Whether `interval` (default: the worst-group risk's) is narrow enough to say something: exact ones always are.

    Not resolved: wider than :data:`UNRESOLVED_SPAN` of [0, cap], the range a noised figure lies in. The worst-group
    risk's width is its noise's (``worst_risk_noise``, where the record has it): the noise at c-bar over rows counted
    apart from the figure's own noise, so no draw the noise made look narrow (clamped at 0 or the cap, and off) is
    called resolved for it (:func:`fedfair.fairness.tail_bounds.resolution_noise`).
    """
    if not noised(evaluation):
        return True
    cap = _cap(evaluation)
    if interval is None and evaluation.get("worst_risk_noise") is not None:
        return cap <= 0.0 or 2.0 * float(evaluation["worst_risk_noise"]) <= UNRESOLVED_SPAN * cap
    low, high = worst_interval(evaluation) if interval is None else interval
    return cap <= 0.0 or high - low <= UNRESOLVED_SPAN * cap


def _half(evaluation: Mapping[str, Any]) -> float:
    """The noise's own 95% half-width of the worst-group risk (the stated one where the record has it)."""
    stated = evaluation.get("worst_risk_noise")
    low, high = worst_interval(evaluation)
    return (high - low) / 2.0 if stated is None else float(stated)


def _noised_low(evaluation: Mapping[str, Any], half: float) -> bool:
    """Whether `half`, the figure's resolution noise, is over label counts the noise took far below the record's rows.

    That noise is over the noised label counts' sum (at least one row), and it then exceeds the most the row count's
    noise can give (:func:`fedfair.fairness.tail.noise_at_zero`): scaled from the rows, it would ask for thousands
    of times the epsilon needed (likely where the rows lie within :func:`fedfair.fairness.tail.count_margin`).
    """
    if evaluation.get("worst_risk_noise") is None or evaluation.get("prior_worst_risk") is None:
        return False  # a record from before the resolution noise, or one whose noise is over the row count itself
    rows = max(float(evaluation["samples"]), 1.0)
    return half > noise_at_zero(float(evaluation["noise_std"]), rows, float(evaluation["rho"]), _cap(evaluation))


def _fix(evaluation: Mapping[str, Any], half: float, lead: str) -> str:
    """`lead`, then the held-out rows or the epsilon that would give the worst-group risk +/- :data:`RESOLVED`.

    Scaled from `half` at the record's rows and epsilon; where the label counts it is over were noised low
    (:func:`_noised_low`), from the noise's bound over the fewest rows the row count allows instead, with rows and
    an epsilon that also lift the counts clear of their noise, and said to be so.
    """
    rows, epsilon = float(evaluation["samples"]), float(evaluation["report_epsilon"])
    # A final model answered at an earlier evaluation keeps those answers: their epsilon is the earlier one's.
    key = "report_epsilon" if evaluation.get("answers_of_round") is None else "interim_report_epsilon"
    if not _noised_low(evaluation, half):
        return f"{lead}{rows_for(half, rows):,.0f} held-out rows or {key} {epsilon_for(half, epsilon):.2g} give +/- {RESOLVED:g}"
    noise_std = float(evaluation["noise_std"])
    # The rows at the low end of the row count's interval: the fix then holds for every row count it allows.
    rows = max(rows - count_margin(noise_std, "rows"), 1.0)
    bound = noise_at_zero(noise_std, rows, float(evaluation["rho"]), _cap(evaluation))
    # Twice the margin: the counts' sum then holds at least half the rows (97.5%), its noise within twice the bound.
    margin = 2.0 * count_margin(noise_std, "labels")
    needed, lifted = max(rows_for(bound, rows), margin), max(epsilon_for(bound, epsilon), epsilon * margin / rows)
    return _fitted(f"{lead}label counts low; {needed:,.0f} rows or {key} {lifted:.2g}", f" give +/- {RESOLVED:g}")


def _figure(value: float, low: float, high: float, where: str = "") -> str:
    """A noised figure and its interval, "0.81 (95% interval 0.74 to 0.88)", to the interval's precision.

    `where` (", round 7") is said inside the brackets, after the interval.
    """
    digits = 2 if high - low >= 0.02 else 3
    return f"{value:.{digits}f} (95% interval {low:.{digits}f} to {high:.{digits}f}{where})"


def estimate_text(
    worst: tuple[float, float, float],
    mean: tuple[float, float, float],
    *,
    noised: bool,
    round_number: int | None = None,
) -> str:
    """The estimate in the one form every surface says it in (console, progress, status, status page, logs).

    `worst` and `mean` are (value, low, high). Noised: "worst-group risk 0.81 (95% interval 0.74 to 0.88, round 7),
    mean 0.33 (0.30 to 0.36)"; exact sums: "worst-group risk 0.8541 (exact sums: 0.8500 to 0.8541, round 7), mean
    0.3300". The round, when given, is the evaluation's the figures are from (a later round's progress may show it).
    Metrics stay numeric series (value, lower, upper), not this text.
    """
    where = "" if round_number is None else f", round {round_number}"
    value, low, high = worst
    if not noised:
        return f"worst-group risk {value:.4f} (exact sums: {low:.4f} to {high:.4f}{where}), mean {mean[0]:.4f}"
    return f"worst-group risk {_figure(value, low, high, where)}, {_mean_text(*mean)}"


def _mean_text(value: float, low: float, high: float) -> str:
    """A noised mean risk beside its worst-group risk: "mean 0.33 (0.30 to 0.36)" (the interval's kind said once)."""
    digits = 2 if high - low >= 0.02 else 3
    return f"mean {value:.{digits}f} ({low:.{digits}f} to {high:.{digits}f})"


def headline(evaluation: Mapping[str, Any]) -> str:
    """The evaluation in one line of at most :data:`LINE` characters: the worst-group risk with its interval first.

    Noised: "worst-group risk 0.81 (95% interval 0.74 to 0.88), mean 0.33 (0.30 to 0.36); losses capped at 3" (what
    the figures are of: each loss above the cap counts as the cap); where the interval is
    not resolved, "worst-group risk not resolved at this budget: ..." and the rows or the epsilon that would give
    +/- :data:`RESOLVED`. Exact sums: the figures with the certified bracket of the worst-group risk.
    """
    worst, mean = float(evaluation["worst_risk"]), float(evaluation["mean_risk"])
    figures = estimate_text(
        (worst, *worst_interval(evaluation)), (mean, *mean_interval(evaluation)), noised=noised(evaluation)
    )
    if not noised(evaluation):
        return _fitted(figures, f", accuracy {float(evaluation['accuracy']):.4f}")
    if not resolved(evaluation):
        return _fix(evaluation, _half(evaluation), "worst-group risk not resolved at this budget: ")
    return f"{figures}; losses capped at {_cap(evaluation):.3g}"


def _fitted(line: str, tail: str) -> str:
    """`line` and `tail` when both fit in :data:`LINE` characters, else `line` alone."""
    return line + tail if len(line) + len(tail) <= LINE else line


def describe(evaluation: Mapping[str, Any]) -> str:
    """The figures of a finished evaluation for a log line, in :func:`headline`'s form, and what they are of.

    The headline, then the accuracy, the epsilon the answers were noised at and the held-out losses above the
    cap, each noised figure with its 95% interval; for the logs, not the console's closing lines.
    """
    line = headline(evaluation)
    if not noised(evaluation):
        return line
    accuracy, error = float(evaluation["accuracy"]), float(evaluation["error_rate_bound"])
    count, bound = float(evaluation.get("above_cap") or 0.0), float(evaluation.get("above_cap_bound") or 0.0)
    return (
        f"{line}; accuracy {_figure(accuracy, max(accuracy - error, 0.0), min(accuracy + error, 1.0))}; answers "
        f"noised at epsilon {float(evaluation['report_epsilon']):g}{_answered_at(evaluation)}; held-out losses "
        f"above the cap: {count:.0f} (95% interval {max(count - bound, 0.0):.0f} to {count + bound:.0f})"
    )


def _answered_at(evaluation: Mapping[str, Any]) -> str:
    """Where a final evaluation's answers were given, when an earlier evaluation of the same model gave them."""
    earlier = evaluation.get("answers_of_round")
    return "" if earlier is None else f", given at round {int(earlier)}'s evaluation of the same model"


def progress_note(evaluation: Mapping[str, Any]) -> str:
    """The latest evaluation beside a progress bar, in :func:`estimate_text`'s form and naming its round.

    "worst-group risk 0.92 (95% interval 0.71 to 1.13, round 7), mean 0.26 (0.12 to 0.40)"; a noised figure that
    is not resolved (:func:`resolved`) reads "not resolved yet", never a value +/- as much as the value itself.
    """
    round_number = int(evaluation["round"])
    worst, mean = float(evaluation["worst_risk"]), float(evaluation["mean_risk"])
    if not noised(evaluation):
        return estimate_text(
            (worst, *worst_interval(evaluation)), (mean, mean, mean), noised=False, round_number=round_number
        )
    interval = mean_interval(evaluation)
    mean_text = _mean_text(mean, *interval) if resolved(evaluation, interval) else "mean not resolved yet"
    if not resolved(evaluation):
        return f"worst-group risk not resolved yet (round {round_number}), {mean_text}"
    return f"worst-group risk {_figure(worst, *worst_interval(evaluation), f', round {round_number}')}, {mean_text}"


def noise_warning(evaluation: Mapping[str, Any]) -> str | None:
    """The noise, when it leaves a resolved worst-group risk wider than +/- :data:`RESOLVED` (None otherwise).

    One line naming the cause (the evaluation's noise) and the fix (the rows or the epsilon for +/- RESOLVED). An
    unresolved figure's headline already says both, so it gets no warning.
    """
    if not noised(evaluation) or not resolved(evaluation):
        return None
    half = _half(evaluation)
    if half <= RESOLVED:
        return None
    return _fix(evaluation, half, f"the noise leaves the worst-group risk +/- {half:.2f}: ")


def cap_warning(evaluation: Mapping[str, Any]) -> str | None:
    """The held-out losses above a noised report's cap: found, or possibly a share of the worst group that matters.

    Each counts as the cap in every figure, so the figures are of the clipped losses; the fix is a higher cap
    (the top of [evaluation] loss_range: a wider interval) or a model whose worst losses are below it. Said when
    the answers find such losses (the count's interval excludes 0), or when they cannot tell but up to more than
    :data:`RESOLVED` of the worst group may lie there (each unit of loss beyond the cap would then add more than
    RESOLVED to its risk); None otherwise.
    """
    rows, share = above_cap(evaluation), cap_share(evaluation) or 0.0
    cap = _cap(evaluation)
    fix = "raise [evaluation] loss_range's top, or train longer"
    if rows is not None:
        return f"about {rows:,.0f} held-out losses above the loss cap {cap:.3g} count as it: {fix}"
    if share > RESOLVED:
        return f"up to {min(share, 1.0):.0%} of the worst group may lie above the loss cap {cap:.3g}: {fix}"
    return None


def guessing_warning(evaluation: Mapping[str, Any]) -> str | None:
    """The warning for a model whose worst group fares worse than under the class-prior classifier (or None).

    It fires only when the whole interval of the worst-group risk lies above that classifier's
    worst-group risk (from the noised label counts), and names the likely causes; an
    evaluation that counted no labels (exact sums) gives no baseline and no warning.
    """
    prior = evaluation.get("prior_worst_risk")
    if prior is None:
        return None
    low, _ = worst_interval(evaluation)
    if not low > float(prior):
        return None
    return (
        f"worst group worse than guessing (risk above {low:.2f}; class prior {float(prior):.2f}): more [training] "
        "rounds, another lr, or a larger rho"
    )


WARNINGS = (noise_warning, cap_warning, guessing_warning)
"""Every warning a finished evaluation may call for, in the order they are said: each one line of at most
:data:`LINE` characters, or None."""


def warning_lines(evaluation: Mapping[str, Any]) -> list[str]:
    """The warnings a finished evaluation calls for, empty when there is none.

    Each is one line of at most :data:`LINE` characters naming its cause and its fix.
    """
    return [warning for warning in (check(evaluation) for check in WARNINGS) if warning is not None]


def trained(exact: Mapping[str, Mapping[str, float]]) -> dict[str, Mapping[str, float]]:
    """The trained models of `fedfair launch`'s exact comparison: every row but the constants'."""
    return {name: report for name, report in exact.items() if name not in (UNIFORM, BASE_RATE)}


def above_uniform(exact: Mapping[str, Mapping[str, float]]) -> bool:
    """Whether every trained model of the exact comparison has a worst-group risk above the uniform classifier's.

    Then a model that learnt nothing beats them all on the figure they are ranked by. False for a comparison
    written before it held h̄'s row.
    """
    if UNIFORM not in exact:
        return False
    return all(float(report["worst_risk"]) > float(exact[UNIFORM]["worst_risk"]) for report in trained(exact).values())
