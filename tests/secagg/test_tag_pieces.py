"""Tagging an input read back a piece at a time: the challenge's dots of the pieces, and a round that verifies."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import VerificationError
from fedfair.pki.identity import public_key_bytes
from fedfair.secagg.client import PLAIN_PIECE, Client
from fedfair.secagg.verify import BLOCK, Challenge
from fedfair.secagg.verify_messages import TagSet
from tests.secagg.helpers import Harness, make_config

SESSION = b"s" * 32


def in_pieces(words: np.ndarray, span: int) -> Iterator[np.ndarray]:
    return (words[start : start + span] for start in range(0, words.size, span))


@settings(max_examples=12, deadline=None)
@given(
    blocks=st.integers(0, 3),
    extra=st.integers(1, BLOCK - 1),
    per_piece=st.integers(1, 3),
    dtype=st.sampled_from([np.uint16, np.uint32, np.uint64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_dots_of_whole_blocks_in_pieces_are_the_dots_of_the_whole_words(
    blocks: int, extra: int, per_piece: int, dtype: type[np.unsignedinteger], seed: int
) -> None:
    """Sizes that are not a whole number of blocks, every word type (64-bit words read as two halves)."""
    words = np.random.default_rng(seed).integers(0, 2**64, blocks * BLOCK + extra, dtype=np.uint64).astype(dtype)
    challenge = Challenge(SESSION, b"d" * 32, words.size)
    assert challenge.dots(in_pieces(words, per_piece * BLOCK)) == challenge.dots(words)


def test_pieces_off_the_block_grid_or_short_of_the_words_are_refused() -> None:
    words = np.arange(2 * BLOCK + 3, dtype=np.uint32)
    challenge = Challenge(SESSION, b"d" * 32, words.size)
    for pieces in (in_pieces(words, BLOCK - 1), iter([words[:BLOCK]]), iter([words, words[:1]])):
        with pytest.raises(ValueError, match="pieces of whole blocks"):
            challenge.dots(pieces)


@pytest.mark.parametrize("modulus_bits", [16, 64])
def test_parties_that_hand_their_words_down_tag_as_those_that_kept_a_copy_with_a_dropout(modulus_bits: int) -> None:
    """Parties 1 and 2 keep no copy at MASK: their caller hands their words to ``tag``, more than one piece each."""
    config = replace(make_config(4, modulus_bits=modulus_bits), dimension=PLAIN_PIECE + 2 * BLOCK + 6)
    harness = Harness(config, verified=True)
    handed = (1, 2)
    for party in handed:
        key = harness.key(party)
        harness.clients[party] = Client(config, config.name_of(party), key, public_key_bytes(key), harness.verify)
    survivors = (1, 2, 3)
    harness.unmask(harness.through_consistency(list(survivors)))
    harness.server.finish()
    claim = harness.server.claim()
    pieces = {party: list(in_pieces(harness.encoded[party], PLAIN_PIECE)) for party in handed}
    assert all(len(kept) == 2 for kept in pieces.values())
    tags = tuple(harness.clients[party].tag(claim, pieces.get(party)) for party in survivors)
    expected = sum((harness.encoded[party] for party in survivors), np.zeros_like(harness.encoded[1]))
    for party in survivors:
        np.testing.assert_array_equal(harness.clients[party].verify(TagSet(claim.header, tags)), expected)


def test_a_party_that_kept_no_copy_and_is_handed_none_cannot_tag() -> None:
    config = make_config(3)
    harness = Harness(config, verified=True)
    key = harness.key(1)
    harness.clients[1] = Client(config, config.name_of(1), key, public_key_bytes(key), harness.verify)
    harness.unmask(harness.through_consistency([1, 2, 3]))
    harness.server.finish()
    with pytest.raises(VerificationError, match="MALFORMED|input"):
        harness.clients[1].tag(harness.server.claim())
