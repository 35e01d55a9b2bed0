"""The masking PRG: an AES-256-CTR keystream read as little-endian unsigned integers.

Why AES-256-CTR: it is a standard PRF-based stream from ``cryptography`` (OpenSSL),
runs at several GB/s with AES-NI/VAES, and is keyed by the *full* 256-bit key the
protocol derives with HKDF, so nothing is folded or truncated into a small seed
(the weakness of masks drawn from a Mersenne Twister seeded with 32 bits).

The initial counter block is all zeros. That is safe because every key in fedfair
is used for exactly one stream: mask keys come from HKDF with the session id as
salt and the purpose and party ids in the info, and the session id changes with
every round's fresh keys.

:func:`apply_masks` is the hot loop of secure aggregation. It walks the vector in
cache-sized blocks and, for each block, pulls the next block of every stream into
one reused buffer and adds or subtracts it in place; the accumulator block stays
in cache across all streams and no full-length keystream is ever materialised, so
masking costs little more than generating the keystream itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

KEY_BYTES = 32
"""PRG key length: AES-256."""

BLOCK_BYTES = 1 << 17
"""Bytes per stream per step of :func:`apply_masks`: the keystream buffer and the
accumulator block together (256 KiB) stay in a 512 KiB L2 cache, and a block is large
enough that the per-call Python overhead is a few percent."""

_ZERO_COUNTER = bytes(16)
_ZEROS = memoryview(bytes(BLOCK_BYTES))

Mask = tuple[bytes, int]
"""``(key, sign)``: add (sign +1) or subtract (sign -1) the stream of ``key``."""


class Keystream:
    """The AES-256-CTR keystream of one key, read sequentially."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"PRG key must be {KEY_BYTES} bytes, got {len(key)}")
        self._encryptor = Cipher(algorithms.AES(key), modes.CTR(_ZERO_COUNTER)).encryptor()

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

    ``accumulator`` is a contiguous 1-D uint32 or uint64 array; word ``i`` of every
    stream goes to coordinate ``i``. Unsigned numpy arithmetic wraps, which is exactly
    arithmetic modulo 2^32 or 2^64.
    """
    if accumulator.ndim != 1 or not accumulator.flags.c_contiguous or accumulator.dtype.kind != "u":
        raise ValueError("accumulator must be a contiguous 1-D unsigned integer array")
    if accumulator.dtype.itemsize not in (4, 8):
        raise ValueError("accumulator words must be 32 or 64 bits")
    word = accumulator.dtype.newbyteorder("<")
    block_words = BLOCK_BYTES // word.itemsize
    streams = [(Keystream(key), sign) for key, sign in masks]
    for _, sign in streams:
        if sign not in (1, -1):
            raise ValueError("mask sign must be +1 or -1")
    buffer = np.empty(block_words, dtype=word)
    buffer_bytes = buffer.data.cast("B")
    for start in range(0, accumulator.size, block_words):
        block = accumulator[start : start + block_words]
        stream_block = buffer[: block.size]
        target = buffer_bytes[: block.size * word.itemsize]
        for stream, sign in streams:
            stream.read_into(target)
            if sign > 0:
                np.add(block, stream_block, out=block)
            else:
                np.subtract(block, stream_block, out=block)
