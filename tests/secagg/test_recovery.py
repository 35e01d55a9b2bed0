"""The server's last stage: a secret rebuilt only from t shares its owner dealt and committed to, every
liar named, the masks undone with the right signs, and an impossible sum refused."""

from __future__ import annotations

import os

import numpy as np
import pytest

from fedfair.core.errors import ProtocolError, SumOutOfRangeError, ThresholdError
from fedfair.secagg import keys, shamir
from fedfair.secagg.encode import Decoded, EncodingConfig
from fedfair.secagg.messages import AdvertiseKeys, EncryptedShares, RevealedShare
from fedfair.secagg.payloads import seed_commitment
from fedfair.secagg.recovery import Recovery, check_range, unmasking_streams
from fedfair.secagg.shares import SECRET_BYTES, Kind
from fedfair.secagg.wire import Header, Stage
from tests.secagg.helpers import make_config

CONFIG = make_config(5)  # t = 3 of parties 1..5
SESSION = bytes(range(32))
OWNER = 4
SEED = os.urandom(SECRET_BYTES)


def advertisement(party: int, seed: bytes = SEED) -> AdvertiseKeys:
    return AdvertiseKeys(
        Header(CONFIG.federation_id, CONFIG.round, Stage.ADVERTISE, b""),
        party,
        b"c" * 32,
        keys.public_bytes(keys.generate_key_pair()),
        seed_commitment(CONFIG.digest, party, seed),
        b"credential",
        b"signature",
    )


Revealed = dict[int, tuple[shamir.Share, RevealedShare]]


def recovery(dealing: tuple[EncryptedShares, ...]) -> Recovery:
    """The UNMASK stage of a round in which the owner dealt ``dealing`` (as the server verified it)."""
    return Recovery(CONFIG, SESSION, {OWNER: dealing}, {party: advertisement(party) for party in range(1, 6)})


def revealed_seed_shares(seed: bytes = SEED) -> tuple[Revealed, tuple[EncryptedShares, ...]]:
    """Every holder's share of `seed`, as revealed, and the owner's dealing committing to each holder's pair."""
    seed_shares = shamir.split(seed, CONFIG.t, range(1, 6))
    key_shares = shamir.split(os.urandom(SECRET_BYTES), CONFIG.t, range(1, 6))
    revealed: Revealed = {}
    dealing = []
    for holder in range(1, 6):
        seed_bytes, key_bytes = seed_shares[holder].to_bytes(), key_shares[holder].to_bytes()
        revealed[holder] = (seed_shares[holder], RevealedShare(OWNER, seed_bytes))
        if holder != OWNER:  # the owner keeps its own shares: no line of its dealing
            committed_seed, committed_key = (
                kind.commitment(SESSION, OWNER, holder, share)
                for kind, share in ((Kind.SEED, seed_bytes), (Kind.MASK_KEY, key_bytes))
            )
            dealing.append(EncryptedShares(OWNER, holder, b"sealed", committed_seed, committed_key))
    return revealed, tuple(dealing)


def test_a_seed_is_rebuilt_from_t_dealt_shares_and_not_from_fewer() -> None:
    shares, dealing = revealed_seed_shares()
    rebuilding = recovery(dealing)
    for responder in (1, 2):
        rebuilding.add(responder, Kind.SEED, {OWNER: shares[responder]})
    assert rebuilding.rebuild(Kind.SEED, OWNER) is None
    rebuilding.add(3, Kind.SEED, {OWNER: shares[3]})
    rebuilt = rebuilding.rebuild(Kind.SEED, OWNER)
    assert rebuilt is not None and rebuilt[0] == SEED
    assert rebuilding.audit(Kind.SEED, OWNER) == {}


def test_a_share_its_owner_never_dealt_is_named_and_left_out() -> None:
    shares, dealing = revealed_seed_shares()
    share, _ = shares[2]
    forged = shamir.Share(share.x, tuple((value + 1) % shamir.PRIME for value in share.values))
    rebuilding = recovery(dealing)
    rebuilding.add(2, Kind.SEED, {OWNER: (forged, RevealedShare(OWNER, forged.to_bytes()))})
    for responder in (1, 3, 5):
        rebuilding.add(responder, Kind.SEED, {OWNER: shares[responder]})
    rebuilt = rebuilding.rebuild(Kind.SEED, OWNER)
    assert rebuilt is not None and rebuilt[0] == SEED
    assert rebuilding.audit(Kind.SEED, OWNER) == {
        2: f"sent a bad unmask share for party {OWNER} (a share of its self-mask seed that party {OWNER} never "
        "dealt: it does not match the dealer's signed dealing)"
    }


@pytest.mark.parametrize("liar", [1, 5])
def test_one_batched_rebuild_takes_clean_secrets_and_sends_only_a_bad_share_to_the_audit(liar: int) -> None:
    # Party 1's share is in the basis (the candidate fails its commitment), party 5's is not (the
    # candidate is right but the shares disagree): either way the secret comes back and the liar is named.
    shares, dealing = revealed_seed_shares()
    rebuilding = recovery(dealing)
    clean = (Kind.SEED, OWNER)
    for responder in range(1, 6):
        share, _ = shares[responder]
        if responder == liar:
            share = shamir.Share(share.x, ((share.values[0] + 1) % shamir.PRIME, *share.values[1:]))
        rebuilding.add(responder, Kind.SEED, {OWNER: (share, RevealedShare(OWNER, share.to_bytes()))})
    secrets, suspects = rebuilding.rebuild_all([clean])
    assert secrets == {clean: SEED} and suspects == {clean}
    assert list(rebuilding.audit(*clean)) == [liar]
    honest = recovery(dealing)
    for responder in range(1, 6):
        honest.add(responder, Kind.SEED, {OWNER: shares[responder]})
    assert honest.rebuild_all([clean]) == ({clean: SEED}, set())


def test_an_owner_whose_signed_shares_rebuild_another_secret_is_named_and_the_round_fails() -> None:
    shares, dealing = revealed_seed_shares(os.urandom(SECRET_BYTES))  # not the committed seed
    rebuilding = recovery(dealing)
    for responder in (1, 2, 3):
        rebuilding.add(responder, Kind.SEED, {OWNER: shares[responder]})
    assert rebuilding.rebuild(Kind.SEED, OWNER) is None
    culprits = rebuilding.audit(Kind.SEED, OWNER)
    assert culprits == {
        OWNER: "dealt signed shares of its self-mask seed that rebuild another secret than it committed to"
    }
    error = rebuilding.failure([(Kind.SEED, OWNER)], {OWNER: culprits[OWNER]})
    assert type(error) is ProtocolError and "Culprits: party 4 dealt signed shares" in str(error)


def test_too_few_dealt_shares_fail_as_below_the_threshold() -> None:
    shares, dealing = revealed_seed_shares()
    rebuilding = recovery(dealing)
    rebuilding.add(1, Kind.SEED, {OWNER: shares[1]})
    error = rebuilding.failure([(Kind.SEED, OWNER)], {})
    assert isinstance(error, ThresholdError) and "1 shares, 1 dealt by it" in str(error)


def test_revealed_shares_are_refused_unless_requested_held_and_well_formed() -> None:
    shares, dealing = revealed_seed_shares()
    rebuilding = recovery(dealing)
    _, entry = shares[2]
    assert set(rebuilding.parse_revealed(2, (entry,), {OWNER})) == {OWNER}
    with pytest.raises(ProtocolError, match="unrequested or repeated share of party 4"):
        rebuilding.parse_revealed(2, (entry,), {1})
    with pytest.raises(ProtocolError, match="unrequested or repeated share of party 4"):
        rebuilding.parse_revealed(2, (entry, entry), {OWNER})
    with pytest.raises(ProtocolError, match="revealed a share with another party's x"):
        rebuilding.parse_revealed(3, (entry,), {OWNER})


def test_the_masks_undone_are_each_survivors_self_mask_and_the_pair_masks_it_added_for_the_dropped() -> None:
    """A survivor with the smaller id added the pair stream and one with the larger subtracted it, so the
    server subtracts and adds them back: the signs are -1 and +1 respectively."""
    mask_key = keys.generate_key_pair()
    survivors = {1, 2, 5}
    advertisements = {party: advertisement(party) for party in range(1, 6)}
    masks = unmasking_streams(
        {(Kind.SEED, 1): SEED, (Kind.MASK_KEY, 3): keys.private_bytes(mask_key)},
        session=SESSION,
        config=CONFIG,
        masked=survivors,
        advertisements=advertisements,
    )
    expected = [(keys.self_mask_key(SEED, SESSION, 1), -1)]
    for survivor in sorted(CONFIG.graph[3] & survivors):
        secret = keys.agree(mask_key, advertisements[survivor].mask_public_key)
        expected.append((keys.pair_mask_key(secret, SESSION, 3, survivor), -1 if survivor < 3 else 1))
    assert masks == expected


def test_an_impossible_decoded_sum_is_refused() -> None:
    encoding = EncodingConfig(clip=1.0, max_weight=10.0, fractional_bits=16)
    bound = 3 * 2.0**-16
    check_range(Decoded(np.array([5.0, -5.0]), 12.0, bound, 1.0), 3, encoding)
    with pytest.raises(SumOutOfRangeError, match="total weight 0 is outside"):
        check_range(Decoded(np.array([0.0, 0.0]), 0.0, bound, 1.0), 3, encoding)
    with pytest.raises(SumOutOfRangeError, match="total weight 31 is outside"):
        check_range(Decoded(np.array([0.0, 0.0]), 31.0, bound, 1.0), 3, encoding)
    with pytest.raises(SumOutOfRangeError, match="beyond clip"):
        check_range(Decoded(np.array([12.5, 0.0]), 12.0, bound, 1.0), 3, encoding)
    with pytest.raises(SumOutOfRangeError, match="coordinate of the decoded weighted sum is 12.5"):
        check_range(Decoded(np.array([1.0, -12.5]), 12.0, bound, 1.0), 3, encoding)
