"""The messages of the VERIFY stage (protocol v3): the aggregate the server claims, and the survivors' signed tags.

The server shows every survivor the sum it will apply (:class:`AggregateClaim`); each survivor answers
with its masked tags of its own input (:class:`AggregateTag`), and the server relays them all
(:class:`TagSet`). What the tags are and why they check the sum is :mod:`fedfair.secagg.verify`. Like
every message they carry a :class:`~fedfair.secagg.wire.Header` and the canonical encoding of
:mod:`fedfair.secagg.wire`; :func:`fedfair.secagg.messages.decode` parses them with the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedfair.secagg.codec import Reader, Writer
from fedfair.secagg.wire import (
    SIGNATURE_LIMIT,
    Header,
    Stage,
    Wire,
    read_messages,
    read_vector,
    write_messages,
    write_vector,
)


@dataclass(frozen=True, eq=False)
class AggregateClaim(Wire):
    """What the server shows every survivor in the VERIFY stage: the unmasked sum it will apply (d + 1 words).

    The claim commits the server: each survivor's challenge is derived from its digest
    (:func:`fedfair.secagg.verify.aggregate_digest`), and every tag is signed over that digest.
    """

    TYPE: ClassVar[int] = 12
    STAGE: ClassVar[Stage] = Stage.VERIFY

    header: Header
    vector: np.ndarray

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        write_vector(writer, self.vector)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> AggregateClaim:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        return cls(header, read_vector(reader))


@dataclass(frozen=True)
class AggregateTag(Wire):
    """A survivor's masked tags of its own input under the claim's challenge, signed over the claim's digest.

    tags: :data:`fedfair.secagg.verify.TAG_BYTES` bytes, the :data:`fedfair.secagg.verify.CHECKS` masked tags
    (each a 256-bit integer, big-endian); signature: the sender's identity signature over
    :func:`fedfair.secagg.verify.tag_payload`.
    """

    TYPE: ClassVar[int] = 13
    STAGE: ClassVar[Stage] = Stage.VERIFY

    header: Header
    sender: int
    tags: bytes
    signature: bytes

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        writer.u32(self.sender).blob(self.tags).blob(self.signature)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> AggregateTag:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        return cls(header, reader.u32(), reader.blob(TAGS_LIMIT), reader.blob(SIGNATURE_LIMIT))


@dataclass(frozen=True)
class TagSet(Wire):
    """Every survivor's tag, as the server relays them to every survivor (one per survivor, in increasing order)."""

    TYPE: ClassVar[int] = 14
    STAGE: ClassVar[Stage] = Stage.VERIFY

    header: Header
    tags: tuple[AggregateTag, ...]

    def write(self, writer: Writer) -> None:
        """Append this message's fields (its header excluded), in the order :meth:`read` expects."""
        write_messages(writer, self.tags)

    @classmethod
    def read(cls, header: Header, reader: Reader) -> TagSet:
        """The message whose fields follow ``header`` in ``reader``; ProtocolError on malformed bytes."""
        return cls(header, read_messages(reader, AggregateTag.read))


TAGS_LIMIT = 64
"""The longest tags field: two 256-bit tags."""
