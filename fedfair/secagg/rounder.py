"""Stochastic rounding of a vector's blocks to fixed point, from the AES keystream: the encoder's inner step.

Split from :mod:`fedfair.secagg.encode`, which picks the scale and bits; the bias and error bounds the
encoder's decoding relies on are derived in :class:`StochasticRounder`'s docstring.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from fedfair.secagg import kernels, prg

ROUNDING_BYTES_PER_COORDINATE = 4
"""Keystream bytes the encoder draws per encoded coordinate (the weight coordinate included)."""

RANDOM_BITS = 8 * ROUNDING_BYTES_PER_COORDINATE
"""Random bits per coordinate for stochastic rounding, and the most extra bits K kept below a unit."""

_scratch = threading.local()


def _scratch_words(count: int) -> np.ndarray:
    """``count`` little-endian 32-bit words of this thread's scratch space, kept from one encoding to the next.

    A block's random words (1 MiB) allocated anew each time come, as often as not, as fresh pages the kernel
    faults in one by one, which cost a third of an encoding at d = 10^6. Per thread, because parties may encode
    at once; one encoding at a time per thread is all the encoder does with it.
    """
    words: np.ndarray | None = getattr(_scratch, "words", None)
    if words is None or words.size < count:
        words = _scratch.words = np.empty(count, dtype=np.dtype(np.uint32).newbyteorder("<"))
    return words[:count]


class StochasticRounder:
    """Stochastic rounding of values to multiples of 2^-f, in integers, block by block.

    With y = x 2^f the value in units and K = ``rounding_bits``, the rounder computes
    m = trunc(y 2^K), an int64, and returns floor((m + r) / 2^K) (an arithmetic shift),
    where r is uniform on [0, 2^K): the top K bits of the i-th 32-bit word of the key's
    stream for the i-th value rounded. Both steps are exact: y 2^K is x times a power of
    two, and the caller guarantees (|y| + 1) 2^K <= 2^63, so m + r fits int64.

    Bias. Write m = q 2^K + s with 0 <= s < 2^K. Then floor((m + r) / 2^K) = q + [r >= 2^K - s],
    which rounds up with probability s / 2^K, so its expectation is exactly m / 2^K. Truncation
    moves y 2^K by less than one toward zero, so E[result] - y lies in (-2^-K, 0] for y >= 0
    and in [0, 2^-K) for y < 0: below 2^-K of a unit, towards zero. It is exactly zero when y
    has at most K fractional bits, as every float64 with |y| >= 2^(52 - K) has. (Flooring
    instead of truncating would bound the bias alike, in (-2^-K, 0] for every sign, at the cost
    of a floor per value; the float-to-int64 conversion truncates for free.)

    Error. If 2^K divides m the result is m / 2^K, within 2^-K of y. Otherwise
    a 2^K < m < (a + 1) 2^K for a = floor(m / 2^K), and y 2^K, within one of the integer m,
    lies strictly between those two integers; the result is a or a + 1, both less than one
    unit from y. So the decoder's bound of one unit per summand holds for every draw, not
    only on average.

    The block's random words are reused for every block, and by the thread's next encoding, so
    no temporary grows with the vector.
    """

    def __init__(self, key: bytes, block: int, fractional_bits: int, rounding_bits: int) -> None:
        self._stream = prg.Keystream(key)
        self._scale = math.ldexp(1.0, fractional_bits + rounding_bits)
        self._rounding_bits = np.int64(rounding_bits)
        # K < 32 keeps the top K bits of each word, so r stays uniform on [0, 2^K).
        self._random_shift = np.uint32(RANDOM_BITS - rounding_bits)
        self._random = _scratch_words(block)
        self._random_bytes = self._random.data.cast("B")
        self._round_block = kernels.round_block()

    def round_into(self, values: np.ndarray, out: np.ndarray, bound: float) -> bool:
        """Clip the float64 ``values`` (at most one block) to [-bound, bound] and round them into ``out``.

        ``out`` is a signed integer array that must hold every rounded value.

        Returns:
            True, or False if a value was NaN or infinite (``out`` then holds unspecified words).
        """
        count = values.size
        self._stream.read_into(self._random_bytes[: count * ROUNDING_BYTES_PER_COORDINATE])
        return self._round_block(
            values, self._random[:count], self._random_shift, self._scale, bound, self._rounding_bits, out
        )
