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

UNIFORM_BITS = 53
"""Random bits per uniform float: a float64 in [0, 1) holds every multiple of 2^-53 exactly."""

_WORD_SHIFT = np.uint64(64 - UNIFORM_BITS)

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


def words_to_uniforms(words: np.ndarray, out: np.ndarray) -> None:
    """Write ``k * 2^-53`` into ``out``, where k is the top 53 bits of the matching 64-bit word.

    Every k in [0, 2^53) is the top of exactly 2^11 words, so uniform words give floats
    exactly uniform on the grid {k 2^-53 : 0 <= k < 2^53}, and P(u < p) = ceil(p 2^53) / 2^53
    for p in [0, 1]. ``words`` (uint64, same length as ``out``) is shifted in place, which is
    why the caller hands over a scratch buffer; ``out`` is float64. Both conversions are
    exact: k < 2^53 is a float64 integer, and scaling by a power of two only moves the exponent.
    """
    if words.dtype.kind != "u" or words.dtype.itemsize != 8 or out.dtype != np.float64 or words.shape != out.shape:
        raise ValueError("words must be uint64 and out float64, of the same shape")
    _words_to_uniforms(words, out)


def _words_to_uniforms(words: np.ndarray, out: np.ndarray) -> None:
    """:func:`words_to_uniforms` without the argument checks, for the per-block hot path."""
    np.right_shift(words, _WORD_SHIFT, out=words)
    np.multiply(words, 2.0**-UNIFORM_BITS, out=out)


class UniformStream:
    """Floats uniform on the 2^-53 grid of [0, 1), one per 64-bit word of the keystream of ``key``.

    Float i is word i of :func:`words` (little-endian) turned into a float by
    :func:`words_to_uniforms`, so the floats are reproducible from the key. Reading goes
    through one reused word buffer of ``block`` words, which the cipher writes into directly.
    """

    def __init__(self, key: bytes, block: int = BLOCK_BYTES // 8) -> None:
        if block < 1:
            raise ValueError(f"block must be at least one word, got {block}")
        self._stream = Keystream(key)
        self._words = np.empty(block, dtype=np.dtype(np.uint64).newbyteorder("<"))
        self._bytes = self._words.data.cast("B")

    def fill(self, out: np.ndarray) -> None:
        """Overwrite the 1-D float64 array ``out`` with the next ``out.size`` uniforms."""
        if out.ndim != 1 or out.dtype != np.float64:
            raise ValueError("out must be a 1-D float64 array")
        block = self._words.size
        for start in range(0, out.size, block):
            target = out[start : start + block]
            words = self._words[: target.size]
            self._stream.read_into(self._bytes[: target.size * 8])
            _words_to_uniforms(words, target)


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
