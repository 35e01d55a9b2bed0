"""Shamir sharing over GF(2^127 - 1): reconstruction from any t shares, nothing from t - 1."""

from __future__ import annotations

import itertools
import os

import pytest

from fedfair.secagg import shamir
from fedfair.secagg.errors import ProtocolError, ThresholdError


def test_field_is_at_least_127_bits_and_chunks_fit() -> None:
    assert shamir.PRIME == 2**127 - 1
    assert 256**shamir.CHUNK_BYTES < shamir.PRIME


def test_combine_known_answer() -> None:
    # f(x) = 42 + 7x: shares (1, 49) and (2, 56) rebuild f(0) = 42 = b"*".
    shares = [shamir.Share(1, (49,)), shamir.Share(2, (56,))]
    assert shamir.combine(shares, 2, 1) == b"*"
    # g(x) = 5 + 3x + 2x^2 through x = 1, 3, 4.
    shares = [shamir.Share(1, (10,)), shamir.Share(3, (32,)), shamir.Share(4, (49,))]
    assert shamir.combine(shares, 3, 1) == b"\x05"


@pytest.mark.parametrize("length", [1, 15, 16, 32, 45])
def test_any_t_shares_rebuild_the_secret(length: int) -> None:
    secret = os.urandom(length)
    holders = [1, 2, 3, 5, 8]
    shares = shamir.split(secret, 3, holders)
    assert len(next(iter(shares.values())).values) == -(-length // shamir.CHUNK_BYTES)
    for subset in itertools.combinations(holders, 3):
        assert shamir.combine([shares[x] for x in subset], 3, length) == secret
    assert shamir.combine(list(shares.values()), 3, length) == secret


def test_fewer_than_t_shares_do_not_rebuild_the_secret() -> None:
    secret = os.urandom(32)
    shares = shamir.split(secret, 4, range(1, 8))
    subset = [shares[x] for x in (2, 3, 6)]
    with pytest.raises(ThresholdError):
        shamir.combine(subset, 4, 32)
    # Interpolating the t - 1 shares as if they were enough yields garbage, not the secret.
    try:
        guess = shamir.combine(subset, 3, 32)
    except ProtocolError:
        guess = None
    assert guess != secret


def test_t_minus_1_shares_are_consistent_with_every_secret() -> None:
    # Perfect hiding: for any candidate secret there is a degree-(t-1) polynomial through the
    # t - 1 observed shares and (0, candidate), so the observed shares single out nothing.
    shares = shamir.split(b"\x11", 3, [1, 2, 3])
    observed = [(shares[1].x, shares[1].values[0]), (shares[2].x, shares[2].values[0])]
    p = shamir.PRIME
    for candidate in (0, 1, 0x11, 200):
        points = [(0, candidate), *observed]

        def through_points(x: int, points: list[tuple[int, int]] = points) -> int:
            total = 0
            for xj, yj in points:
                term = yj
                for xm, _ in points:
                    if xm != xj:
                        term = term * (x - xm) * pow(xj - xm, -1, p) % p
                total += term
            return total % p

        third = shamir.Share(3, (through_points(3),))
        assert shamir.combine([shares[1], shares[2], third], 3, 1) == bytes([candidate])


def test_share_serialisation_round_trips_and_refuses_malformed_input() -> None:
    share = shamir.split(os.urandom(32), 2, [4, 9])[9]
    assert shamir.Share.from_bytes(share.to_bytes()) == share
    data = share.to_bytes()
    for bad in (data[:5], data[:-1], data + b"\x00", bytes(4) + data[4:]):
        with pytest.raises(ProtocolError):
            shamir.Share.from_bytes(bad)
    too_big = shamir.Share(1, (shamir.PRIME,)).to_bytes()
    with pytest.raises(ProtocolError, match="outside the field"):
        shamir.Share.from_bytes(too_big)


def test_mixed_shares_of_two_secrets_are_detected_or_wrong() -> None:
    first, second = shamir.split(b"A" * 32, 2, [1, 2]), shamir.split(b"B" * 32, 2, [1, 2])
    try:
        mixed = shamir.combine([first[1], second[2]], 2, 32)
    except ProtocolError:
        mixed = None
    assert mixed not in (b"A" * 32, b"B" * 32)


def test_split_refuses_bad_parameters() -> None:
    with pytest.raises(ValueError):
        shamir.split(b"x", 4, [1, 2, 3])
    with pytest.raises(ValueError):
        shamir.split(b"x", 0, [1, 2, 3])
    with pytest.raises(ValueError):
        shamir.split(b"x", 2, [0, 1, 2])
