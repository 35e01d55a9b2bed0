"""The shares a party holds of its peers' secrets: opening a dealer's entry, revealing one share, and
the signatures that must come before any share is revealed.

Each peer deals this party a share of its self-mask seed and of its mask key, sealed for it
and signed by the dealer (so a share revealed later can be traced to its dealer). A party
reveals a share only for the one view it signed, and only once t distinct survivors signed
that same view (:func:`check_view_signatures`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.pki.identity import is_valid_signature
from fedfair.secagg import keys, shamir
from fedfair.secagg.codec import Reader
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.errors import AuthenticationError, ProtocolError, UnmaskRefusedError
from fedfair.secagg.messages import EncryptedShares, RevealedShare
from fedfair.secagg.payloads import consistency_payload, dealt_shares_payload, share_digest, share_entry_payload

SECRET_BYTES = 32
"""Length of the two shared secrets: the self-mask seed and the raw X25519 mask key."""

SHARE_CHUNKS = -(-SECRET_BYTES // shamir.CHUNK_BYTES)
"""Field elements per share of a secret."""


class Kind(enum.Enum):
    """Which secret of a peer a share is of."""

    SEED = "self-mask seed"
    MASK_KEY = "mask key"


@dataclass(frozen=True)
class Held:
    """The two shares a dealer gave this party, as received, with the dealer's signature over their digests."""

    seed: bytes
    key: bytes
    dealer_signature: bytes

    def reveal(self, owner: int, kind: Kind) -> RevealedShare:
        if kind is Kind.SEED:
            return RevealedShare(owner, self.seed, share_digest(self.key), self.dealer_signature)
        return RevealedShare(owner, self.key, share_digest(self.seed), self.dealer_signature)


def open_entry(
    entry: EncryptedShares, *, session: bytes, party: int, identity: ec.EllipticCurvePublicKey, share_key: bytes
) -> Held | str:
    """The checked shares in one bundle entry addressed to `party`, or why its sender is accused.

    `identity` is the sender's verified identity key and `share_key` the key this party agreed
    with the sender for sealing shares.
    """
    sender = entry.sender
    entry_payload = share_entry_payload(session, sender, party, entry.ciphertext)
    if not is_valid_signature(identity, entry.signature, entry_payload):
        return "its share entry's signature does not verify"
    associated_data = keys.share_associated_data(session, sender, party)
    try:
        plaintext = keys.open_sealed(share_key, entry.ciphertext, associated_data)
    except AuthenticationError:
        return "its encrypted shares fail authentication"
    try:
        reader = Reader(plaintext)
        claimed_sender, claimed_recipient = reader.u32(), reader.u32()
        seed_bytes, key_bytes, dealer_signature = reader.blob(), reader.blob(), reader.blob()
        reader.finish()
        seed_share, key_share = shamir.Share.from_bytes(seed_bytes), shamir.Share.from_bytes(key_bytes)
    except ProtocolError:
        return "its shares are malformed"
    if (claimed_sender, claimed_recipient) != (sender, party) or seed_share.x != party or key_share.x != party:
        return "its shares are labelled for another sender or recipient"
    if len(seed_share.values) != SHARE_CHUNKS or len(key_share.values) != SHARE_CHUNKS:
        return "its shares have the wrong length"
    payload = dealt_shares_payload(session, sender, party, share_digest(seed_bytes), share_digest(key_bytes))
    if not is_valid_signature(identity, dealer_signature, payload):
        return "its dealt shares are not signed by it"
    return Held(seed_bytes, key_bytes, dealer_signature)


def check_view_signatures(
    signatures: tuple[tuple[int, bytes], ...],
    view: tuple[tuple[int, ...], tuple[int, ...]],
    *,
    session: bytes,
    identities: Mapping[int, ec.EllipticCurvePublicKey],
    config: SecAggConfig,
    wanted: Mapping[int, Kind],
) -> None:
    """Refuse unless t distinct survivors of `view` (t holders of every owner in `wanted`) signed it.

    `view` is the (U2', U3) this party signed; `signatures` are the (party, signature) pairs the
    server relayed. Signatures of non-survivors, repeats and forgeries do not count.
    """
    payload = consistency_payload(session, *view)
    survivors = set(view[1])
    t = config.t
    holders = {owner: config.holders_of(owner) for owner in wanted}
    signers: set[int] = set()

    def enough() -> bool:
        return len(signers) >= t and all(len(signers & group) >= t for group in holders.values())

    for party, signature in sorted(signatures):
        if enough():
            break
        if party in survivors and party not in signers:
            if is_valid_signature(identities[party], signature, payload):
                signers.add(party)
    if not enough():
        raise UnmaskRefusedError(
            f"only {len(signers)} distinct survivors signed the view this party signed (t = {t} needed, "
            "from the holders of every secret asked for); the server may be showing different views, refused"
        )
