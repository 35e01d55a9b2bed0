"""What an evaluation record says in words: its figures with their intervals, and the warnings they call for.

Said once here, by the report page, the aggregator's closing lines and the progress bar. An
evaluation record is the ``evaluation`` of a round record (``rounds.jsonl``) or of
``final_model.json``: the report's fields (:class:`fedfair.fairness.report.GroupRiskReport`),
and for a noised report its 95% interval, the epsilon of its answers and the class-prior
classifier's worst-group risk (:mod:`fedfair.fairness.tail`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedfair.fairness.tail import RESOLVED, epsilon_for, rows_for


def noised(evaluation: Mapping[str, Any]) -> bool:
    """Whether the record is of a noised evaluation (its figures are estimates with an interval)."""
    return float(evaluation.get("noise_std") or 0.0) > 0.0


def above_cap(evaluation: Mapping[str, Any]) -> float | None:
    """The held-out rows a noised report finds above its loss cap, when its 95% interval excludes none (else None).

    Each such loss counts as the cap in every figure, so the figures are lower bounds only.
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
    """The worst-group risk's interval: the noised report's 95% one, or the exact sums' certified bracket.

    A noised report with losses above its cap has no upper end: the interval then reaches the cap, the
    most it can state.
    """
    worst = float(evaluation["worst_risk"])
    if evaluation.get("worst_risk_low") is not None:
        high = float(evaluation["worst_risk_high"])
        unbounded = above_cap(evaluation) is not None
        return float(evaluation["worst_risk_low"]), max(high, float(evaluation["loss_cap"])) if unbounded else high
    gap = float(evaluation.get("worst_risk_gap") or 0.0)
    return (worst - gap, worst + gap) if noised(evaluation) else (worst - gap, worst)


def describe(evaluation: Mapping[str, Any]) -> str:
    """The figures of a finished evaluation for one line: each with its interval, and what they are of."""
    worst, mean = float(evaluation["worst_risk"]), float(evaluation["mean_risk"])
    low, high = worst_interval(evaluation)
    if not noised(evaluation):
        return (
            f"worst-group risk {worst:.4f} (exact sums; the exact value lies in [{low:.4f}, {high:.4f}]), "
            f"mean {mean:.4f}, accuracy {float(evaluation['accuracy']):.4f}"
        )
    cap, rows = float(evaluation["loss_cap"]), above_cap(evaluation)
    others = (
        f"mean {mean:.4f} +/- {float(evaluation['mean_error_bound']):.4f}, accuracy "
        f"{float(evaluation['accuracy']):.4f} +/- {float(evaluation['error_rate_bound']):.4f}; answers noised at "
        f"epsilon {float(evaluation['report_epsilon']):g}{_answered_at(evaluation)}"
    )
    share = cap_share(evaluation)
    beyond = (
        ""
        if not share
        else f"; up to {share:.0%} of the worst group may lie above the cap, and each unit of loss beyond it adds "
        f"up to {share:.2f} to the worst-group risk"
    )
    if rows is not None:
        return (
            f"worst-group risk at least {low:.4f} (95%): about {rows:.0f} held-out losses lie above the loss cap "
            f"{cap:g}, so the answers cannot bound it from above; of the losses clipped at the cap it is "
            f"{worst:.4f} +/- {float(evaluation['worst_risk_gap']):.4f}{beyond}; {others} (of clipped losses too)"
        )
    count, bound = float(evaluation["above_cap"]), float(evaluation["above_cap_bound"])
    return (
        f"worst-group risk {worst:.4f} +/- {(high - low) / 2:.4f} (95% interval [{low:.4f}, {high:.4f}]), {others}; "
        f"of the losses clipped at {cap:g} (about {count:.0f} +/- {bound:.0f} of them above it, each counted as "
        f"{cap:g}: the unclipped figures are at least these{beyond})"
    )


def _answered_at(evaluation: Mapping[str, Any]) -> str:
    """Where a final evaluation's answers were given, when an earlier evaluation of the same model gave them."""
    earlier = evaluation.get("answers_of_round")
    return "" if earlier is None else f", given at round {int(earlier)}'s evaluation of the same model"


def progress_note(evaluation: Mapping[str, Any]) -> str:
    """The latest evaluation beside a progress bar: "worst 0.9237 +/- 0.21, mean 0.2574 +/- 0.14" (bare if exact).

    With losses above a noised report's cap both are bounded below only: "worst at least 0.7137, mean at least ...".
    """
    worst, mean = float(evaluation["worst_risk"]), float(evaluation["mean_risk"])
    if not noised(evaluation):
        return f"worst {worst:.4f}, mean {mean:.4f}"
    low, high = worst_interval(evaluation)
    bound = float(evaluation["mean_error_bound"])
    if above_cap(evaluation) is not None:
        return f"worst at least {low:.4f}, mean at least {mean - bound:.4f}"
    return f"worst {worst:.4f} +/- {(high - low) / 2:.4f}, mean {mean:.4f} +/- {bound:.4f}"


def noise_warning(evaluation: Mapping[str, Any]) -> str | None:
    """What the budget cannot resolve: a noised worst-group risk wider than +/- :data:`RESOLVED` (None otherwise).

    It names the noise as the cause, and the held-out rows or the epsilon that would resolve it.
    """
    if not noised(evaluation):
        return None
    low, high = worst_interval(evaluation)
    # The noise's own half-width where the record states it: the rest of the interval is the threshold's
    # (threshold_warning), which more rows or epsilon would not narrow.
    stated = evaluation.get("worst_risk_noise")
    half = (high - low) / 2.0 if stated is None else float(stated)
    if half <= RESOLVED:
        return None
    rows, epsilon = float(evaluation["samples"]), float(evaluation["report_epsilon"])
    # A final model answered at an earlier evaluation keeps those answers: their epsilon is the earlier one's.
    key = "report_epsilon" if evaluation.get("answers_of_round") is None else "interim_report_epsilon"
    share = cap_share(evaluation) or 0.0
    capped = (
        f"; the same noise cannot tell whether up to {share:.0%} of the worst group lies above the loss cap "
        f"{float(evaluation['loss_cap']):g}, each unit of loss beyond it adding up to {share:.2f} to the figure"
        if share > RESOLVED and above_cap(evaluation) is None
        else ""
    )
    return (
        f"the budget cannot resolve the worst-group risk: +/- {half:.2f} (95%), from the evaluation's noise "
        f"(epsilon {epsilon:g}{_answered_at(evaluation)} over about {rows:,.0f} held-out rows), not from the "
        f"model{capped}. About {rows_for(half, rows):,.0f} held-out rows or {key} {epsilon_for(half, epsilon):.2g} "
        f"would give +/- {RESOLVED:g}"
    )


def threshold_warning(evaluation: Mapping[str, Any]) -> str | None:
    """What reading the worst-group risk at c-bar costs, when that alone widens its interval by :data:`RESOLVED`.

    The noised answers read the risk at the trained threshold c-bar; the further c-bar is from the worst group's
    boundary (the (1 - rho)-quantile of the losses), the further below the read value the risk may lie (the
    convexity gap). None for exact sums, a smaller gap, or a record from before it was stated.
    """
    gap = evaluation.get("worst_risk_threshold_gap")
    if not noised(evaluation) or gap is None or float(gap) <= RESOLVED:
        return None
    low, high = worst_interval(evaluation)
    return (
        f"reading the worst-group risk at the trained threshold c-bar rather than at the worst group's boundary "
        f"leaves up to {float(gap):.2f} of room below the read value (its interval is [{low:.4f}, {high:.4f}]); "
        "more held-out rows or epsilon would not narrow that part. It shrinks as c-bar settles at the "
        "(1 - rho)-quantile of the losses: train further ([training] rounds, threshold_lr), or average later "
        "rounds only ([training] average_from)"
    )


def cap_warning(evaluation: Mapping[str, Any]) -> str | None:
    """What losses above a noised report's cap may do to it.

    None when its answers found none, and the share of the worst group they may make up is too small for one
    unit of loss beyond the cap each to move the worst-group risk by :data:`RESOLVED`, or :func:`noise_warning`
    already says it (the noise that hides the count is the one it names).
    """
    rows, share = above_cap(evaluation), cap_share(evaluation) or 0.0
    cap = float(evaluation.get("loss_cap") or 0.0)
    if rows is not None:
        found = f"about {rows:.0f} held-out losses exceed the loss cap {cap:g}"
    elif share > RESOLVED and noise_warning(evaluation) is None:
        count, bound = float(evaluation["above_cap"]), float(evaluation["above_cap_bound"])
        found = (
            f"the answers cannot tell how many held-out losses exceed the loss cap {cap:g} (about {count:.0f} +/- "
            f"{bound:.0f}): up to {share:.0%} of the worst group may lie above it"
        )
    else:
        return None
    return (
        f"{found}: each counts as the cap, so the worst-group risk is only bounded below (at least "
        f"{worst_interval(evaluation)[0]:.4f}), and each unit of loss beyond the cap adds up to {share:.2f} to it. "
        "Raise the top of [evaluation] loss_range to cover them (one record then moves the sums further: the "
        "interval widens in proportion), or train further: a model whose worst losses lie above the cap serves its "
        "worst group poorly"
    )


def guessing_warning(evaluation: Mapping[str, Any]) -> str | None:
    """The warning for a model whose worst group fares worse than under the class-prior classifier (or None).

    It fires only when the whole interval of the worst-group risk lies above that classifier's
    worst-group risk (from the noised label counts), and names the likely causes; an
    evaluation that counted no labels (exact sums) gives no baseline and no warning.
    """
    prior = evaluation.get("prior_worst_risk")
    if prior is None:
        return None
    low, high = worst_interval(evaluation)
    if not low > float(prior):
        return None
    return (
        f"the output model's worst-group risk (95% interval [{low:.4f}, {high:.4f}]) lies above "
        f"{float(prior):.4f}, the class-prior classifier's (each class predicted at its share of the rows): on its "
        "worst group it does worse than guessing. Likely causes: too few rounds for the step ([training] rounds), "
        "a step too small or too large ([training] lr, threshold_lr, server_momentum), or a group size rho below "
        "what the features can serve ([objective] rho)"
    )


WARNINGS = (noise_warning, threshold_warning, cap_warning, guessing_warning)
"""Every warning a finished evaluation may call for, in the order they are said."""


def headline(evaluation: Mapping[str, Any]) -> str:
    """The evaluation's headline in one line: the worst-group risk with its interval, and the mean with its own."""
    worst, mean = float(evaluation["worst_risk"]), float(evaluation["mean_risk"])
    if not noised(evaluation):
        return f"worst-group risk {worst:.4f}, mean {mean:.4f}"
    low, high = worst_interval(evaluation)
    bound = float(evaluation["mean_error_bound"])
    return f"worst-group risk {worst:.3f} (95% interval {low:.3f} to {high:.3f}), mean {mean:.3f} +/- {bound:.3f}"


def warning_lines(evaluation: Mapping[str, Any]) -> list[str]:
    """Each warning the evaluation calls for, in :data:`WARNINGS`' order, its first clause only (114 characters)."""
    import textwrap

    return [textwrap.shorten(warning, 114) for check in WARNINGS if (warning := check(evaluation))]
