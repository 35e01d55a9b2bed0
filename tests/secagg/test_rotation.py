"""The randomised Walsh-Hadamard rotation: orthogonal, exactly inverted, agreed from public data."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedfair.core.errors import ConfigError
from fedfair.secagg import rotation

EPS = np.finfo(np.float64).eps


def float_error(size: int, norm: float) -> float:
    """Float64 rounding of log2(m) butterfly stages, a scaling and the signs: a few ulps of the norm
    per stage, or of the smallest subnormal where the values are that small."""
    return float(4.0 * (np.log2(size) + 2.0) * (EPS * norm + 2.0**-1074))


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.integers(1, 700), elements=st.floats(-1e6, 1e6)))
def test_rotation_preserves_the_norm_and_its_inverse_is_exact(vector: np.ndarray) -> None:
    key = os.urandom(32)
    rotated = rotation.rotate(vector, key)
    size = rotation.padded_dimension(vector.size)
    largest = float(np.max(np.abs(vector)))
    # Scaled first: the squares of tiny coordinates underflow in np.linalg.norm.
    norm = largest * float(np.linalg.norm(vector / largest)) if largest > 0 else 0.0
    assert rotated.size == size and size >= vector.size and size < 2 * vector.size + 1
    rotated_norm = largest * float(np.linalg.norm(rotated / largest)) if largest > 0 else 0.0
    assert abs(rotated_norm - norm) <= float_error(size, norm) * np.sqrt(size)
    back = rotation.unrotate(rotated, key, vector.size)
    assert np.max(np.abs(back - vector), initial=0.0) <= float_error(size, norm)


def test_the_rotation_is_the_matrix_h_d_over_root_m() -> None:
    key = os.urandom(32)
    size = 8
    hadamard = np.array([[1.0]])
    while hadamard.shape[0] < size:
        hadamard = np.block([[hadamard, hadamard], [hadamard, -hadamard]])
    matrix = hadamard @ np.diag(rotation.signs(key, size)) / np.sqrt(size)
    vector = np.arange(1.0, 6.0)
    padded = np.concatenate([vector, np.zeros(size - vector.size)])
    assert np.allclose(rotation.rotate(vector, key), matrix @ padded, rtol=0, atol=1e-13)


def test_a_sum_of_rotated_vectors_unrotates_to_the_sum() -> None:
    key = rotation.rotation_key("federation", 3, "training")
    vectors = [np.random.default_rng(seed).normal(size=1000) for seed in range(5)]
    total = np.sum([rotation.rotate(vector, key) for vector in vectors], axis=0)
    assert np.allclose(rotation.unrotate(total, key, 1000), sum(vectors), rtol=0, atol=1e-12)


def test_rotation_spreads_a_spike_evenly() -> None:
    spike = np.zeros(1 << 12)
    spike[17] = 1.0
    rotated = rotation.rotate(spike, os.urandom(32))
    assert np.allclose(np.abs(rotated), 1.0 / 64.0, rtol=0, atol=1e-15)


def test_rotation_keys_bind_every_public_input() -> None:
    keys = {
        rotation.rotation_key("fed", 1, "training"),
        rotation.rotation_key("fed", 2, "training"),
        rotation.rotation_key("fed", 1, "evaluation"),
        rotation.rotation_key("fed1", 1, "training"),
        rotation.rotation_key("fe", 11, "training"),
    }
    assert len(keys) == 5
    assert rotation.rotation_key("fed", 1, "training") == rotation.rotation_key("fed", 1, "training")


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ConfigError, match="power-of-two"):
        rotation.hadamard(np.ones(3))
    with pytest.raises(ConfigError, match="1-D"):
        rotation.rotate(np.ones((2, 2)), os.urandom(32))
    with pytest.raises(ConfigError, match="8 coordinates"):
        rotation.unrotate(np.ones(4), os.urandom(32), 5)
