"""The RDP of a Skellam release charged in expectation over its stochastic rounding, against the exact divergence."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.privacy import distributed, ring, rounding


def exact_divergence(alpha: int, mu: float, start: np.ndarray, shift: np.ndarray) -> float:
    """D_alpha(SR(x + v) + N || SR(x) + N), N Skellam(mu) per coordinate, summed exactly over the integers.

    Every coordinate rounds and draws its noise independently, so both sides are products of per-coordinate
    laws, each the Skellam pmf mixed over the two integers its rounding may give, and the divergence is the sum
    of the coordinates' (each a sum over the pmfs, as in :func:`~fedfair.privacy.distributed.skellam_rdp_exact`).
    """
    reach = math.ceil(np.abs(start).max() + np.abs(shift).max()) + 2
    spread = math.ceil(40.0 * math.sqrt(2.0 * mu) + 40.0)
    table = distributed.skellam_log_pmf(np.arange(-spread - 2 * reach, spread + 2 * reach + 1), mu)
    centre = spread + 2 * reach  # table[centre + k] = log P[Skellam(mu) = k]

    def law(point: float) -> np.ndarray:
        low = math.floor(point)
        fraction = point - low
        if fraction >= 1.0:  # a point just below an integer, whose fraction rounds to 1 in float64
            low, fraction = low + 1, 0.0
        window = slice(centre - reach - low - spread, centre + reach - low + spread + 1)
        down = table[window]  # k - low for k in [-spread - reach, spread + reach]
        if fraction == 0.0:
            return down
        up = table[window.start - 1 : window.stop - 1]
        mixed = np.asarray(np.logaddexp(down + math.log1p(-fraction), up + math.log(fraction)))
        # Where one of the two pmfs underflows (scipy's ive does, near e^-709 of the unscaled Bessel function), the
        # mixture would be the other's alone, far too small: leave the k out, as skellam_rdp_exact does.
        mixed[~(np.isfinite(down) & np.isfinite(up))] = -np.inf
        return mixed

    total = 0.0
    for point, move in zip(start, shift, strict=True):
        log_p, log_q = law(point + move), law(point)
        usable = np.isfinite(log_p) & np.isfinite(log_q)
        terms = alpha * log_p[usable] + (1.0 - alpha) * log_q[usable]
        top = float(terms.max())
        total += (top + math.log(float(np.exp(terms - top).sum()))) / (alpha - 1.0)
    return total


def worst_exact(alpha: int, mu: float, shift: np.ndarray, seed: int) -> float:
    """The largest exact divergence over a few offsets x of the rounded sum, in both directions."""
    starts = np.random.default_rng(seed).uniform(0.0, 1.0, (3, shift.size))
    return max(
        max(exact_divergence(alpha, mu, start, shift), exact_divergence(alpha, mu, start + shift, -shift))
        for start in starts
    )


def shifts(dimension: int, l2: float, seed: int) -> dict[str, np.ndarray]:
    """One record's moves of norm at most ``l2``: all on one coordinate, a random direction, and as many
    coordinates as fit at a half unit past an integer (each rounding's variance at its largest, 1/4)."""
    one = np.zeros(dimension)
    one[0] = l2
    spread = np.random.default_rng(seed).normal(size=dimension)
    spread *= l2 / np.linalg.norm(spread)
    level = max(0.5, math.floor(l2 / math.sqrt(dimension) - 0.5) + 0.5)
    halves = np.zeros(dimension)
    halves[: min(dimension, math.floor((l2 / level) ** 2))] = level
    return {"one": one, "spread": spread, "halves": halves}


@pytest.mark.parametrize("mu", [3.0, 50.0, 1000.0])
@pytest.mark.parametrize(("dimension", "l2"), [(6, 3.3), (16, 20.0)])
def test_expected_rounding_rdp_bounds_the_exact_divergence(mu: float, dimension: int, l2: float) -> None:
    # Joint convexity and Hoeffding's lemma make it a bound for every real shift of norm l2 and every offset: far
    # from tight at small mu (the worst rounding's bound takes over there), never below the exact divergence.
    for name, shift in shifts(dimension, l2, 1).items():
        norm, spread = float(np.linalg.norm(shift)), float(np.abs(shift).sum())
        assert norm <= l2 * (1 + 1e-12), name
        for alpha in (2, 8, 32):
            bound = rounding.expected_rounding_rdp(np.array([alpha]), mu, spread, norm, dimension)[0]
            # The exact sums are accurate to a few ulps of their terms (float64 logs of the Bessel function).
            assert bound >= worst_exact(alpha, mu, shift, alpha) * (1 - 1e-9), (name, alpha)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-12.0, 12.0), min_size=1, max_size=8),
    st.lists(st.floats(-3.0, 3.0), min_size=8, max_size=8),
    st.floats(0.5, 3000.0),
    st.sampled_from([2, 3, 5, 16, 64]),
)
def test_expected_rounding_rdp_bounds_any_shift_from_any_offset(
    moves: list[float], offsets: list[float], mu: float, alpha: int
) -> None:
    shift = np.array(moves)
    start = np.array(offsets[: shift.size])
    norm, spread = float(np.linalg.norm(shift)), float(np.abs(shift).sum())
    bound = rounding.expected_rounding_rdp(np.array([alpha]), mu, spread, norm, shift.size)[0]
    for exact in (exact_divergence(alpha, mu, start, shift), exact_divergence(alpha, mu, start + shift, -shift)):
        assert bound >= exact * (1 - 1e-9) - 1e-12


@pytest.mark.parametrize("alpha", [2, 8, 32])
def test_the_16_bit_fit_charges_its_rounding_at_the_gaussian_cost_plus_d_over_4(alpha: int) -> None:
    # Adult's 16-bit fit (f = 5: one record moves the sum by 25.6 units in m = 128 rotated coordinates). The old
    # charge, Skellam at the L2 bound rounded with beta = 2^-80, cost 1.55 times the exact divergence at
    # low orders (noise 1.24x); the expected one must hold against the exact divergence of the rounded shift and exceed the
    # Gaussian one, alpha l2^2 / (4 mu), by no more than its expansion: the rounding variance d / (4 l2^2), the
    # Hoeffding term s / 2 (1 + sqrt(d) / (2 l2))^2 with s = (alpha - 1) alpha / (4 mu), and at most 1 / mu of
    # integrality (its (2 alpha - 1) / (16 mu^2) in s and the L1 terms). The exact divergence is itself below the Gaussian one by Skellam's higher cumulants, which
    # are relatively O(alpha / mu).
    words = ring.Ring(16, 3, 2, 875.0, (875.0, 98.0, 51.0))
    release = distributed.training_noise(1.0, 1e-5, 0.8, 0.03, 200, 128, words).release
    mu, l2, dimension = release.mu, release.l2, release.rounding
    assert (dimension, l2) == (128, 25.6)
    bound = rounding.expected_rounding_rdp(np.array([alpha]), mu, release.l1, l2, dimension)[0]
    gaussian = alpha * l2 * l2 / (4.0 * mu)
    s = (alpha - 1) * alpha / (4.0 * mu)
    expansion = 1 + dimension / (4 * l2 * l2) + s / 2 * (1 + math.sqrt(dimension) / (2 * l2)) ** 2 + 1 / mu
    assert bound <= gaussian * expansion
    for name, shift in shifts(dimension, l2, 2).items():
        exact = worst_exact(alpha, mu, shift, alpha)
        assert exact <= bound, name
        assert exact >= gaussian * (np.linalg.norm(shift) / l2) ** 2 * (1 - alpha / mu), name
    old_l2 = rounding.rounded_l2(l2, dimension, distributed.ROUNDING_BETA)
    old = distributed.skellam_rdp(alpha, mu, rounding.rounded_l1(old_l2, dimension), old_l2)
    assert old > 1.3 * bound  # 1.47 times at orders 2 and 8, 1.31 at 32


def test_the_worst_rounding_bounds_high_orders() -> None:
    # At high orders the Hoeffding term grows as alpha^3 / mu^2; the bound for ||z|| < l2 + sqrt(d) caps it.
    mu, l1, l2, dimension = 50.0, 40.0, 10.0, 16
    orders = np.array([2, 256])
    worst = l2 + math.sqrt(dimension)
    capped = distributed.skellam_rdp(256, mu, min(l1 + dimension, rounding.rounded_l1(worst, dimension)), worst)
    curve = rounding.expected_rounding_rdp(orders, mu, l1, l2, dimension)
    assert curve[1] == pytest.approx(capped, rel=1e-12)
    assert curve[0] < distributed.skellam_rdp(2, mu, l1 + dimension, worst)
