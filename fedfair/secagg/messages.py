"""The messages of one secure-aggregation round (protocol v3), as plain frozen dataclasses.

Every message carries a :class:`Header` binding it to (federation id, round, stage, session id),
and receivers refuse any other binding. Party ids in messages are claims: the runtime checks
``sender`` against the peer its mutual-TLS connection authenticated. Every message has the
canonical encoding of :mod:`fedfair.secagg.wire`; nothing is pickled. The stage-by-stage flow is
in docs/design.md ("Inside secure aggregation"). The VERIFY stage's messages are in
:mod:`fedfair.secagg.verify_messages`; :data:`Message` and :func:`decode` cover them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedfair.core.errors import ProtocolError
from fedfair.secagg.codec import Reader, Writer
from fedfair.secagg.payloads import DIGEST_BYTES
from fedfair.secagg.verify_messages import AggregateClaim, AggregateTag, TagSet
from fedfair.secagg.wire import (
    SIGNATURE_LIMIT,
    Header,
    Stage,
    Wire,
    read_message,
    read_messages,
    read_vector,
    write_messages,
    write_vector,
)


@dataclass(frozen=True)
class AdvertiseKeys(Wire):
    """A party's two fresh public keys and seed commitment for this round, signed with its identity key.

    seed_commitment: :func:`~fedfair.secagg.payloads.seed_commitment` of its self-mask seed (the mask key's
    commitment is its public key), so that a rebuilt seed can be checked.
    credential: the party's certificate (DER), or its bare identity public key (DER
    SubjectPublicKeyInfo) where no PKI is used; peers check it belongs to the roster name.
    signature: ECDSA-SHA256 over :func:`~fedfair.secagg.payloads.advertisement_payload`.
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
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        writer.u32(self.sender).blob(self.cipher_public_key).blob(self.mask_public_key).blob(self.seed_commitment)
        writer.blob(self.credential).blob(self.signature)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> AdvertiseKeys:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        return cls(header, reader.u32(), reader.blob(), reader.blob(), reader.blob(), reader.blob(), reader.blob())


@dataclass(frozen=True)
class KeyDirectory(Wire):
    """The server's list of the advertisements it accepted (the surviving set U1)."""

    TYPE: ClassVar[int] = 2
    STAGE: ClassVar[Stage] = Stage.ADVERTISE

    header: Header
    advertisements: tuple[AdvertiseKeys, ...]

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        write_messages(writer, self.advertisements)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> KeyDirectory:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        return cls(header, read_messages(reader, AdvertiseKeys.read))


@dataclass(frozen=True)
class EncryptedShares:
    """The sender's Shamir shares for one recipient, AES-256-GCM encrypted (nonce | ciphertext | tag).

    seed_commitment, key_commitment: :func:`~fedfair.secagg.payloads.share_commitment` of the recipient's
    share of the sender's seed and mask key, so a share the recipient decrypts, or reveals at
    UNMASK, can be checked against what the sender dealt. The entry is one line of the sender's
    signed dealing (:class:`ShareKeys`); it carries no signature of its own.
    """

    sender: int
    recipient: int
    ciphertext: bytes
    seed_commitment: bytes
    key_commitment: bytes

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        writer.u32(self.sender).u32(self.recipient).blob(self.ciphertext)
        writer.blob(self.seed_commitment).blob(self.key_commitment)

    @classmethod
    def read(cls, reader: Reader) -> EncryptedShares:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        return cls(reader.u32(), reader.u32(), reader.blob(), reader.fixed(DIGEST_BYTES), reader.fixed(DIGEST_BYTES))


@dataclass(frozen=True)
class ShareKeys(Wire):
    """A party's encrypted shares, one entry per neighbour that advertised keys, in increasing recipient order.

    signature: the sender's one identity signature over all its entries, its *dealing*
    (:func:`~fedfair.secagg.payloads.dealing_payload` of :func:`~fedfair.secagg.payloads.dealing_lines`),
    so the server and every recipient can tell the sender's entries from ones the server altered.
    """

    TYPE: ClassVar[int] = 3
    STAGE: ClassVar[Stage] = Stage.SHARE

    header: Header
    sender: int
    shares: tuple[EncryptedShares, ...]
    signature: bytes

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        _write_shares(writer.u32(self.sender), self.shares)
        writer.blob(self.signature)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> ShareKeys:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        return cls(header, reader.u32(), _read_shares(reader), reader.blob(SIGNATURE_LIMIT))


@dataclass(frozen=True)
class Dealing:
    """What a recipient needs to check a sender's signature over its entries without seeing the others.

    holders: the recipients of the dealer's entries, in order; lines: their
    :func:`~fedfair.secagg.payloads.dealing_line` digests, concatenated (32 bytes each);
    signature: the dealer's, as in its :class:`ShareKeys`.
    """

    dealer: int
    holders: tuple[int, ...]
    lines: bytes
    signature: bytes

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        writer.u32(self.dealer).ids(self.holders).blob(self.lines).blob(self.signature)

    @classmethod
    def read(cls, reader: Reader) -> Dealing:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        dealer, holders = reader.u32(), reader.ids()
        return cls(dealer, holders, reader.fixed(DIGEST_BYTES * len(holders)), reader.blob(SIGNATURE_LIMIT))

    def line(self, holder: int) -> bytes | None:
        """The line digest the dealer signed for ``holder``; None if it dealt ``holder`` nothing."""
        if holder not in self.holders:
            return None
        index = self.holders.index(holder)
        return self.lines[index * DIGEST_BYTES : (index + 1) * DIGEST_BYTES]


@dataclass(frozen=True)
class ShareBundle(Wire):
    """What the server forwards to one party: the encrypted shares addressed to it, with their senders' dealings.

    Its senders are the recipient's neighbours that completed the SHARE stage (U2); ``dealings[i]``
    is the dealing of ``shares[i]``'s sender. The recipient checks each entry in the CHECK stage.
    """

    TYPE: ClassVar[int] = 4
    STAGE: ClassVar[Stage] = Stage.SHARE

    header: Header
    recipient: int
    shares: tuple[EncryptedShares, ...]
    dealings: tuple[Dealing, ...]

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        _write_shares(writer.u32(self.recipient), self.shares)
        writer.u32(len(self.dealings))
        for dealing in self.dealings:
            dealing.write(writer)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> ShareBundle:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        recipient, shares = reader.u32(), _read_shares(reader)
        return cls(header, recipient, shares, tuple(Dealing.read(reader) for _ in range(reader.u32())))


@dataclass(frozen=True)
class ShareCheck(Wire):
    """A party's verdict on its bundle: the senders whose entry failed (bad signature, decryption or content).

    signature: the party's identity signature over :func:`~fedfair.secagg.payloads.share_check_payload`, so the
    server cannot invent or drop an accusation.
    """

    TYPE: ClassVar[int] = 8
    STAGE: ClassVar[Stage] = Stage.CHECK

    header: Header
    sender: int
    accused: tuple[int, ...]
    signature: bytes

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        writer.u32(self.sender).ids(self.accused)
        writer.blob(self.signature)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> ShareCheck:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        return cls(header, reader.u32(), reader.ids(), reader.blob())


@dataclass(frozen=True)
class MaskingSet(Wire):
    """U2': the parties that sent a share check and were accused by nobody; they mask with each other."""

    TYPE: ClassVar[int] = 9
    STAGE: ClassVar[Stage] = Stage.MASK

    header: Header
    parties: tuple[int, ...]

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        writer.ids(self.parties)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> MaskingSet:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        return cls(header, reader.ids())


@dataclass(frozen=True, eq=False)
class MaskedInput(Wire):
    """A party's encoded update plus its self mask and pairwise masks, modulo 2^k.

    ``vector`` is a 1-D uint16, uint32 or uint64 array of length d + 1. (No ``==``: numpy arrays
    do not compare to a single bool.)
    """

    TYPE: ClassVar[int] = 5
    STAGE: ClassVar[Stage] = Stage.MASK

    header: Header
    sender: int
    vector: np.ndarray

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        write_vector(writer.u32(self.sender), self.vector)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> MaskedInput:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        return cls(header, reader.u32(), read_vector(reader))


@dataclass(frozen=True)
class SurvivorSet(Wire):
    """The server's view of the MASK stage, for every survivor to sign.

    masking_set: U2', as sent in the MaskingSet.
    survivors: U3, the parties whose masked input arrived (a subset of U2').
    inputs: each survivor's :func:`~fedfair.secagg.payloads.masked_input_digest`, in the order of ``survivors``.
    """

    TYPE: ClassVar[int] = 10
    STAGE: ClassVar[Stage] = Stage.CONSISTENCY

    header: Header
    masking_set: tuple[int, ...]
    survivors: tuple[int, ...]
    inputs: tuple[bytes, ...]

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        writer.ids(self.masking_set)
        writer.ids(self.survivors)
        writer.u32(len(self.inputs))
        for digest in self.inputs:
            writer.blob(digest)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> SurvivorSet:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        masking_set, survivors = reader.ids(), reader.ids()
        return cls(header, masking_set, survivors, tuple(reader.fixed(DIGEST_BYTES) for _ in range(reader.u32())))


@dataclass(frozen=True)
class ConsistencySignature(Wire):
    """A survivor's identity signature over :func:`~fedfair.secagg.payloads.consistency_payload` of the view (U2', U3, masked-input digests) it was shown."""

    TYPE: ClassVar[int] = 11
    STAGE: ClassVar[Stage] = Stage.CONSISTENCY

    header: Header
    sender: int
    signature: bytes

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        writer.u32(self.sender).blob(self.signature)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> ConsistencySignature:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        return cls(header, reader.u32(), reader.blob())


@dataclass(frozen=True)
class UnmaskRequest(Wire):
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
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        writer.ids(self.survivors)
        writer.ids(self.dropped)
        writer.u32(len(self.signatures))
        for party, signature in self.signatures:
            writer.u32(party).blob(signature)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> UnmaskRequest:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        survivors, dropped = reader.ids(), reader.ids()
        signatures = tuple((reader.u32(), reader.blob()) for _ in range(reader.u32()))
        return cls(header, survivors, dropped, signatures)

    @property
    def masking_set(self) -> tuple[int, ...]:
        """U2' as this request implies it: survivors and dropped together, sorted."""
        return tuple(sorted((*self.survivors, *self.dropped)))


@dataclass(frozen=True)
class RevealedShare:
    """The responder's Shamir share (:meth:`fedfair.secagg.shamir.Share.to_bytes`) of ``owner``'s secret.

    The server checks it against the commitment in ``owner``'s dealing, which it verified at SHARE.
    """

    owner: int
    share: bytes


@dataclass(frozen=True)
class UnmaskResponse(Wire):
    """A surviving party's shares: of self-mask seeds for survivors, of mask keys for the dropped."""

    TYPE: ClassVar[int] = 7
    STAGE: ClassVar[Stage] = Stage.UNMASK

    header: Header
    sender: int
    seed_shares: tuple[RevealedShare, ...]
    key_shares: tuple[RevealedShare, ...]

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        writer.u32(self.sender)
        for group in (self.seed_shares, self.key_shares):
            writer.u32(len(group))
            for revealed in group:
                writer.u32(revealed.owner).blob(revealed.share)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> UnmaskResponse:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        sender = reader.u32()
        groups = [tuple(RevealedShare(reader.u32(), reader.blob()) for _ in range(reader.u32())) for _ in range(2)]
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
    | AggregateClaim
    | AggregateTag
    | TagSet
)


def _write_shares(writer: Writer, shares: tuple[EncryptedShares, ...]) -> None:
    writer.u32(len(shares))
    for share in shares:
        share.write(writer)


def _read_shares(reader: Reader) -> tuple[EncryptedShares, ...]:
    return tuple(EncryptedShares.read(reader) for _ in range(reader.u32()))


def decode(data: bytes) -> Message:
    """Parse any message produced by ``to_bytes()``."""
    message = read_message(data)
    if not isinstance(message, Message):
        raise ProtocolError(f"malformed message: {type(message).__name__} is not a secure-aggregation message")
    return message
