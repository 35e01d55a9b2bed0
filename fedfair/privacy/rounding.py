"""Bounds for the Skellam mechanism's integers: stochastic rounding, wrap-around, and their delta add-on.

Each party rounds its scaled update to integers before adding noise and masking; these bounds turn
a real-valued sensitivity into what the accountant (:mod:`fedfair.privacy.distributed`) charges (an
integer one, or the RDP of the rounded shift in expectation), and count what conditional rounding and a
wrap modulo 2^k add to delta.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

import numpy as np

from fedfair.core.errors import ConfigError


def rounded_l2(l2: float, dimension: int, beta: float) -> float:
    """An L2 bound, holding with probability at least 1 - beta, on a stochastic rounding of a vector.

    The vector has L2 norm at most ``l2`` (encoded units) in ``dimension`` coordinates; the bound is
    (Kairouz, Liu and Steinke 2021)

        min(l2 + sqrt(d), sqrt(l2^2 + d / 4 + sqrt(2 log(1/beta)) (l2 + sqrt(d) / 2))).

    The first bound always holds (each coordinate moves by less than 1), beta = 0 selects it.

    Why it is the record-level sensitivity of a rounded sum: when one party's sum is x or x + v (v one
    record's clipped contribution) and both are rounded with the same uniforms, coordinate i of the
    difference is floor(x_i + v_i + r_i) - floor(x_i + r_i), which is floor(v_i) or floor(v_i) + 1 with
    mean v_i: an independent stochastic rounding of v. So the bound on rounding v bounds the shift.

    Raises:
        ConfigError: ``dimension`` < 1 or ``beta`` outside [0, 1).
    """
    if dimension < 1:
        raise ConfigError(f"dimension={dimension} must be at least 1")
    if not 0.0 <= beta < 1.0:
        raise ConfigError(f"beta={beta!r} must be in [0, 1)")
    root = math.sqrt(dimension)
    always = l2 + root
    if beta == 0.0:
        return always
    squared = l2 * l2 + dimension / 4.0 + math.sqrt(2.0 * math.log(1.0 / beta)) * (l2 + root / 2.0)
    return min(always, math.sqrt(squared))


def expected_rounding_rdp(orders: np.ndarray, mu: float, l1: float, l2: float, dimension: int) -> np.ndarray:
    """RDP at each integer order of Skellam(mu) noise on a shift by a stochastic rounding of a real vector.

    The vector v (one record's move before rounding, encoded units) has L2 norm at most ``l2`` and L1 norm at
    most ``l1`` in ``dimension`` coordinates; as :func:`rounded_l2` says, the two neighbouring rounded sums differ
    by z, an independent stochastic rounding of each v_i. Rather than charge a bound on ||z|| that fails with
    probability beta (the sqrt(2 log(1/beta)) (l2 + sqrt(d) / 2) of :func:`rounded_l2`, 10.5 units at beta =
    2^-80), this averages over z: e^((alpha - 1) D_alpha) is jointly convex in the pair of distributions, so
    the divergence of the two mixtures is at most (1 / (alpha - 1)) log E_z e^((alpha - 1) eps(alpha, z)), with
    eps Agarwal et al.'s bound for the integer shift z (:func:`fedfair.privacy.distributed.skellam_rdp`; each
    of its two integrality branches is s ||z||^2 + t ||z||_1). With e_i = z_i - v_i in [-p_i, 1 - p_i] of mean
    0 (p_i the fractional part of v_i), exactly

        z_i^2 = v_i^2 + p_i (1 - p_i) + (2 floor(v_i) + 1) e_i,    |z_i| = |v_i| + sign(v_i) e_i,

    so s z_i^2 + t |z_i| is linear in e_i with a coefficient at most s (2 |v_i| + 1) + t in size, and
    Hoeffding's lemma (E e^(c e_i) <= e^(c^2 / 8)) over the independent coordinates gives

        log E e^(s ||z||^2 + t ||z||_1) <= s (l2^2 + d / 4) + t l1 + s^2 l2^2 / 2 + s (s + t) l1 / 2 + d (s + t)^2 / 8.

    Near the Gaussian limit that charges the squared sensitivity l2^2 + d / 4, not l2^2 + d / 4 + 10.5 (l2 +
    sqrt(d) / 2). Each order takes the least of both branches and of the bound for the worst rounding
    (||z||_2 < l2 + sqrt(d), ||z||_1 <= l1 + d), which wins at high orders.
    """
    alpha = np.asarray(orders, dtype=np.float64)
    count = float(dimension)
    l1 = min(l1, math.sqrt(count) * l2)
    gaussian = (alpha - 1.0) * alpha / (4.0 * mu)
    branches = (
        (gaussian + (alpha - 1.0) * (2.0 * alpha - 1.0) / (16.0 * mu * mu), (alpha - 1.0) * 6.0 / (16.0 * mu * mu)),
        (gaussian, (alpha - 1.0) * 3.0 / (4.0 * mu)),
    )
    logs = [
        s * (l2 * l2 + count / 4.0)
        + t * l1
        + s * s * l2 * l2 / 2.0
        + s * (s + t) * l1 / 2.0
        + count * (s + t) ** 2 / 8.0
        for s, t in branches
    ]
    worst_l2 = l2 + math.sqrt(count)
    worst_l1 = min(l1 + count, rounded_l1(worst_l2, dimension))
    worst = alpha * worst_l2 * worst_l2 / (4.0 * mu) + np.minimum(
        ((2.0 * alpha - 1.0) * worst_l2 * worst_l2 + 6.0 * worst_l1) / (16.0 * mu * mu), 3.0 * worst_l1 / (4.0 * mu)
    )
    return np.minimum(np.minimum(logs[0], logs[1]) / (alpha - 1.0), worst)


def rounded_l1(l2: float, dimension: int) -> float:
    """An L1 bound on an integer vector of L2 norm at most ``l2`` in ``dimension`` coordinates.

    Min(l2^2, sqrt(d) l2), since |e_i| <= e_i^2 for integers and by Cauchy-Schwarz.
    """
    return min(l2 * l2, math.sqrt(dimension) * l2)


def skellam_tail(mu: float, threshold: float) -> float:
    """Chernoff bound on P[Skellam(mu) >= t] for t >= 0.

    With E e^(s X) = e^(2 mu (cosh s - 1)) and the optimal s = asinh(t / (2 mu)), exp(-(t asinh(t / (2 mu)) -
    sqrt(4 mu^2 + t^2) + 2 mu)).
    """
    if threshold <= 0:
        return 1.0
    if mu == 0:
        return 0.0
    exponent = threshold * math.asinh(threshold / (2.0 * mu)) - math.hypot(2.0 * mu, threshold) + 2.0 * mu
    return min(1.0, math.exp(-exponent))


def wrap_probability(mu: float, signal: float, modulus_bits: int, dimension: int) -> float:
    """A bound on the probability that some coordinate of a noised sum wraps around modulo 2^k.

    The signal is at most ``signal`` in magnitude per coordinate, the noise Skellam(mu) (all parties' mu, honest
    or not), and a coordinate wraps only if |signal + noise| >= 2^(k-1); union bound over the ``dimension``
    coordinates and both signs.
    """
    room = 2.0 ** (modulus_bits - 1) - signal
    return min(1.0, 2.0 * dimension * skellam_tail(mu, room))


_SPLITS = 64
"""Points at which :func:`rotated_wrap_probability` splits the room between signal and noise; each gives a valid
bound, so the grid only decides how tight the least of them is."""


def rotated_wrap_probability(mu: float, norm: float, summands: int, modulus_bits: int, dimension: int) -> float:
    """A bound on the probability that some coordinate of a rotated, rounded and noised sum wraps modulo 2^k.

    The sum adds ``summands`` vectors of L2 norm at most ``norm`` on average (encoded units, before rounding: only
    their sum counts), each rotated by
    the round's R = H D / sqrt(m) (``dimension`` = m) and stochastically rounded, plus Skellam(``mu``) noise per
    coordinate (all parties' mu). Coordinate i of the rotated real sum y is sum_j H_ij s_j y_j / sqrt(m) with
    ||y|| <= summands * norm, and D's signs s_j are independent of y (keyed by public round data fixed before the
    update exists), so by Hoeffding P(|(R y)_i| >= t) <= 2 exp(-t^2 m / (2 ||y||^2)). Rounding adds less than
    ``summands`` units. A coordinate wraps only if its signal exceeds t or its noise exceeds
    2^(k-1) - t - summands; the union bound over both events and the m coordinates holds for every t, and the
    least over a grid of t is returned.

    This is what lets words of 16 bits carry a sum: a fixed vector's energy spreads over m coordinates, so each
    is about its norm / sqrt(m), where :func:`wrap_probability` must allow the whole norm in one coordinate.
    """
    room = 2.0 ** (modulus_bits - 1) - summands
    spread = summands * norm
    if room <= 0:
        return 1.0
    if spread == 0:
        return min(1.0, 2.0 * dimension * skellam_tail(mu, room))
    best = 1.0
    for index in range(1, _SPLITS):
        signal = room * index / _SPLITS
        exponent = signal * signal * dimension / (2.0 * spread * spread)
        tails = math.exp(-exponent) + skellam_tail(mu, room - signal)
        best = min(best, 2.0 * dimension * tails)
    return best


BATCH_TAIL = 8.0
"""Standard deviations of a Poisson batch above its mean that :func:`batch_radius` allows."""


def batch_radius(records: float) -> float:
    """How many records' sensitivities bound a party's clipped sum, for a Poisson batch of ``records`` expected rows.

    A clipped sum S of a Poisson sample moves by at most the clip per row drawn, and the rows drawn, a sum of
    independent Bernoullis of mean b = ``records`` (variance at most b), exceed b + t with probability at most
    exp(-t^2 / (2 (b + t / 3))) (Bernstein). At t = BATCH_TAIL sqrt(b) = 8 sqrt(b) that is exp(-32 / (1 + 8 /
    (3 sqrt(b)))): below 2e-4 at b = 1, e^-24 at b = 64, and the bound only binds if every gradient is also at its
    clip and aligned. The encoder projects onto this radius, which is 1-Lipschitz and so costs no privacy, and the
    wrap bound counts it; b + 8 sqrt(b) replaces a bound linear in b (8 b), 6 times tighter at b = 875.

    Raises:
        ConfigError: ``records`` is not a positive finite number.
    """
    if not (math.isfinite(records) and records > 0):
        raise ConfigError(f"records={records!r} must be a positive expected batch")
    return records + BATCH_TAIL * math.sqrt(records)


def largest_total(values: Iterable[float], count: int) -> float:
    """The sum of the ``count`` largest of ``values``: what any ``count`` of them can add up to at most."""
    return sum(heapq.nlargest(count, values))


def delta_addon(*, steps: int, parties: int, beta: float, epsilon: float, wrap: float) -> float:
    """What rounding and wrapping add to delta over ``steps`` noised sums of ``parties`` parties.

    The sum of two terms (the record's rounded shift is charged in expectation,
    :func:`expected_rounding_rdp`, so it adds nothing here):

    - parties * steps * beta * (1 + e^epsilon): each party's conditional rounding (redraw while the
      rounded norm exceeds its bound, probability at most beta) moves its output by at most beta in
      total variation, and a mechanism within TV b of an (epsilon, delta)-DP one is
      (epsilon, delta + b (1 + e^epsilon))-DP;
    - steps * wrap: a sum that wraps decodes wrong; counted, conservatively, as a failure.
    """
    if steps < 0 or parties < 1:
        raise ConfigError(f"steps={steps} and parties={parties} must be >= 0 and >= 1")
    return parties * steps * beta * (1.0 + math.exp(epsilon)) + steps * wrap
