"""Shamir t-of-n secret sharing over the prime field GF(2^127 - 1).

A secret byte string is cut into 15-byte chunks (120 bits, always below the
prime), and each chunk is the constant term of its own random polynomial of
degree t - 1; a share is the evaluation of every chunk polynomial at the holder's
x. Any t shares determine the polynomials (Lagrange interpolation at 0); any
t - 1 shares are consistent with every possible secret, so they reveal nothing.

Holders are identified by their party id, used directly as x (never 0, which
would hand out the secret itself). Coefficients come from :mod:`secrets`.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fedfair.secagg.errors import ProtocolError, ThresholdError

PRIME = (1 << 127) - 1
"""The field modulus, the Mersenne prime 2^127 - 1."""

CHUNK_BYTES = 15
"""Secret bytes per field element: 2^120 < PRIME, so every chunk is a field element."""

_VALUE_BYTES = 16


@dataclass(frozen=True)
class Share:
    """One holder's share: its x and one field element per secret chunk."""

    x: int
    values: tuple[int, ...]

    def to_bytes(self) -> bytes:
        """``x`` (u32) | chunk count (u32) | each value as 16 big-endian bytes."""
        head = struct.pack(">II", self.x, len(self.values))
        return head + b"".join(value.to_bytes(_VALUE_BYTES, "big") for value in self.values)

    @classmethod
    def from_bytes(cls, data: bytes) -> Share:
        """Parse :meth:`to_bytes` output, refusing anything that is not a valid share."""
        if len(data) < 8:
            raise ProtocolError("malformed share: truncated")
        x, count = struct.unpack(">II", data[:8])
        if len(data) != 8 + count * _VALUE_BYTES or x == 0:
            raise ProtocolError("malformed share: wrong length or x = 0")
        values = tuple(
            int.from_bytes(data[8 + i * _VALUE_BYTES : 8 + (i + 1) * _VALUE_BYTES], "big") for i in range(count)
        )
        if any(value >= PRIME for value in values):
            raise ProtocolError("malformed share: value outside the field")
        return cls(x, values)


def split(secret: bytes, threshold: int, holders: Iterable[int]) -> dict[int, Share]:
    """Split ``secret`` so that any ``threshold`` of the ``holders`` can rebuild it.

    Returns one :class:`Share` per holder id.
    """
    xs = sorted(set(holders))
    if not 1 <= threshold <= len(xs):
        raise ValueError(f"threshold {threshold} must be between 1 and the number of holders {len(xs)}")
    if xs[0] < 1 or xs[-1] >= PRIME:
        raise ValueError("holder ids must be positive field elements")
    chunks = [int.from_bytes(secret[i : i + CHUNK_BYTES], "big") for i in range(0, len(secret), CHUNK_BYTES)]
    polynomials = [[chunk] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)] for chunk in chunks]
    shares = {}
    for x in xs:
        # One table of powers serves every chunk; a single reduction per value keeps Python's
        # big-integer work to one multiply-add per coefficient.
        powers = [1]
        for _ in range(threshold - 1):
            powers.append(powers[-1] * x % PRIME)
        values = tuple(sum(c * p for c, p in zip(poly, powers, strict=True)) % PRIME for poly in polynomials)
        shares[x] = Share(x, values)
    return shares


def combine(shares: Sequence[Share], threshold: int, secret_length: int) -> bytes:
    """Rebuild a ``secret_length``-byte secret from at least ``threshold`` shares.

    Raises :class:`ThresholdError` with fewer than ``threshold`` distinct holders and
    :class:`ProtocolError` if the shares do not interpolate to a secret of that length
    (a corrupted or mismatched share).
    """
    by_x = {share.x: share for share in shares}
    if len(by_x) < threshold:
        raise ThresholdError(f"{len(by_x)} shares cannot rebuild a secret shared with threshold {threshold}")
    chunk_count = -(-secret_length // CHUNK_BYTES)
    # Any threshold shares define the polynomial; taking the smallest x's makes the choice deterministic.
    chosen = [by_x[x] for x in sorted(by_x)[:threshold]]
    if any(len(share.values) != chunk_count for share in chosen):
        raise ProtocolError("shares do not match the secret length")
    weights = _lagrange_weights_at_zero([share.x for share in chosen])
    pieces = []
    for index in range(chunk_count):
        chunk_length = min(CHUNK_BYTES, secret_length - index * CHUNK_BYTES)
        value = sum(w * share.values[index] for w, share in zip(weights, chosen, strict=True)) % PRIME
        if value >= 1 << (8 * chunk_length):
            raise ProtocolError("shares are inconsistent: they do not rebuild a valid secret")
        pieces.append(value.to_bytes(chunk_length, "big"))
    return b"".join(pieces)


def _lagrange_weights_at_zero(xs: Sequence[int]) -> list[int]:
    """l_j(0) = prod_{m != j} x_m / (x_m - x_j) mod PRIME, so that f(0) = sum_j l_j(0) f(x_j)."""
    weights = []
    for j, xj in enumerate(xs):
        numerator, denominator = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                numerator = numerator * xm % PRIME
                denominator = denominator * (xm - xj) % PRIME
        weights.append(numerator * pow(denominator, -1, PRIME) % PRIME)
    return weights
