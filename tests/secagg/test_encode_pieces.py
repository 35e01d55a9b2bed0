"""Encoding a weighted update a piece at a time: the same words, masked inputs, sums and tags as encoding it whole."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ConfigError
from fedfair.core.update import Update, WeightedVector
from fedfair.secagg import encode, rotation
from fedfair.secagg.encode import Encoder, EncodingConfig
from fedfair.secagg.noise import NoiseConfig
from fedfair.secagg.pieces import Blocks
from fedfair.secagg.verify_messages import TagSet
from tests.secagg.helpers import CLIP, MAX_WEIGHT, Harness, make_config

SPAN = 7
"""Coordinates the encoder reads at a time in these tests: most sizes drawn are not multiples of it."""


def drawn_update(data: st.DataObject, dimension: int, *, drift: bool, wide: bool) -> Update:
    """An update of `dimension` parameters whose weighted coordinates mostly lie within the clip, some beyond it."""
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    generator = torch.Generator().manual_seed(seed)
    dtype = torch.float64 if wide else torch.float32
    delta = 0.6 * CLIP * torch.randn(dimension, generator=generator, dtype=dtype)
    control = 0.3 * CLIP * torch.randn(dimension + 1, generator=generator, dtype=torch.float64) if drift else None
    weight = data.draw(st.floats(0.5, MAX_WEIGHT), label="weight")
    return Update(
        delta=delta, delta_c=data.draw(st.floats(-CLIP, CLIP), label="delta_c"), weight=weight, control=control
    )


def sent_form(update: Update) -> WeightedVector:
    """The vector as a site sends it: in float32 for a float32 model without drift correction, else float64."""
    compact = update.delta.dtype == torch.float32 and update.control is None
    return WeightedVector(update, torch.float32 if compact else torch.float64)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), dimension=st.integers(1, 40), drift=st.booleans(), wide=st.booleans(), noised=st.booleans())
def test_the_pieces_encode_to_the_words_of_the_whole_vector(
    data: st.DataObject, dimension: int, drift: bool, wide: bool, noised: bool
) -> None:
    """With and without the noise step (which gathers the pieces, as its rotation mixes every coordinate)."""
    update = drawn_update(data, dimension, drift=drift, wide=wide)
    weighted = sent_form(update)
    config = EncodingConfig(CLIP, MAX_WEIGHT, fractional_bits=16, modulus_bits=32)
    if noised:
        key = rotation.rotation_key("federation", 1, "training")
        step = NoiseConfig(mu=100.0, norm_clip=2.0, dimension=weighted.size, rotation_key=key)
        config = EncodingConfig(CLIP, MAX_WEIGHT, 16, 64, noise=step)
    encoder = Encoder(config, parties=3)
    key = data.draw(st.binary(min_size=32, max_size=32), label="key")
    whole = update.weighted_vector(weighted.dtype).numpy()
    assert np.array_equal(np.asarray(weighted), whole)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(encode, "_BLOCK", SPAN)
        sliced = encoder.encode(weighted, update.weight, key)
        blocks = encoder.encode(whole, update.weight, key)
    assert sliced.tobytes() == blocks.tobytes() == encoder.encode(whole, update.weight, key).tobytes()


@settings(max_examples=15, deadline=None)
@given(data=st.data(), dimension=st.integers(1, 30), drift=st.booleans(), wide=st.booleans())
def test_a_verified_round_of_sliced_encodings_sums_and_tags_as_the_whole_ones_with_dropouts(
    data: st.DataObject, dimension: int, drift: bool, wide: bool
) -> None:
    """Every party masks its sliced encoding; one drops before masking: the claimed sum is the survivors' whole
    encodings summed word for word, and every survivor's tags check it."""
    updates = {party: drawn_update(data, dimension, drift=drift, wide=wide) for party in range(1, 5)}
    length = sent_form(updates[1]).size
    harness = Harness(replace(make_config(4), dimension=length), verified=True)
    encoder = harness.config.encoder
    keys = {party: bytes([party]) * 32 for party in updates}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(encode, "_BLOCK", SPAN)
        harness.encoded = {
            party: encoder.encode(sent_form(update), update.weight, keys[party]) for party, update in updates.items()
        }
    whole = {
        party: encoder.encode(update.weighted_vector(sent_form(update).dtype).numpy(), update.weight, keys[party])
        for party, update in updates.items()
    }
    assert all(harness.encoded[party].tobytes() == whole[party].tobytes() for party in updates)
    dropped = data.draw(st.integers(1, 4), label="dropped")
    survivors = tuple(party for party in updates if party != dropped)
    request = harness.through_consistency(list(survivors))
    harness.unmask(request)
    harness.server.finish()
    claim = harness.server.claim()
    expected = sum((whole[party] for party in survivors), np.zeros_like(whole[1]))
    np.testing.assert_array_equal(claim.vector, expected)
    tags = tuple(harness.clients[party].tag(claim) for party in survivors)
    for party in survivors:
        np.testing.assert_array_equal(harness.clients[party].verify(TagSet(claim.header, tags)), expected)


def test_pieces_that_do_not_hold_the_values_they_announce_are_refused() -> None:
    encoder = Encoder(EncodingConfig(CLIP, MAX_WEIGHT, fractional_bits=16), parties=3)

    class Short(Blocks):
        @property
        def size(self) -> int:
            return self.vector.size + 1

    class Long(Blocks):
        @property
        def size(self) -> int:
            return self.vector.size - 1

    for pieces in (Short(np.zeros(5)), Long(np.zeros(5)), Blocks(np.zeros(5, dtype=np.int64))):
        with pytest.raises(ConfigError, match="pieces"):
            encoder.encode(pieces, 1.0)
