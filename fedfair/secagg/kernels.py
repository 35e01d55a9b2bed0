"""The secure-aggregation inner loops, compiled: the encoder's rounding pass and the masks' additions.

Written with numpy, encoding takes five passes over each block (two reductions for the NaN and
clip checks, a multiply into int64, an add of the random words and a shift into the output
words), each with its own loads and stores, several times the cost of drawing the keystream.
:func:`round_block` reads each value once and writes its word once, in SIMD registers (its
docstring says how it stays exact without the int64 vector conversions AVX2 lacks). Masking
with ``np.add(..., out=...)`` reads and writes the accumulator block once per stream;
:func:`add_rows` adds two streams per pass without a branch on the sign. What each costs is
measured by ``benchmarks/secagg_bench.py`` (docs/benchmarks.md).

The kernels keep the GIL: each call takes well under a millisecond, while giving the GIL up and
taking it back can cost a whole switch interval in a process whose other threads run Python.

numba is imported on first use, not with fedfair: it takes most of a second to import, and only
a party that encodes or masks needs it. The compiled code is cached beside this file
(``cache=True``), so later processes load it instead of compiling it again.
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
    """Clip each value to [-bound, bound], write floor((trunc(value * scale) + (random >> random_shift))
    / 2^rounding_bits) to ``out`` (int32 or int64), and return whether every value was finite.

    This is the formula ``encode._StochasticRounder`` derives its bias and error bounds for, in
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
    """Add row j of ``rows`` to ``accumulator`` in place, negated where ``negate[j]`` is all ones
    (it is zero or all ones), modulo 2^bits; only the first ``accumulator.size`` words of each row.

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
