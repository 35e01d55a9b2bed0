"""The shares a party holds: a dealer's entry opened only when every check passes, each failure named,
and no share revealed before t distinct survivors signed the party's view."""

from __future__ import annotations

import dataclasses
import os

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import UnmaskRefusedError
from fedfair.pki.identity import generate_identity_key, sign
from fedfair.secagg import keys, shamir
from fedfair.secagg.codec import Writer
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import EncodingConfig
from fedfair.secagg.messages import Dealing, EncryptedShares, RevealedShare
from fedfair.secagg.payloads import View, consistency_payload, dealing_lines, dealing_payload
from fedfair.secagg.shares import SECRET_BYTES, Held, Kind, check_view_signatures, open_entry

SESSION = bytes(range(32))
SENDER, RECIPIENT, OTHER = 2, 5, 3
DEALER = generate_identity_key()
SHARE_KEY = os.urandom(32)


def dealt(*, share_x: int = RECIPIENT, chunks: int | None = None) -> tuple[bytes, bytes]:
    """A seed share and a mask-key share at x = `share_x`."""
    seed = shamir.split(os.urandom(SECRET_BYTES), 2, (share_x, share_x + 10))[share_x]
    key = shamir.split(os.urandom(SECRET_BYTES), 2, (share_x, share_x + 10))[share_x]
    if chunks is not None:
        seed = shamir.Share(seed.x, seed.values[:chunks])
    return seed.to_bytes(), key.to_bytes()


def entry(
    shares: tuple[bytes, bytes],
    *,
    labels: tuple[int, int] = (SENDER, RECIPIENT),
    key: bytes = SHARE_KEY,
    committed: tuple[bytes, bytes] | None = None,
) -> EncryptedShares:
    """The sender's entry for the recipient, committing to `committed` (default: the shares sealed inside)."""
    plaintext = Writer().u32(labels[0]).u32(labels[1]).blob(shares[0]).blob(shares[1]).getvalue()
    sealed = keys.seal(key, plaintext, keys.share_associated_data(SESSION, SENDER, RECIPIENT))
    seed, mask_key = committed or shares
    return EncryptedShares(
        SENDER,
        RECIPIENT,
        sealed,
        Kind.SEED.commitment(SESSION, SENDER, RECIPIENT, seed),
        Kind.MASK_KEY.commitment(SESSION, SENDER, RECIPIENT, mask_key),
    )


def dealing_of(mine: EncryptedShares, signer: ec.EllipticCurvePrivateKey = DEALER) -> Dealing:
    """The sender's signed dealing over `mine` and an entry for another holder, as the server relays it."""
    other = EncryptedShares(SENDER, OTHER, b"sealed for party 3", b"s" * 32, b"k" * 32)
    holders, lines = dealing_lines(SESSION, SENDER, (other, mine))
    return Dealing(SENDER, holders, lines, sign(signer, dealing_payload(SESSION, SENDER, holders, lines)))


def opened(encrypted: EncryptedShares, dealing: Dealing | None = None) -> Held | str:
    return open_entry(
        encrypted,
        dealing or dealing_of(encrypted),
        session=SESSION,
        party=RECIPIENT,
        identity=DEALER.public_key(),
        share_key=SHARE_KEY,
    )


def test_a_well_formed_entry_opens_to_the_dealt_shares_and_reveals_either() -> None:
    shares = dealt()
    held = opened(entry(shares))
    assert held == Held(*shares)
    assert isinstance(held, Held)
    assert held.reveal(SENDER, Kind.SEED) == RevealedShare(SENDER, shares[0])
    assert held.reveal(SENDER, Kind.MASK_KEY) == RevealedShare(SENDER, shares[1])


def test_each_bad_entry_is_opened_to_the_reason_its_sender_is_accused() -> None:
    good = entry(dealt())
    forged = dealing_of(good, generate_identity_key())
    assert opened(good, forged) == "its dealing's signature does not verify"
    tampered = dataclasses.replace(good, ciphertext=good.ciphertext[:-1] + bytes([good.ciphertext[-1] ^ 1]))
    assert opened(tampered, dealing_of(good)) == "its share entry does not match its signed dealing"
    assert opened(good, dataclasses.replace(dealing_of(good), holders=(OTHER, 6))) == (
        "its share entry does not match its signed dealing"
    )
    wrong_key = entry(dealt(), key=os.urandom(32))
    assert opened(wrong_key) == "its encrypted shares fail authentication"
    assert opened(entry(dealt(), labels=(SENDER, 7))) == "its shares are labelled for another sender or recipient"
    assert opened(entry(dealt(share_x=9))) == "its shares are labelled for another sender or recipient"
    assert opened(entry(dealt(chunks=1))) == "its shares have the wrong length"
    seed, key = dealt()
    assert opened(entry((seed, key), committed=(key, seed))) == (
        "its shares do not match the commitments in its signed dealing"
    )


def test_share_commitments_bind_session_owner_holder_and_kind() -> None:
    share = dealt()[0]
    commitments = {
        Kind.SEED.commitment(SESSION, SENDER, RECIPIENT, share),
        Kind.MASK_KEY.commitment(SESSION, SENDER, RECIPIENT, share),
        Kind.SEED.commitment(SESSION, RECIPIENT, SENDER, share),
        Kind.SEED.commitment(SESSION, SENDER, OTHER, share),
        Kind.SEED.commitment(bytes(32), SENDER, RECIPIENT, share),
        Kind.SEED.commitment(SESSION, SENDER, RECIPIENT, dealt()[0]),
    }
    assert len(commitments) == 6 and all(len(c) == 32 for c in commitments)


CONFIG = SecAggConfig(
    federation_id="fed",
    round=1,
    parties=tuple(f"p{index}" for index in range(1, 6)),
    dimension=4,
    encoding=EncodingConfig(clip=1.0, max_weight=1.0, fractional_bits=8),
)
IDENTITIES = {party: generate_identity_key() for party in range(1, 6)}
VIEW = ((1, 2, 3, 4, 5), (1, 2, 3, 4), (b"1" * 32, b"2" * 32, b"3" * 32, b"4" * 32))


def signatures(*parties: int, view: View = VIEW) -> tuple[tuple[int, bytes], ...]:
    payload = consistency_payload(SESSION, *view)
    return tuple((party, sign(IDENTITIES[party], payload)) for party in parties)


def check(relayed: tuple[tuple[int, bytes], ...]) -> None:
    public = {party: key.public_key() for party, key in IDENTITIES.items()}
    check_view_signatures(
        relayed, VIEW, session=SESSION, identities=public, config=CONFIG, wanted={1: Kind.SEED, 5: Kind.MASK_KEY}
    )


def test_t_distinct_survivors_signing_the_view_let_shares_be_revealed() -> None:
    assert CONFIG.t == 3
    check(signatures(1, 2, 3))
    check(signatures(4, 3, 2, 1))


@pytest.mark.parametrize(
    "relayed",
    [
        signatures(1, 2),  # too few
        signatures(1, 2) + signatures(2),  # a repeat does not count twice
        signatures(1, 2, 5),  # 5 did not survive: its signature does not count
        signatures(1, 2) + signatures(3, view=((1, 2, 3, 4, 5), (1, 2, 3), VIEW[2][:3])),  # 3 signed another view
        signatures(1, 2) + signatures(3, view=(*VIEW[:2], (b"0" * 32, *VIEW[2][1:]))),  # another masked input
        signatures(1, 2) + ((3, b"\x00" * 70),),  # a forgery
    ],
    ids=["too-few", "repeat", "non-survivor", "other-view", "other-input", "forgery"],
)
def test_shares_are_refused_without_t_distinct_valid_signatures_on_the_same_view(
    relayed: tuple[tuple[int, bytes], ...],
) -> None:
    with pytest.raises(UnmaskRefusedError, match="distinct survivors signed the view"):
        check(relayed)
