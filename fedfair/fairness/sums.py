"""Group risk at rho for a federated test set, from secure sums alone: the math, without any I/O.

This is the form the runtime uses: every collaborator holds its own held-out losses
and none may leave it, so the aggregator sees only the secure sum of fixed-size
vectors (`local_answers`), from which `report_from_sums` builds the report. Whoever
holds every loss in one place uses `fedfair.fairness.pooled` instead.

Why: docs/design.md, "Inside the fairness library".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.fairness import histogram, noisy
from fedfair.fairness.report import GroupRiskReport, SecureSumCertificate
from fedfair.secagg.encode import EncodingConfig

THRESHOLDS = 4096
"""K, thresholds per direction: half spaced evenly over the plan's loss range, half geometric."""

GEOMETRIC_RANGE = (1e-6, 1e4)
"""The geometric half of the grid covers losses from here to there."""

LOSS_RANGE = (0.0, 3.0)
"""The default dense range: cross-entropy losses around the worst group's boundary (plan: [evaluation] loss_range)."""

MIN_BUCKET_COUNT = 10
"""The default fewest samples between the two thresholds a reported group risk rests on."""

RECORD_L1, RECORD_L2 = histogram.record_sensitivity(THRESHOLDS)
"""How far one held-out record (added or removed) moves a collaborator's evaluation vector, in
L1 and L2 norm, in real units (multiply by 2^f of `ENCODING` for encoded ones): one count and
one offset in [0, 1] per level of the tree, and the error count. 27 and sqrt(27) for K = 4096."""


ENCODING = EncodingConfig(clip=2.0**30, max_weight=1.0, fractional_bits=20, modulus_bits=64)
"""Fixed-point encoding of evaluation vectors (each sent with weight 1): counts and offset
sums up to 2^30 per collaborator, 2^-20 resolution, no wraparound for up to 8191 parties;
counts, being integers, come out of an exact sum exact."""


def vector_length(thresholds: int = THRESHOLDS) -> int:
    """Length of one collaborator's evaluation vector for K thresholds (a power of two).

    The tree's counts, its offset sums, the error count.
    """
    return 2 * histogram.node_count(thresholds) + 1


def check_loss_range(loss_range: tuple[float, float]) -> tuple[float, float]:
    """Return ``(low, high)`` if 0 <= low < high <= the geometric half's top, else raise ConfigError."""
    low, high = (float(value) for value in loss_range)
    if not (math.isfinite(low) and math.isfinite(high) and 0.0 <= low < high <= GEOMETRIC_RANGE[1]):
        raise ConfigError(
            f"the evaluation's loss range must be [low, high] with 0 <= low < high <= {GEOMETRIC_RANGE[1]:g}, "
            f"got {[low, high]}; cover the losses where the worst group's boundary lies, e.g. [0.0, 3.0]"
        )
    return low, high


def threshold_grid(loss_range: tuple[float, float] = LOSS_RANGE, count: int = THRESHOLDS) -> np.ndarray:
    """The public thresholds of every evaluation of a federation: 0, then increasing, `count` in all.

    Half are spaced evenly over the plan's `loss_range` (where the worst group's
    boundary should lie), the rest geometric over GEOMETRIC_RANGE (the best group, and
    a boundary outside the range). The grid depends on the plan alone, never on a
    value of the round, so the aggregator cannot move thresholds to where it wants
    counts; each side computes it from its own copy of the plan, and it travels nowhere.
    """
    if count < 8:
        raise ConfigError(f"an evaluation needs at least 8 thresholds, got {count}")
    low, high = check_loss_range(loss_range)
    dense = np.linspace(low, high, count // 2)
    geometric = np.geomspace(*GEOMETRIC_RANGE, count - count // 2 - 1)
    grid = np.unique(np.concatenate([[0.0], dense, geometric]))
    # Points can coincide (0 itself when the range starts there): top up with geometric midpoints,
    # smallest first, so the vector length stays fixed without a threshold above the top (whose
    # negated sums would overflow the encoding sooner).
    spare = np.setdiff1d(np.sqrt(geometric[:-1] * geometric[1:]), grid)[: count - grid.size]
    grid = np.union1d(grid, spare)
    if grid.size != count:
        raise ConfigError(f"the loss range {[low, high]} is too narrow to hold distinct thresholds; widen it")
    return grid


def local_answers(losses: np.ndarray, errors: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """One collaborator's evaluation vector: what it adds to the secure sum, and all it reveals.

    [the histogram tree's node counts, its node offset sums (`fedfair.fairness.histogram`,
    levels 0 to H each), the number of errors]; one record moves it by at most `RECORD_L1`
    and `RECORD_L2`.
    """
    values = np.asarray(losses, dtype=np.float64).reshape(-1)
    wrong = np.asarray(errors, dtype=np.float64).reshape(-1)
    if values.shape != wrong.shape:
        raise ConfigError("losses and errors need one entry per held-out sample")
    if not np.isfinite(values).all() or (values < 0).any():
        raise ConfigError("held-out losses must be finite and non-negative; the evaluated model has diverged")
    if not np.isin(wrong, (0.0, 1.0)).all():
        raise ConfigError("errors must be 0 or 1 per held-out sample")
    if values.size > ENCODING.clip:
        raise ConfigError(
            f"{values.size} held-out samples exceed {ENCODING.clip:g}, the most the evaluation encoding holds; "
            "evaluate on fewer samples per collaborator"
        )
    counts, offsets = histogram.local_histogram(histogram.Layout.of(thresholds), values)
    return np.concatenate([counts, offsets, [float(wrong.sum())]])


def cumulative(
    leaves: np.ndarray, offsets: np.ndarray, thresholds: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """From the leaves' counts and offset sums, at every threshold t_j.

    A(t_j) = #{l > t_j}, S(t_j) = sum (l - t_j)+, #{l <= t_j} and sum (t_j - l)+ (of the losses clipped at
    t_{K-1}).

    Each is a running sum of non-negative terms, so no cancellation: S(t_j) - S(t_{j+1}) =
    w (offsets_{j+1} + A(t_{j+1})) and the shortfall rises by w (#{l <= t_j} - offsets_j),
    w = t_{j+1} - t_j or t_j - t_{j-1} the leaf's width.
    """
    widths = np.diff(thresholds)
    above = np.append(np.cumsum(leaves[::-1])[::-1][1:], 0.0)
    excess = np.append(np.cumsum((widths * (offsets[1:] + above[1:]))[::-1])[::-1], 0.0)
    at_most = np.cumsum(leaves)
    shortfall = np.concatenate([[0.0], np.cumsum(widths * (at_most[1:] - offsets[1:]))])
    return above, excess, at_most, shortfall


@dataclass(frozen=True)
class RiskBound:
    """CVaR_rho from threshold sums: the reported value (an upper bound), a certified gap, and what they rest on.

    `bracket` is the threshold pair (lo, hi) the value and the gap come from (None when the
    first threshold is a minimiser and the gap is 0), `bucket` how many values lie in (lo, hi].
    """

    value: float
    gap: float
    bracket: tuple[float, float] | None
    bucket: int


def _widened(thresholds: np.ndarray, counts: np.ndarray, low: int, high: int, least: int) -> tuple[int, int]:
    """The narrowest threshold pair lo' <= low < high <= hi' with at least `least` values in (t[lo'], t[hi']].

    Counts fall along the grid, so for each lo' the first hi' that holds enough is found
    by bisection; of those pairs the narrowest wins (the nearest to (low, high) on a tie).
    """
    lows = np.arange(low, -1, -1)
    # First index whose count is at most counts[lo'] - least: bisection on the rising -counts.
    highs = np.maximum(np.searchsorted(-counts, least - counts[lows], side="left"), high)
    usable = highs < thresholds.size
    if not usable.any():
        raise ConfigError(
            f"fewer than {least} held-out values lie between any two thresholds around the group boundary, "
            "so a reported group risk would rest on a handful of samples; evaluate on more data or lower "
            "[evaluation] min_bucket_count"
        )
    lows, highs = lows[usable], highs[usable]
    best = int(np.argmin(thresholds[highs] - thresholds[lows]))
    chosen_low, chosen_high = int(lows[best]), int(highs[best])
    if counts[chosen_low] - counts[chosen_high] < least:
        # Only sums that are not counts of one set of values (a broken contributor) get here.
        raise ConfigError("the evaluation's counts do not fall along the thresholds; a contributor sent broken sums")
    return chosen_low, chosen_high


def cvar_from_sums(
    thresholds: np.ndarray,
    counts: np.ndarray,
    excess: np.ndarray,
    total: float,
    rho: float,
    *,
    sum_error: float = 0.0,
    values_at_least_first: bool = False,
    min_bucket_count: int = 1,
) -> RiskBound:
    """CVaR_rho of the summed values from A and S at increasing thresholds (see the module doc).

    `values_at_least_first`: no value lies below thresholds[0] (losses >= 0), so a
    first threshold that already has at most a rho-fraction above it is a minimiser.
    `min_bucket_count`: the bracket (lo, hi] the result rests on must hold at least this
    many values; a thinner one is widened to the narrowest pair that does (the gap grows
    with it), and with no such pair the result is refused. 1 never widens: the
    boundary bucket always holds a value.
    """
    if not 0.0 < rho <= 1.0:
        raise ConfigError(f"rho must be in (0, 1], got {rho}")
    if not total > 0:
        raise ConfigError("the evaluation sums report no held-out samples; every collaborator needs test data")
    if min_bucket_count < 1:
        raise ConfigError(f"min_bucket_count must be at least 1, got {min_bucket_count}")
    mass = rho * total
    within = np.flatnonzero(counts <= mass)
    if within.size == 0:
        raise ConfigError(
            f"over a {rho:g} fraction of held-out losses exceed {thresholds[-1]:g}; the evaluated model has diverged"
        )
    high = int(within[0])
    slack = sum_error / mass
    if high == 0:
        # F falls to the left of t_0 (slope 1 - 1/rho) while every value lies above t_0 or
        # none lies below it, so t_0 is then a minimiser.
        if not (values_at_least_first or counts[0] >= total):
            raise ConfigError(
                "the evaluation thresholds start above the group boundary; the evaluated values are out of range"
            )
        return RiskBound(float(thresholds[0] + excess[0] / mass), slack, None, 0)
    low, high = _widened(thresholds, counts, high - 1, high, min_bucket_count)
    value = float(thresholds[high] + excess[high] / mass)
    slope_low, slope_high = 1.0 - counts[low] / mass, 1.0 - counts[high] / mass
    value_low = float(thresholds[low] + excess[low] / mass)
    # Two supporting lines of the convex F; their crossing lower-bounds its minimum.
    crossing = (value - value_low + slope_low * thresholds[low] - slope_high * thresholds[high]) / (
        slope_low - slope_high
    )
    lower = value_low + slope_low * (crossing - thresholds[low])
    bracket = (float(thresholds[low]), float(thresholds[high]))
    return RiskBound(value, max(value - lower, 0.0) + 2 * slack, bracket, int(counts[low] - counts[high]))


def report_from_sums(
    summed: np.ndarray,
    thresholds: np.ndarray,
    rho: float,
    *,
    min_bucket_count: int = MIN_BUCKET_COUNT,
    sum_error: float = 0.0,
    noise_std: float = 0.0,
    loss_cap: float = LOSS_RANGE[1],
    failure: float = noisy.NOISE_FAILURE,
) -> GroupRiskReport:
    """The federation's group risks at rho from the secure sum of the collaborators' vectors, certified.

    `thresholds` is the plan's grid (`threshold_grid` of its loss range, the one every
    collaborator answered); `sum_error` bounds the absolute deterministic error of every
    summed coordinate (the encoder's rounding; 0 for plain sums; never the noise).

    `noise_std` 0: exact sums. Each group risk rests on a threshold pair holding at least
    `min_bucket_count` samples, widened if need be, so the report never turns on a handful
    of individual losses (see the module doc for what the raw sums themselves reveal).

    `noise_std` > 0: the standard deviation of the noise on each decoded coordinate. The
    report is of the losses clipped at `loss_cap` (rounded up to the grid; the plan's loss
    range top), every figure with a bound that holds, all at once, with probability at least
    1 - `failure` (`fedfair.fairness.noisy`); `min_bucket_count` plays no part, since no
    decoded count is exact.
    """
    k = thresholds.size
    if summed.size != vector_length(k):
        raise ConfigError(f"an evaluation sum has {summed.size} entries; expected {vector_length(k)}")
    if not (math.isfinite(noise_std) and noise_std >= 0.0 and math.isfinite(sum_error) and sum_error >= 0.0):
        raise ConfigError(f"noise_std and sum_error must be finite and non-negative, got {noise_std} and {sum_error}")
    nodes = histogram.node_count(k)
    layout = histogram.Layout.of(thresholds)
    counts, offsets, error_count = summed[:nodes], summed[nodes : 2 * nodes], float(summed[-1])
    if noise_std > 0.0:
        return noisy.noisy_report(
            layout,
            counts,
            offsets,
            error_count,
            rho,
            noise_std=noise_std,
            sum_error=sum_error,
            loss_cap=loss_cap,
            failure=failure,
        )
    # Counts are sums of integers; rounding them removes any encoding error.
    leaves, leaf_offsets = np.rint(counts[:k]), offsets[:k]
    total, error_count = float(leaves.sum()), float(np.rint(error_count))
    if 0 < total < min_bucket_count:
        raise ConfigError(
            f"the evaluation covers {int(total)} held-out samples, fewer than min_bucket_count = {min_bucket_count}; "
            "a report would expose individual losses: evaluate on more data or lower [evaluation] min_bucket_count"
        )
    above, excess, at_most, shortfall = cumulative(leaves, leaf_offsets, thresholds)
    # Only occupied leaves carry an offset error: every S is off by at most sum_error times their width.
    slack = sum_error * float(np.diff(thresholds)[leaves[1:] > 0].sum())
    worst = cvar_from_sums(
        thresholds,
        above,
        excess,
        total,
        rho,
        sum_error=slack,
        values_at_least_first=True,
        min_bucket_count=min_bucket_count,
    )
    # The negated losses at -t_j in increasing order; none is above -t_0 = 0, since losses are >= 0.
    negated_counts = at_most[::-1].copy()
    negated_counts[-1] = 0.0
    negated_worst = cvar_from_sums(
        -thresholds[::-1],
        negated_counts,
        shortfall[::-1],
        total,
        rho,
        sum_error=slack,
        min_bucket_count=min_bucket_count,
    )
    mean_bound = slack / total
    return GroupRiskReport.from_risks(
        rho=rho,
        mean_risk=float(excess[0]) / total,
        worst_risk=worst.value,
        best_risk=0.0 - negated_worst.value,
        mean_error=error_count / total,
        worst_error=min(error_count, rho * total) / (rho * total),
        best_error=max(error_count - (1.0 - rho) * total, 0.0) / (rho * total),
        certificate=SecureSumCertificate(
            samples=int(total),
            worst_risk_gap=float(worst.gap),
            best_risk_gap=float(negated_worst.gap),
            mean_error_bound=mean_bound,
            error_rate_bound=0.0,
            disparity_bound=0.0 if rho >= 1.0 else float(worst.gap + mean_bound) / (1.0 - rho),
            noise_std=0.0,
            confidence=1.0,
            loss_cap=float(thresholds[-1]),
        ),
    )
