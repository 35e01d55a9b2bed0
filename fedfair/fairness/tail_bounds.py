"""The worst-group risk's bracket and 95% interval from noised layered tail sums, the grid inside.

F(c) = c + T(c) / (rho n) is convex and piecewise linear; the layers give it at the boundaries and its secant
slopes, so on each layer the lines from its two ends with the neighbouring layers' slopes bound F's least value
from below (m_j), and F at every boundary bounds CVaR from above: min m_j <= CVaR <= min F(b_j). The 95% interval
is [min m_j - 1.96 sd, min F(b_j) + z_s sd]: the low end fails only with the one layer holding the minimiser, the
high end holds at every boundary at once (:func:`simultaneous_z`), so the boundary the noise makes look lowest
is accounted for. The figure is the bracket's middle (:func:`_widened`); whether it is resolved,
:func:`resolution_noise`. Vectorised over leading axes. Why: docs/design.md, "Inside the fairness library".
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

Z_ONE_SIDED = 1.959963984540054
"""The low end's one-sided 97.5% quantile: with the high end's simultaneous one, they fail together at most 5%."""

DRAWS = 40_000
"""Noises drawn (from a fixed seed: the same answer every time) for :func:`simultaneous_z`'s quantile, to about
+/- 0.02 of z."""


CONFIDENCE_EACH = 0.975
"""Each end's one-sided confidence."""

WIDENING = 2.5
"""How many brackets the interval reaches each side of its middle, at least (:func:`_widened`)."""


@dataclass(frozen=True)
class WorstBounds:
    """Per noise (leading axes of the inputs): the bracket [lower, upper] and the 95% interval [low, high].

    `lower` and `upper` are the bounds the noised answers give as if they were exact (noise-free, CVaR lies
    between them); `low` and `high` add each bound's noise margin (:func:`_widened`).
    """

    lower: np.ndarray
    upper: np.ndarray
    low: np.ndarray
    high: np.ndarray
    value: np.ndarray
    """The bracket's middle (kept inside the interval): the figure whose largest discretisation error is least."""
    point: np.ndarray
    """The boundary whose noised F is least."""


def worst_bounds(
    points: np.ndarray,
    layers: np.ndarray,
    layers_var: np.ndarray,
    rows: np.ndarray | float,
    rows_sd: float,
    rho: float,
) -> WorstBounds:
    """The worst-group risk's bracket and 95% interval from noised layer sums.

    Args:
        points: the K + 1 boundaries 0 = b_0 < ... < b_K = cap.
        layers: (..., K) the noised sums of clip(l - b_j, 0, b_(j+1) - b_j) over the clipped losses.
        layers_var: (K,) each layer sum's noise variance.
        rows: (...) the noised row count n (positive).
        rows_sd: the row count's noise standard deviation.
        rho: the worst group's share, in (0, 1).
    """
    points = np.asarray(points, dtype=np.float64)
    layers = np.asarray(layers, dtype=np.float64)
    n = np.asarray(rows, dtype=np.float64)[..., None]
    mass = rho * n
    widths = np.diff(points)
    k = widths.size
    # T(b_j), j = 0..K, and the variance of its noise (the layers above b_j; none at the cap).
    tails = np.concatenate([np.cumsum(layers[..., ::-1], axis=-1)[..., ::-1], np.zeros_like(layers[..., :1])], -1)
    tails_var = np.append(np.cumsum(layers_var[::-1])[::-1], 0.0)
    f = points + tails / mass
    # Upper ends: F(b_j) + z sd, the row count entering as (F - b) sd_n / n.
    f_sd = np.hypot(np.sqrt(tails_var) / mass, (f - points) * rows_sd / n)
    upper_each = f + simultaneous_z(layers_var) * f_sd
    # Secant slopes 1 - (layer / width) / (rho n) of F over each layer, kept in the slopes F can have
    # ([1 - 1 / rho, 1]: 0 <= N <= n); outside the grid F's slope is 1 - 1 / rho below 0 and 1 above the cap.
    lowest = 1.0 - 1.0 / rho
    slopes = np.clip(1.0 - layers / widths / mass, lowest, 1.0)
    shape = slopes.shape[:-1]
    left = np.concatenate([np.full((*shape, 1), lowest), slopes[..., :-1]], -1)  # s_(j-1) per layer j
    right = np.concatenate([slopes[..., 1:], np.ones((*shape, 1))], -1)  # s_(j+1) per layer j
    start, end = f[..., :-1], f[..., 1:]
    # The lines g1 = F(b_j) + left x and g2 = F(b_(j+1)) - right (w - x), x = c - b_j in [0, w]: their maximum is
    # least at the crossing when it lies inside, else at an end.
    with np.errstate(divide="ignore", invalid="ignore"):
        crossing = (start - end + right * widths) / (right - left)
    crossing = np.where(right > left, np.clip(np.nan_to_num(crossing, nan=0.0), 0.0, widths), 0.0)
    candidates = np.stack([np.zeros_like(crossing), np.broadcast_to(widths, crossing.shape), crossing], -1)
    g1 = start[..., None] + left[..., None] * candidates
    g2 = end[..., None] - right[..., None] * (widths[..., None] - candidates)
    envelope = np.maximum(g1, g2)
    best = np.argmin(envelope, axis=-1)
    x = np.take_along_axis(candidates, best[..., None], -1)[..., 0]
    bound = np.take_along_axis(envelope, best[..., None], -1)[..., 0]
    line1 = np.take_along_axis(g1, best[..., None], -1)[..., 0]
    line2 = np.take_along_axis(g2, best[..., None], -1)[..., 0]
    # The weight on g1 at the least maximum: the mix of the two lines with slope 0 at a crossing, else the higher.
    with np.errstate(divide="ignore", invalid="ignore"):
        mixed = np.where(right > left, right / (right - left), 0.5)
    inside = (x > 0.0) & (x < widths) & np.isclose(line1, line2, rtol=0.0, atol=1e-12 * (1.0 + np.abs(bound)))
    weight = np.where(inside, np.clip(mixed, 0.0, 1.0), (line1 >= line2).astype(np.float64))
    # Its noise in T units: the layers above b_(j+2) once; layer j+1 once plus its slope's reach; layer j through
    # g1's T(b_j); layer j-1 through g1's slope.
    above = np.append(tails_var[2:], [0.0])  # the layers above b_(j+2), per layer j (none for the last)
    var_previous = np.concatenate([[0.0], layers_var[:-1]])
    var_next = np.append(layers_var[1:], 0.0)
    width_previous = np.concatenate([[1.0], widths[:-1]])
    width_next = np.append(widths[1:], 1.0)
    # A layer pinched narrow (c-bar near 0) reads its slope with a noise that overflows its coefficient: infinite,
    # its bound then its own start; noise-free, none.
    with np.errstate(over="ignore", invalid="ignore"):
        coefficient_next = np.where(np.arange(k) < k - 1, 1.0 + (1.0 - weight) * (widths - x) / width_next, 0.0)
        coefficient_previous = np.where(np.arange(k) > 0, weight * x / width_previous, 0.0)
        reaches = [(coefficient_next, var_next), (weight, layers_var), (coefficient_previous, var_previous)]
        bound_var = above + sum(np.where(var > 0.0, coefficient**2 * var, 0.0) for coefficient, var in reaches)
    bound_sd = np.hypot(np.sqrt(bound_var) / mass, np.maximum(bound - points[:-1] - x, 0.0) * rows_sd / n)
    # F(c) >= c: no layer's bound lies below its own start.
    lower = np.maximum(bound, points[:-1]).min(-1)
    low = np.maximum(bound - Z_ONE_SIDED * bound_sd, points[:-1]).min(-1)
    upper, high = f.min(-1), upper_each.min(-1)
    least = Z_ONE_SIDED * np.sqrt(layers_var[-1]) / mass[..., 0]
    return _widened(lower, upper, low, high, points, least, points[np.argmin(f, axis=-1)])


def _widened(
    lower: np.ndarray,
    upper: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    points: np.ndarray,
    least: np.ndarray,
    point: np.ndarray,
) -> WorstBounds:
    """The bounds as reported: the bracket's middle, its interval at least 5 times the middle's largest error.

    The middle of [lower, upper] is within half the bracket of every value the bracket holds, so an interval
    reaching 2.5 brackets each side keeps that error within a fifth of its half-width (under the quarter the
    report promises, with room for the noise in the bracket's own ends). Where the noise leaves that half-width
    wide, the report says the figure is not resolved (:func:`resolution_noise`). The ends
    stay in [0, cap] (where CVaR lies); an interval the noise turned inside out (low above high: one end has
    failed) keeps at least `least` (the last layer's 95% noise) of width, so a noised figure never reads as
    exact.
    """
    bracket = np.maximum(upper - lower, 0.0)
    middle = (lower + upper) / 2.0
    span = 2.0 * WIDENING * bracket  # kept whole at a range end: the reach 0 or the cap cuts goes to the other side
    low = np.maximum(np.minimum(low, middle - WIDENING * bracket), 0.0)
    high = np.minimum(np.maximum(np.maximum(high, middle + WIDENING * bracket), low + span), points[-1])
    low = np.minimum(low, np.maximum(high - span, 0.0))
    low = np.minimum(low, np.maximum(high - least, 0.0))
    high = np.maximum(high, np.minimum(low + least, points[-1]))
    return WorstBounds(lower, upper, low, high, np.clip(middle, low, high), point)


def resolution_noise(
    points: np.ndarray, layers_var: np.ndarray, threshold: float, counted: np.ndarray | float, rho: float
) -> np.ndarray:
    """The 95% half-width the noise gives F at c-bar over `counted` rows: what decides whether a figure is resolved.

    `counted` must be a row count whose noise is independent of the layers' and of the row count's (the sum of
    the label counts, a separate part of the release): a decision on it selects no draws whose noise happens to
    make the interval look narrow. A rule on the interval's own width would (a draw pushed towards 0 or the cap
    is clamped narrow, and its figure is off), and so would one on the noised row count (a count noised high
    shrinks every figure and the stated noise with it). c-bar is public and fixed before any noise; infinite
    where the count is not positive.
    """
    tails_var = np.cumsum(np.asarray(layers_var, dtype=np.float64)[::-1])[::-1]
    reference = min(int(np.searchsorted(points, threshold)), tails_var.size - 1)
    rows = np.asarray(counted, dtype=np.float64)
    with np.errstate(divide="ignore"):
        noise: np.ndarray = np.where(
            rows > 0.0, Z_ONE_SIDED * math.sqrt(float(tails_var[reference])) / (rho * rows), np.inf
        )
    return noise


def simultaneous_z(layers_var: np.ndarray) -> float:
    """The z whose band F(b_j) + z sd_j holds at every boundary below the cap at once with probability 97.5%.

    The noise of F(b_j) is the sum of the layers' above b_j: a random walk down from the cap, its standardised
    values strongly correlated, so the band needs less than Bonferroni's z (about 2.73 for 30 even layers against
    3.15). Its 2.5% quantile of the least standardised value, drawn from a fixed seed; the row count's noise is
    common to every boundary and left to each boundary's own sd. It depends on the variances' proportions alone.
    """
    variances = np.asarray(layers_var, dtype=np.float64)
    if not (variances > 0.0).any():
        return Z_ONE_SIDED
    return _simultaneous_z(tuple(np.round(variances / variances.max(), 12)))


@functools.lru_cache(maxsize=64)
def _simultaneous_z(proportions: tuple[float, ...]) -> float:
    """:func:`simultaneous_z` of variances in these proportions (cached: a query's widths repeat every call)."""
    variances = np.array(proportions)
    noises = np.random.default_rng(20_771).standard_normal((DRAWS, variances.size)) * np.sqrt(variances)
    walks = np.cumsum(noises[:, ::-1], axis=1)[:, ::-1]
    spread = np.sqrt(np.cumsum(variances[::-1])[::-1])
    least = (walks[:, spread > 0.0] / spread[spread > 0.0]).min(axis=1)
    return float(-np.quantile(least, 1.0 - CONFIDENCE_EACH))
