"""Integer noise for distributed differential privacy: Poisson and Skellam samples from a keystream.

Skellam(mu) is Poisson(mu) - Poisson(mu) for two independent Poissons: mean 0, variance 2 mu, and a
sum of independent Skellam(mu_i) is Skellam(sum mu_i). That closure is why every party can add its
own share of the noise inside the secure sum and the decoded total still has a known law
(Agarwal, Kairouz and Liu 2021).

Randomness: every uniform comes from an AES-256-CTR keystream (:class:`fedfair.secagg.prg.Keystream`)
read as little-endian 64-bit words, never from numpy's RNG; a party keys it with fresh OS entropy, so
nobody else can regenerate and subtract its noise. The samplers are compiled
(:func:`fedfair.secagg.kernels.poisson_fill`): inversion below mu = 10, Hormann's PTRS above.
"""

from __future__ import annotations

import math

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.secagg import kernels, prg

_WORD = np.dtype(np.uint64).newbyteorder("<")

_BLOCK_WORDS = 1 << 17
"""64-bit words drawn per cipher call (1 MiB, the encoder's block of random bytes)."""

_MAX_MU = 2.0**50
"""Largest mu a single draw takes: PTRS computes mu + (a few sqrt(mu)) in float64, which stays exact
in integers up to 2^53; larger noise is far beyond any use (a 64-bit word holds 2^63)."""


def check_mu(mu: float) -> float:
    """Return ``mu`` as a float if it is a usable Poisson/Skellam parameter (finite, 0 <= mu <= 2^50),
    else raise :class:`ConfigError` naming the fix."""
    if not (isinstance(mu, (int, float)) and math.isfinite(mu) and 0.0 <= mu <= _MAX_MU):
        raise ConfigError(
            f"the noise parameter mu={mu!r} must be a finite number from 0 to 2^50; "
            "lower the noise or the fractional bits"
        )
    return float(mu)


def poisson_into(out: np.ndarray, mu: float, stream: prg.Keystream) -> None:
    """Overwrite the int64 array ``out`` with independent Poisson(mu) samples drawn from ``stream``.

    Contract: ``out`` is a contiguous 1-D int64 array; the samples depend only on mu and the words
    read from ``stream`` (so a keyed stream reproduces them); the stream is advanced by whole blocks.
    """
    mu = check_mu(mu)
    if out.dtype != np.int64 or out.ndim != 1 or not out.flags.c_contiguous:
        raise ConfigError("Poisson samples go into a contiguous 1-D int64 array")
    if mu == 0.0:
        out[:] = 0
        return
    fill = kernels.poisson_fill()
    # Inversion takes one word per sample, PTRS about 2.2; draw a little more than that at once.
    per_sample = 1.0 if mu < 10.0 else 2.4
    index = 0
    while index < out.size:
        count = min(_BLOCK_WORDS, max(64, math.ceil((out.size - index) * per_sample)))
        words = np.empty(count, dtype=_WORD)
        stream.read_into(words.data.cast("B"))
        index, _ = fill(mu, words, out, index)


def skellam_into(out: np.ndarray, mu: float, stream: prg.Keystream) -> None:
    """Overwrite the int64 array ``out`` with independent Skellam(mu) = Poisson(mu) - Poisson(mu)
    samples drawn from ``stream`` (mean 0, variance 2 mu)."""
    poisson_into(out, mu, stream)
    other = np.empty_like(out)
    poisson_into(other, mu, stream)
    out -= other


def skellam(mu: float, count: int, key: bytes) -> np.ndarray:
    """``count`` independent Skellam(mu) samples (int64) from the keystream of the 32-byte ``key``."""
    out = np.empty(count, dtype=np.int64)
    skellam_into(out, mu, prg.Keystream(key))
    return out


def poisson(mu: float, count: int, key: bytes) -> np.ndarray:
    """``count`` independent Poisson(mu) samples (int64) from the keystream of the 32-byte ``key``."""
    out = np.empty(count, dtype=np.int64)
    poisson_into(out, mu, prg.Keystream(key))
    return out
