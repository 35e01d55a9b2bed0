"""What the worst-off group's composition costs the headline: its 95% half-width with and without the counts.

Above the plan's privacy (:mod:`fedfair.runtime.plan.privacy`), which calibrates the release the counts travel in,
and below what says it: ``fedfair init``'s comments and ``fedfair data check``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fedfair.fairness import tail
from fedfair.runtime.composition_counts import (
    CompositionColumn,
    composition_columns,
    composition_length,
    composition_sensitivity,
    suggested_composition,
)
from fedfair.runtime.plan.learning_settings import LearningSettings
from fedfair.runtime.plan.privacy import ROUNDING_BETA


def headline_half_widths(
    epsilon: float,
    delta: float,
    rows: float,
    rho: float,
    cap: float,
    columns: Sequence[CompositionColumn],
    *,
    excess: float = 1.0,
) -> tuple[float, float]:
    """The final worst-group risk's expected 95% half-width: without composition counts, and with `columns`'.

    Over `rows` held-out rows at `epsilon` (:func:`fedfair.fairness.tail.expected_half_width`). The counts
    travel in the final answer (:func:`fedfair.runtime.plan.privacy.answer_release`): one record moves them
    too (:func:`composition_sensitivity`), so the release calibrated to both carries a larger Skellam mu on
    every coordinate, the tail sums' included, and the half-width grows as the noise's standard deviation,
    sqrt(mu). Equal when `columns` is empty.
    """
    alone = tail.expected_half_width(rows, rho, epsilon, delta, cap, beta=ROUNDING_BETA, excess=excess)
    if not columns:
        return alone, alone
    l1, l2 = composition_sensitivity(columns)
    bare = tail.answer_release(epsilon, delta, ROUNDING_BETA, (0.0, 0.0, 0))
    counted = tail.answer_release(epsilon, delta, ROUNDING_BETA, (l1, l2, composition_length(columns)))
    return alone, alone * math.sqrt(counted.mu / bare.mu)


def plan_half_widths(
    plan: LearningSettings, rows: float, columns: Sequence[CompositionColumn], excess: float
) -> tuple[float, float] | None:
    """:func:`headline_half_widths` under `plan`'s privacy, rho and loss cap (None: its answers are exact)."""
    privacy = plan.privacy
    if privacy.report_epsilon is None:
        return None
    return headline_half_widths(
        privacy.report_epsilon,
        privacy.delta,
        rows,
        plan.objective.rho,
        plan.evaluation.loss_range[1],
        columns,
        excess=excess,
    )


def composition_sizing_line(plan: LearningSettings, rows: int, held_out_share: float, excess: float) -> str | None:
    """What composition costs the headline, for a site holding `rows` rows (said by ``fedfair data check``).

    The final worst-group risk's expected 95% half-width over this site's held-out rows without and with
    the plan's [evaluation] composition (:func:`headline_half_widths`), or, for a plan without one, with the
    columns :func:`suggested_composition` names. None when the answers are exact or there is no [schema].
    """
    schema = plan.schema
    if schema is None:
        return None
    names = plan.evaluation.composition or suggested_composition(schema)
    held_out = max(round(rows * held_out_share), 1)
    widths = plan_half_widths(plan, held_out, composition_columns(schema, names), excess)
    if widths is None:
        return None
    without, widened = widths
    if plan.evaluation.composition:
        return (
            f"composition priced: the plan's [evaluation] composition ({', '.join(names)}) sends its counts in the "
            f"final answer, which widens its worst-group risk over these {held_out:,} held-out rows to "
            f"+/- {widened:.2g} (+/- {without:.2g} without it; 95%, from the noise)"
        )
    listed = ", ".join(f'"{name}"' for name in names)
    return (
        f"composition priced: [evaluation] composition = [{listed}] would send counts in the final answer and "
        f"widen its worst-group risk over these {held_out:,} held-out rows from +/- {without:.2g} to "
        f"+/- {widened:.2g} (95%, from the noise)"
    )
