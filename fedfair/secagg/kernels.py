"""The encoder's inner loop, compiled, so a block is scaled, checked, clipped, rounded and packed in one pass.

Written with numpy, the same arithmetic takes five passes over each block (two reductions for
the NaN and clip checks, a multiply into int64, an add of the random words and a shift into the
output words), each with its own loads and stores: encoding d = 10^6 took 5.7 ms on the 2-core
development host against 0.7 ms for the 4 MB of keystream it draws. The compiled loop reads each
value once and writes its word once: 2.4 ms (``benchmarks/secagg_bench.py``, client_encode_s).

numba is imported on first use, not with fedfair: it takes most of a second to import, and only
a party that encodes needs it. The compiled code is cached beside this file (``cache=True``),
so later processes load it instead of compiling it again.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

RoundBlock = Callable[[np.ndarray, np.ndarray, np.uint32, float, float, np.int64, np.ndarray], bool]
"""``round_block(values, random, random_shift, scale, bound, rounding_bits, out) -> finite``."""


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

    This is the formula ``encode._StochasticRounder`` derives its bias and error bounds for: the
    float-to-int64 conversion truncates toward zero, and the shift of an int64 is arithmetic (a
    floor). A non-finite value leaves unspecified words behind; the caller refuses the whole vector
    then.
    """
    finite = True
    for index in range(values.size):
        value = values[index]
        finite &= math.isfinite(value)
        value = min(max(value, -bound), bound)
        offset = np.int64(random[index] >> random_shift)
        out[index] = (np.int64(value * scale) + offset) >> rounding_bits
    return finite


@functools.cache
def round_block() -> RoundBlock:
    """The compiled :func:`_round_block` (compiled, or loaded from the cache, on first call)."""
    import numba

    compiled: RoundBlock = numba.njit(cache=True, nogil=True, boundscheck=False)(_round_block)
    return compiled
