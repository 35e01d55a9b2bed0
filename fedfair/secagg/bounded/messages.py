"""The messages of a bounded secure sum as its runner carries them, each with canonical bytes.

The protocol's own messages (:mod:`~fedfair.secagg.bounded.upload`, :mod:`~fedfair.secagg.bounded.exchange`,
:mod:`~fedfair.secagg.bounded.record`) go through the aggregator, so each stage's upload and input bundles
what one party says to it, or what the aggregator relays, in one message: the auditor's signed round key
(:class:`SignedRoundKey`), a site's two parts (:class:`SiteShare`), the sealed seeds relayed to the auditor with
the aggregator's roster (:class:`SeedRelay`), and each verifier's two exchange messages per relay
(:class:`Exchange`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Generic, TypeVar

from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import AuthenticationError
from fedfair.pki import identity
from fedfair.secagg import keys
from fedfair.secagg.bounded.exchange import AUDITOR, Commitments, Reveal, Roster, SeedReveal
from fedfair.secagg.bounded.upload import LeaderUpload, SealedSeed
from fedfair.secagg.codec import Reader, Writer
from fedfair.secagg.wire import SIGNATURE_LIMIT

KEY_BYTES = 32

PUBLIC_LIMIT = 1 << 20
"""The most bytes of a round's public parameters SHARE carries (a certificate per party, and JSON)."""


def round_binding(federation_id: str, round_number: int, session_id: bytes) -> bytes:
    """SHA-256 of the round the auditor's round key is for (its context needs the key, so cannot bind it)."""
    writer = Writer().text(federation_id).u64(round_number).blob(session_id)
    return hashlib.sha256(b"fedfair bounded v1 auditor round key\x00" + writer.getvalue()).digest()


@dataclass(frozen=True)
class SignedRoundKey:
    """The auditor's X25519 public key for one round, signed with its identity key for that round."""

    cipher_key: bytes
    signature: bytes

    @classmethod
    def sign(cls, key: ec.EllipticCurvePrivateKey, binding: bytes, cipher_key: bytes) -> SignedRoundKey:
        """``cipher_key`` signed by the auditor's identity ``key`` for the round of ``binding``."""
        return cls(cipher_key, identity.sign(key, binding + cipher_key))

    def checked(self, auditor_key: ec.EllipticCurvePublicKey, binding: bytes) -> bytes:
        """The round key, once its signature by the auditor for the round of ``binding`` checks.

        Raises:
            AuthenticationError: it is not signed by the auditor for this round (a key swapped in transit).
        """
        keys.check_public_key(self.cipher_key)
        if not identity.is_valid_signature(auditor_key, self.signature, binding + self.cipher_key):
            raise AuthenticationError("the auditor's round key is not signed by the auditor for this round")
        return self.cipher_key

    @property
    def sender(self) -> int:
        """Who uploads a round key: the auditor."""
        return AUDITOR

    def to_bytes(self) -> bytes:
        """Canonical bytes."""
        return Writer().blob(self.cipher_key).blob(self.signature).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> SignedRoundKey:
        """Parse :meth:`to_bytes`; ProtocolError if malformed."""
        reader = Reader(data)
        cipher_key, signature = reader.blob(KEY_BYTES), reader.blob(SIGNATURE_LIMIT)
        reader.finish()
        return cls(cipher_key, signature)


@dataclass(frozen=True)
class ShareOpening:
    """SHARE's input to every site: the round's public parameters as its runner states them, and the round key.

    A site's first input in the round: it checks the parameters against its own plan (the runtime's, opaque here;
    empty in process) and the key's signature before it shares anything.
    """

    public: bytes
    round_key: SignedRoundKey

    def to_bytes(self) -> bytes:
        """Canonical bytes."""
        return Writer().blob(self.public).blob(self.round_key.to_bytes()).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> ShareOpening:
        """Parse :meth:`to_bytes`; ProtocolError if malformed."""
        reader = Reader(data)
        public, round_key = reader.blob(PUBLIC_LIMIT), SignedRoundKey.from_bytes(reader.blob())
        reader.finish()
        return cls(public, round_key)


@dataclass(frozen=True)
class SiteShare:
    """A site's SHARE upload: its part for the aggregator and its seed sealed to the auditor."""

    leader: LeaderUpload
    sealed: SealedSeed

    @property
    def sender(self) -> int:
        """The site the aggregator's part names (its signature binds it)."""
        return self.leader.party

    def to_bytes(self) -> bytes:
        """Canonical bytes."""
        return Writer().blob(self.leader.to_bytes()).blob(self.sealed.to_bytes()).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> SiteShare:
        """Parse :meth:`to_bytes`; ProtocolError if malformed."""
        reader = Reader(data)
        leader, sealed = LeaderUpload.from_bytes(reader.blob()), SealedSeed.from_bytes(reader.blob())
        reader.finish()
        return cls(leader, sealed)


@dataclass(frozen=True)
class SeedRelay:
    """What the aggregator relays to the auditor once SHARE closes: the sealed seeds, and its own roster."""

    seeds: tuple[SealedSeed, ...]
    roster: Roster

    def to_bytes(self) -> bytes:
        """Canonical bytes."""
        writer = Writer().u32(len(self.seeds))
        for seed in self.seeds:
            writer.blob(seed.to_bytes())
        return writer.blob(self.roster.to_bytes()).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> SeedRelay:
        """Parse :meth:`to_bytes`; ProtocolError if malformed."""
        reader = Reader(data)
        seeds = tuple(SealedSeed.from_bytes(reader.blob()) for _ in range(reader.u32()))
        roster = Roster.from_bytes(reader.blob())
        reader.finish()
        return cls(seeds, roster)


First = TypeVar("First", Roster, SeedReveal, Commitments)
Second = TypeVar("Second", SeedReveal, Commitments, Reveal)


@dataclass(frozen=True)
class Exchange(Generic[First, Second]):
    """Two of a verifier's exchange messages sent together, the second computed after the first."""

    first: First
    second: Second

    @property
    def sender(self) -> int:
        """Who uploads an exchange: the auditor (the aggregator's own go to it as a stage's input)."""
        return AUDITOR

    def to_bytes(self) -> bytes:
        """Canonical bytes."""
        return Writer().blob(self.first.to_bytes()).blob(self.second.to_bytes()).getvalue()


def _exchange(first: type[First], second: type[Second], data: bytes | memoryview) -> Exchange[First, Second]:
    reader = Reader(data)
    pair = first.from_bytes(reader.blob()), second.from_bytes(reader.blob())
    reader.finish()
    return Exchange(*pair)


def auditor_rosters(data: bytes | memoryview) -> Exchange[Roster, SeedReveal]:
    """Parse the auditor's EXCHANGE_1 upload: its roster and its half of the query seed."""
    return _exchange(Roster, SeedReveal, data)


def aggregator_seed(data: bytes | memoryview) -> Exchange[SeedReveal, Commitments]:
    """Parse the aggregator's EXCHANGE_2 input: its half of the query seed and its commitments."""
    return _exchange(SeedReveal, Commitments, data)


def auditor_messages(data: bytes | memoryview) -> Exchange[Commitments, Reveal]:
    """Parse the auditor's EXCHANGE_2 upload: its commitments and its signed messages."""
    return _exchange(Commitments, Reveal, data)


@dataclass(frozen=True)
class Encoded:
    """A message already in its bytes (the verdict record, whose bytes need the round's context)."""

    data: bytes

    def to_bytes(self) -> bytes:
        """The bytes."""
        return self.data
