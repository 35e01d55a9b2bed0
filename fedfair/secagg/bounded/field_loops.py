"""The prime field's inner loops, compiled by numba: what :mod:`.field` runs over whole element arrays.

Apart from :mod:`.field` so that numba is imported only when a loop first runs (:func:`.field.loops`): importing it
costs a process about 60 MB of resident memory (llvmlite's compiler) and 0.3 s, and every process of the runtime
imports the field (the bounded sum's kind is registered with every other), while only a bounded sum's parties run
these loops. Elements are uint64 in [0, p); the arithmetic and its bounds are :mod:`.field`'s.
"""

from __future__ import annotations

import numba
import numpy as np

from fedfair.secagg.bounded.modulus import ELEMENT_BITS, FOLD, P

_HALF_BITS = ELEMENT_BITS // 2
_P = np.uint64(P)
_C = np.uint64(FOLD)
_MASK = np.uint64((1 << ELEMENT_BITS) - 1)
_HALF_MASK = np.uint64((1 << _HALF_BITS) - 1)
_BITS = np.uint64(ELEMENT_BITS)
_HALF = np.uint64(_HALF_BITS)
_S3 = np.uint64(3)
_BYTE = np.uint64(0xFF)
_ZERO = np.uint64(0)
_EXTEND_BLOCK = 256
"""Columns :func:`extend` works on at once: its two N x 256 tables (128 KiB at N = 64) stay in the L2 cache."""


@numba.njit(cache=True, inline="always")
def mul(a: np.uint64, b: np.uint64) -> np.uint64:
    """The product a b mod p for a, b < p < 2^52: 26-bit halves, then two folds by 2^52 = c.

    a b = hh 2^52 + m 2^26 + ll, with hh, ll < 2^52 and m < 2^53; m = m_high 2^26 + m_low, m_high < 2^27. So
    a b = c hh + c m_high + m_low 2^26 + ll (mod p), below 47 2^52 + 2^33 + 2 2^52 < 2^58: no overflow. Its
    fold (t >> 52) c + (t & (2^52 - 1)) is below 2^52 + 2^6 47 < 2 p, so one subtraction leaves it in [0, p).
    """
    a_low, a_high = a & _HALF_MASK, a >> _HALF
    b_low, b_high = b & _HALF_MASK, b >> _HALF
    middle = a_high * b_low + a_low * b_high
    total = _C * (a_high * b_high) + _C * (middle >> _HALF) + ((middle & _HALF_MASK) << _HALF) + a_low * b_low
    total = _C * (total >> _BITS) + (total & _MASK)
    return total - _P if total >= _P else total


@numba.njit(cache=True, inline="always")
def add(a: np.uint64, b: np.uint64) -> np.uint64:
    """The sum a + b mod p for a, b < p."""
    total = a + b
    return total - _P if total >= _P else total


@numba.njit(cache=True)
def dot(a: np.ndarray, b: np.ndarray) -> np.uint64:
    """sum_i a_i b_i mod p."""
    total = _ZERO
    for index in range(a.size):
        total = add(total, mul(a[index], b[index]))
    return total


@numba.njit(cache=True)
def combine_rows(weights: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """out[k] = sum_m weights[m] rows[m, k]: a row vector times a matrix."""
    out[:] = 0
    for row in range(rows.shape[0]):
        weight = weights[row]
        for column in range(rows.shape[1]):
            out[column] = add(out[column], mul(weight, rows[row, column]))


@numba.njit(cache=True)
def matmul_transposed(left: np.ndarray, right: np.ndarray, out: np.ndarray) -> None:
    """out[i, j] = sum_t left[i, t] right[j, t]."""
    for i in range(left.shape[0]):
        for j in range(right.shape[0]):
            total = _ZERO
            for t in range(left.shape[1]):
                total = add(total, mul(left[i, t], right[j, t]))
            out[i, j] = total


@numba.njit(cache=True)
def extend(columns: np.ndarray, out: np.ndarray) -> None:
    """Per column w, the polynomial through columns[0..N-1, w] at N..2N-2, into out[0..N-2, w].

    Finite differences: the backward differences at the last point (N^2 / 2 subtractions), then each
    next value by N - 1 additions, since the (N-1)-th difference of a degree N - 1 polynomial is constant.
    No multiplications, and each step runs along a row of the columns, which the compiler vectorises.
    """
    count, width = columns.shape
    table = np.empty((count, _EXTEND_BLOCK), dtype=np.uint64)
    diagonal = np.empty((count, _EXTEND_BLOCK), dtype=np.uint64)
    for start in range(0, width, _EXTEND_BLOCK):
        stop = min(width, start + _EXTEND_BLOCK)
        block = stop - start
        table[:, :block] = columns[:, start:stop]
        diagonal[0, :block] = table[count - 1, :block]
        for order in range(1, count):
            for index in range(count - 1, order - 1, -1):
                for column in range(block):
                    high, low = table[index, column], table[index - 1, column]
                    table[index, column] = high - low + (_P if high < low else _ZERO)
            diagonal[order, :block] = table[count - 1, :block]
        for step in range(count - 1):
            for order in range(count - 2, -1, -1):
                for column in range(block):
                    diagonal[order, column] = add(diagonal[order, column], diagonal[order + 1, column])
            out[step, start:stop] = diagonal[0, :block]


@numba.njit(cache=True)
def signed_projections(values: np.ndarray, codes: np.ndarray, tests: int, out: np.ndarray) -> None:
    """out[j] = sum_i z_ji values[i], z = bit0 - bit1 of the 2-bit code of trit i tests + j (4 per byte)."""
    out[:] = 0
    choices = np.zeros(4, dtype=np.uint64)
    for index in range(values.size):
        value = values[index]
        choices[1] = value
        choices[2] = _P - value if value != _ZERO else _ZERO
        base = index * tests
        for test in range(tests):
            trit = base + test
            code = (codes[trit >> 2] >> (2 * (trit & 3))) & 3
            out[test] = add(out[test], choices[code])


@numba.njit(cache=True)
def multiply(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out_i = a_i b_i mod p."""
    for index in range(a.size):
        out[index] = mul(a[index], b[index])


@numba.njit(cache=True)
def pack(elements: np.ndarray, out: np.ndarray) -> None:
    """Element i's 52 bits at bits 52 i to 52 i + 51 of ``out`` (little-endian); ``out`` zeroed, 8 bytes spare.

    An element starts at bit 0 to 7 of its first byte, so its 52 bits end within that byte's 8-byte word (59 < 64).
    """
    for index in range(elements.size):
        value = elements[index]
        position = np.uint64(index) * _BITS
        start = position >> _S3
        shift = position & np.uint64(7)
        low = value << shift  # below 2^59: every bit lands in bytes start .. start + 7
        for offset in range(8):
            out[start + np.uint64(offset)] |= np.uint8((low >> np.uint64(8 * offset)) & _BYTE)


@numba.njit(cache=True)
def unpack(data: np.ndarray, out: np.ndarray) -> None:
    """The inverse of :func:`pack`: ``data`` holds 8 spare zero bytes past the packed ones."""
    for index in range(out.size):
        position = np.uint64(index) * _BITS
        start = position >> _S3
        shift = position & np.uint64(7)
        word = _ZERO
        for offset in range(8):
            word |= np.uint64(data[start + np.uint64(offset)]) << np.uint64(8 * offset)
        out[index] = (word >> shift) & _MASK
