"""The canonical encoding every secure-aggregation message shares, and what binds a message to its round.

Every field is a str, int, bytes, a tuple of such, or (MaskedInput, AggregateClaim) a numpy vector,
so a gRPC/protobuf schema can carry the fields one to one. For a single opaque payload,
``to_bytes()`` gives a canonical encoding (see :mod:`fedfair.secagg.codec`): magic
``FSA3`` | message type (u8) | header (federation id, round u64, stage u8, session id) |
the fields in declaration order, integers fixed-width big-endian, byte strings and tuples
length-prefixed, the masked vector as its modulus bits (u8) and little-endian words.
``Cls.from_bytes(data)`` parses one type; :func:`read_message` any registered type.
Nothing is pickled.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Self, TypeVar

import numpy as np

from fedfair.core.errors import ProtocolError, StaleMessageError
from fedfair.secagg.codec import Reader, Writer
from fedfair.secagg.config import SecAggConfig

MAGIC = b"FSA3"

SIGNATURE_LIMIT = 72
"""The longest DER encoding of an ECDSA P-256 signature; a longer signature field is malformed."""


class Stage(enum.IntEnum):
    """The stages of a round, in order: the six that make the sum, then the optional VERIFY of it."""

    ADVERTISE = 1
    SHARE = 2
    CHECK = 3
    MASK = 4
    CONSISTENCY = 5
    UNMASK = 6
    VERIFY = 7
    """The aggregate is shown to the survivors, each tags it, and each checks the tags (:mod:`fedfair.secagg.verify`)."""


SUM_STAGES: tuple[Stage, ...] = tuple(stage for stage in Stage if stage <= Stage.UNMASK)
"""The six stages that make the sum (every round has them; VERIFY follows where the caller asks for it)."""


@dataclass(frozen=True)
class Header:
    """What a message is bound to. ``session_id`` is empty in the ADVERTISE stage."""

    federation_id: str
    round: int
    stage: Stage
    session_id: bytes

    def write(self, writer: Writer) -> None:
        """Append these fields, in the order :meth:`read` expects."""
        writer.text(self.federation_id).u64(self.round).u8(self.stage).blob(self.session_id)

    @classmethod
    def read(cls, reader: Reader) -> Header:
        """The header at ``reader``'s position.

        Raises:
            ProtocolError: malformed bytes or an unknown stage.
        """
        federation_id, round_number, stage = reader.text(), reader.u64(), reader.u8()
        try:
            return cls(federation_id, round_number, Stage(stage), reader.blob())
        except ValueError:
            raise ProtocolError(f"malformed message: unknown stage {stage}") from None


def write_vector(writer: Writer, vector: np.ndarray) -> None:
    """Append ``vector`` as its word size in bits (u8) and its little-endian words."""
    bits = vector.dtype.itemsize * 8
    words = np.ascontiguousarray(vector, dtype=f"<u{bits // 8}")
    writer.u8(bits).blob(words.data)


def read_vector(reader: Reader) -> np.ndarray:
    """The vector :func:`write_vector` wrote; ProtocolError on malformed bytes."""
    bits = reader.u8()
    if bits not in (16, 32, 64):
        raise ProtocolError(f"malformed message: {bits}-bit words")
    data = reader.blob_view()
    if len(data) % (bits // 8):
        raise ProtocolError("malformed message: vector length is not a whole number of words")
    # Zero-copy view of the received bytes; read-only, which is all a receiver needs.
    return np.frombuffer(data, dtype=f"<u{bits // 8}")


class Framed(Protocol):
    """What framing needs of a message: its type byte, its header, and how it writes its own fields."""

    TYPE: ClassVar[int]

    @property
    def header(self) -> Header:
        """The federation, round, stage and session the message is bound to."""
        ...

    def write(self, writer: Writer) -> None:
        """Append the message's own fields (its header excluded), in the order its ``read`` expects."""
        ...


_Read = TypeVar("_Read")
"""What a message type's ``read`` returns: the type :func:`read_messages` gives a tuple of."""


def write_messages(writer: Writer, messages: Sequence[Framed]) -> None:
    """Append ``messages`` whole inside another message: their count (u32), then each one's header and fields."""
    writer.u32(len(messages))
    for message in messages:
        message.header.write(writer)
        message.write(writer)


def read_messages(reader: Reader, read: Callable[[Header, Reader], _Read]) -> tuple[_Read, ...]:
    """The messages :func:`write_messages` wrote, each parsed by ``read`` (its type's ``read``)."""
    return tuple(read(Header.read(reader), reader) for _ in range(reader.u32()))


class Wire:
    """The canonical encoding every message type shares: ``to_bytes()`` and ``Cls.from_bytes(data)``.

    Each subclass registers its ``TYPE`` byte, so that :func:`read_message` can parse it.
    """

    def __init_subclass__(cls, **options: Any) -> None:
        super().__init_subclass__(**options)
        _TYPES[cls.TYPE] = cls  # type: ignore[attr-defined]  # every message class sets TYPE

    def to_bytes(self: Framed) -> bytes:
        """The canonical encoding: magic, type byte, header, then the message's fields; what ``from_bytes`` parses."""
        return b"".join(Wire.to_pieces(self))

    def to_pieces(self: Framed) -> tuple[bytes | memoryview, ...]:
        """:meth:`to_bytes` as consecutive pieces, a vector field one view of its own words (never copied whole).

        For a masked input, which is streamed from them: its vector must not change until they are sent.
        """
        writer = Writer().blob(MAGIC).u8(self.TYPE)
        self.header.write(writer)
        self.write(writer)
        return writer.pieces()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> Self:
        """Parse ``data`` as this message type.

        Raises:
            ProtocolError: ``data`` is malformed or holds a message of another type.
        """
        message = read_message(data)
        if not isinstance(message, cls):
            raise ProtocolError(f"malformed message: expected {cls.__name__}, got {type(message).__name__}")
        return message


_TYPES: dict[int, type[Wire]] = {}
"""Every message type by its type byte, as the classes register themselves."""


class Bound(Protocol):
    """What :func:`check_header` needs of a message: its header and the stage its type belongs to."""

    STAGE: ClassVar[Stage]

    @property
    def header(self) -> Header:
        """The federation, round, stage and session the message claims."""
        ...


def read_message(data: bytes | memoryview) -> Wire:
    """Parse any registered message produced by ``to_bytes()``."""
    reader = Reader(data)
    if bytes(reader.blob_view()) != MAGIC:
        raise ProtocolError("malformed message: not a fedfair secure-aggregation v3 message")
    kind = reader.u8()
    if kind not in _TYPES:
        raise ProtocolError(f"malformed message: unknown message type {kind}")
    message = _TYPES[kind].read(Header.read(reader), reader)  # type: ignore[attr-defined]  # each type reads itself
    reader.finish()
    return message  # type: ignore[no-any-return]


def check_header(message: Bound, config: SecAggConfig, session: bytes) -> None:
    """Refuse a message not bound to this federation, round, the message's stage and ``session``.

    Raises:
        StaleMessageError: any of the four differs (a replayed or late message; it is dropped).
    """
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
