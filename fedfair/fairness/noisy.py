"""Group risks at rho from a noised histogram tree, each with a bound that holds with a stated probability.

Not the runtime's: a noised federation answers the tail sums of :mod:`fedfair.fairness.tail`. This
report (``sums.report_from_sums(noise_std=...)``) is kept for ``benchmarks/eval_error.py``'s "before"
row, which measures what the tail sums replaced, and its tests; the runtime uses only
:data:`NOISE_FAILURE` (the composition counts' confidence). A decoded tree carries, on every coordinate,
noise of standard deviation sigma plus a rounding error of at most `sum_error`, so this report never
refuses for thin buckets; it states how far each figure may be from the truth instead.

Why: docs/design.md, "Inside the fairness library".
"""

from __future__ import annotations

import math

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.fairness.histogram import Layout, RangeSums, range_nodes
from fedfair.fairness.report import GroupRiskReport, SecureSumCertificate

NOISE_FAILURE = 0.05
"""The default probability that some bound of a noised report fails (its confidence is 1 - this)."""


def _interval(value: float, bound: float, low: float, high: float) -> tuple[float, float]:
    """[value - bound, value + bound] intersected with [low, high], which holds the truth: its middle and half-width."""
    lower, upper = max(value - bound, low), min(value + bound, high)
    if lower > upper:  # only if the event failed; the range alone is then all that is known
        lower, upper = low, high
    return (lower + upper) / 2.0, (upper - lower) / 2.0


def _non_increasing(values: np.ndarray) -> np.ndarray:
    """The midpoint of the running minimum from the left and the running maximum from the right."""
    left = np.minimum.accumulate(values)
    right = np.maximum.accumulate(values[::-1])[::-1]
    repaired: np.ndarray = (left + right) / 2.0
    return repaired


class _Direction:
    """One group's estimates at every candidate threshold: S^, its error bound, and the thresholds."""

    def __init__(self, thresholds: np.ndarray, sums: np.ndarray, errors: np.ndarray, positions: np.ndarray) -> None:
        self.thresholds, self.sums, self.errors, self.positions = thresholds, sums, errors, positions

    def best(self, rho: float, n: float, n_error: float, cap: float, worst: bool) -> tuple[float, float]:
        """(value, bound) of min F (worst) or max G (best) over the level of candidates whose bound is smallest."""
        n_low = n - n_error
        found: tuple[float, float] | None = None
        for level in range(int(self.positions.max()).bit_length() + 1):
            keep = (self.positions % (1 << level) == 0) | (self.thresholds == cap) | (self.thresholds == 0.0)
            t, error = self.thresholds[keep], float(self.errors[keep].max())
            # S_B(t) <= (B - t) n (worst: losses above t) or t n (best: losses below t).
            room = (cap - t) if worst else t
            estimate = self.sums[keep] if worst else self.sums[keep][::-1]
            estimate = np.clip(_non_increasing(estimate), 0.0, room[:: 1 if worst else -1] * (n + n_error))
            estimate = estimate if worst else estimate[::-1]
            share = np.minimum(room, (estimate + error) / max(n_low, 1e-300)) / rho
            slack = error / (rho * n) + float((share * n_error / n).max())
            gap = float(np.diff(t).max()) / 2.0
            values = t + estimate / (rho * n) if worst else t - estimate / (rho * n)
            value = float(values.min()) - gap if worst else float(values.max()) + gap
            if found is None or slack + gap < found[1]:
                found = (value, slack + gap)
        assert found is not None
        return found


def noisy_report(
    layout: Layout,
    counts: np.ndarray,
    offsets: np.ndarray,
    error_count: float,
    rho: float,
    *,
    noise_std: float,
    sum_error: float,
    loss_cap: float,
    failure: float,
) -> GroupRiskReport:
    """The group risks of the losses clipped at the cap, from a noised tree, with bounds (see the module doc)."""
    grid = layout.thresholds
    if not grid[0] < loss_cap <= grid[-1]:
        raise ConfigError(f"the loss cap must lie in ({grid[0]:g}, {grid[-1]:g}], got {loss_cap}")
    if not 0.0 < failure < 1.0:
        raise ConfigError(f"the failure probability of a noised report must be in (0, 1), got {failure}")
    cap_index = int(np.searchsorted(grid, loss_cap, side="left"))
    cap = float(grid[cap_index])
    levels_counts, levels_offsets = layout.split(counts), layout.split(offsets)
    # Worst: leaves [a, cap_index + 1) above t_{a-1}, plus the count of the leaves above the cap.
    starts = np.arange(cap_index + 2)
    above = range_nodes(layout, levels_counts, levels_offsets, np.array([cap_index + 1]), np.array([grid.size]))
    upper = range_nodes(layout, levels_counts, levels_offsets, starts, np.full(starts.size, cap_index + 1))
    upper_t = grid[np.maximum(starts - 1, 0)]
    # Best: leaves [0, e) at or below t_{e-1}.
    ends = np.arange(1, cap_index + 2)
    lower = range_nodes(layout, levels_counts, levels_offsets, np.zeros(ends.size, dtype=np.int64), ends)
    lower_t = grid[ends - 1]
    z = math.sqrt(2.0 * math.log(2.0 * (starts.size + ends.size + 2) / failure))

    def bound(sums: RangeSums, t: np.ndarray, sign: float, extra_nodes: float, extra: np.ndarray) -> np.ndarray:
        # Coefficients sign (lo - t) on counts and (hi - lo) on offsets, plus `extra` on `extra_nodes` counts.
        variance = sums.low2 - 2 * t * sums.low + t * t * sums.nodes + sums.width2 + extra * extra * extra_nodes
        absolute = sign * (sums.low - t * sums.nodes) + sums.width + extra * extra_nodes
        errors: np.ndarray = z * noise_std * np.sqrt(np.maximum(variance, 0.0)) + sum_error * absolute
        return errors

    worst_sums = upper.low_count - upper_t * upper.count + upper.width_offset + (cap - upper_t) * above.count[0]
    worst_errors = bound(upper, upper_t, 1.0, float(above.nodes[0]), cap - upper_t)
    best_sums = lower_t * lower.count - lower.low_count - lower.width_offset
    best_errors = bound(lower, lower_t, -1.0, 0.0, np.zeros(ends.size))
    n_error = z * noise_std + sum_error
    n = max(float(levels_counts[-1][0]), 1.0)
    worst = _Direction(upper_t, worst_sums, worst_errors, starts).best(rho, n, n_error, cap, worst=True)
    best = _Direction(lower_t, best_sums, best_errors, ends).best(rho, n, n_error, cap, worst=False)
    worst_risk, worst_gap = _interval(*worst, 0.0, cap)
    best_risk, best_gap = _interval(*best, 0.0, cap)
    # The mean is F at t = 0 with rho = 1: the first worst candidate.
    total, total_error = float(worst_sums[0]), float(worst_errors[0])
    mean_share = min(cap, (max(total, 0.0) + total_error) / max(n - n_error, 1e-300))
    mean_risk, mean_bound = _interval(total / n, total_error / n + mean_share * n_error / n, 0.0, cap)
    mean_error, error_bound = _interval(error_count / n, 2.0 * n_error / n, 0.0, 1.0)
    return GroupRiskReport.from_risks(
        rho=rho,
        mean_risk=mean_risk,
        worst_risk=worst_risk,
        best_risk=best_risk,
        mean_error=mean_error,
        worst_error=min(mean_error, rho) / rho,
        best_error=max(mean_error - (1.0 - rho), 0.0) / rho,
        certificate=SecureSumCertificate(
            samples=int(round(max(float(levels_counts[-1][0]), 0.0))),
            worst_risk_gap=worst_gap,
            best_risk_gap=best_gap,
            mean_error_bound=mean_bound,
            error_rate_bound=error_bound,
            disparity_bound=0.0 if rho >= 1.0 else (worst_gap + mean_bound) / (1.0 - rho),
            noise_std=noise_std,
            confidence=1.0 - failure,
            loss_cap=cap,
        ),
    )
