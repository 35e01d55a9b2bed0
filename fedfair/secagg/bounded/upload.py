"""The client's SHARE upload: the aggregator's explicit shares, and the auditor's seed sealed to the auditor.

A party makes one report (:func:`~fedfair.secagg.bounded.shares.make_report`) and sends it in two parts:
:class:`LeaderUpload` to the aggregator, :class:`SealedSeed` to the auditor through the aggregator, its
32-byte seed encrypted to the auditor's round key (X25519 with a fresh ephemeral key, HKDF-SHA256 salted with
the context's digest, AES-256-GCM: :mod:`fedfair.secagg.keys`, as the pairwise shares are sealed), so the
aggregator that relays it cannot read it. The party signs, with its identity key, the context and the
digests of both parts' plaintexts; each part carries the other's digest, so each verifier checks the
signature on its own, and a site framed by the aggregator shows it with the aggregator's part alone (:mod:`.record`).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedfair.core.errors import AuthenticationError, ProtocolError
from fedfair.pki import identity
from fedfair.secagg import keys
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.shares import (
    SEED_BYTES,
    HelperShare,
    LeaderShare,
    Parts,
    Witness,
    honest_witness,
    make_report,
)
from fedfair.secagg.codec import Reader, Writer
from fedfair.secagg.wire import SIGNATURE_LIMIT

DIGEST_BYTES = 32
_PARTY = struct.Struct(">I")


@dataclass(frozen=True)
class LeaderUpload:
    """What the aggregator receives from ``party``: its share, the digest of the auditor's part, the signature."""

    party: int
    share: LeaderShare
    helper_digest: bytes
    signature: bytes

    def to_bytes(self) -> bytes:
        """Canonical bytes: party, the share's elements (52 bits each), seeds and parts, the digest, the signature."""
        writer = Writer().u32(self.party)
        writer.blob(field.to_wire(self.share.inputs)).blob(field.to_wire(self.share.values))
        share = self.share
        writer.blob(share.wire_seed + share.blind + share.peer_parts.tests + share.peer_parts.witness)
        return writer.blob(self.helper_digest).blob(self.signature).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> LeaderUpload:
        """Parse :meth:`to_bytes` (the shapes are checked against the layout when the share is received).

        Raises:
            ProtocolError: the bytes are malformed.
        """
        reader = Reader(data)
        party = reader.u32()
        inputs = field.from_wire(reader.blob(), "bounded upload's input share")
        values = field.from_wire(reader.blob(), "bounded upload's proof share")
        secrets = reader.blob()
        if len(secrets) != 4 * SEED_BYTES:
            raise ProtocolError("malformed bounded upload: its wire seed, blind and parts are not four 32-byte strings")
        wire_seed, blind, tests, witness = (
            secrets[index : index + SEED_BYTES] for index in range(0, 4 * SEED_BYTES, SEED_BYTES)
        )
        helper_digest, signature = reader.blob(DIGEST_BYTES), reader.blob(SIGNATURE_LIMIT)
        reader.finish()
        share = LeaderShare(inputs, wire_seed, values, blind, Parts(tests, witness))
        return cls(party, share, helper_digest, signature)


@dataclass(frozen=True)
class SealedSeed:
    """What the auditor receives from ``party``: its share sealed to it, the digest of the aggregator's part."""

    party: int
    ephemeral_key: bytes
    sealed: bytes
    leader_digest: bytes
    signature: bytes

    def to_bytes(self) -> bytes:
        """Canonical bytes, in field order."""
        writer = Writer().u32(self.party).blob(self.ephemeral_key).blob(self.sealed)
        return writer.blob(self.leader_digest).blob(self.signature).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> SealedSeed:
        """Parse :meth:`to_bytes`.

        Raises:
            ProtocolError: the bytes are malformed.
        """
        reader = Reader(data)
        fields = (reader.u32(), reader.blob(32), reader.blob(1024), reader.blob(DIGEST_BYTES))
        signature = reader.blob(SIGNATURE_LIMIT)
        reader.finish()
        return cls(*fields, signature)


def leader_digest(share: LeaderShare) -> bytes:
    """SHA-256 of the aggregator's part, as the party signs it."""
    digest = hashlib.sha256(b"fedfair bounded v1 leader share\x00")
    digest.update(np.ascontiguousarray(share.inputs, dtype="<u8").data)
    digest.update(np.ascontiguousarray(share.values, dtype="<u8").data)
    digest.update(share.wire_seed + share.blind + share.peer_parts.tests + share.peer_parts.witness)
    return digest.digest()


def helper_digest(share: HelperShare) -> bytes:
    """SHA-256 of the auditor's part (its seed and the parts claimed for the aggregator), as the party signs it."""
    return hashlib.sha256(
        b"fedfair bounded v1 helper share\x00" + share.seed + share.peer_parts.tests + share.peer_parts.witness
    ).digest()


def statement(context: BoundedContext, party: int, leader: bytes, helper: bytes) -> bytes:
    """What a party signs: the round's context, its id and the digests of its two parts."""
    return b"fedfair bounded v1 upload\x00" + context.digest + _PARTY.pack(party) + leader + helper


def make_uploads(
    context: BoundedContext,
    party: int,
    identity_key: ec.EllipticCurvePrivateKey,
    encoded: np.ndarray,
    witness: Witness = honest_witness,
) -> tuple[LeaderUpload, SealedSeed, HelperShare]:
    """``party``'s two SHARE uploads for its ``encoded`` update (signed integers, within its bound), and its share.

    The share is the auditor's as the auditor opens it: the party keeps it to check the auditor's message about it.

    ``witness`` is the honest one but for tests, which hand in a liar's.

    Raises:
        ConfigError: the update is over the party's bound, or not the round's dimension.
    """
    leader_share, helper_share = make_report(context.layout(party), field.from_signed(encoded), witness)
    digests = (leader_digest(leader_share), helper_digest(helper_share))
    signature = identity.sign(identity_key, statement(context, party, *digests))
    ephemeral = keys.generate_key_pair()
    ephemeral_public = keys.public_bytes(ephemeral)
    key = _seed_key(context, party, keys.agree(ephemeral, context.auditor_cipher_key), ephemeral_public)
    sealed = keys.seal(key, helper_share.to_bytes(), _associated_data(context, party))
    return (
        LeaderUpload(party, leader_share, digests[1], signature),
        SealedSeed(party, ephemeral_public, sealed, digests[0], signature),
        helper_share,
    )


def check_leader_upload(context: BoundedContext, upload: LeaderUpload, client_key: ec.EllipticCurvePublicKey) -> None:
    """Refuse an aggregator's part that its party did not sign for this round.

    Raises:
        AuthenticationError: the signature does not verify.
    """
    signed = statement(context, upload.party, leader_digest(upload.share), upload.helper_digest)
    if not identity.is_valid_signature(client_key, upload.signature, signed):
        raise AuthenticationError(f"party {upload.party}'s upload to the aggregator is not signed by it for this round")


def open_seed(
    context: BoundedContext,
    upload: SealedSeed,
    auditor_cipher: X25519PrivateKey,
    client_key: ec.EllipticCurvePublicKey,
) -> HelperShare:
    """The auditor's share, decrypted, once its party's signature over it checks.

    Raises:
        AuthenticationError: the seal or the signature does not verify (tampered, or for another round).
    """
    secret = keys.agree(auditor_cipher, upload.ephemeral_key)
    key = _seed_key(context, upload.party, secret, upload.ephemeral_key)
    share = HelperShare.from_bytes(keys.open_sealed(key, upload.sealed, _associated_data(context, upload.party)))
    if share is None:
        raise AuthenticationError(f"party {upload.party}'s sealed seed is not a seed and two parts")
    signed = statement(context, upload.party, upload.leader_digest, helper_digest(share))
    if not identity.is_valid_signature(client_key, upload.signature, signed):
        raise AuthenticationError(f"party {upload.party}'s upload to the auditor is not signed by it for this round")
    return share


def _seed_key(context: BoundedContext, party: int, secret: bytes, ephemeral_public: bytes) -> bytes:
    info = keys.DOMAIN + b"bounded-auditor-seed" + _PARTY.pack(party) + ephemeral_public
    return keys.hkdf(secret, context.digest, info)


def _associated_data(context: BoundedContext, party: int) -> bytes:
    return b"fedfair bounded v1 auditor seed\x00" + context.digest + _PARTY.pack(party)
