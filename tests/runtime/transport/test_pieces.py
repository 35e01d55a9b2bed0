"""A payload in pieces travels as its joined bytes would: the same chunks, at every size and chunk size."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.runtime.contract import TRAINING
from fedfair.runtime.transport import join, split
from fedfair.runtime.transport.chunks import payload_size, plain_upload, read_plain_upload

PIECES = st.lists(st.binary(max_size=40), max_size=6).map(tuple)


CUTS = st.tuples(st.sampled_from(["tiny", "one below", "one above", "below one chunk"]), st.integers(1, 5))
"""How a chunk size relates to a payload's size (see :func:`chunk_size`)."""


def chunk_size(total: int, cut: tuple[str, int]) -> int:
    """A chunk size for a `total`-byte payload: a few bytes, one byte either side of a `total` / k, or past `total`."""
    kind, k = cut
    share = -(-total // k)
    return {"tiny": k, "one below": max(1, share - 1), "one above": share + 1, "below one chunk": total + k}[kind]


@given(PIECES, CUTS)
def test_pieces_are_cut_into_the_chunks_of_their_concatenation(pieces: tuple[bytes, ...], cut: tuple[str, int]) -> None:
    joined = b"".join(pieces)
    chunk_bytes = chunk_size(len(joined), cut)
    streamed = list(split(pieces, chunk_bytes))
    assert streamed == list(split(joined, chunk_bytes))
    assert payload_size(pieces) == len(joined)
    assert join(streamed, max_total_bytes=len(joined), max_chunk_bytes=chunk_bytes) == joined


@given(st.integers(1, 400), st.integers(1, 4), CUTS)
@settings(max_examples=60, deadline=None)
def test_a_plain_sum_of_chunked_uploads_is_bit_equal_to_the_unchunked_one(
    dimension: int, parties: int, cut: tuple[str, int]
) -> None:
    rng = np.random.default_rng(dimension * 7 + parties)
    uploads = [
        b"".join(plain_upload(rng.normal(size=dimension), float(party + 1), TRAINING.plain_values))
        for party in range(parties)
    ]
    chunk_bytes = chunk_size(len(uploads[0]), cut)
    whole = np.zeros(dimension, dtype=np.float64)
    chunked = np.zeros(dimension, dtype=np.float64)
    for upload in uploads:
        arrived = join(split(upload, chunk_bytes), max_total_bytes=len(upload), max_chunk_bytes=chunk_bytes)
        whole += read_plain_upload(upload, TRAINING.plain_values)[0]
        chunked += read_plain_upload(arrived, TRAINING.plain_values)[0]
    assert whole.tobytes() == chunked.tobytes()
