"""The prime field F_p, p = 2^52 - 47, on uint64 arrays: exact arithmetic, compiled inner loops.

Why this prime: an element's bits are what a site uploads for each coordinate of its x share (uniform in F_p
whatever its coding), so p is the smallest that still holds what the norm check must hold without wrapping
(docs/security.md, "Bounded inputs (two verifiers)"): the range tests need about 800 B^2 < p, and 2^52 keeps
init's plan (update_norm 1 at 20 fractional bits, B = 2^20) and bounds up to about 3 times it within 2^-64
soundness (:mod:`.layout`). 2^61 - 1 took 61 bits a coordinate for the same checks. A pseudo-Mersenne prime 2^52 - c
reduces with shifts, adds and small products: 2^52 = c (mod p). Elements are uint64 in [0, p); a product is
formed from 26-bit halves (numba has no 128-bit integer) and folded twice, in compiled loops (:mod:`.field_loops`,
imported on first use: :func:`loops`). Pseudorandom elements come from the project's AES-256-CTR PRG
(:mod:`fedfair.secagg.prg`), one key per purpose derived from a seed by SHA-256.
"""

from __future__ import annotations

import functools
import hashlib
from types import ModuleType

import numpy as np

from fedfair.core.errors import ProtocolError
from fedfair.secagg import prg
from fedfair.secagg.bounded.modulus import ELEMENT_BITS as ELEMENT_BITS, FOLD as FOLD, P as P

ELEMENT_BYTES = 8
"""Bytes of one element in memory and in a hash (a little-endian uint64); on the wire, :func:`to_wire` packs 52 bits."""

_P = np.uint64(P)
_MASK = np.uint64((1 << ELEMENT_BITS) - 1)
_ZERO = np.uint64(0)


@functools.cache
def loops() -> ModuleType:
    """The compiled loops (:mod:`.field_loops`), imported at the first call: only then is numba loaded.

    Every runtime process imports this module (the bounded sum's kind is registered beside the others), but only
    a bounded sum's parties run a loop; numba costs a process about 60 MB of resident memory and 0.3 s to import.
    """
    from fedfair.secagg.bounded import field_loops

    return field_loops


def compile_kernels() -> None:
    """Run each compiled loop once on a few elements, so that numba compiles it now rather than mid-round.

    numba compiles a loop at its first call: every loop of :mod:`.field_loops` takes about 20 s of one busy core the
    first time on a machine (then kept in numba's cache beside the source) and about 1 s to load from that cache in a new
    process. A party of a bounded sum calls this before its first round; uncompiled, each site compiled at its first
    SHARE and the auditor at its first stages, and round 1 waited for all of them.
    """
    row = np.ones(4, dtype=np.uint64)
    rows = np.ones((3, 4), dtype=np.uint64)
    multiply(row, row)
    dot(row, row)
    combine_rows(row[:3], rows)
    matmul_transposed(rows, rows)
    extend(rows)
    signed_projections(row, trit_codes(bytes(32), b"compile", 8), 2)  # read-only bytes, as a round's
    from_wire(to_wire(row), "compiled elements")


def multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The products a_i b_i mod p (equal-length element vectors)."""
    out = np.empty(a.size, dtype=np.uint64)
    loops().multiply(np.ascontiguousarray(a), np.ascontiguousarray(b), out)
    return out


def dot(a: np.ndarray, b: np.ndarray) -> int:
    """sum_i a_i b_i mod p of two equal-length element vectors."""
    return int(loops().dot(np.ascontiguousarray(a), np.ascontiguousarray(b)))


def combine_rows(weights: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The vector-matrix product ``weights @ rows`` mod p (weights: m elements, rows: m x n)."""
    out = np.empty(rows.shape[1], dtype=np.uint64)
    loops().combine_rows(weights, np.ascontiguousarray(rows), out)
    return out


def matmul_transposed(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``left @ right.T`` mod p (left: a x t, right: b x t)."""
    out = np.empty((left.shape[0], right.shape[0]), dtype=np.uint64)
    loops().matmul_transposed(np.ascontiguousarray(left), np.ascontiguousarray(right), out)
    return out


def extend(columns: np.ndarray) -> np.ndarray:
    """Columns of N values at 0..N-1 to their polynomials' values at N..2N-2 ((N - 1) x columns)."""
    out = np.empty((columns.shape[0] - 1, columns.shape[1]), dtype=np.uint64)
    loops().extend(np.ascontiguousarray(columns), out)
    return out


def signed_projections(values: np.ndarray, trits: np.ndarray, tests: int) -> np.ndarray:
    """The ``tests`` projections <z_j, values> mod p, z_j in {-1, 0, 1}^d from :func:`trit_codes` bytes."""
    out = np.empty(tests, dtype=np.uint64)
    loops().signed_projections(values, trits, tests, out)
    return out


def wire_bytes(count: int) -> int:
    """Bytes of ``count`` elements on the wire: :data:`ELEMENT_BITS` each, the last byte's spare bits zero."""
    return -(-count * ELEMENT_BITS // 8)


def to_wire(elements: np.ndarray) -> bytes:
    """Elements (each below p) packed at 52 bits each, little-endian: 13 bytes for 2 elements, not 16.

    An element is uniform in [0, p) wherever it is a share, so no coding can take fewer bits than log2(p); the top
    twelve bits of a uint64 are the only slack.

    Raises:
        ValueError: a value is p or more (the caller's bug): its top bits would spill into the next element's, so
            the bytes would be another list's canonical packing.
    """
    if elements.size and int(np.max(elements)) >= P:
        raise ValueError(f"to_wire takes field elements, below p = 2^52 - {FOLD}; got {int(np.max(elements))}")
    out = np.zeros(wire_bytes(elements.size) + 8, dtype=np.uint8)
    loops().pack(np.ascontiguousarray(elements, dtype=np.uint64), out)
    return out[: out.size - 8].tobytes()


def from_wire(data: bytes | memoryview, what: str) -> np.ndarray:
    """Parse :func:`to_wire`'s packing of ``what`` (named in the error) into its elements.

    The count is the one whose packing takes ``len(data)`` bytes (8 len / 52 rounded down: two counts never share a
    length, since a count's packing grows by at least 6 bytes); the spare bits of the last byte must be zero, so each
    list of elements has one encoding, which a signature over the bytes then binds.

    Raises:
        ProtocolError: ``data`` is not a canonical packing of elements below p (a peer's bug or tampering): each
            52-bit value must be below p, not merely below 2^52.
    """
    count = len(data) * 8 // ELEMENT_BITS
    if wire_bytes(count) != len(data):
        raise ProtocolError(
            f"malformed {what}: {len(data)} bytes are not a whole number of {ELEMENT_BITS}-bit elements"
        )
    padded = np.zeros(len(data) + 8, dtype=np.uint8)
    padded[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    out = np.empty(count, dtype=np.uint64)
    loops().unpack(padded, out)
    spare = 8 * len(data) - ELEMENT_BITS * count
    if spare and padded[len(data) - 1] >> (8 - spare):
        raise ProtocolError(f"malformed {what}: the spare bits after its last element are not zero")
    if np.any(out >= _P):
        raise ProtocolError(f"{what} holds a value that is not a field element (at least p = 2^52 - {FOLD})")
    return out


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The sums a_i + b_i mod p."""
    total: np.ndarray = a + b
    reduced: np.ndarray = np.where(total >= _P, total - _P, total)
    return reduced


def subtract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The differences a_i - b_i mod p."""
    return add(a, np.where(b == _ZERO, _ZERO, _P - b))


def from_signed(values: np.ndarray | list[int]) -> np.ndarray:
    """Signed integers of magnitude below p / 2 as elements (negative v as p + v).

    Raises:
        ValueError: a value's magnitude is p / 2 or more: it has no element of its own (the caller's bug; an
            update within its bound is far below). That includes int64's minimum and values beyond int64.
    """
    try:
        signed = np.asarray(values, dtype=np.int64)
    except OverflowError as error:
        raise ValueError(f"a value beyond int64 does not fit the field's (-p/2, p/2): {error}") from None
    # The extremes, not np.abs: |int64's minimum| overflows back to itself and would pass.
    magnitude = max(-int(np.min(signed)), int(np.max(signed))) if signed.size else 0
    if magnitude > P // 2:
        raise ValueError(f"a value of magnitude {magnitude} does not fit the field's (-p/2, p/2)")
    return np.where(signed < 0, signed + np.int64(P), signed).astype(np.uint64)


def to_signed(elements: np.ndarray) -> np.ndarray:
    """Elements as the signed integers in (-p/2, p/2) they are congruent to (int64)."""
    signed = elements.astype(np.int64)
    return np.where(elements > np.uint64(P // 2), signed - np.int64(P), signed)


def element(value: int) -> int:
    """A Python integer reduced into [0, p)."""
    return value % P


def inverse(value: int) -> int:
    """The multiplicative inverse of a nonzero element."""
    if value % P == 0:
        raise ZeroDivisionError("zero has no inverse in the field")
    return pow(value, P - 2, P)


def derive_key(seed: bytes, purpose: bytes) -> bytes:
    """A PRG key for one purpose of one seed: SHA-256 over a domain label, the purpose and the seed."""
    return hashlib.sha256(b"fedfair bounded v1 key\x00" + purpose + b"\x00" + seed).digest()


def random_elements(seed: bytes, purpose: bytes, count: int) -> np.ndarray:
    """``count`` uniform elements expanded from ``seed``: 52-bit words, the c values from p to 2^52 - 1 rejected.

    A word is rejected with probability c / 2^52 < 2^-46; 64 spare words make running out impossible in practice
    (below 2^-2900), and both parties expand the same seed to the same elements.
    """
    spare = 64
    candidates = prg.words(derive_key(seed, purpose), count + spare, np.uint64) & _MASK
    kept = candidates[candidates < _P][:count]
    if kept.size < count:
        raise RuntimeError("the PRG produced a rejected value more than 64 times; this cannot happen by chance")
    return np.ascontiguousarray(kept)


def trit_codes(seed: bytes, purpose: bytes, count: int) -> np.ndarray:
    """``count`` trits z = bit0 - bit1 (-1, 0, 1 with probabilities 1/4, 1/2, 1/4), four per byte."""
    return np.frombuffer(prg.keystream(derive_key(seed, purpose), (count + 3) // 4), dtype=np.uint8)
