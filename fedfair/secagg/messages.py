"""The messages of one secure-aggregation round (protocol v2), as plain frozen dataclasses.

Flow (party = collaborator, server = aggregator); U1 advertised, U2 shared, U2' passed
the share check unaccused, U3 sent a masked input:

===========  ====================  =======================  ========================================
stage        party -> server       server -> party          content
===========  ====================  =======================  ========================================
ADVERTISE    AdvertiseKeys                                  two X25519 public keys and a commitment
                                                            to the self-mask seed, signed
ADVERTISE                          KeyDirectory (all)       every accepted AdvertiseKeys (U1)
SHARE        ShareKeys                                      Shamir shares, encrypted per recipient,
                                                            each entry signed by its sender
SHARE                              ShareBundle (each)       the signed entries addressed to it (U2)
CHECK        ShareCheck                                     the senders whose entry failed
                                                            (accused), signed
CHECK                              MaskingSet (all)         U2': checked parties minus the accused
MASK         MaskedInput                                    the masked, encoded update
MASK                               SurvivorSet (all)        U2' and U3 (whose masked input arrived)
CONSISTENCY  ConsistencySignature                           signature over the view (U2', U3)
CONSISTENCY                        UnmaskRequest (all)      U3, U2' - U3, and the survivors'
                                                            consistency signatures
UNMASK       UnmaskResponse                                 seed shares of survivors, mask-key
                                                            shares of the dropped, each with its
                                                            dealer's signature
===========  ====================  =======================  ========================================

Every message carries a :class:`Header` binding it to (federation id, round, stage,
session id); receivers refuse any other binding, so a message replayed from another
round or session is rejected. The session id is the hash of the round's parameters
and all accepted advertised keys and commitments (:func:`session_id`), so it does not
exist yet in the ADVERTISE stage: there ``session_id`` is empty and each advertisement
is bound to the round by its signature over the config digest instead. A server
message carries the stage it closes (KeyDirectory, ShareBundle) or the stage it opens
(MaskingSet, SurvivorSet, UnmaskRequest), as its ``STAGE`` says.

Party ids in messages are *claims*: the runtime must check that ``sender`` is the id
of the peer its mutual-TLS connection authenticated (and deliver a party only what is
addressed to it). What must survive an active aggregator is signed with the parties'
identity keys (ECDSA P-256, :mod:`fedfair.pki.identity`) over a domain-separated
payload built here: advertisements, each encrypted share entry, each share check, each
consistency view, and, inside the encryption, each pair of dealt shares (so that a
share revealed at unmasking can be traced to its dealer).

Wire format. Every field is a str, int, bytes, a tuple of such, or (MaskedInput only)
a numpy vector, so a gRPC/protobuf schema can carry the fields one to one. For a
single opaque payload, ``to_bytes()`` gives a canonical encoding (see
:mod:`fedfair.secagg.codec`): magic ``FSA2`` | message type (u8) | header
(federation id, round u64, stage u8, session id) | the fields in declaration order,
integers fixed-width big-endian, byte strings and tuples length-prefixed, the masked
vector as its modulus bits (u8) and little-endian words. ``Cls.from_bytes(data)``
parses one type; :func:`decode` dispatches on the type byte. Nothing is pickled.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from dataclasses import dataclass
from typing import ClassVar, Protocol, Self

import numpy as np

from fedfair.secagg.codec import Reader, Writer
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.errors import ProtocolError, StaleMessageError

MAGIC = b"FSA2"

_DOMAIN = "fedfair/secagg/v2/"


class Stage(enum.IntEnum):
    """The six stages of a round, in order."""

    ADVERTISE = 1
    SHARE = 2
    CHECK = 3
    MASK = 4
    CONSISTENCY = 5
    UNMASK = 6


@dataclass(frozen=True)
class Header:
    """What a message is bound to. ``session_id`` is empty in the ADVERTISE stage."""

    federation_id: str
    round: int
    stage: Stage
    session_id: bytes

    def write(self, writer: Writer) -> None:
        writer.text(self.federation_id).u64(self.round).u8(self.stage).blob(self.session_id)

    @classmethod
    def read(cls, reader: Reader) -> Header:
        federation_id, round_number, stage = reader.text(), reader.u64(), reader.u8()
        try:
            return cls(federation_id, round_number, Stage(stage), reader.blob())
        except ValueError:
            raise ProtocolError(f"malformed message: unknown stage {stage}") from None


class _Framed(Protocol):
    """What framing needs of a message: its type byte, its header, and how it writes its own fields."""

    TYPE: ClassVar[int]

    @property
    def header(self) -> Header: ...

    def write(self, writer: Writer) -> None: ...


class _Wire:
    """The canonical encoding every message type shares: ``to_bytes()`` and ``Cls.from_bytes(data)``."""

    def to_bytes(self: _Framed) -> bytes:
        writer = Writer().blob(MAGIC).u8(self.TYPE)
        self.header.write(writer)
        self.write(writer)
        return writer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> Self:
        """Parse ``data`` as this message type; any other type is refused."""
        message = decode(data)
        if not isinstance(message, cls):
            raise ProtocolError(f"malformed message: expected {cls.__name__}, got {type(message).__name__}")
        return message


@dataclass(frozen=True)
class AdvertiseKeys(_Wire):
    """A party's two fresh public keys and seed commitment for this round, signed with its identity key.

    seed_commitment: :func:`seed_commitment` of its self-mask seed (the mask key's
    commitment is its public key), so that a rebuilt seed can be checked.
    credential: the party's certificate (DER), or its bare identity public key (DER
    SubjectPublicKeyInfo) where no PKI is used; peers check it belongs to the roster name.
    signature: ECDSA-SHA256 over :func:`advertisement_payload`.
    """

    TYPE: ClassVar[int] = 1
    STAGE: ClassVar[Stage] = Stage.ADVERTISE

    header: Header
    sender: int
    cipher_public_key: bytes
    mask_public_key: bytes
    seed_commitment: bytes
    credential: bytes
    signature: bytes

    def write(self, writer: Writer) -> None:
        writer.u32(self.sender).blob(self.cipher_public_key).blob(self.mask_public_key).blob(self.seed_commitment)
        writer.blob(self.credential).blob(self.signature)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> AdvertiseKeys:
        return cls(header, reader.u32(), reader.blob(), reader.blob(), reader.blob(), reader.blob(), reader.blob())


@dataclass(frozen=True)
class KeyDirectory(_Wire):
    """The server's list of the advertisements it accepted (the surviving set U1)."""

    TYPE: ClassVar[int] = 2
    STAGE: ClassVar[Stage] = Stage.ADVERTISE

    header: Header
    advertisements: tuple[AdvertiseKeys, ...]

    def write(self, writer: Writer) -> None:
        writer.u32(len(self.advertisements))
        for advertisement in self.advertisements:
            advertisement.header.write(writer)
            advertisement.write(writer)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> KeyDirectory:
        return cls(header, tuple(AdvertiseKeys.read(Header.read(reader), reader) for _ in range(reader.u32())))


@dataclass(frozen=True)
class EncryptedShares:
    """The sender's Shamir shares for one recipient, AES-256-GCM encrypted (nonce | ciphertext | tag).

    signature: the sender's identity signature over :func:`share_entry_payload`, so the
    server and the recipient can tell the sender's ciphertext from one the server altered.
    """

    sender: int
    recipient: int
    ciphertext: bytes
    signature: bytes

    def write(self, writer: Writer) -> None:
        writer.u32(self.sender).u32(self.recipient).blob(self.ciphertext).blob(self.signature)

    @classmethod
    def read(cls, reader: Reader) -> EncryptedShares:
        return cls(reader.u32(), reader.u32(), reader.blob(), reader.blob())


@dataclass(frozen=True)
class ShareKeys(_Wire):
    """A party's encrypted shares, one entry per neighbour that advertised keys."""

    TYPE: ClassVar[int] = 3
    STAGE: ClassVar[Stage] = Stage.SHARE

    header: Header
    sender: int
    shares: tuple[EncryptedShares, ...]

    def write(self, writer: Writer) -> None:
        _write_shares(writer.u32(self.sender), self.shares)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> ShareKeys:
        return cls(header, reader.u32(), _read_shares(reader))


@dataclass(frozen=True)
class ShareBundle(_Wire):
    """What the server forwards to one party: the signed, encrypted shares addressed to it.

    Its senders are the recipient's neighbours that completed the SHARE stage (U2); the
    recipient checks each entry in the CHECK stage.
    """

    TYPE: ClassVar[int] = 4
    STAGE: ClassVar[Stage] = Stage.SHARE

    header: Header
    recipient: int
    shares: tuple[EncryptedShares, ...]

    def write(self, writer: Writer) -> None:
        _write_shares(writer.u32(self.recipient), self.shares)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> ShareBundle:
        return cls(header, reader.u32(), _read_shares(reader))


@dataclass(frozen=True)
class ShareCheck(_Wire):
    """A party's verdict on its bundle: the senders whose entry failed (bad signature, decryption or content).

    signature: the party's identity signature over :func:`share_check_payload`, so the
    server cannot invent or drop an accusation.
    """

    TYPE: ClassVar[int] = 8
    STAGE: ClassVar[Stage] = Stage.CHECK

    header: Header
    sender: int
    accused: tuple[int, ...]
    signature: bytes

    def write(self, writer: Writer) -> None:
        _write_ids(writer.u32(self.sender), self.accused)
        writer.blob(self.signature)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> ShareCheck:
        return cls(header, reader.u32(), _read_ids(reader), reader.blob())


@dataclass(frozen=True)
class MaskingSet(_Wire):
    """U2': the parties that sent a share check and were accused by nobody; they mask with each other."""

    TYPE: ClassVar[int] = 9
    STAGE: ClassVar[Stage] = Stage.MASK

    header: Header
    parties: tuple[int, ...]

    def write(self, writer: Writer) -> None:
        _write_ids(writer, self.parties)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> MaskingSet:
        return cls(header, _read_ids(reader))


@dataclass(frozen=True, eq=False)
class MaskedInput(_Wire):
    """A party's encoded update plus its self mask and pairwise masks, modulo 2^k.

    ``vector`` is a 1-D uint32 or uint64 array of length d + 1. (No ``==``: numpy arrays
    do not compare to a single bool.)
    """

    TYPE: ClassVar[int] = 5
    STAGE: ClassVar[Stage] = Stage.MASK

    header: Header
    sender: int
    vector: np.ndarray

    def write(self, writer: Writer) -> None:
        bits = self.vector.dtype.itemsize * 8
        words = np.ascontiguousarray(self.vector, dtype=f"<u{bits // 8}")
        writer.u32(self.sender).u8(bits).blob(words.data)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> MaskedInput:
        sender, bits = reader.u32(), reader.u8()
        if bits not in (32, 64):
            raise ProtocolError(f"malformed message: {bits}-bit words")
        data = reader.blob_view()
        if len(data) % (bits // 8):
            raise ProtocolError("malformed message: vector length is not a whole number of words")
        # Zero-copy view of the received bytes; read-only, which is all the server needs.
        return cls(header, sender, np.frombuffer(data, dtype=f"<u{bits // 8}"))


@dataclass(frozen=True)
class SurvivorSet(_Wire):
    """The server's view of the MASK stage, for every survivor to sign.

    masking_set: U2', as sent in the MaskingSet.
    survivors: U3, the parties whose masked input arrived (a subset of U2').
    """

    TYPE: ClassVar[int] = 10
    STAGE: ClassVar[Stage] = Stage.CONSISTENCY

    header: Header
    masking_set: tuple[int, ...]
    survivors: tuple[int, ...]

    def write(self, writer: Writer) -> None:
        _write_ids(writer, self.masking_set)
        _write_ids(writer, self.survivors)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> SurvivorSet:
        return cls(header, _read_ids(reader), _read_ids(reader))


@dataclass(frozen=True)
class ConsistencySignature(_Wire):
    """A survivor's identity signature over :func:`consistency_payload` of the view (U2', U3) it was shown."""

    TYPE: ClassVar[int] = 11
    STAGE: ClassVar[Stage] = Stage.CONSISTENCY

    header: Header
    sender: int
    signature: bytes

    def write(self, writer: Writer) -> None:
        writer.u32(self.sender).blob(self.signature)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> ConsistencySignature:
        return cls(header, reader.u32(), reader.blob())


@dataclass(frozen=True)
class UnmaskRequest(_Wire):
    """The server's account of the MASK stage, with the survivors' signatures on it.

    survivors: U3, parties whose masked input arrived; their self-mask seeds are needed.
    dropped: U2' minus U3, parties that passed the share check but sent no masked input;
        their mask keys are needed to cancel the pairwise masks survivors added for them.
    signatures: (party, signature) consistency signatures of survivors over the view
        (U2' = survivors + dropped, U3); a party unmasks only if t distinct survivors
        signed the very view it signed.
    """

    TYPE: ClassVar[int] = 6
    STAGE: ClassVar[Stage] = Stage.UNMASK

    header: Header
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    signatures: tuple[tuple[int, bytes], ...]

    def write(self, writer: Writer) -> None:
        _write_ids(writer, self.survivors)
        _write_ids(writer, self.dropped)
        writer.u32(len(self.signatures))
        for party, signature in self.signatures:
            writer.u32(party).blob(signature)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> UnmaskRequest:
        survivors, dropped = _read_ids(reader), _read_ids(reader)
        signatures = tuple((reader.u32(), reader.blob()) for _ in range(reader.u32()))
        return cls(header, survivors, dropped, signatures)

    @property
    def masking_set(self) -> tuple[int, ...]:
        """U2' as this request implies it: survivors and dropped together, sorted."""
        return tuple(sorted((*self.survivors, *self.dropped)))


@dataclass(frozen=True)
class RevealedShare:
    """The responder's Shamir share (:meth:`fedfair.secagg.shamir.Share.to_bytes`) of ``owner``'s secret.

    other_digest: :func:`share_digest` of the responder's share of ``owner``'s other secret
        (never the share itself).
    dealer_signature: ``owner``'s signature over :func:`dealt_shares_payload` of both
        digests, as the responder received it; it proves what ``owner`` dealt.
    """

    owner: int
    share: bytes
    other_digest: bytes
    dealer_signature: bytes


@dataclass(frozen=True)
class UnmaskResponse(_Wire):
    """A surviving party's shares: of self-mask seeds for survivors, of mask keys for the dropped."""

    TYPE: ClassVar[int] = 7
    STAGE: ClassVar[Stage] = Stage.UNMASK

    header: Header
    sender: int
    seed_shares: tuple[RevealedShare, ...]
    key_shares: tuple[RevealedShare, ...]

    def write(self, writer: Writer) -> None:
        writer.u32(self.sender)
        for group in (self.seed_shares, self.key_shares):
            writer.u32(len(group))
            for revealed in group:
                writer.u32(revealed.owner).blob(revealed.share).blob(revealed.other_digest)
                writer.blob(revealed.dealer_signature)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> UnmaskResponse:
        sender = reader.u32()
        groups = [
            tuple(
                RevealedShare(reader.u32(), reader.blob(), reader.blob(), reader.blob()) for _ in range(reader.u32())
            )
            for _ in range(2)
        ]
        return cls(header, sender, groups[0], groups[1])


Message = (
    AdvertiseKeys
    | KeyDirectory
    | ShareKeys
    | ShareBundle
    | ShareCheck
    | MaskingSet
    | MaskedInput
    | SurvivorSet
    | ConsistencySignature
    | UnmaskRequest
    | UnmaskResponse
)
_TYPES: dict[int, type[Message]] = {
    cls.TYPE: cls
    for cls in (
        AdvertiseKeys,
        KeyDirectory,
        ShareKeys,
        ShareBundle,
        ShareCheck,
        MaskingSet,
        MaskedInput,
        SurvivorSet,
        ConsistencySignature,
        UnmaskRequest,
        UnmaskResponse,
    )
}


def decode(data: bytes) -> Message:
    """Parse any message produced by ``to_bytes()``."""
    reader = Reader(data)
    if bytes(reader.blob_view()) != MAGIC:
        raise ProtocolError("malformed message: not a fedfair secure-aggregation v2 message")
    kind = reader.u8()
    if kind not in _TYPES:
        raise ProtocolError(f"malformed message: unknown message type {kind}")
    message = _TYPES[kind].read(Header.read(reader), reader)
    reader.finish()
    return message


def check_header(message: Message, config: SecAggConfig, session: bytes) -> None:
    """Refuse a message not bound to this federation, round, the message's stage and ``session``."""
    header = message.header
    if header.federation_id != config.federation_id or header.round != config.round:
        raise StaleMessageError(
            f"{type(message).__name__} is for another federation or round (replayed or late); it was dropped"
        )
    if header.stage != message.STAGE:
        raise StaleMessageError(f"{type(message).__name__} is labelled with stage {header.stage.name}; it was dropped")
    if not hmac.compare_digest(header.session_id, session):
        raise StaleMessageError(
            f"{type(message).__name__} is for another session of this round (replayed or late); it was dropped"
        )


def check_ids(ids: tuple[int, ...], what: str) -> None:
    """Refuse a list of party ids that is not strictly increasing (unsorted or with a repeat)."""
    if any(a >= b for a, b in zip(ids, ids[1:], strict=False)):
        raise ProtocolError(f"{what} lists a party twice or out of order")


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
    _write_ids(writer, accused)
    return writer.getvalue()


def consistency_payload(session: bytes, masking_set: tuple[int, ...], survivors: tuple[int, ...]) -> bytes:
    """The bytes a survivor signs in the CONSISTENCY stage: the view (U2', U3) it was shown."""
    writer = Writer().text(_DOMAIN + "consistency").blob(session)
    _write_ids(writer, masking_set)
    _write_ids(writer, survivors)
    return writer.getvalue()


def session_id(config_digest: bytes, advertisements: tuple[AdvertiseKeys, ...]) -> bytes:
    """SHA-256 of the round's parameters (federation id and round included) and every accepted key, by party id."""
    writer = Writer().text(_DOMAIN + "session").blob(config_digest).u32(len(advertisements))
    for advertisement in sorted(advertisements, key=lambda a: a.sender):
        writer.u32(advertisement.sender).blob(advertisement.cipher_public_key).blob(advertisement.mask_public_key)
        writer.blob(advertisement.seed_commitment)
    return hashlib.sha256(writer.getvalue()).digest()


def _write_shares(writer: Writer, shares: tuple[EncryptedShares, ...]) -> None:
    writer.u32(len(shares))
    for share in shares:
        share.write(writer)


def _read_shares(reader: Reader) -> tuple[EncryptedShares, ...]:
    return tuple(EncryptedShares.read(reader) for _ in range(reader.u32()))


def _write_ids(writer: Writer, ids: tuple[int, ...]) -> None:
    writer.u32(len(ids))
    for party in ids:
        writer.u32(party)


def _read_ids(reader: Reader) -> tuple[int, ...]:
    return tuple(reader.u32() for _ in range(reader.u32()))
