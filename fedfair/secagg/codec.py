"""A tiny canonical binary encoding for secure-aggregation messages and digests.

Every value has exactly one encoding (fixed-width big-endian integers, length-
prefixed byte strings, IEEE-754 doubles), so the same bytes serve three purposes:
carrying messages, signing advertised keys and hashing the session id. Nothing is
ever unpickled or evaluated; a reader refuses truncated or trailing input.
"""

from __future__ import annotations

import struct

from fedfair.core.errors import ProtocolError


class Writer:
    """Appends canonically encoded fields to a buffer."""

    def __init__(self) -> None:
        self._parts: list[bytes | memoryview] = []

    def u8(self, value: int) -> Writer:
        """Append one unsigned byte."""
        self._parts.append(struct.pack(">B", value))
        return self

    def u32(self, value: int) -> Writer:
        """Append a big-endian unsigned 32-bit integer."""
        self._parts.append(struct.pack(">I", value))
        return self

    def u64(self, value: int) -> Writer:
        """Append a big-endian unsigned 64-bit integer."""
        self._parts.append(struct.pack(">Q", value))
        return self

    def f64(self, value: float) -> Writer:
        """Append a big-endian IEEE 754 double."""
        self._parts.append(struct.pack(">d", value))
        return self

    def blob(self, value: bytes | memoryview) -> Writer:
        """A byte string with a 64-bit length prefix (masked vectors can exceed 4 GiB).

        A memoryview is not copied here, only by :meth:`getvalue`: a masked vector is written
        once, not twice. Its buffer must not change before then.
        """
        self.u64(value.nbytes if isinstance(value, memoryview) else len(value))
        self._parts.append(value)
        return self

    def text(self, value: str) -> Writer:
        """Append a UTF-8 string as a blob."""
        return self.blob(value.encode("utf-8"))

    def ids(self, ids: tuple[int, ...]) -> Writer:
        """A list of party ids: its length (u32), then each id (u32)."""
        self.u32(len(ids))
        for party in ids:
            self.u32(party)
        return self

    def pairs(self, pairs: tuple[tuple[int, bytes], ...]) -> Writer:
        """(party id, bytes) pairs: their count (u32), then each id (u32) and its bytes (a blob)."""
        self.u32(len(pairs))
        for party, value in pairs:
            self.u32(party).blob(value)
        return self

    def getvalue(self) -> bytes:
        """Every field appended so far, as one byte string."""
        return b"".join(self._parts)

    def pieces(self) -> tuple[bytes | memoryview, ...]:
        """Every field appended so far, as the pieces whose concatenation :meth:`getvalue` is (nothing copied)."""
        return tuple(self._parts)


class Reader:
    """Reads fields written by :class:`Writer`; raises :class:`ProtocolError` on malformed input."""

    def __init__(self, data: bytes | memoryview) -> None:
        self._view = memoryview(data)
        self._offset = 0

    def _take(self, size: int) -> memoryview:
        end = self._offset + size
        if size < 0 or end > len(self._view):
            raise ProtocolError("malformed message: truncated")
        chunk = self._view[self._offset : end]
        self._offset = end
        return chunk

    def u8(self) -> int:
        """The next unsigned byte; ProtocolError if the message ends first."""
        return int(struct.unpack(">B", self._take(1))[0])

    def u32(self) -> int:
        """The next big-endian unsigned 32-bit integer; ProtocolError if the message ends first."""
        return int(struct.unpack(">I", self._take(4))[0])

    def u64(self) -> int:
        """The next big-endian unsigned 64-bit integer; ProtocolError if the message ends first."""
        return int(struct.unpack(">Q", self._take(8))[0])

    def f64(self) -> float:
        """The next big-endian IEEE 754 double; ProtocolError if the message ends first."""
        return float(struct.unpack(">d", self._take(8))[0])

    def blob(self, limit: int | None = None) -> bytes:
        """A length-prefixed byte string; with ``limit``, refused if longer."""
        size = self.u64()
        if limit is not None and size > limit:
            raise ProtocolError(f"malformed message: a field of {size} bytes, more than its {limit}")
        return bytes(self._take(size))

    def fixed(self, size: int) -> bytes:
        """A length-prefixed byte string that must be exactly ``size`` bytes long (a digest)."""
        value = self.blob(size)
        if len(value) != size:
            raise ProtocolError(f"malformed message: a field of {len(value)} bytes, not {size}")
        return value

    def blob_view(self) -> memoryview:
        """Like :meth:`blob` without copying (for large vectors)."""
        return self._take(self.u64())

    def text(self) -> str:
        """The next blob decoded as UTF-8; ProtocolError if it is not UTF-8."""
        try:
            return self.blob().decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("malformed message: text field is not UTF-8") from None

    def ids(self) -> tuple[int, ...]:
        """A list of party ids written by :meth:`Writer.ids`."""
        return tuple(self.u32() for _ in range(self.u32()))

    def pairs(self, limit: int) -> tuple[tuple[int, bytes], ...]:
        """(party id, bytes) pairs written by :meth:`Writer.pairs`, each blob at most ``limit`` bytes."""
        return tuple((self.u32(), self.blob(limit)) for _ in range(self.u32()))

    def finish(self) -> None:
        """Insist that every byte was consumed."""
        if self._offset != len(self._view):
            raise ProtocolError("malformed message: trailing bytes")
