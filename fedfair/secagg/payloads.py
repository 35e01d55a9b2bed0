"""What the parties sign: domain-separated payloads, the seed commitment and the session id.

What must survive an active aggregator is signed with the parties' identity keys (ECDSA
P-256, :mod:`fedfair.pki.identity`) over a payload built here: advertisements, each
encrypted share entry, each share check, each consistency view, and, inside the
encryption, each pair of dealt shares (so that a share revealed at unmasking can be traced
to its dealer). Every payload starts with its own domain string, so no signature over one
kind can be replayed as another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol

from fedfair.secagg.codec import Writer

_DOMAIN = "fedfair/secagg/v2/"


class Advertised(Protocol):
    """What the session id covers of an advertisement."""

    @property
    def sender(self) -> int: ...

    @property
    def cipher_public_key(self) -> bytes: ...

    @property
    def mask_public_key(self) -> bytes: ...

    @property
    def seed_commitment(self) -> bytes: ...


def seed_commitment(config_digest: bytes, party: int, seed: bytes) -> bytes:
    """SHA-256 commitment to a party's self-mask seed, bound to the round's parameters and the party."""
    writer = Writer().text(_DOMAIN + "seed-commitment").blob(config_digest).u32(party).blob(seed)
    return hashlib.sha256(writer.getvalue()).digest()


def advertisement_payload(
    config_digest: bytes, sender: int, cipher_public_key: bytes, mask_public_key: bytes, seed_commitment: bytes
) -> bytes:
    """The bytes a party signs at ADVERTISE: its id, keys and seed commitment, bound to this round's parameters."""
    writer = Writer().text(_DOMAIN + "advertise").blob(config_digest).u32(sender)
    return writer.blob(cipher_public_key).blob(mask_public_key).blob(seed_commitment).getvalue()


def share_entry_payload(session: bytes, sender: int, recipient: int, ciphertext: bytes) -> bytes:
    """The bytes a sender signs for one encrypted share entry."""
    return Writer().text(_DOMAIN + "share-entry").blob(session).u32(sender).u32(recipient).blob(ciphertext).getvalue()


def share_digest(share: bytes) -> bytes:
    """SHA-256 of one serialised Shamir share, as the dealer signs it."""
    return hashlib.sha256(Writer().text(_DOMAIN + "share-digest").blob(share).getvalue()).digest()


def dealt_shares_payload(session: bytes, owner: int, holder: int, seed_digest: bytes, key_digest: bytes) -> bytes:
    """The bytes a dealer signs for the two shares (seed, mask key) it deals one holder, inside the encryption.

    Signing digests lets the holder later reveal one share and prove it was dealt, without
    revealing the other.
    """
    writer = Writer().text(_DOMAIN + "dealt-shares").blob(session).u32(owner).u32(holder)
    return writer.blob(seed_digest).blob(key_digest).getvalue()


def share_check_payload(session: bytes, sender: int, accused: tuple[int, ...]) -> bytes:
    """The bytes a party signs with its share check."""
    writer = Writer().text(_DOMAIN + "share-check").blob(session).u32(sender)
    writer.ids(accused)
    return writer.getvalue()


def consistency_payload(session: bytes, masking_set: tuple[int, ...], survivors: tuple[int, ...]) -> bytes:
    """The bytes a survivor signs in the CONSISTENCY stage: the view (U2', U3) it was shown."""
    writer = Writer().text(_DOMAIN + "consistency").blob(session)
    writer.ids(masking_set)
    writer.ids(survivors)
    return writer.getvalue()


def session_id(config_digest: bytes, advertisements: Sequence[Advertised]) -> bytes:
    """SHA-256 of the round's parameters (federation id and round included) and every accepted key, by party id."""
    writer = Writer().text(_DOMAIN + "session").blob(config_digest).u32(len(advertisements))
    for advertisement in sorted(advertisements, key=lambda a: a.sender):
        writer.u32(advertisement.sender).blob(advertisement.cipher_public_key).blob(advertisement.mask_public_key)
        writer.blob(advertisement.seed_commitment)
    return hashlib.sha256(writer.getvalue()).digest()
