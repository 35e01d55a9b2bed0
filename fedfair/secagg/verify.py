"""Verified aggregation: each survivor checks that the aggregate it is shown is the sum of the signed survivors' inputs.

After UNMASK the server claims the sum S' it will apply. Each survivor derives a challenge from the
SHA-256 of S' (:func:`aggregate_digest`, :class:`Challenge`), tags its own input with the exact
integer dot products <r^c, x_i> plus pairwise masks that cancel over the survivor set U3
(:func:`masked_tags`), signs the tags over the digest, and accepts S' only if every survivor of U3
signed tags over the digest it computed itself and the tags sum to <r^c, S'> modulo 2^256
(:func:`check_sum`). The tags reveal <r^c, S> and nothing else. The construction, its soundness
argument and what it does not cover are in docs/security.md ("Verified aggregation").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedfair.secagg import kernels, keys, prg
from fedfair.secagg.codec import Writer

CHECKS = 2
"""Independent checks per round. One misses a wrong aggregate with probability at most 2^-63 (docs/security.md),
so two miss it with probability at most 2^-126 for each aggregate the server tries."""

BLOCK = 1 << 16
"""Coordinates per inner block: the challenge's inner coefficients a^c repeat every BLOCK coordinates, each block
scaled by its own outer coefficient b^c_q, so a round draws 2 x (BLOCK + d / BLOCK) keystream words, not 2 d."""

TAG_MODULUS = 1 << 256
"""Tags are integers modulo 2^256. Every honest |<r, v>| is below 2^255 (128-bit coefficients, words below 2^64,
fewer than 2^32 coordinates and 2^31 parties), so a sum that is zero modulo 2^256 is zero over the integers."""

TAG_WORD_BYTES = 32
TAG_BYTES = CHECKS * TAG_WORD_BYTES
"""Length of a party's tags field: CHECKS big-endian 256-bit integers."""

_DOMAIN = "fedfair/secagg/v3/verify-"


def aggregate_digest(
    session: bytes,
    survivors: tuple[int, ...],
    inputs: tuple[bytes, ...],
    vector: np.ndarray,
    carries: np.ndarray | None = None,
) -> bytes:
    """SHA-256 of the session, the survivor set U3, its masked-input digests, the aggregate's words and its carries.

    What every tag is signed over: survivors shown different views (another masked input for one of them)
    sign different digests, so each refuses the others' tags. ``carries`` (a re-checked round's,
    :mod:`fedfair.secagg.recheck`; as many 16-bit words as the aggregate has words) follow the words, so the
    challenge is drawn only once both are fixed; the header's word count says where the words end.
    """
    bits = vector.dtype.itemsize * 8
    head = Writer().text(_DOMAIN + "aggregate").blob(session).ids(survivors).u32(len(inputs))
    for input_digest in inputs:
        head.blob(input_digest)
    head.u8(bits).u64(vector.size)
    digest = hashlib.sha256(head.getvalue())
    digest.update(np.ascontiguousarray(vector, dtype=f"<u{bits // 8}").data)
    if carries is not None:
        digest.update(np.ascontiguousarray(carries, dtype="<u2").data)
    return digest.digest()


def tag_payload(
    session: bytes, digest: bytes, party: int, tags: bytes, values: tuple[tuple[int, bytes], ...] = ()
) -> bytes:
    """The bytes a survivor signs with its tags: bound to the session, the aggregate's digest and the sender.

    ``values`` are the re-checked values the tag reports (:mod:`fedfair.secagg.recheck`; none where the round
    is not re-checked).
    """
    writer = Writer().text(_DOMAIN + "tag").blob(session).blob(digest).u32(party).blob(tags)
    return writer.pairs(values).getvalue()


class Challenge:
    """The challenge of one aggregate: CHECKS rows of coefficients r^c_j = b^c_q a^c_(j mod BLOCK), q = j div BLOCK.

    Drawn from the AES-256-CTR keystream of HKDF(digest) with the session as salt, so nobody can choose it
    and the server learns it only once it has committed to the aggregate. Every a and b is a uniform
    64-bit integer.
    """

    def __init__(self, session: bytes, digest: bytes, words: int) -> None:
        if words < 1:
            raise ValueError(f"a challenge needs at least one coordinate, got {words}")
        stream = prg.Keystream(keys.hkdf(digest, session, (_DOMAIN + "challenge").encode()))
        self.words = words
        self._inner = _uint64(stream.read(CHECKS * BLOCK * 8)).reshape(CHECKS, BLOCK)
        blocks = -(-words // BLOCK)
        outer = _uint64(stream.read(CHECKS * blocks * 8)).reshape(blocks, CHECKS)
        self._outer = [[int(value) for value in row] for row in outer]

    def dots(self, vector: np.ndarray | Iterable[np.ndarray]) -> tuple[int, ...]:
        """The exact integers <r^c, v> for each check c, v the words of ``vector`` read as two's complement.

        ``vector`` is a 1-D uint16, uint32 or uint64 array of ``words`` words, or those words in 1-D pieces of
        one type, in order, each but the last a whole number of BLOCKs long (read one at a time, never joined).
        """
        pieces = [vector] if isinstance(vector, np.ndarray) else vector
        counters: list[np.ndarray] = []  # one set per 32-bit half of a word (one set for words of 32 bits or less)
        start, bits = 0, 0
        for piece in pieces:
            if start == 0:
                bits = piece.dtype.itemsize * 8
                counters = [np.zeros((len(self._outer), CHECKS, 5), dtype=np.uint64) for _ in range(bits // 64 + 1)]
            if (
                piece.ndim != 1
                or piece.dtype.kind != "u"
                or piece.dtype.itemsize * 8 != bits
                or start % BLOCK
                or start + piece.size > self.words
            ):
                raise ValueError(
                    f"the vector must be 1-D unsigned words, {self.words} of them, in pieces of whole blocks"
                )
            first, last = start // BLOCK, -(-(start + piece.size) // BLOCK)
            self._add_block_dots(np.ascontiguousarray(piece), [half[first:last] for half in counters])
            start += piece.size
        if start != self.words:
            raise ValueError(f"the vector must be 1-D unsigned words, {self.words} of them, in pieces of whole blocks")
        if bits <= 32:
            sums = _folded(counters[0], bits)
        else:
            # 64-bit words as two 32-bit halves: v = low + 2^32 high, the high half carrying the sign.
            low, high = _folded(counters[0], 64), _folded(counters[1], 32)
            sums = [
                [one + (other << 32) for one, other in zip(a, b, strict=True)] for a, b in zip(low, high, strict=True)
            ]
        return tuple(
            sum(outer[check] * block[check] for outer, block in zip(self._outer, sums, strict=True))
            for check in range(CHECKS)
        )

    def _add_block_dots(self, words: np.ndarray, counters: list[np.ndarray]) -> None:
        """Add the kernel's counters of `words` (their blocks' <a^c, words>) to `counters`, one set per half."""
        if words.dtype.itemsize <= 4:
            kernels.challenge_dots()(self._inner, words, words.dtype.itemsize * 8, counters[0])
            return
        halves = words.astype(words.dtype.newbyteorder("<"), copy=False).view("<u4")
        kernels.challenge_dots()(self._inner, halves[0::2], 64, counters[0])
        kernels.challenge_dots()(self._inner, halves[1::2], 32, counters[1])


def masked_tags(
    challenge: Challenge,
    plain: np.ndarray | Iterable[np.ndarray],
    party: int,
    tag_keys: Mapping[int, bytes],
    session: bytes,
    digest: bytes,
) -> bytes:
    """``party``'s tags of its plain encoded input: <r^c, x> plus its pairwise tag masks, modulo 2^256.

    ``plain`` is the input's words, whole or in pieces (:meth:`Challenge.dots`).

    ``tag_keys`` maps each neighbour in U3 to the pairwise tag key (:func:`~fedfair.secagg.keys.pair_tag_key`);
    the smaller id adds the mask and the larger subtracts it, so the masks cancel in the sum over U3.
    """
    tags = list(challenge.dots(plain))
    for peer, key in tag_keys.items():
        sign = 1 if party < peer else -1
        for check, mask in enumerate(tag_masks(key, session, digest)):
            tags[check] += sign * mask
    return encode_tags(tags)


def tag_masks(tag_key: bytes, session: bytes, digest: bytes) -> tuple[int, ...]:
    """The CHECKS pairwise masks of one aggregate: uniform 256-bit integers from HKDF-SHA256 of the pair's tag key."""
    info = (_DOMAIN + "tag-mask").encode() + digest
    stream = HKDF(algorithm=hashes.SHA256(), length=TAG_BYTES, salt=session, info=info).derive(tag_key)
    return decode_tags(stream)


def encode_tags(tags: Iterable[int]) -> bytes:
    """CHECKS integers modulo 2^256 as big-endian 32-byte words."""
    return b"".join((tag % TAG_MODULUS).to_bytes(TAG_WORD_BYTES, "big") for tag in tags)


def decode_tags(data: bytes) -> tuple[int, ...]:
    """The CHECKS integers of a tags field (:func:`encode_tags`).

    Raises:
        ValueError: ``data`` is not TAG_BYTES long.
    """
    if len(data) != TAG_BYTES:
        raise ValueError(f"a tags field is {TAG_BYTES} bytes, got {len(data)}")
    return tuple(int.from_bytes(data[i : i + TAG_WORD_BYTES], "big") for i in range(0, TAG_BYTES, TAG_WORD_BYTES))


def check_sum(expected: tuple[int, ...], tags: Iterable[bytes]) -> bool:
    """Whether the tags sum, modulo 2^256, to ``expected`` (the dots of the aggregate) in every check."""
    totals = [0] * CHECKS
    for field in tags:
        for check, value in enumerate(decode_tags(field)):
            totals[check] += value
    return all((total - want) % TAG_MODULUS == 0 for total, want in zip(totals, expected, strict=True))


def _folded(counters: np.ndarray, bits: int) -> list[list[int]]:
    """Per block q, the exact <a^c, words of block q> for each check c, from the kernel's counters."""
    return [[_fold(row, bits) for row in block] for block in counters.tolist()]


def _fold(row: list[int], bits: int) -> int:
    """The dot product a row of the kernel's counters stands for (see :func:`kernels._challenge_dots`)."""
    positive = row[0] + (row[1] << 32) + (row[2] << 64)
    negative = row[3] + (row[4] << 32)
    return positive - (negative << bits)


def _uint64(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<u8").astype(np.uint64)
