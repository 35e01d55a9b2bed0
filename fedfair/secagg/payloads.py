"""What the parties sign: domain-separated payloads, the seed commitment and the session id.

What must survive an active aggregator is signed with the parties' identity keys (ECDSA
P-256, :mod:`fedfair.pki.identity`) over a payload built here: advertisements, each
party's dealing (one signature over every share entry it sends, see
:func:`dealing_payload`), each share check and each consistency view. Every payload starts
with its own domain string, so no signature over one kind can be replayed as another.
A label carries the protocol version that last changed its format: the dealing and its
parts are v3 (v2 signed each entry and each pair of dealt shares apart), and so is the consistency view (v2 named
no masked input), the rest v2.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np

from fedfair.secagg.codec import Writer

_DOMAIN = "fedfair/secagg/v2/"
_DEALING_DOMAIN = "fedfair/secagg/v3/"

DIGEST_BYTES = 32
"""Length of a SHA-256 digest: a share commitment, one line of a dealing."""

View = tuple[tuple[int, ...], tuple[int, ...], tuple[bytes, ...]]
"""What a survivor signs at CONSISTENCY: U2', U3 and each survivor's masked-input digest (in U3's order)."""


class Advertised(Protocol):
    """What the session id covers of an advertisement."""

    @property
    def sender(self) -> int:
        """The advertising party's id."""
        ...

    @property
    def cipher_public_key(self) -> bytes:
        """Its raw X25519 public key (32 bytes) for encrypting shares."""
        ...

    @property
    def mask_public_key(self) -> bytes:
        """Its raw X25519 public key (32 bytes) for pairwise masks."""
        ...

    @property
    def seed_commitment(self) -> bytes:
        """Its :func:`seed_commitment` (32 bytes) to its self-mask seed."""
        ...


class DealtLine(Protocol):
    """What a dealing covers of one share entry (:class:`~fedfair.secagg.messages.EncryptedShares`)."""

    @property
    def recipient(self) -> int:
        """The holder the entry's shares are for."""
        ...

    @property
    def ciphertext(self) -> bytes:
        """The holder's shares, sealed (AES-256-GCM nonce | ciphertext | tag)."""
        ...

    @property
    def seed_commitment(self) -> bytes:
        """The :func:`share_commitment` (32 bytes) of the holder's share of the dealer's seed."""
        ...

    @property
    def key_commitment(self) -> bytes:
        """The :func:`share_commitment` (32 bytes) of the holder's share of the dealer's mask key."""
        ...


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


def share_commitment(session: bytes, owner: int, holder: int, kind: str, share: bytes) -> bytes:
    """SHA-256 commitment to one serialised Shamir share: ``holder``'s share of ``owner``'s secret ``kind``.

    No salt is needed: a share is full-entropy field elements (fewer than t of them say nothing
    of the secret), so the commitment only lets a share be checked, not guessed. Session,
    owner, holder and kind are bound so that a commitment fits exactly one share slot.
    """
    writer = Writer().text(_DEALING_DOMAIN + "share-commitment").blob(session).u32(owner).u32(holder).text(kind)
    return hashlib.sha256(writer.blob(share).getvalue()).digest()


def dealing_line(session: bytes, dealer: int, entry: DealtLine) -> bytes:
    """SHA-256 of one line of ``dealer``'s dealing: the holder, its sealed shares and both share commitments."""
    writer = Writer().text(_DEALING_DOMAIN + "dealing-line").blob(session).u32(dealer).u32(entry.recipient)
    writer.blob(entry.ciphertext).blob(entry.seed_commitment).blob(entry.key_commitment)
    return hashlib.sha256(writer.getvalue()).digest()


def dealing_lines(session: bytes, dealer: int, entries: Iterable[DealtLine]) -> tuple[tuple[int, ...], bytes]:
    """The holders of ``dealer``'s entries, in the entries' order, and their line digests concatenated."""
    listed = list(entries)
    return tuple(entry.recipient for entry in listed), b"".join(dealing_line(session, dealer, e) for e in listed)


def dealing_payload(session: bytes, dealer: int, holders: tuple[int, ...], lines: bytes) -> bytes:
    """The bytes a dealer signs, once, for every share entry it sends: each holder with its line digest.

    Signing line digests rather than the lines lets a holder check the signature with its own
    line in full and only 32 bytes of every other.
    """
    writer = Writer().text(_DEALING_DOMAIN + "dealing").blob(session).u32(dealer)
    return writer.ids(holders).blob(lines).getvalue()


def share_check_payload(session: bytes, sender: int, accused: tuple[int, ...]) -> bytes:
    """The bytes a party signs with its share check."""
    writer = Writer().text(_DOMAIN + "share-check").blob(session).u32(sender)
    writer.ids(accused)
    return writer.getvalue()


def consistency_payload(
    session: bytes, masking_set: tuple[int, ...], survivors: tuple[int, ...], inputs: tuple[bytes, ...]
) -> bytes:
    """The bytes a survivor signs in the CONSISTENCY stage: the view (U2', U3, the survivors' masked inputs).

    ``inputs`` holds each survivor's :func:`masked_input_digest`, in the order of ``survivors``: signing them
    before any share is revealed fixes every masked input before the sum can be known (v3; v2 signed no digest).
    """
    writer = Writer().text(_DEALING_DOMAIN + "consistency").blob(session)
    writer.ids(masking_set)
    writer.ids(survivors)
    writer.u32(len(inputs))
    for digest in inputs:
        writer.blob(digest)
    return writer.getvalue()


def masked_input_digest(session: bytes, sender: int, vector: np.ndarray) -> bytes:
    """SHA-256 of a party's masked input: its session, its sender and its little-endian words."""
    width = vector.dtype.itemsize
    head = Writer().text(_DEALING_DOMAIN + "masked-input").blob(session).u32(sender).u8(8 * width).u64(vector.size)
    digest = hashlib.sha256(head.getvalue())
    digest.update(np.ascontiguousarray(vector, dtype=f"<u{width}").data)
    return digest.digest()


def session_id(config_digest: bytes, advertisements: Sequence[Advertised]) -> bytes:
    """SHA-256 of the round's parameters (federation id and round included) and every accepted key, by party id."""
    writer = Writer().text(_DOMAIN + "session").blob(config_digest).u32(len(advertisements))
    for advertisement in sorted(advertisements, key=lambda a: a.sender):
        writer.u32(advertisement.sender).blob(advertisement.cipher_public_key).blob(advertisement.mask_public_key)
        writer.blob(advertisement.seed_commitment)
    return hashlib.sha256(writer.getvalue()).digest()
