"""The shares a party holds: a dealer's entry opened only when every check passes, each failure named,
and no share revealed before t distinct survivors signed the party's view."""

from __future__ import annotations

import os

import pytest

from fedfair.pki.identity import generate_identity_key, sign
from fedfair.secagg import keys, shamir
from fedfair.secagg.codec import Writer
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import EncodingConfig
from fedfair.secagg.errors import UnmaskRefusedError
from fedfair.secagg.messages import EncryptedShares
from fedfair.secagg.payloads import consistency_payload, dealt_shares_payload, share_digest, share_entry_payload
from fedfair.secagg.shares import SECRET_BYTES, Held, Kind, check_view_signatures, open_entry

SESSION = bytes(range(32))
SENDER, RECIPIENT = 2, 5
DEALER = generate_identity_key()
SHARE_KEY = os.urandom(32)


def dealt(
    *, sender: int = SENDER, recipient: int = RECIPIENT, share_x: int = RECIPIENT, chunks: int | None = None
) -> tuple[bytes, bytes, bytes]:
    """A seed share and a mask-key share at x = `share_x`, and the dealer's signature over their digests."""
    seed = shamir.split(os.urandom(SECRET_BYTES), 2, (share_x, share_x + 10))[share_x]
    key = shamir.split(os.urandom(SECRET_BYTES), 2, (share_x, share_x + 10))[share_x]
    if chunks is not None:
        seed = shamir.Share(seed.x, seed.values[:chunks])
    seed_bytes, key_bytes = seed.to_bytes(), key.to_bytes()
    payload = dealt_shares_payload(SESSION, sender, recipient, share_digest(seed_bytes), share_digest(key_bytes))
    return seed_bytes, key_bytes, sign(DEALER, payload)


def entry(
    shares: tuple[bytes, bytes, bytes], *, labels: tuple[int, int] = (SENDER, RECIPIENT), key: bytes = SHARE_KEY
) -> EncryptedShares:
    plaintext = Writer().u32(labels[0]).u32(labels[1]).blob(shares[0]).blob(shares[1]).blob(shares[2]).getvalue()
    sealed = keys.seal(key, plaintext, keys.share_associated_data(SESSION, SENDER, RECIPIENT))
    signature = sign(DEALER, share_entry_payload(SESSION, SENDER, RECIPIENT, sealed))
    return EncryptedShares(SENDER, RECIPIENT, sealed, signature)


def opened(encrypted: EncryptedShares) -> Held | str:
    return open_entry(
        encrypted, session=SESSION, party=RECIPIENT, identity=DEALER.public_key(), share_key=SHARE_KEY
    )


def test_a_well_formed_entry_opens_to_the_dealt_shares_and_reveals_either_with_the_others_digest() -> None:
    shares = dealt()
    held = opened(entry(shares))
    assert held == Held(*shares)
    assert isinstance(held, Held)
    seed = held.reveal(SENDER, Kind.SEED)
    assert (seed.owner, seed.share, seed.other_digest) == (SENDER, shares[0], share_digest(shares[1]))
    key = held.reveal(SENDER, Kind.MASK_KEY)
    assert (key.share, key.other_digest, key.dealer_signature) == (shares[1], share_digest(shares[0]), shares[2])


def test_each_bad_entry_is_opened_to_the_reason_its_sender_is_accused() -> None:
    good = entry(dealt())
    forged = EncryptedShares(SENDER, RECIPIENT, good.ciphertext, sign(generate_identity_key(), b"other"))
    assert opened(forged) == "its share entry's signature does not verify"
    wrong_key = entry(dealt(), key=os.urandom(32))
    assert opened(wrong_key) == "its encrypted shares fail authentication"
    assert opened(entry(dealt(), labels=(SENDER, 7))) == "its shares are labelled for another sender or recipient"
    assert opened(entry(dealt(share_x=9))) == "its shares are labelled for another sender or recipient"
    assert opened(entry(dealt(chunks=1))) == "its shares have the wrong length"
    seed, key, _ = dealt()
    assert opened(entry((seed, key, sign(DEALER, b"not the dealt payload")))) == "its dealt shares are not signed by it"


CONFIG = SecAggConfig(
    federation_id="fed",
    round=1,
    parties=tuple(f"p{index}" for index in range(1, 6)),
    dimension=4,
    encoding=EncodingConfig(clip=1.0, max_weight=1.0, fractional_bits=8),
)
IDENTITIES = {party: generate_identity_key() for party in range(1, 6)}
VIEW = ((1, 2, 3, 4, 5), (1, 2, 3, 4))


def signatures(*parties: int, view: tuple[tuple[int, ...], tuple[int, ...]] = VIEW) -> tuple[tuple[int, bytes], ...]:
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
        signatures(1, 2) + signatures(3, view=((1, 2, 3, 4, 5), (1, 2, 3))),  # 3 signed another view
        signatures(1, 2) + ((3, b"\x00" * 70),),  # a forgery
    ],
    ids=["too-few", "repeat", "non-survivor", "other-view", "forgery"],
)
def test_shares_are_refused_without_t_distinct_valid_signatures_on_the_same_view(
    relayed: tuple[tuple[int, bytes], ...],
) -> None:
    with pytest.raises(UnmaskRefusedError, match="distinct survivors signed the view"):
        check(relayed)
