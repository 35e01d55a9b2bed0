"""The noised encoding chunk by chunk: the same words for every chunk size, and so the same secure sums."""

from __future__ import annotations

import os

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.secagg import DropOut, SecAggConfig, prg, simulate_round
from fedfair.secagg.encode import Encoder, EncodingConfig
from fedfair.secagg.noise import PoissonSampler, NoiseConfig, NoisyEncoding
from fedfair.secagg.rotation import rotation_key
from fedfair.secagg.wire import Stage

CLIP, MAX_WEIGHT, FRACTIONAL_BITS = 1.0, 4.0, 6


def encoding(dimension: int, bits: int, rotate: bool) -> EncodingConfig:
    key = rotation_key("federation", 1, "training") if rotate else None
    noise = NoiseConfig(mu=20.0, norm_clip=2.0, dimension=dimension, rotation_key=key)
    return EncodingConfig(CLIP, MAX_WEIGHT, FRACTIONAL_BITS, bits, noise=noise)


def chunked(
    config: EncodingConfig, parties: int, vector: np.ndarray, weight: float, key: bytes, chunk: int
) -> np.ndarray:
    """The encoding of (vector, weight) under `key`, its noised words made `chunk` coordinates at a time."""
    encoder = Encoder(config, parties)
    assert config.noise is not None
    noisy = NoisyEncoding(config.noise, CLIP, MAX_WEIGHT, FRACTIONAL_BITS, config.modulus_bits, parties)
    words = encoder.encode(vector, weight, key)  # the weight's word, and the reference for the rest
    noisy.encode_into(vector, weight, key, words[:-1], chunk)
    return words


@settings(max_examples=25, deadline=None)
@given(
    dimension=st.integers(1, 700),
    chunk=st.integers(1, 1100),
    bits=st.sampled_from([16, 32, 64]),
    rotate=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_chunk_size_gives_the_same_words(dimension: int, chunk: int, bits: int, rotate: bool, seed: int) -> None:
    config = encoding(dimension, bits, rotate)
    rng = np.random.default_rng(seed)
    vector = rng.normal(scale=0.05, size=dimension).astype(rng.choice([np.float32, np.float64]))
    key = os.urandom(prg.KEY_BYTES)
    whole = Encoder(config, 3).encode(vector, 3.0, key)
    assert np.array_equal(chunked(config, 3, vector, 3.0, key, chunk), whole)
    # The default pass is one chunk here (dimension < CHUNK), so this also pins it to the one-piece words.
    assert np.array_equal(chunked(config, 3, vector, 3.0, key, whole.size), whole)


@settings(max_examples=6, deadline=None)
@given(
    chunk=st.integers(1, 300),
    dropped=st.sets(st.integers(1, 5), max_size=2),
    stage=st.sampled_from([Stage.MASK, Stage.CONSISTENCY]),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_secure_sum_of_chunked_encodings_is_the_one_piece_sum_bit_for_bit(
    chunk: int, dropped: set[int], stage: Stage, seed: int
) -> None:
    """Survivors (or, dropped after masking, every masker) summed modulo 2^16 as if each had encoded in one piece."""
    parties, dimension = 5, 200
    config = encoding(dimension, 16, rotate=True)
    secagg = SecAggConfig(
        "federation",
        1,
        tuple(f"p{index}" for index in range(parties)),
        dimension=Encoder(config, parties).encoded_dimension(dimension),
        encoding=config,
        threshold=3,
    )
    rng = np.random.default_rng(seed)
    vectors = {party: rng.normal(scale=0.05, size=dimension) for party in range(1, parties + 1)}
    keys = {party: os.urandom(prg.KEY_BYTES) for party in vectors}
    trace = simulate_round(
        secagg,
        lambda party: chunked(config, parties, vectors[party], 3.0, keys[party], chunk),
        DropOut({stage: dropped}),
    )
    summed = set(trace.result.contributors)
    assert summed == set(vectors) - (dropped if stage is Stage.MASK else set())
    encoder = Encoder(config, parties)
    expected = np.zeros(secagg.dimension + 1, dtype=np.uint16)
    for party in summed:
        expected += encoder.encode(vectors[party], 3.0, keys[party])
    assert np.array_equal(trace.result.encoded_sum, expected)
    assert np.array_equal(trace.result.decoded.weighted_sum, encoder.decode(expected, len(summed)).weighted_sum)


@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=6), mu=st.sampled_from([0.5, 40.0]))
@settings(max_examples=20, deadline=None)
def test_poisson_samples_do_not_depend_on_how_they_are_asked_for(sizes: list[int], mu: float) -> None:
    key = os.urandom(prg.KEY_BYTES)
    pieces = PoissonSampler(mu, prg.Keystream(key))
    parts = []
    for size in sizes:
        part = np.empty(size, dtype=np.int64)
        pieces.fill(part)
        parts.append(part)
    whole = np.empty(sum(sizes), dtype=np.int64)
    PoissonSampler(mu, prg.Keystream(key)).fill(whole)
    assert np.array_equal(np.concatenate(parts), whole)


def test_the_streams_of_one_key_are_disjoint_stretches_of_its_keystream() -> None:
    key = os.urandom(prg.KEY_BYTES)
    streams = [prg.Keystream(key, index).read(64) for index in range(4)]
    assert len(set(streams)) == 4
    assert streams[0] == prg.keystream(key, 64)
