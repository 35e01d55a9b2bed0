"""Shamir sharing over GF(2^127 - 1): reconstruction from any t shares, nothing from t - 1, and robust
reconstruction that finds the verified secret and the shares that disagree with it."""

from __future__ import annotations

import hashlib
import itertools
import os
import secrets

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ProtocolError, ThresholdError
from fedfair.secagg import shamir


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


def test_evaluate_gives_the_polynomial_anywhere() -> None:
    # f(x) = 5 + 3x + 2x^2 through x = 1, 3, 4; and the same at every other x, including 0.
    basis = [shamir.Share(1, (10,)), shamir.Share(3, (32,)), shamir.Share(4, (49,))]
    for x in (0, 1, 2, 5, 100):
        assert shamir.evaluate(basis, x) == ((5 + 3 * x + 2 * x * x) % shamir.PRIME,)
    assert shamir.secret_at_zero(basis, 1) == b"\x05"
    with pytest.raises(ValueError, match="distinct"):
        shamir.evaluate([basis[0], basis[0]], 2)


def test_off_polynomial_names_exactly_the_shares_that_disagree() -> None:
    shares = shamir.split(os.urandom(32), 3, range(1, 8))
    basis = [shares[x] for x in (1, 2, 3)]
    assert shamir.off_polynomial(basis, shares.values()) == []
    bent = shamir.Share(5, (shares[5].values[0] ^ 1, *shares[5].values[1:]))
    short = shamir.Share(6, shares[6].values[:-1])
    assert shamir.off_polynomial(basis, [*basis, shares[4], bent, short, shares[7]]) == [bent, short]


def test_secret_at_zero_refuses_values_that_fit_no_secret() -> None:
    # A chunk of one byte cannot be 300; a wrong chunk count is no secret either.
    assert shamir.secret_at_zero([shamir.Share(1, (300,))], 1) is None
    assert shamir.secret_at_zero([shamir.Share(1, (3, 4))], 1) is None
    with pytest.raises(ProtocolError, match="inconsistent"):
        shamir.combine([shamir.Share(1, (300,))], 1, 1)


@settings(max_examples=40, deadline=None)
@given(
    holders=st.integers(3, 8),
    data=st.data(),
)
def test_find_verified_recovers_through_any_corruption_that_leaves_t_good_shares(
    holders: int, data: st.DataObject
) -> None:
    threshold = data.draw(st.integers(1, holders - 1), label="threshold")
    bad = data.draw(st.sets(st.integers(1, holders), max_size=holders - threshold), label="corrupted holders")
    secret = data.draw(st.binary(min_size=32, max_size=32), label="secret")
    shares = shamir.split(secret, threshold, range(1, holders + 1))
    # Pseudo-random offsets per share and chunk: structured ones (the same offset everywhere, or a low-degree
    # polynomial in x) are themselves polynomials and can vanish at 0, which verifies a wrong basis.
    seed = data.draw(st.binary(min_size=8, max_size=8), label="offset seed")

    def offset(x: int, chunk: int) -> int:
        return 1 + int.from_bytes(hashlib.sha256(seed + bytes([x, chunk])).digest(), "big") % (shamir.PRIME - 1)

    received = [
        shamir.Share(x, tuple((v + offset(x, i)) % shamir.PRIME for i, v in enumerate(share.values)))
        if x in bad
        else share
        for x, share in shares.items()
    ]
    committed = hashlib.sha256(secret).digest()
    found = shamir.find_verified(received, threshold, 32, lambda s: hashlib.sha256(s).digest() == committed)
    assert found is not None
    recovered, basis = found
    assert recovered == secret
    assert {share.x for share in shamir.off_polynomial(basis, received)} == bad


def test_find_verified_gives_up_without_t_good_shares_or_past_its_budget() -> None:
    secret = os.urandom(32)
    shares = shamir.split(secret, 3, range(1, 6))
    # Random offsets: a constant one would be a polynomial too, and some subsets would still verify.
    bent = [
        shamir.Share(x, tuple((v + secrets.randbelow(shamir.PRIME - 1) + 1) % shamir.PRIME for v in s.values))
        for x, s in shares.items()
    ]

    def check(candidate: bytes) -> bool:
        return candidate == secret

    # Three bent shares leave only two good ones: no subset verifies.
    assert shamir.find_verified([*bent[:3], shares[4], shares[5]], 3, 32, check) is None
    assert shamir.find_verified([shares[1], shares[2]], 3, 32, check) is None
    # With share 1 bent, the first subset fails; a budget of one subset stops there.
    mixed = [bent[0], *[shares[x] for x in (2, 3, 4, 5)]]
    assert shamir.find_verified(mixed, 3, 32, check, max_subsets=1) is None
    assert shamir.find_verified(mixed, 3, 32, check) is not None


@settings(max_examples=40, deadline=None)
@given(
    threshold=st.integers(1, 6),
    extra=st.integers(0, 5),
    owners=st.integers(1, 6),
    length=st.sampled_from([1, 15, 16, 32]),
    data=st.data(),
)
def test_rebuild_many_equals_combine_per_owner_and_flags_exactly_the_inconsistent_groups(
    threshold: int, extra: int, owners: int, length: int, data: st.DataObject
) -> None:
    # Owners share some sets of holders (the weights are reused) and not others.
    size = threshold + extra
    holder_sets = [sorted(data.draw(st.sets(st.integers(1, 40), min_size=size, max_size=size))) for _ in range(2)]
    groups: dict[int, list[shamir.Share]] = {}
    for owner in range(owners):
        holders = holder_sets[owner % 2]
        groups[owner] = list(shamir.split(secrets.token_bytes(length), threshold, holders).values())
    bent = data.draw(st.sets(st.sampled_from(range(owners))))
    for owner in bent:
        index = data.draw(st.integers(0, len(groups[owner]) - 1))
        share = groups[owner][index]
        groups[owner][index] = shamir.Share(share.x, ((share.values[0] + 1) % shamir.PRIME, *share.values[1:]))
    rebuilt = shamir.rebuild_many(groups, threshold, length)
    assert rebuilt.keys() == groups.keys()
    for owner, shares in groups.items():
        result = rebuilt[owner]
        basis = sorted(shares, key=lambda share: share.x)[:threshold]
        assert result.basis == tuple(basis)
        assert result.secret == shamir.secret_at_zero(basis, length)
        if result.secret is not None:
            assert result.secret == shamir.combine(shares, threshold, length)
        # One bent share is inconsistent with the rest unless the t shares are all there is.
        assert result.consistent == (not shamir.off_polynomial(basis, shares))
        assert result.consistent == (owner not in bent or extra == 0)


def test_rebuild_many_leaves_out_groups_it_cannot_rebuild() -> None:
    shares = list(shamir.split(b"s" * 16, 3, range(1, 6)).values())
    groups = {
        "ok": shares,
        "too few": shares[:2],
        "repeated x": [*shares[:2], shares[1]],
        "short": [*shares[:2], shamir.Share(3, shares[2].values[:1])],
    }
    assert set(shamir.rebuild_many(groups, 3, 16)) == {"ok"}
