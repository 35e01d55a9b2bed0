"""How many rounds a method needs: the round its output iterate's training trace settles within 1% of its end.

`fedfair reproduce --convergence` trains each method's point chosen on validation rows again on the test seeds,
at the profile's rounds and at a longer count, keeping the averaged iterate's worst-group risk (exact CVaR at
rho) and mean loss on the pooled training rows every `HISTORY_EVERY` rounds (`Run.history_every`). Its table
gives each trace's last value and the first recorded round from which it stays within `TOLERANCE` of it, beside
the run's held-out risks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fedfair.research.runs import judged_at

TOLERANCE = 0.01
"""Relative: a trace has settled once every later value is within 1% of its final value."""

HISTORY_EVERY = 5
"""Rounds between the trace's points: the resolution of every round the table gives."""


def settled_round(trace: Sequence[tuple[int, float]], tolerance: float = TOLERANCE) -> int | None:
    """The first recorded round from which every later value is within `tolerance` (relative) of the last value.

    `trace` is (round, value) pairs in round order. None when it is empty or its last value is not finite; a
    NaN on the way is outside every band. A final value of 0 leaves a band of width 0: the answer is then the
    round from which the trace is exactly 0.
    """
    if not trace or not math.isfinite(trace[-1][1]):
        return None
    final = trace[-1][1]
    band = tolerance * abs(final)
    settled = trace[-1][0]
    for round_number, value in reversed(trace):
        if not abs(value - final) <= band:  # written so that a NaN is outside
            break
        settled = round_number
    return settled


def trace_row(result: Mapping[str, Any], rho: float) -> dict[str, Any]:
    """A traced run's final worst-group risk at `rho` and mean loss, and the round each settled (NaN, None: diverged).

    Then the same run's held-out worst-group and mean risk at `rho` (the test rows, as the study's tables).
    """
    held_out = judged_at(result, rho)
    tested = {"held_out_worst_risk": held_out["worst_risk"], "held_out_mean_risk": held_out["mean_risk"]}
    if "diverged" in result:
        traced = {"final_worst_risk": math.nan, "worst_risk_round": None, "final_mean_loss": math.nan}
        return {**traced, "mean_loss_round": None, **tested}
    history = result["history"]
    worst = [(int(point["round"]), float(point["worst_risk"][f"{rho:g}"])) for point in history]
    mean = [(int(point["round"]), float(point["mean_loss"])) for point in history]
    return {
        "final_worst_risk": worst[-1][1],
        "worst_risk_round": settled_round(worst),
        "final_mean_loss": mean[-1][1],
        "mean_loss_round": settled_round(mean),
        **tested,
    }
