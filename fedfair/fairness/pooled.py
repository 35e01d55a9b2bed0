"""Group risk at a protected group size rho: worst group, best group, mean, disparity.

The worst group at rho is the rho-fraction of held-out samples with the highest
values (the paper's high-risk group); its risk is CVaR_rho. The best group is the
rho-fraction with the lowest values. Both use a fractional weight on the boundary
sample, so they are defined for every rho in (0, 1] and any number of samples.

Two forms of the same numbers:

- From per-sample values held in one place (`group_risk_report`): the simulation,
  or one institution looking at its own data.
- From secure sums (`worst_group_risk_from_queries` and friends): a federated test
  set where no per-sample loss may leave its institution. This works because

      CVaR_rho(l) = min_c  c + sum((l - c)+) / (rho n),

  and for a fixed c the right-hand side needs only three sums over all samples,
  which each institution computes on its own losses and secure aggregation adds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.core.objective import cvar

ThresholdQuery = Callable[[float], tuple[float, float, float]]
"""q(c) -> (count of l > c, sum of (l - c)+, count of all l), summed over institutions."""


def _values(name: str, values: np.ndarray, *, allow_empty: bool = False) -> np.ndarray:
    """Per-sample values as a flat float64 array; refuse non-finite input, and empty input unless allowed."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or (array.size == 0 and not allow_empty):
        raise ConfigError(f"{name} must be a non-empty 1-D array of per-sample values, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ConfigError(f"{name} contains NaN or Inf; evaluate a finite model (check the learning rate)")
    return array


def _check_rho(rho: float) -> None:
    if not 0.0 < rho <= 1.0:
        raise ConfigError(f"rho must be in (0, 1], got {rho}; it is the protected group fraction, e.g. --rho 0.3")


def worst_group_risk(values: np.ndarray, rho: float) -> float:
    """Mean of the highest rho-fraction of values (CVaR_rho), boundary sample weighted fractionally."""
    _check_rho(rho)
    return cvar(_values("values", values), rho)


def best_group_risk(values: np.ndarray, rho: float) -> float:
    """Mean of the lowest rho-fraction of values: the worst group of the negated values, negated."""
    _check_rho(rho)
    # 0.0 - x rather than -x: a zero risk reads 0.0, not -0.0, in reports.
    return 0.0 - cvar(-_values("values", values), rho)


@dataclass(frozen=True)
class GroupRiskReport:
    """Risk (cross-entropy) and 0-1 error of a model on held-out data, overall and by group at rho.

    Losses and errors each rank the samples by their own value, so the worst group
    for the error is the rho-fraction of samples with the most errors, which need
    not be the samples with the highest loss.
    """

    rho: float
    mean_risk: float
    worst_risk: float
    best_risk: float
    disparity: float
    accuracy: float
    mean_error: float
    worst_error: float
    best_error: float
    error_disparity: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def group_risk_report(losses: np.ndarray, correct: np.ndarray, rho: float) -> GroupRiskReport:
    """Group risks at rho from per-sample losses and per-sample correctness (bool or 0/1)."""
    _check_rho(rho)
    losses = _values("losses", losses)
    hits = _values("correct", correct)
    if hits.shape != losses.shape:
        raise ConfigError(f"losses and correct must have one entry per sample, got {losses.shape} and {hits.shape}")
    if not np.isin(hits, (0.0, 1.0)).all():
        raise ConfigError("correct must hold only 0/1 (or False/True) per sample")
    errors = 1.0 - hits
    worst, best = worst_group_risk(losses, rho), best_group_risk(losses, rho)
    worst_error, best_error = worst_group_risk(errors, rho), best_group_risk(errors, rho)
    mean_error = float(errors.mean())
    return GroupRiskReport(
        rho=rho,
        mean_risk=float(losses.mean()),
        worst_risk=worst,
        best_risk=best,
        disparity=worst - best,
        accuracy=1.0 - mean_error,
        mean_error=mean_error,
        worst_error=worst_error,
        best_error=best_error,
        error_disparity=worst_error - best_error,
    )


# Secure-sum form. An institution answers a threshold query from its own losses;
# the federation sees only the sum of the answers over institutions (what secure
# aggregation reveals), never a per-sample loss nor one institution's answer.


def local_threshold_query(losses: np.ndarray, c: float) -> tuple[float, float, float]:
    """One institution's answer to q(c): (count of l > c, sum of (l - c)+, count of l).

    These three numbers are all that leaves the institution, and only as its share
    of a secure sum: its per-sample losses, and even its own totals, stay private.
    For the best group an institution answers for its negated losses instead
    (`local_threshold_query(-losses, c)`), because the lowest values of l are the
    highest values of -l. An institution without held-out data answers (0, 0, 0).
    """
    values = _values("losses", losses, allow_empty=True)
    excess = values - c
    above = excess > 0.0
    return float(np.count_nonzero(above)), float(excess[above].sum()), float(values.size)


def summed_query(parts: Sequence[np.ndarray]) -> ThresholdQuery:
    """The federation's q(c) when every institution's losses are at hand (simulation, tests).

    Adds the institutions' local answers in the clear, which is exactly the sum a
    secure-aggregation round returns for the same inputs.
    """
    held = [_values("losses", part, allow_empty=True) for part in parts]
    if not held:
        raise ConfigError("a threshold query needs at least one institution's losses")

    def query(c: float) -> tuple[float, float, float]:
        answers = np.array([local_threshold_query(part, c) for part in held])
        count, excess, total = answers.sum(axis=0)
        return float(count), float(excess), float(total)

    return query


def worst_group_risk_from_queries(
    query: ThresholdQuery, rho: float, lower: float, upper: float, tolerance: float = 1e-9
) -> float:
    """CVaR_rho of the federation's losses from threshold queries alone (bisection on c).

    F(c) = c + S(c) / (rho n), with S(c) = sum((l - c)+), is convex and piecewise
    linear in c; its minimum is CVaR_rho and its minimisers are the (1 - rho)-quantiles.
    Its right slope at c is g(c) = 1 - A(c) / (rho n), A(c) = #{l > c}, which one
    query returns. g(c) < 0 puts every minimiser above c; g(c) >= 0 puts one at or
    below c. Bisection on that sign keeps a minimiser c* in [lo, hi] with g(hi) >= 0.

    Exactness: convexity gives F(c*) >= F(hi) + g_left(hi) (c* - hi) with the left
    slope g_left(hi) <= g(hi) <= 1 and hi - c* >= 0, so

        0 <= F(hi) - CVaR_rho <= g(hi) * (hi - c*) <= g(hi) * (hi - lo) <= hi - lo.

    We stop once g(hi) * (hi - lo) <= tolerance and return F(hi): an upper bound on
    CVaR_rho within `tolerance` (plus float64 rounding of the sums, about n * 1e-16
    relative), exact when g(hi) = 0. It takes at most 1 + ceil(log2((upper - lower) / tolerance))
    queries, each one secure-sum round, and sees nothing but their sums.

    `lower` must not exceed any loss (0 for cross-entropy and 0-1 error); this cannot be
    checked from counts of l > c. `upper` must leave at most a rho-fraction of losses
    above it (any bound on the losses does); one query checks it.
    """
    _check_rho(rho)
    if not (np.isfinite(lower) and np.isfinite(upper) and lower < upper):
        raise ConfigError(f"need finite lower < upper to bracket the quantile, got [{lower}, {upper}]")
    if not tolerance > 0.0:
        raise ConfigError(f"tolerance must be positive, got {tolerance}; e.g. 1e-9")
    count, excess, total = query(upper)
    if not total > 0.0:
        raise ConfigError("the threshold query reports no samples; every institution needs held-out data")
    mass = rho * total
    if count > mass:
        raise ConfigError(f"over a rho-fraction of losses exceed upper={upper}; raise upper above the largest loss")
    lo, hi = float(lower), float(upper)
    while (1.0 - count / mass) * (hi - lo) > tolerance:
        middle = 0.5 * (lo + hi)
        if not lo < middle < hi:
            break  # float64 cannot split the bracket further; the bound above still holds at this width
        middle_count, middle_excess, _ = query(middle)
        if middle_count > mass:
            lo = middle
        else:
            hi, count, excess = middle, middle_count, middle_excess
    return hi + excess / mass


def best_group_risk_from_queries(
    negated_query: ThresholdQuery, rho: float, lower: float, upper: float, tolerance: float = 1e-9
) -> float:
    """Mean of the lowest rho-fraction of losses from queries on the negated losses.

    `negated_query` answers q(c) for -l (each institution calls
    `local_threshold_query(-losses, c)`); `lower` and `upper` bound l itself. The
    result is -CVaR_rho(-l), a lower bound on the best-group risk within `tolerance`.
    """
    return 0.0 - worst_group_risk_from_queries(negated_query, rho, -upper, -lower, tolerance)


def mean_from_query(query: ThresholdQuery, lower: float) -> float:
    """Mean loss from one query at c = lower: (l - lower)+ = l - lower when no loss is below `lower`."""
    _, excess, total = query(lower)
    if not total > 0.0:
        raise ConfigError("the threshold query reports no samples; every institution needs held-out data")
    return lower + excess / total
