"""The messages of one secure-aggregation round, as plain frozen dataclasses.

Flow (party = collaborator, server = aggregator):

==========  =================  ======================  =========================================
stage       party -> server    server -> party         content
==========  =================  ======================  =========================================
ADVERTISE   AdvertiseKeys                              two X25519 public keys, signed
ADVERTISE                      KeyDirectory (all)      every accepted AdvertiseKeys
SHARE       ShareKeys                                  Shamir shares, encrypted per recipient
SHARE                          ShareBundle (each)      the encrypted shares addressed to it
MASK        MaskedInput                                the masked, encoded update
UNMASK                         UnmaskRequest (all)     who survived masking, who dropped
UNMASK      UnmaskResponse                             seed shares of survivors, mask-key
                                                       shares of the dropped
==========  =================  ======================  =========================================

Every message carries a :class:`Header` binding it to (federation id, round, stage,
session id); receivers refuse any other binding, so a message replayed from another
round or session is rejected. The session id is the hash of the round's parameters
and all accepted advertised keys (:func:`session_id`), so it does not exist yet in
the ADVERTISE stage: there ``session_id`` is empty and each advertisement is bound
to the round by its signature over the config digest instead.

Party ids in messages are *claims*: the runtime must check that ``sender`` is the id
of the peer its mutual-TLS connection authenticated (and deliver a party only what is
addressed to it). Encrypted shares are additionally authenticated end to end by
AES-GCM with sender and recipient in the associated data.

Wire format. Every field is a str, int, bytes, a tuple of such, or (MaskedInput only)
a numpy vector, so a gRPC/protobuf schema can carry the fields one to one. For a
single opaque payload, ``to_bytes()`` gives a canonical encoding (see
:mod:`fedfair.secagg.codec`): magic ``FSA1`` | message type (u8) | header
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

MAGIC = b"FSA1"


class Stage(enum.IntEnum):
    """The four stages of a round, in order."""

    ADVERTISE = 1
    SHARE = 2
    MASK = 3
    UNMASK = 4


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
    """A party's two fresh public keys for this round, signed with its identity key.

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
    credential: bytes
    signature: bytes

    def write(self, writer: Writer) -> None:
        writer.u32(self.sender).blob(self.cipher_public_key).blob(self.mask_public_key)
        writer.blob(self.credential).blob(self.signature)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> AdvertiseKeys:
        return cls(header, reader.u32(), reader.blob(), reader.blob(), reader.blob(), reader.blob())


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
    """The sender's Shamir shares for one recipient, AES-256-GCM encrypted (nonce | ciphertext | tag)."""

    sender: int
    recipient: int
    ciphertext: bytes

    def write(self, writer: Writer) -> None:
        writer.u32(self.sender).u32(self.recipient).blob(self.ciphertext)

    @classmethod
    def read(cls, reader: Reader) -> EncryptedShares:
        return cls(reader.u32(), reader.u32(), reader.blob())


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
    """What the server forwards to one party: the encrypted shares addressed to it.

    Its senders are the recipient's neighbours that completed the SHARE stage (U2); the
    recipient masks against exactly those.
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
        writer.u32(self.sender).u8(bits).blob(self.vector.astype(f"<u{bits // 8}", copy=False).tobytes())

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
class UnmaskRequest(_Wire):
    """The server's account of the MASK stage.

    survivors: parties whose masked input arrived (U3); their self-mask seeds are needed.
    dropped: parties that shared keys but sent no masked input (U2 minus U3); their
        mask keys are needed to cancel the pairwise masks survivors added for them.
    """

    TYPE: ClassVar[int] = 6
    STAGE: ClassVar[Stage] = Stage.UNMASK

    header: Header
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]

    def write(self, writer: Writer) -> None:
        _write_ids(writer, self.survivors)
        _write_ids(writer, self.dropped)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> UnmaskRequest:
        return cls(header, _read_ids(reader), _read_ids(reader))


@dataclass(frozen=True)
class RevealedShare:
    """The responder's Shamir share (:meth:`fedfair.secagg.shamir.Share.to_bytes`) of ``owner``'s secret."""

    owner: int
    share: bytes


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
                writer.u32(revealed.owner).blob(revealed.share)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> UnmaskResponse:
        sender = reader.u32()
        seed_shares = tuple(RevealedShare(reader.u32(), reader.blob()) for _ in range(reader.u32()))
        key_shares = tuple(RevealedShare(reader.u32(), reader.blob()) for _ in range(reader.u32()))
        return cls(header, sender, seed_shares, key_shares)


Message = AdvertiseKeys | KeyDirectory | ShareKeys | ShareBundle | MaskedInput | UnmaskRequest | UnmaskResponse
_TYPES: dict[int, type[Message]] = {
    cls.TYPE: cls
    for cls in (AdvertiseKeys, KeyDirectory, ShareKeys, ShareBundle, MaskedInput, UnmaskRequest, UnmaskResponse)
}


def decode(data: bytes) -> Message:
    """Parse any message produced by ``to_bytes()``."""
    reader = Reader(data)
    if bytes(reader.blob_view()) != MAGIC:
        raise ProtocolError("malformed message: not a fedfair secure-aggregation message")
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


def advertisement_payload(config_digest: bytes, sender: int, cipher_public_key: bytes, mask_public_key: bytes) -> bytes:
    """The bytes a party signs: its id and keys, bound to this round's parameters."""
    writer = Writer().text("fedfair/secagg/v1/advertise").blob(config_digest).u32(sender)
    return writer.blob(cipher_public_key).blob(mask_public_key).getvalue()


def session_id(config_digest: bytes, advertisements: tuple[AdvertiseKeys, ...]) -> bytes:
    """SHA-256 of the round's parameters (federation id and round included) and every accepted key, by party id."""
    writer = Writer().text("fedfair/secagg/v1/session").blob(config_digest).u32(len(advertisements))
    for advertisement in sorted(advertisements, key=lambda a: a.sender):
        writer.u32(advertisement.sender).blob(advertisement.cipher_public_key).blob(advertisement.mask_public_key)
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
