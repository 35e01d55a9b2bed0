"""The masking PRG: known answers, determinism per key, independence across pair keys."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fedfair.secagg import keys, prg

# AES-256 with the all-zero key on counter blocks 0 and 1 (the classic AES-256 known answer
# for a zero key and zero plaintext, then the next counter block).
ZERO_KEY_STREAM = bytes.fromhex("dc95c078a2408989ad48a21492842087530f8afbc74536b9a963b4f1c4cb738b")
SESSION = bytes(range(32))


def test_keystream_known_answer() -> None:
    assert prg.keystream(bytes(32), 32) == ZERO_KEY_STREAM


def test_words_are_the_keystream_read_little_endian() -> None:
    words = prg.words(bytes(32), 2, np.uint32)
    assert words.tolist() == [0x78C095DC, 0x898940A2]
    assert prg.words(bytes(32), 1, np.uint64).tolist() == [0x898940A278C095DC]


def test_keystream_is_deterministic_per_key_and_differs_across_keys() -> None:
    key_a, key_b = bytes([1]) * 32, bytes([2]) * 32
    assert prg.keystream(key_a, 1000) == prg.keystream(key_a, 1000)
    assert prg.keystream(key_a, 1000) != prg.keystream(key_b, 1000)
    # Reading in pieces gives the same stream as reading at once.
    stream = prg.Keystream(key_a)
    pieces = b"".join(stream.read(size) for size in (1, 15, 300, prg.BLOCK_BYTES + 7))
    assert pieces == prg.keystream(key_a, len(pieces))


def test_short_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        prg.Keystream(bytes(16))


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("size", [1, 1000, prg.BLOCK_BYTES // 4 + 3, 3 * prg.BLOCK_BYTES // 8 + 1])
def test_apply_masks_adds_and_subtracts_the_streams_modulo_2k(dtype: type, size: int) -> None:
    key_a, key_b = bytes([7]) * 32, bytes([9]) * 32
    base: np.ndarray = np.arange(size, dtype=dtype)
    accumulator = base.copy()
    prg.apply_masks(accumulator, [(key_a, 1), (key_b, -1)])
    expected = base + prg.words(key_a, size, dtype) - prg.words(key_b, size, dtype)
    np.testing.assert_array_equal(accumulator, expected)
    prg.apply_masks(accumulator, [(key_b, 1), (key_a, -1)])
    np.testing.assert_array_equal(accumulator, base)


# Mask sets as a party builds them: its self mask (always added) and one pairwise stream per
# neighbour, added towards larger ids and subtracted towards smaller ones; the last set masks
# with one key both ways, which must cancel exactly.
NEIGHBOUR_SETS = {
    "no masks": [],
    "self mask only": [(bytes([1]) * 32, 1)],
    "one neighbour each way": [(bytes([1]) * 32, 1), (bytes([2]) * 32, 1), (bytes([3]) * 32, -1)],
    "six neighbours": [(bytes([1]) * 32, 1)] + [(bytes([10 + peer]) * 32, (-1) ** peer) for peer in range(6)],
    "cancelling pair": [(bytes([4]) * 32, 1), (bytes([4]) * 32, -1), (bytes([5]) * 32, -1)],
}


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("blocks", [0, 1, 2])
@pytest.mark.parametrize("neighbours", sorted(NEIGHBOUR_SETS))
def test_apply_masks_equals_the_sum_of_the_streams_in_exact_integers(
    dtype: type, blocks: int, neighbours: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The blocked, in-place masking loop against the definition, in unbounded integers.

    Every party and the server must derive bit-identical masks, so the reference takes
    nothing from apply_masks' blocking or numpy's wraparound: each stream is read whole and
    summed as Python integers, reduced modulo 2^bits once at the end. Lengths end one word
    past whole blocks, so every block boundary and the partial last block are covered. The
    blocks are made small (4 KiB) so that the reference stays quick; the loop is the same.
    """
    monkeypatch.setattr(prg, "BLOCK_BYTES", 4096)
    masks = NEIGHBOUR_SETS[neighbours]
    word_bytes = np.dtype(dtype).itemsize
    size = blocks * (prg.BLOCK_BYTES // word_bytes) + 1
    base = np.random.default_rng(blocks).integers(0, np.iinfo(dtype).max, size=size, dtype=dtype, endpoint=True)
    expected = base.astype(object)
    for key, sign in masks:
        stream = prg.keystream(key, size * word_bytes)
        words = [int.from_bytes(stream[i : i + word_bytes], "little") for i in range(0, len(stream), word_bytes)]
        expected = expected + sign * np.array(words, dtype=object)
    accumulator = base.copy()
    prg.apply_masks(accumulator, masks)
    assert accumulator.tolist() == (expected % (1 << (8 * word_bytes))).tolist()


def test_apply_masks_refuses_unsuitable_accumulators() -> None:
    with pytest.raises(ValueError):
        prg.apply_masks(np.zeros(4, dtype=np.float64), [])
    with pytest.raises(ValueError):
        prg.apply_masks(np.zeros(4, dtype=np.uint8), [])
    with pytest.raises(ValueError):
        prg.apply_masks(np.zeros(4, dtype=np.uint32), [(bytes(32), 2)])


def test_pair_keys_agree_at_both_ends_and_are_independent_across_pairs() -> None:
    private = {party: keys.generate_key_pair() for party in (1, 2, 3)}
    public = {party: keys.public_bytes(key) for party, key in private.items()}

    def pair_key(me: int, peer: int) -> bytes:
        return keys.pair_mask_key(keys.agree(private[me], public[peer]), SESSION, me, peer)

    assert pair_key(1, 2) == pair_key(2, 1)
    pair_keys = {pair_key(1, 2), pair_key(1, 3), pair_key(2, 3)}
    assert len(pair_keys) == 3
    assert keys.pair_mask_key(keys.agree(private[1], public[2]), bytes(32), 1, 2) != pair_key(1, 2)  # another session
    streams = [prg.words(key, 1 << 14, np.uint32) for key in sorted(pair_keys)]
    # Joint distribution of the top 4 bits of two streams: independent streams give a
    # contingency table a chi-square test cannot tell from independence.
    for first, second in [(0, 1), (0, 2), (1, 2)]:
        table = np.zeros((16, 16))
        np.add.at(table, (streams[first] >> 28, streams[second] >> 28), 1)
        assert stats.chi2_contingency(table).pvalue > 1e-6


def test_apply_masks_leaves_an_empty_accumulator_empty() -> None:
    accumulator = np.zeros(0, dtype=np.uint64)
    prg.apply_masks(accumulator, [(bytes([3]) * 32, 1)])
    assert accumulator.size == 0
