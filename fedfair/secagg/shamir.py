"""Shamir t-of-n secret sharing over the prime field GF(2^127 - 1).

A secret byte string is cut into 15-byte chunks, each the constant term of its own random
polynomial of degree t - 1 (coefficients from :mod:`secrets`); a share is every polynomial's value
at the holder's party id (never 0). Any t shares determine the secret, any t - 1 reveal nothing.
:func:`find_verified` and :func:`off_polynomial` rebuild a checkable secret despite wrong shares
and name them; :func:`rebuild_many` does it for many secrets at once (docs/design.md, "Inside
secure aggregation").
"""

from __future__ import annotations

import functools
import itertools
import secrets
import struct
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter, mul
from typing import TypeVar

from fedfair.core.errors import ProtocolError, ThresholdError

PRIME = (1 << 127) - 1
"""The field modulus, the Mersenne prime 2^127 - 1."""

CHUNK_BYTES = 15
"""Secret bytes per field element: 2^120 < PRIME, so every chunk is a field element."""

_VALUE_BYTES = 16

MAX_SUBSETS = 4096
"""How many t-subsets :func:`find_verified` tries at most before it gives up."""

_K = TypeVar("_K", bound=Hashable)
_X = attrgetter("x")
_VALUES = attrgetter("values")


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
        # The server parses every revealed share, n^2 of them a round: keep the per-share work in C.
        view = memoryview(data)
        values = tuple(int.from_bytes(view[i : i + _VALUE_BYTES]) for i in range(8, len(data), _VALUE_BYTES))
        if values and max(values) >= PRIME:
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

    Uses the ``threshold`` shares with the smallest x and trusts them; when shares may be
    wrong and the secret can be checked, use :func:`find_verified` instead.

    Raises:
        ThresholdError: fewer than ``threshold`` distinct holders.
        ProtocolError: the shares do not interpolate to a secret of that length (a corrupted or
            mismatched share).
    """
    by_x = {share.x: share for share in shares}
    if len(by_x) < threshold:
        raise ThresholdError(f"{len(by_x)} shares cannot rebuild a secret shared with threshold {threshold}")
    # Any threshold shares define the polynomial; taking the smallest x's makes the choice deterministic.
    chosen = [by_x[x] for x in sorted(by_x)[:threshold]]
    secret = secret_at_zero(chosen, secret_length)
    if secret is None:
        raise ProtocolError("shares are inconsistent: they do not rebuild a valid secret")
    return secret


def secret_at_zero(basis: Sequence[Share], secret_length: int) -> bytes | None:
    """The ``secret_length``-byte secret the polynomials through ``basis`` hide, or None if they hide none.

    None means a value at 0 does not fit its chunk (impossible for shares of one secret,
    so some share in ``basis`` is wrong) or the shares have the wrong number of chunks.
    """
    chunk_count = -(-secret_length // CHUNK_BYTES)
    if not basis or any(len(share.values) != chunk_count for share in basis):
        return None
    return _secret_bytes(evaluate(basis, 0), secret_length)


def _secret_bytes(values: Sequence[int], secret_length: int) -> bytes | None:
    """The secret whose chunks are ``values`` (one per chunk), or None if a value does not fit its chunk."""
    pieces = []
    for index, value in enumerate(values):
        chunk_length = min(CHUNK_BYTES, secret_length - index * CHUNK_BYTES)
        if value >= 1 << (8 * chunk_length):
            return None
        pieces.append(value.to_bytes(chunk_length, "big"))
    return b"".join(pieces)


@dataclass(frozen=True)
class Rebuilt:
    """One secret of :func:`rebuild_many`.

    secret: the secret at 0 of the polynomials through ``basis``, or None if they hide none.
    basis: the ``threshold`` shares with the smallest x.
    consistent: whether every share given lies on those polynomials (false with probability at
        most 1/PRIME when one does not).
    """

    secret: bytes | None
    basis: tuple[Share, ...]
    consistent: bool


def rebuild_many(groups: Mapping[_K, Sequence[Share]], threshold: int, secret_length: int) -> dict[_K, Rebuilt]:
    """Each group's secret from its ``threshold`` smallest-x shares, and whether all its shares agree.

    The result for a group equals ``combine`` on it (when it has a secret) and ``off_polynomial``
    finding nothing (when it is consistent), at the cost of one dot product per chunk for each:
    the Lagrange weights at 0 and a random dual-code vector are made once per distinct set of x
    and reused for every group with that set. Groups with fewer than ``threshold`` shares,
    repeated x or shares of another length than ``secret_length`` needs are left out.
    """
    chunk_count = -(-secret_length // CHUNK_BYTES)
    by_xs: dict[tuple[int, ...], list[tuple[_K, list[Share]]]] = {}
    for key, group in groups.items():
        ordered = sorted(group, key=_X)
        xs = tuple(map(_X, ordered))
        if len(xs) >= threshold and len(set(xs)) == len(xs) and set(map(len, map(_VALUES, ordered))) == {chunk_count}:
            by_xs.setdefault(xs, []).append((key, ordered))
    rebuilt: dict[_K, Rebuilt] = {}
    for xs, members in by_xs.items():
        weights = lagrange_weights(xs[:threshold], 0)
        check = _dual_vector(xs, threshold)
        for key, ordered in members:
            # One column per chunk, across the shares in x order; map stops the weights at the basis.
            columns = list(zip(*map(_VALUES, ordered), strict=True))
            at_zero = [sum(map(mul, weights, column)) % PRIME for column in columns]
            consistent = all(sum(map(mul, check, column)) % PRIME == 0 for column in columns)
            rebuilt[key] = Rebuilt(_secret_bytes(at_zero, secret_length), tuple(ordered[:threshold]), consistent)
    return rebuilt


def _dual_vector(xs: tuple[int, ...], threshold: int) -> tuple[int, ...]:
    """A random c with sum_j c_j f(x_j) = 0 for every polynomial f of degree < threshold.

    With v_j = 1 / prod_{k != j} (x_j - x_k), sum_j v_j h(x_j) = 0 for any h of degree at most
    m - 2 (m = len(xs)), so c_j = v_j g(x_j) for g of degree at most m - 1 - threshold: these c
    span the dual of the code of evaluations. g is drawn fresh from :mod:`secrets`, so no share
    can be crafted to pass: a vector of values off every such polynomial gives c . y = 0 with
    probability 1/PRIME. Empty when m = threshold (any threshold values lie on a polynomial).
    """
    if len(xs) == threshold:
        return ()
    coefficients = [secrets.randbelow(PRIME) for _ in range(len(xs) - threshold)]
    vector = []
    for j, xj in enumerate(xs):
        product = 1
        for k, xk in enumerate(xs):
            if k != j:
                product = product * (xj - xk) % PRIME
        g = 0
        for coefficient in coefficients:  # Horner
            g = (g * xj + coefficient) % PRIME
        vector.append(pow(product, -1, PRIME) * g % PRIME)
    return tuple(vector)


def evaluate(basis: Sequence[Share], x: int) -> tuple[int, ...]:
    """The value at ``x`` of each chunk's polynomial of degree < len(basis) through the ``basis`` shares.

    The basis shares must have distinct x and the same number of chunks (ValueError otherwise).
    """
    xs = tuple(share.x for share in basis)
    if len(set(xs)) != len(xs):
        raise ValueError("basis shares must have distinct x")
    chunks = {len(share.values) for share in basis}
    if len(chunks) != 1:
        raise ValueError("basis shares must have the same number of chunks")
    weights = lagrange_weights(xs, x % PRIME)
    (chunk_count,) = chunks
    return tuple(
        sum(w * share.values[index] for w, share in zip(weights, basis, strict=True)) % PRIME
        for index in range(chunk_count)
    )


def off_polynomial(basis: Sequence[Share], shares: Iterable[Share]) -> list[Share]:
    """The ``shares`` that do not lie on the polynomials through ``basis`` (in the order given).

    A share with another number of chunks than the basis is off. Basis shares are on.
    """
    on_basis = {share.x: share for share in basis}
    chunk_count = len(basis[0].values) if basis else 0
    off = []
    for share in shares:
        if share.x in on_basis:
            if share != on_basis[share.x]:
                off.append(share)
        elif len(share.values) != chunk_count or evaluate(basis, share.x) != share.values:
            off.append(share)
    return off


def find_verified(
    shares: Iterable[Share],
    threshold: int,
    secret_length: int,
    verify: Callable[[bytes], bool],
    max_subsets: int = MAX_SUBSETS,
) -> tuple[bytes, tuple[Share, ...]] | None:
    """The first secret that ``verify`` accepts, interpolated from a ``threshold``-subset of ``shares``.

    Subsets are tried in lexicographic order of x (so the ``threshold`` smallest x first),
    at most ``max_subsets`` of them. Returns the secret and the subset (the basis of the
    polynomials that hide it), or None when no tried subset gives a verified secret.
    A verified secret is the dealt one as long as ``verify`` binds it (a hash or a public
    key), whatever the other shares say; :func:`off_polynomial` then finds the shares that
    disagree with that basis.
    """
    by_x = {share.x: share for share in shares}
    ordered = [by_x[x] for x in sorted(by_x)]
    if threshold < 1 or len(ordered) < threshold:
        return None
    for subset in itertools.islice(itertools.combinations(ordered, threshold), max_subsets):
        secret = secret_at_zero(subset, secret_length)
        if secret is not None and verify(secret):
            return secret, subset
    return None


@functools.lru_cache(maxsize=4096)
def lagrange_weights(xs: tuple[int, ...], at: int) -> tuple[int, ...]:
    """l_j(at) = prod_{m != j} (at - x_m) / (x_j - x_m) mod PRIME, so that f(at) = sum_j l_j(at) f(x_j).

    Cached: a round rebuilds many secrets from the same holders, so the same (xs, at) recurs.
    """
    weights = []
    for j, xj in enumerate(xs):
        numerator, denominator = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                numerator = numerator * (at - xm) % PRIME
                denominator = denominator * (xj - xm) % PRIME
        weights.append(numerator * pow(denominator, -1, PRIME) % PRIME)
    return tuple(weights)
