"""A random rotation every party and the aggregator agree on: the randomised Walsh-Hadamard transform.

Before rounding and noise, distributed DP rotates each party's vector by R = H D / sqrt(m): D a
diagonal of random signs, H the m x m Walsh-Hadamard matrix (m the dimension padded to a power of
two). R is orthogonal, so L2 norms are unchanged, while any fixed vector's energy is spread evenly
over the coordinates, which keeps the rounding inflation and the modular range small (Kairouz, Liu
and Steinke 2021). The decoder applies R^-1 = D H / sqrt(m), then drops the padding. The signs come
from an AES-CTR keystream keyed by :func:`rotation_key` from public round data: the rotation needs
agreement, not secrecy.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.privacy.distributed import padded_dimension
from fedfair.secagg import kernels, prg

__all__ = ["hadamard", "padded_dimension", "rotate", "rotation_key", "signs", "unrotate"]

_DOMAIN = b"fedfair rotation v1"


def rotation_key(federation_id: str, round_number: int, purpose: str) -> bytes:
    """The 32-byte key of a round's rotation.

    SHA-256 over a domain tag, the federation, the round and the purpose (e.g. "training", "evaluation"), each
    length-prefixed so distinct inputs never collide.
    """
    digest = hashlib.sha256(_DOMAIN)
    for part in (federation_id.encode(), str(round_number).encode(), purpose.encode()):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.digest()


_SIGN_CHUNK = 1 << 16
"""Signs applied per pass by :func:`_apply_signs` (one keystream byte and a float64 factor each)."""


def signs(key: bytes, size: int) -> np.ndarray:
    """The diagonal D: ``size`` float64 values +-1, bit 0 of each byte of the keystream of ``key``."""
    bits = np.frombuffer(prg.keystream(key, size), dtype=np.uint8) & 1
    return 1.0 - 2.0 * bits.astype(np.float64)


def _apply_signs(values: np.ndarray, key: bytes) -> None:
    """Multiply the float64 ``values`` by D (:func:`signs`) in place, a chunk of the keystream at a time."""
    stream = prg.Keystream(key)
    buffer = np.empty(min(values.size, _SIGN_CHUNK), dtype=np.uint8)
    for start in range(0, values.size, _SIGN_CHUNK):
        piece = values[start : start + _SIGN_CHUNK]
        bits = buffer[: piece.size]
        stream.read_into(bits.data.cast("B"))
        bits &= 1
        piece *= 1.0 - 2.0 * bits


def _check_power_of_two(size: int) -> None:
    if size < 1 or size & (size - 1):
        raise ConfigError(f"the Walsh-Hadamard transform needs a power-of-two length, got {size}")


def _hadamard_in_place(values: np.ndarray) -> None:
    kernels.hadamard()(values)
    values *= 1.0 / np.sqrt(values.size)


def hadamard(vector: np.ndarray) -> np.ndarray:
    """The normalised fast Walsh-Hadamard transform H x / sqrt(m), as a new float64 array of length m.

    m log2(m) additions (compiled, :func:`fedfair.secagg.kernels.hadamard`); H / sqrt(m) is
    orthogonal and its own inverse.

    Raises:
        ConfigError: the length m of ``vector`` is not a power of two.
    """
    _check_power_of_two(vector.size)
    out = np.array(vector, dtype=np.float64, copy=True)
    _hadamard_in_place(out)
    return out


def rotate_in_place(values: np.ndarray, key: bytes) -> None:
    """Overwrite the float64 ``values`` (a power-of-two length m, zero-padded by the caller) with R values.

    The same bits as :func:`rotate` without a second vector: what the encoder uses on its one float64 copy.
    """
    _check_power_of_two(values.size)
    _apply_signs(values, key)
    _hadamard_in_place(values)


def rotate(vector: np.ndarray, key: bytes) -> np.ndarray:
    """R x = H D x / sqrt(m) of the float64 ``vector``, zero-padded to m = :func:`padded_dimension`."""
    vector = np.asarray(vector, dtype=np.float64)
    if vector.ndim != 1:
        raise ConfigError(f"only a 1-D vector can be rotated, got shape {vector.shape}; flatten it first")
    padded = np.zeros(padded_dimension(vector.size))
    padded[: vector.size] = vector
    rotate_in_place(padded, key)
    return padded


def unrotate(rotated: np.ndarray, key: bytes, dimension: int, *, in_place: bool = False) -> np.ndarray:
    """R^-1 y = D H y / sqrt(m), the first ``dimension`` coordinates.

    Undoes :func:`rotate` (up to float64 rounding, about log2(m) ulps of the norm per coordinate) and, applied
    to a sum of rotated vectors, gives the sum of the originals. With ``in_place`` a float64 ``rotated`` is
    overwritten and the result is a view of it (the decoder's own copy of the sum need not be copied again).
    """
    rotated = np.asarray(rotated, dtype=np.float64)
    if rotated.ndim != 1 or rotated.size != padded_dimension(dimension):
        raise ConfigError(
            f"a rotated vector of dimension {dimension} has {padded_dimension(dimension)} coordinates, "
            f"got shape {rotated.shape}"
        )
    values = rotated if in_place else rotated.copy()
    _hadamard_in_place(values)
    _apply_signs(values, key)
    return values[:dimension]
