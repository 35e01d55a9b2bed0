"""The secure-aggregation inner loops, compiled: the encoder's rounding pass and the masks' additions.

:func:`round_block` checks, clips, scales, rounds and packs a block in one pass; :func:`add_rows`
adds two keystreams to the accumulator per pass. The kernels keep the GIL; numba is imported on
first use and the compiled code is cached beside this file (``cache=True``). Why each choice, and
what it saves, is in docs/design.md ("Inside secure aggregation"); ``benchmarks/secagg_bench.py``
measures it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

RoundBlock = Callable[[np.ndarray, np.ndarray, np.uint32, float, float, np.int64, np.ndarray], bool]
"""``round_block(values, random, random_shift, scale, bound, rounding_bits, out) -> finite``."""

AddRows = Callable[[np.ndarray, np.ndarray, np.ndarray], None]
"""``add_rows(accumulator, rows, negate)``."""


def _round_block(
    values: np.ndarray,
    random: np.ndarray,
    random_shift: np.uint32,
    scale: float,
    bound: float,
    rounding_bits: np.int64,
    out: np.ndarray,
) -> bool:
    """Stochastically round each clipped value into ``out``; True when every value was finite.

    Each value is clipped to [-bound, bound], and floor((trunc(value * scale) + (random >> random_shift))
    / 2^rounding_bits) is written to ``out`` (int32 or int64).

    This is the formula ``rounder.StochasticRounder`` derives its bias and error bounds for, in
    integers: m = trunc(value * scale) (an int64) plus the K = ``rounding_bits`` random bits r,
    floored by 2^K. It is computed here in float64, because AVX2 has no vector conversion
    between float64 and int64 and the integer form runs one coordinate at a time; every step is
    exact, so the words are the same:

    - m = trunc(clipped * scale) is an integer-valued float64 below 2^63 in magnitude (the
      caller guarantees it); scale is a power of two, so the product is exact.
    - q = floor(m / 2^K) is exact (a power-of-two division, then floor); s = m - q 2^K is an
      integer in [0, 2^K), which float64 holds, so the subtraction returns it exactly.
    - r = floor(word * 2^-shift) is the word's top K bits (multiplying by a power of two is
      exact); r + s < 2^33 is exact, and floor((r + s) / 2^K) is the carry, 0 or 1.
    - floor((m + r) / 2^K) = q + floor((s + r) / 2^K), the word written; |q| + 1 fits ``out``.

    A non-finite value leaves unspecified words behind; the caller refuses the whole vector then.
    """
    unit = math.ldexp(1.0, int(rounding_bits))
    per_unit = 1.0 / unit
    random_scale = math.ldexp(1.0, -int(random_shift))
    finite = True
    for index in range(values.size):
        value = values[index]
        finite &= math.isfinite(value)
        fixed = np.trunc(min(max(value, -bound), bound) * scale)
        whole = np.floor(fixed * per_unit)
        below = fixed - whole * unit
        offset = np.floor(np.float64(random[index]) * random_scale)
        out[index] = whole + np.floor((below + offset) * per_unit)
    return finite


def _add_rows(accumulator: np.ndarray, rows: np.ndarray, negate: np.ndarray) -> None:
    """Add each row of ``rows`` to ``accumulator`` in place, modulo 2^bits, subtracting where ``negate`` says.

    Row j is negated where ``negate[j]`` is all ones (it is zero or all ones); only the first
    ``accumulator.size`` words of each row are read.

    (x ^ n) - n is x for n = 0 and -x for n = ~0, so one branch-free loop both adds and subtracts;
    rows are taken two at a time, which halves the passes over the accumulator.
    """
    count = accumulator.size
    row = 0
    while row + 2 <= rows.shape[0]:
        first, second = negate[row], negate[row + 1]
        for index in range(count):
            accumulator[index] += ((rows[row, index] ^ first) - first) + ((rows[row + 1, index] ^ second) - second)
        row += 2
    if row < rows.shape[0]:
        last = negate[row]
        for index in range(count):
            accumulator[index] += (rows[row, index] ^ last) - last


@functools.cache
def round_block() -> RoundBlock:
    """The compiled :func:`_round_block` (compiled, or loaded from the cache, on first call)."""
    import numba

    compiled: RoundBlock = numba.njit(cache=True, boundscheck=False)(_round_block)
    return compiled


@functools.cache
def add_rows() -> AddRows:
    """The compiled :func:`_add_rows` (compiled, or loaded from the cache, on first call)."""
    import numba

    compiled: AddRows = numba.njit(cache=True, boundscheck=False)(_add_rows)
    return compiled


PoissonFill = Callable[[float, np.ndarray, np.ndarray, int], tuple[int, int]]
"""``poisson_fill(mu, words, out, start) -> (filled, words_used)``."""


def _poisson_fill(mu: float, words: np.ndarray, out: np.ndarray, start: int) -> tuple[int, int]:
    """Fill ``out[start:]`` with Poisson(mu) samples drawn in order from the uint64 ``words``.

    It stops when ``out`` is full or fewer words remain than the next attempt needs, and returns
    (the index one past the last sample written, the number of words consumed).

    A word w becomes the uniform u = (w >> 11) 2^-53 on [0, 1), exactly representable. For mu < 10
    one word per sample, by inversion (the cumulative pmf summed term by term; the loop stops when a
    term underflows, which only cuts off probabilities below 10^-300). For mu >= 10, Hormann's
    transformed rejection with squeeze (PTRS, 1993), two words per attempt, about 1.1 attempts per
    sample; its acceptance test is exact, so the samples are exactly Poisson up to float64 rounding
    of log and lgamma (an attempt with u = -1/2, of probability 2^-53, is redrawn). The caller
    refills ``words`` and calls again with the returned index.
    """
    used = 0
    index = start
    available = words.size
    unit = 2.0**-53
    if mu < 10.0:
        floor_mass = math.exp(-mu)
        while index < out.size and used < available:
            u = np.float64(words[used] >> np.uint64(11)) * unit
            used += 1
            k = 0
            term = floor_mass
            total = term
            while u >= total and term > 0.0:
                k += 1
                term *= mu / k
                total += term
            out[index] = k
            index += 1
        return index, used
    root = math.sqrt(mu)
    log_mu = math.log(mu)
    b = 0.931 + 2.53 * root
    a = -0.059 + 0.02483 * b
    log_inverse_alpha = math.log(1.1239 + 1.1328 / (b - 3.4))
    v_r = 0.9277 - 3.6224 / (b - 2.0)
    while index < out.size and used + 2 <= available:
        u = np.float64(words[used] >> np.uint64(11)) * unit - 0.5
        v = np.float64(words[used + 1] >> np.uint64(11)) * unit
        used += 2
        us = 0.5 - abs(u)
        if us <= 0.0:  # u = -1/2 (probability 2^-53) would divide by zero; such an attempt is redrawn
            continue
        k = math.floor((2.0 * a / us + b) * u + mu + 0.43)
        if us >= 0.07 and v <= v_r:
            out[index] = k
            index += 1
            continue
        if k < 0 or (us < 0.013 and v > us):
            continue
        # log(e^-mu mu^k / k!): the direct form subtracts terms of size mu log mu and loses mu log mu 2^-52
        # (10^-5 at mu = 10^10), so from k = 100 on it is Stirling's series, lgamma(k + 1) = k log k - k +
        # log(2 pi k) / 2 + 1/(12k) - 1/(360k^3) + 1/(1260k^5) (error below 1/(1680k^7) < 10^-17), with
        # k log(k / mu) taken as k log1p((k - mu) / mu), which keeps its precision.
        if k < 100:
            log_mass = -mu + k * log_mu - math.lgamma(k + 1.0)
        else:
            inverse = 1.0 / k
            square = inverse * inverse
            series = inverse * (1.0 / 12.0 - square * (1.0 / 360.0 - square / 1260.0))
            log_mass = (k - mu) - k * math.log1p((k - mu) / mu) - 0.5 * math.log(2.0 * math.pi * k) - series
        # v = 0 is accepted (log 0 = -inf).
        if v == 0.0 or math.log(v) + log_inverse_alpha - math.log(a / (us * us) + b) <= log_mass:
            out[index] = k
            index += 1
    return index, used


@functools.cache
def poisson_fill() -> PoissonFill:
    """The compiled :func:`_poisson_fill` (compiled, or loaded from the cache, on first call)."""
    import numba

    compiled: PoissonFill = numba.njit(cache=True, boundscheck=False)(_poisson_fill)
    return compiled


Hadamard = Callable[[np.ndarray], None]
"""``hadamard(values)``: the unnormalised Walsh-Hadamard transform in place."""


def _hadamard(values: np.ndarray) -> None:
    """Overwrite the float64 ``values`` (a power-of-two length m) with H values, in place.

    H is the m x m Walsh-Hadamard matrix in Sylvester's order, applied by log2(m) butterfly passes
    (a + b, a - b): no temporary, and each pass streams the array once (numpy's reshaped form takes a
    copy and three passes per stage).
    """
    size = values.size
    half = 1
    while half < size:
        for start in range(0, size, 2 * half):
            for index in range(start, start + half):
                upper = values[index]
                lower = values[index + half]
                values[index] = upper + lower
                values[index + half] = upper - lower
        half *= 2


@functools.cache
def hadamard() -> Hadamard:
    """The compiled :func:`_hadamard` (compiled, or loaded from the cache, on first call)."""
    import numba

    compiled: Hadamard = numba.njit(cache=True, boundscheck=False)(_hadamard)
    return compiled


ChallengeDots = Callable[[np.ndarray, np.ndarray, int, np.ndarray], None]
"""``challenge_dots(coefficients, words, bits, counters)``."""

_LOW = np.uint64(0xFFFFFFFF)
_HALF = np.uint64(32)
_NARROW_SPAN = 1 << 16


def _challenge_dots(coefficients: np.ndarray, words: np.ndarray, bits: int, counters: np.ndarray) -> None:
    """Write to ``counters`` the pieces of the exact integer dot products of each block of ``words``.

    ``coefficients`` is a c x m uint64 array (c rows of 64-bit coefficients, repeated every m words) and
    ``words`` a vector of unsigned words below 2^32, read as ``bits``-bit two's complement (a ``bits`` of
    64 reads them as unsigned); block q is words[q m : (q + 1) m]. Python ints would take a microsecond a
    coordinate, so each 64 x 32-bit product is cut into two 32 x 32-bit limb products (each below 2^64)
    whose 32-bit halves are summed in uint64 counters, kept in locals so the loop vectorises; no addend
    reaches 2^33, so a block of up to 2^30 words cannot overflow them. ``counters[q, row]`` 0..2 hold the
    sums at weight 2^(32 j), 3..4 the limbs of the coefficients of negative words. Words of at most 16 bits
    in blocks of at most 2^16 take a shorter loop: the limb products are summed whole (0 and 1, 2 left 0).
    :func:`fedfair.secagg.verify._fold` turns them into the dot product.
    """
    top = np.uint64(bits - 1)
    span = coefficients.shape[1]
    narrow = bits <= 16 and span <= _NARROW_SPAN
    for block in range(counters.shape[0]):
        start = block * span
        stop = min(start + span, words.size)
        piece = words[start:stop]
        for row in range(coefficients.shape[0]):
            # 1-D views with one index: the form the loop vectoriser takes.
            line = coefficients[row]
            c0 = c1 = c2 = c3 = c4 = np.uint64(0)
            for index in range(piece.size):
                u = np.uint64(piece[index])
                sign = u >> top
                coefficient = line[index]
                low = coefficient & _LOW
                high = coefficient >> _HALF
                c3 += low * sign
                c4 += high * sign
                if narrow:
                    # Words below 2^16: each limb product is below 2^48, so 2^16 of them sum below 2^64 whole.
                    c0 += low * u
                    c1 += high * u
                else:
                    p0 = low * u
                    p1 = high * u
                    c0 += p0 & _LOW
                    c1 += (p0 >> _HALF) + (p1 & _LOW)
                    c2 += p1 >> _HALF
            counters[block, row, 0] = c0
            counters[block, row, 1] = c1
            counters[block, row, 2] = c2
            counters[block, row, 3] = c3
            counters[block, row, 4] = c4


@functools.cache
def challenge_dots() -> ChallengeDots:
    """The compiled :func:`_challenge_dots` (compiled, or loaded from the cache, on first call)."""
    import numba

    compiled: ChallengeDots = numba.njit(cache=True, boundscheck=False)(_challenge_dots)
    return compiled
