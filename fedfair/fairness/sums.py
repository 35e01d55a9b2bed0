"""Group risk at rho for a federated test set, from secure sums alone: the math, without any I/O.

This is the form the runtime uses: every collaborator holds its own held-out losses
and none may leave it, so the aggregator sees only the secure sum of fixed-size
vectors (`local_answers`), from which `report_from_sums` builds the report. Whoever
holds every loss in one place uses `fedfair.fairness.pooled` instead.

The worst-group risk of the whole federation's test set is CVaR_rho of all losses, and

    CVaR_rho = min_c F(c),   F(c) = c + S(c) / (rho n),   S(c) = sum over samples of (l - c)+,

so for any threshold c the federation needs only sums over samples: A(c), the count
of losses above c (the right slope of F is g(c) = 1 - A(c) / (rho n)), S(c) and n.
Each collaborator computes them on its own losses; secure aggregation adds them up.

One evaluation is one secure-sum round over a fixed vector of queries: for K
thresholds t_0 = 0 < t_1 < ... < t_{K-1} every collaborator sends A(t_j) and S(t_j)
for its losses, the same for its negated losses (the best group is the worst group
of -l), its sample count, its loss sum and its error count. The thresholds are a
public function of the evaluated model's threshold c (which FedSRCVaR trains to the
(1 - rho)-quantile of the training losses): dense around it, geometric elsewhere,
so the aggregator cannot pick them to probe anyone.

Why the result is exact up to a certified gap: from the sums, F is known exactly at
every t_j, and its right slopes too. F is convex and piecewise linear, so with
lo < hi the consecutive thresholds where g changes sign (g(lo) < 0 <= g(hi)), a
minimiser c* lies in [lo, hi] and F(hi) >= CVaR_rho. The two supporting lines
F(lo) + g(lo)(c - lo) and F(hi) + g(hi)(c - hi) lie below F and cross in [lo, hi]
at a lower bound on CVaR_rho. We report F(hi) with the gap between the two:

    0 <= F(hi) - CVaR_rho <= gap <= g(hi) (hi - lo) <= hi - lo,

up to float64 rounding of the sums (about n * 1e-16 relative): the line through hi
falls by at most g(hi) (hi - lo) before the crossing, and g(hi) <= 1. When already
t_0 has at most a rho-fraction of losses above it, t_0 is a minimiser and the gap
is 0. The grid is dense where the boundary lies, so the gap is small there. Sums of
the fixed-point encoding carry an error of at most `sum_error` per coordinate, which
adds 2 sum_error / (rho n) to the gap; counts are integers and come out exact, and
so do the error-rate groups, which need only the error count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.fairness.report import GroupRiskReport, SecureSumCertificate
from fedfair.secagg.encode import EncodingConfig

THRESHOLDS = 4096
"""K, thresholds per direction: half dense around the model's c, half geometric."""

GEOMETRIC_RANGE = (1e-6, 1e4)
"""The geometric half of the grid covers losses from here to there."""

EXTRA_COORDINATES = 3
"""After the 4 K threshold sums: the sample count, the loss sum and the error count."""


ENCODING = EncodingConfig(clip=2.0**30, max_weight=1.0, fractional_bits=20, modulus_bits=64)
"""Fixed-point encoding of evaluation vectors (each sent with weight 1): counts and loss
sums up to 2^30 per collaborator, 2^-20 resolution, no wraparound for up to 8191 parties."""


def vector_length(thresholds: int = THRESHOLDS) -> int:
    """Length of one collaborator's evaluation vector for K thresholds."""
    return 4 * thresholds + EXTRA_COORDINATES


def threshold_grid(center: float, count: int = THRESHOLDS) -> np.ndarray:
    """The public thresholds of one evaluation: 0, then increasing, `count` in all.

    Half are spaced evenly on [center / 2, 3 center / 2 + 0.05], where the boundary of
    the worst group lies when the model's c is close to the test quantile; the rest
    are geometric over GEOMETRIC_RANGE, for the best group and for a c that is off.
    Both sides compute it from the evaluated model's c, so it travels nowhere.
    """
    if count < 8:
        raise ConfigError(f"an evaluation needs at least 8 thresholds, got {count}")
    if not (math.isfinite(center) and center >= 0.0):
        raise ConfigError(f"the evaluated threshold c must be a finite number >= 0, got {center}")
    low, high = GEOMETRIC_RANGE
    dense = np.linspace(0.5 * center, 1.5 * center + 0.05, count // 2)
    geometric = np.geomspace(low, high, count - count // 2 - 1)
    grid = np.unique(np.concatenate([[0.0], dense, geometric]))
    # Dense and geometric points can coincide; top up so the vector length stays fixed.
    extra = count - grid.size
    if extra > 0:
        grid = np.unique(np.concatenate([grid, np.geomspace(high, 10 * high, extra + 1)[1:]]))
    return grid[:count]


def _above(sorted_values: np.ndarray, suffix_sums: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(count of values > t, sum of (value - t)+) for every t, from sorted values and their suffix sums."""
    first_above = np.searchsorted(sorted_values, thresholds, side="right")
    counts = sorted_values.size - first_above
    excess = suffix_sums[first_above] - thresholds * counts
    # Rounding in the suffix sums must not turn an empty sum negative.
    return counts.astype(np.float64), np.maximum(excess, 0.0)


def local_answers(losses: np.ndarray, errors: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """One collaborator's evaluation vector: what it adds to the secure sum, and all it reveals.

    [A(t), S(t) for the losses; A(-t'), S(-t') for the negated losses at the negated
    thresholds taken in increasing order; n; sum of losses; number of errors].
    """
    values = np.asarray(losses, dtype=np.float64).reshape(-1)
    wrong = np.asarray(errors, dtype=np.float64).reshape(-1)
    if values.shape != wrong.shape:
        raise ConfigError("losses and errors need one entry per held-out sample")
    if not np.isfinite(values).all() or (values < 0).any():
        raise ConfigError("held-out losses must be finite and non-negative; the evaluated model has diverged")
    ordered = np.sort(values)
    suffix = np.concatenate([np.cumsum(ordered[::-1])[::-1], [0.0]])
    counts, excess = _above(ordered, suffix, thresholds)
    negated = -ordered[::-1]
    negated_suffix = np.concatenate([np.cumsum(negated[::-1])[::-1], [0.0]])
    negated_counts, negated_excess = _above(negated, negated_suffix, -thresholds[::-1])
    totals = [float(values.size), float(values.sum()), float(wrong.sum())]
    answers = np.concatenate([counts, excess, negated_counts, negated_excess, totals])
    if np.abs(answers).max(initial=0.0) > ENCODING.clip:
        raise ConfigError(
            f"the held-out sums exceed {ENCODING.clip:g}, the most the evaluation encoding holds; "
            "evaluate on fewer samples per collaborator"
        )
    return answers


@dataclass(frozen=True)
class RiskBound:
    """CVaR_rho from threshold sums: the reported value (an upper bound) and a certified gap."""

    value: float
    gap: float


def cvar_from_sums(
    thresholds: np.ndarray,
    counts: np.ndarray,
    excess: np.ndarray,
    total: float,
    rho: float,
    *,
    sum_error: float = 0.0,
    values_at_least_first: bool = False,
) -> RiskBound:
    """CVaR_rho of the summed values from A and S at increasing thresholds (see the module doc).

    `values_at_least_first`: no value lies below thresholds[0] (losses >= 0), so a
    first threshold that already has at most a rho-fraction above it is a minimiser.
    """
    if not 0.0 < rho <= 1.0:
        raise ConfigError(f"rho must be in (0, 1], got {rho}")
    if not total > 0:
        raise ConfigError("the evaluation sums report no held-out samples; every collaborator needs test data")
    mass = rho * total
    within = np.flatnonzero(counts <= mass)
    if within.size == 0:
        raise ConfigError(
            f"over a {rho:g} fraction of held-out losses exceed {thresholds[-1]:g}; the evaluated model has diverged"
        )
    high = int(within[0])
    value = float(thresholds[high] + excess[high] / mass)
    slack = sum_error / mass
    if high == 0:
        # F falls to the left of t_0 (slope 1 - 1/rho) while every value lies above t_0 or
        # none lies below it, so t_0 is then a minimiser.
        if not (values_at_least_first or counts[0] >= total):
            raise ConfigError(
                "the evaluation thresholds start above the group boundary; the evaluated values are out of range"
            )
        return RiskBound(value, slack)
    low = high - 1
    slope_low, slope_high = 1.0 - counts[low] / mass, 1.0 - counts[high] / mass
    value_low = float(thresholds[low] + excess[low] / mass)
    # Two supporting lines of the convex F; their crossing lower-bounds its minimum.
    crossing = (value - value_low + slope_low * thresholds[low] - slope_high * thresholds[high]) / (
        slope_low - slope_high
    )
    lower = value_low + slope_low * (crossing - thresholds[low])
    return RiskBound(value, max(value - lower, 0.0) + 2 * slack)


def report_from_sums(summed: np.ndarray, center: float, rho: float, *, sum_error: float = 0.0) -> GroupRiskReport:
    """The federation's group risks at rho from the secure sum of the collaborators' vectors, certified.

    `center` is the evaluated model's c (it fixes the thresholds); `sum_error` bounds the
    absolute error of every summed coordinate (the encoder's bound; 0 for plain sums).
    """
    thresholds = threshold_grid(center, (summed.size - EXTRA_COORDINATES) // 4)
    k = thresholds.size
    if summed.size != vector_length(k):
        raise ConfigError(f"an evaluation sum has {summed.size} entries; expected {vector_length(k)}")
    counts, excess, negated_counts, negated_excess = (summed[i * k : (i + 1) * k] for i in range(4))
    # Counts are sums of integers; rounding them removes any encoding error.
    total, loss_sum, error_count = np.rint(summed[-3]), float(summed[-2]), float(np.rint(summed[-1]))
    worst = cvar_from_sums(
        thresholds, np.rint(counts), excess, total, rho, sum_error=sum_error, values_at_least_first=True
    )
    negated_worst = cvar_from_sums(
        -thresholds[::-1], np.rint(negated_counts), negated_excess, total, rho, sum_error=sum_error
    )
    best = 0.0 - negated_worst.value
    mean_error = error_count / total
    worst_error = min(error_count, rho * total) / (rho * total)
    best_error = max(error_count - (1.0 - rho) * total, 0.0) / (rho * total)
    return GroupRiskReport.from_risks(
        rho=rho,
        mean_risk=loss_sum / total,
        worst_risk=worst.value,
        best_risk=best,
        mean_error=mean_error,
        worst_error=worst_error,
        best_error=best_error,
        certificate=SecureSumCertificate(
            samples=int(total),
            worst_risk_gap=worst.gap,
            best_risk_gap=negated_worst.gap,
            mean_error_bound=sum_error / total,
        ),
    )
