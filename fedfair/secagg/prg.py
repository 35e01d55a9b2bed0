"""The masking PRG: an AES-256-CTR keystream read as little-endian unsigned integers.

Each key is used for exactly one stream (HKDF with the session id as salt and the purpose and
party ids in the info), so the initial counter block is all zeros. :func:`apply_masks`, the hot
loop of secure aggregation, adds or subtracts the keystreams block by block without ever
materialising a full-length stream. Why AES-256-CTR, and the block sizes, are in docs/design.md
("Inside secure aggregation").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedfair.secagg import kernels

KEY_BYTES = 32
"""PRG key length: AES-256."""

BLOCK_BYTES = 1 << 21
"""Largest number of bytes :meth:`Keystream.read_into` draws per cipher call, and per stream per
step of :func:`apply_masks`. The cipher releases the GIL on every call, and in a process whose
other threads run Python (the aggregator's handlers, or every party of an in-process
federation) getting it back can take a whole switch interval (5 ms): few, large calls keep
masking off that convoy. Ten parties masking as threads beside Python threads ran about twice
as fast with 2 MiB calls as with 512 KiB ones, for the same CPU alone."""

STREAMS_PER_PASS = 2
"""Streams :func:`apply_masks` adds per pass over an accumulator block (``kernels.add_rows`` takes two
rows per pass); its buffer holds this many blocks, so it stays small however many streams there are."""

_ZERO_COUNTER = bytes(16)
_ZEROS = memoryview(bytes(BLOCK_BYTES))

Mask = tuple[bytes, int]
"""``(key, sign)``: add (sign +1) or subtract (sign -1) the stream of ``key``."""


STREAMS = 1 << 32
"""Independent streams one key gives (:class:`Keystream`'s ``stream``), each 2^96 AES blocks long."""


class Keystream:
    """The AES-256-CTR keystream of one key, read sequentially.

    ``stream`` i (0 <= i < :data:`STREAMS`) starts the counter at i 2^96: the streams of one key are
    disjoint stretches of its one keystream, so a party can draw several independent sequences (rounding
    uniforms, each Poisson) from one fresh key, each read in pieces of any size.
    """

    def __init__(self, key: bytes, stream: int = 0) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"PRG key must be {KEY_BYTES} bytes, got {len(key)}")
        if not 0 <= stream < STREAMS:
            raise ValueError(f"stream must be from 0 to 2^32 - 1, got {stream}")
        counter = (stream << 96).to_bytes(16, "big") if stream else _ZERO_COUNTER
        self._encryptor = Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor()

    def read_into(self, buffer: memoryview) -> None:
        """Overwrite the byte buffer ``buffer`` with the next ``len(buffer)`` keystream bytes."""
        # CTR encryption of zeros is the keystream itself; update_into writes it straight
        # into the caller's buffer, avoiding an allocation per call.
        if len(buffer) <= BLOCK_BYTES:  # the hot path of apply_masks: one call
            self._encryptor.update_into(_ZEROS[: len(buffer)], buffer)
            return
        for start in range(0, len(buffer), BLOCK_BYTES):
            chunk = buffer[start : start + BLOCK_BYTES]
            self._encryptor.update_into(_ZEROS[: len(chunk)], chunk)

    def read(self, size: int) -> bytes:
        """The next ``size`` keystream bytes."""
        out = bytearray(size)
        self.read_into(memoryview(out))
        return bytes(out)


def keystream(key: bytes, size: int) -> bytes:
    """The first ``size`` bytes of the stream of ``key``."""
    return Keystream(key).read(size)


def words(key: bytes, count: int, dtype: type[np.unsignedinteger]) -> np.ndarray:
    """The first ``count`` stream words of ``key`` as little-endian unsigned integers."""
    word = np.dtype(dtype).newbyteorder("<")
    return np.frombuffer(keystream(key, count * word.itemsize), dtype=word).astype(dtype)


def apply_masks(accumulator: np.ndarray, masks: Sequence[Mask]) -> None:
    """Add or subtract the streams of ``masks`` to ``accumulator`` in place, modulo 2^bits.

    ``accumulator`` is a contiguous 1-D uint16, uint32 or uint64 array; word ``i`` of every
    stream goes to coordinate ``i``. Unsigned arithmetic wraps, which is exactly
    arithmetic modulo 2^16, 2^32 or 2^64.
    """
    if accumulator.ndim != 1 or not accumulator.flags.c_contiguous or accumulator.dtype.kind != "u":
        raise ValueError("accumulator must be a contiguous 1-D unsigned integer array")
    if accumulator.dtype.itemsize not in (2, 4, 8):
        raise ValueError("accumulator words must be 16, 32 or 64 bits")
    for _, sign in masks:
        if sign not in (1, -1):
            raise ValueError("mask sign must be +1 or -1")
    if not masks:
        return
    word = accumulator.dtype.newbyteorder("<")
    block_words = max(1, min(BLOCK_BYTES // word.itemsize, accumulator.size))
    streams = [Keystream(key) for key, _ in masks]
    # All ones negates a word in add_rows: (x ^ ~0) - ~0 = -x modulo 2^bits.
    negate = np.array([0 if sign > 0 else -1 for _, sign in masks], dtype=np.int64).astype(word)
    rows = np.empty((min(STREAMS_PER_PASS, len(masks)), block_words), dtype=word)
    row_bytes = [rows[row].data.cast("B") for row in range(rows.shape[0])]
    add_rows = kernels.add_rows()
    for start in range(0, accumulator.size, block_words):
        block = accumulator[start : start + block_words]
        size = block.size * word.itemsize
        for first in range(0, len(streams), STREAMS_PER_PASS):
            group = streams[first : first + STREAMS_PER_PASS]
            for stream, target in zip(group, row_bytes, strict=False):
                stream.read_into(target[:size])
            add_rows(block, rows[: len(group)], negate[first : first + len(group)])
