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

import heapq
import math
from dataclasses import dataclass

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.privacy import rounding
from fedfair.secagg import kernels, prg, rotation

_WORD = np.dtype(np.uint64).newbyteorder("<")

_BLOCK_WORDS = 1 << 17
"""64-bit words drawn per cipher call (1 MiB, the encoder's block of random bytes)."""

_MAX_MU = 2.0**50
"""Largest mu a single draw takes: PTRS computes mu + (a few sqrt(mu)) in float64, which stays exact
in integers up to 2^53; larger noise is far beyond any use (a 64-bit word holds 2^63)."""


def check_mu(mu: float) -> float:
    """``mu`` as a float, once it is a usable Poisson/Skellam parameter (finite, 0 <= mu <= 2^50).

    Raises:
        ConfigError: naming the fix, for any other ``mu``.
    """
    if not (isinstance(mu, (int, float)) and math.isfinite(mu) and 0.0 <= mu <= _MAX_MU):
        raise ConfigError(
            f"the noise parameter mu={mu!r} must be a finite number from 0 to 2^50; "
            "lower the noise or the fractional bits"
        )
    return float(mu)


class PoissonSampler:
    """Independent Poisson(mu) samples drawn in order from one keystream, in pieces of any size.

    The stream is read in fixed blocks of :data:`_BLOCK_WORDS` words and a block's unread words carry over
    to the next piece, so the samples depend on mu and the stream alone, never on how many are asked for
    at a time: an encoder may noise a vector chunk by chunk and get the words it would get in one piece.

    Raises:
        ConfigError: ``mu`` is unusable (:func:`check_mu`).
    """

    def __init__(self, mu: float, stream: prg.Keystream) -> None:
        self._mu = check_mu(mu)
        self._stream = stream
        self._words = np.empty(_BLOCK_WORDS, dtype=_WORD)
        self._next = self._words.size
        """Index of the first unread word of the current block."""

    def fill(self, out: np.ndarray) -> None:
        """Overwrite the contiguous 1-D int64 array ``out`` with the next ``out.size`` samples."""
        if out.dtype != np.int64 or out.ndim != 1 or not out.flags.c_contiguous:
            raise ConfigError("Poisson samples go into a contiguous 1-D int64 array")
        if self._mu == 0.0:
            out[:] = 0
            return
        fill = kernels.poisson_fill()
        index = 0
        while index < out.size:
            # An attempt takes one word (inversion) or two (PTRS): a block with one word left is done.
            if self._next >= self._words.size - 1:
                self._stream.read_into(self._words.data.cast("B"))
                self._next = 0
            index, used = fill(self._mu, self._words[self._next :], out, index)
            self._next += used


def poisson_into(out: np.ndarray, mu: float, stream: prg.Keystream) -> None:
    """Overwrite the int64 array ``out`` with independent Poisson(mu) samples drawn from ``stream``.

    The samples depend only on mu and the words read from ``stream`` (so a keyed stream reproduces
    them); the stream is advanced by whole blocks (:class:`PoissonSampler`).

    Raises:
        ConfigError: ``mu`` is unusable (:func:`check_mu`), or ``out`` is not a contiguous 1-D int64 array.
    """
    PoissonSampler(mu, stream).fill(out)


def skellam_into(out: np.ndarray, mu: float, stream: prg.Keystream) -> None:
    """Overwrite the int64 array ``out`` with independent Skellam(mu) samples drawn from ``stream``.

    Skellam(mu) = Poisson(mu) - Poisson(mu): mean 0, variance 2 mu. ``out`` must be as
    :func:`poisson_into` requires.
    """
    sampler = PoissonSampler(mu, stream)
    sampler.fill(out)
    other = np.empty_like(out)
    sampler.fill(other)
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


@dataclass(frozen=True)
class NoiseConfig:
    """Distributed DP inside the secure sum: how a party noises its encoded vector.

    mu: this party's Skellam share per coordinate, in encoded units (2^-f); the decoded sum of the
        honest survivors carries their total (:func:`fedfair.privacy.distributed.party_mu`).
    norm_clip: L2 bound of a party's unweighted update; the weighted vector is projected onto the ball
        of radius :meth:`radius` (after the per-coordinate clip), which is 1-Lipschitz, so one
        record's L2 sensitivity is kept, and gives the public norm the conditional rounding and the
        modular range are checked against.
    dimension: d, the length of the update (the encoding has m + 1 words, m = d, or the next power of
        two with rotation).
    rotation_key: the 32-byte key of the round's rotation (:func:`fedfair.secagg.rotation.rotation_key`),
        or None for no rotation.
    beta: the conditional rounding redraws while the rounded norm exceeds
        :func:`~fedfair.privacy.rounding.rounded_l2` at this beta (so with probability <= beta).
    failure: the largest probability the encoder accepts that some coordinate of a sum wraps modulo
        2^k or leaves the range :meth:`NoisyEncoding.error_bound` states.
    weight_per_record: r = w_k / b_k of DP-SGD updates, whose radius is then a Poisson batch's clipped sum
        (:meth:`radius`); None for a radius linear in the weight.
    """

    mu: float
    norm_clip: float
    dimension: int
    rotation_key: bytes | None = None
    beta: float = 1e-18
    failure: float = 2.0**-40
    weight_per_record: float | None = None

    def __post_init__(self) -> None:
        check_mu(self.mu)
        if not (math.isfinite(self.norm_clip) and self.norm_clip > 0):
            raise ConfigError(f"norm_clip={self.norm_clip!r} must be a positive finite L2 bound")
        if self.dimension < 1:
            raise ConfigError(f"dimension={self.dimension} must be at least 1")
        if self.rotation_key is not None and len(self.rotation_key) != prg.KEY_BYTES:
            raise ConfigError(f"the rotation key must be {prg.KEY_BYTES} bytes; derive it with rotation_key()")
        if not (0.0 < self.beta < 1.0 and 0.0 < self.failure < 1.0):
            raise ConfigError(f"beta={self.beta!r} and failure={self.failure!r} must be probabilities in (0, 1)")
        if self.weight_per_record is not None and not (
            math.isfinite(self.weight_per_record) and self.weight_per_record > 0
        ):
            raise ConfigError(f"weight_per_record={self.weight_per_record!r} must be a positive w_k / b_k")

    def radius(self, weight: float) -> float:
        """The L2 radius a party of ``weight`` is projected onto.

        ``norm_clip * weight``; with ``weight_per_record`` r (DP-SGD updates, ``norm_clip`` then one record's
        move at weight r), the clipped sum of a Poisson batch of weight / r expected records:
        norm_clip r :func:`~fedfair.privacy.rounding.batch_radius` (weight / r).
        """
        r = self.weight_per_record
        if r is None or weight == 0:
            return self.norm_clip * weight
        return self.norm_clip * r * rounding.batch_radius(weight / r)

    def radii(self, parties: int, max_weight: float, weights: tuple[float, ...] = ()) -> list[float]:
        """Bounds on the :meth:`radius` of each of ``parties`` parties, largest first.

        The radius at ``max_weight`` for each, or with agreed ``weights`` the ``parties`` largest of theirs.
        """
        agreed = heapq.nlargest(parties, (self.radius(weight) for weight in weights))
        return agreed + [self.radius(max_weight)] * (parties - len(agreed))

    @property
    def encoded_dimension(self) -> int:
        """m: the coordinates of the noised vector (d, or d padded to a power of two when rotating)."""
        return rotation.padded_dimension(self.dimension) if self.rotation_key is not None else self.dimension


def noised_wrap_probability(noise: NoiseConfig, norms: list[float], modulus_bits: int) -> float:
    """A bound on the probability that a noised sum of ``len(norms)`` inputs wraps modulo 2^k.

    ``norms`` bounds each party's norm in encoded units (:meth:`NoiseConfig.radii` times 2^f). Rotated, the
    signal of each coordinate is bounded in probability (:func:`~fedfair.privacy.rounding.rotated_wrap_probability`,
    which counts only their sum); without a rotation every coordinate may hold every party's whole rounded norm
    (:func:`~fedfair.privacy.rounding.wrap_probability`). Either way 1 when a norm reaches 2^52, beyond what
    float64 rounds exactly.
    """
    size, parties = noise.encoded_dimension, len(norms)
    rounded = [rounding.rounded_l2(norm, size, noise.beta) for norm in norms]
    if max(rounded) >= 2.0**52:
        return 1.0
    if noise.rotation_key is None:
        return rounding.wrap_probability(parties * noise.mu, sum(rounded), modulus_bits, size)
    return rounding.rotated_wrap_probability(parties * noise.mu, sum(norms) / parties, parties, modulus_bits, size)


CHUNK = 1 << 17
"""Coordinates :meth:`NoisyEncoding.encode_into` rounds and noises per pass: its temporaries (a few MiB) are
this long, whatever the model's size."""

_ROUNDING_STREAM, _POSITIVE_STREAM, _NEGATIVE_STREAM, WEIGHT_STREAM = 0, 1, 2, 3
"""The streams of an encoding's key (:class:`fedfair.secagg.prg.Keystream`): the rounding uniforms, the two
Poissons of each Skellam sample, and the weight's rounding."""

_MAX_REDRAWS = 64
"""Conditional rounding gives up after this many draws (each fails with probability <= beta)."""

_UNIT = 2.0**-53


class NoisyEncoding:
    """The noise step of :class:`fedfair.secagg.encode.Encoder` for one configuration.

    Clip, project, rotate, scale, round conditionally, add Skellam noise; and the inverse after the sum is
    decoded.

    Contract: :meth:`encode_into` writes the party's m words modulo 2^k; a sum of at most ``parties`` of them wraps modulo 2^k, or has a coordinate beyond
    :meth:`noise_bound`, with probability at most ``noise.failure`` (checked when built).
    """

    def __init__(
        self,
        noise: NoiseConfig,
        clip: float,
        max_weight: float,
        fractional_bits: int,
        modulus_bits: int,
        parties: int,
        weights: tuple[float, ...] = (),
    ) -> None:
        self.noise = noise
        self.clip = clip
        self.scale = math.ldexp(1.0, fractional_bits)
        self.size = noise.encoded_dimension
        norms = [radius * self.scale for radius in noise.radii(parties, max_weight, weights)]
        wrap = noised_wrap_probability(noise, norms, modulus_bits)
        if wrap > noise.failure:
            raise ConfigError(
                f"the noised sum of {parties} parties wraps modulo 2^{modulus_bits} with probability up to "
                f"{wrap:.3g} > failure={noise.failure:g}; lower mu or fractional_bits, or use modulus_bits=64"
            )
        self.parties = parties

    def encode_into(self, vector: np.ndarray, weight: float, key: bytes, out: np.ndarray, chunk: int = CHUNK) -> None:
        """Encode the weighted ``vector`` (d float32 or float64 values) into ``out``: m words modulo 2^k.

        Clip each coordinate to clip * weight, project onto the L2 ball of :meth:`NoiseConfig.radius`, rotate,
        scale by 2^f (all in one float64 copy of m values), then ``chunk`` coordinates at a time: round
        stochastically until the rounded norm is within the bound (uniforms from stream 0 of ``key``) and add
        Skellam(mu) noise (its two Poissons from streams 1 and 2). ``out`` (m contiguous unsigned words) takes
        each chunk's words as it is made, so no other vector of m values is held.

        Every stream is read in order whatever ``chunk`` is, so the words are the same for every chunk size
        (the rounded norm sums its chunks' squares in float64 in another order, which could only decide a
        draw within rounding of the bound, an event far less likely than beta).
        """
        if vector.size != self.noise.dimension:
            raise ConfigError(
                f"the update has {vector.size} coordinates but the noise was configured for "
                f"{self.noise.dimension}; set NoiseConfig.dimension to the update's length"
            )
        if chunk < 1:
            raise ConfigError(f"chunk={chunk} must be a positive number of coordinates")
        if not np.isfinite(vector).all():
            raise ConfigError("the update has NaN or infinite coordinates; fix the local training step")
        values = np.zeros(self.size)  # the padding stays zero through clipping and projection
        np.clip(vector, -self.clip * weight, self.clip * weight, out=values[: vector.size])
        radius = self.noise.radius(weight)
        length = float(np.linalg.norm(values))
        if length > radius:
            values *= radius / length
        if self.noise.rotation_key is not None:
            rotation.rotate_in_place(values, self.noise.rotation_key)
        values *= self.scale
        bound = rounding.rounded_l2(radius * self.scale, self.size, self.noise.beta)
        uniforms = np.empty(min(chunk, self.size), dtype=_WORD)
        rounder = prg.Keystream(key, _ROUNDING_STREAM)
        for _ in range(_MAX_REDRAWS):
            squares = 0.0
            for start in range(0, self.size, chunk):
                piece = values[start : start + chunk]
                drawn = uniforms[: piece.size]
                rounder.read_into(drawn.data.cast("B"))
                rounded = np.floor(piece + (drawn >> np.uint64(11)).astype(np.float64) * _UNIT)
                squares += float(np.dot(rounded, rounded))
                # int64 to the word type keeps the low k bits: the two's complement modulo 2^k.
                out[start : start + piece.size] = rounded.astype(np.int64).astype(out.dtype)
            if math.sqrt(squares) <= bound:
                break
        else:
            raise ConfigError(
                f"conditional rounding failed {_MAX_REDRAWS} times in a row, which happens with probability "
                f"below beta^{_MAX_REDRAWS}; the norm bound is wrong: report this"
            )
        positive = PoissonSampler(self.noise.mu, prg.Keystream(key, _POSITIVE_STREAM))
        negative = PoissonSampler(self.noise.mu, prg.Keystream(key, _NEGATIVE_STREAM))
        plus, minus = np.empty(uniforms.size, dtype=np.int64), np.empty(uniforms.size, dtype=np.int64)
        for start in range(0, self.size, chunk):
            words = out[start : start + chunk]
            positive.fill(plus[: words.size])
            negative.fill(minus[: words.size])
            np.subtract(plus[: words.size], minus[: words.size], out=plus[: words.size])
            words += plus[: words.size].astype(out.dtype)  # unsigned words wrap: addition modulo 2^k

    def decode(self, values: np.ndarray) -> np.ndarray:
        """The decoded sum's m real coordinates (signed sum / 2^f) back to the d coordinates of the update.

        The float64 ``values`` are unrotated in place (the result may be a view of them).
        """
        key = self.noise.rotation_key
        return rotation.unrotate(values, key, self.noise.dimension, in_place=True) if key is not None else values

    def noise_bound(self, summands: int) -> float:
        """A bound t (real units) on every decoded coordinate's noise and rounding error.

        Rounding moves each party's coordinate by less than one unit before the inverse rotation (less than
        sqrt(m) after it, whose rows have m entries of 1/sqrt(m)); the noise, Skellam(summands mu) per rotated
        coordinate, becomes a combination with coefficients +-1/sqrt(m), whose tail is Skellam's at (summands mu
        m, t sqrt(m)). t is the least (found by bisection) whose union bound over the d coordinates is at most
        ``noise.failure``.
        """
        spread = math.sqrt(self.size) if self.noise.rotation_key is not None else 1.0
        rounding_error = summands * spread
        mu = summands * self.noise.mu * spread * spread

        def failure(units: float) -> float:
            return 2.0 * self.noise.dimension * rounding.skellam_tail(mu, units * spread)

        high = 1.0
        while failure(high) > self.noise.failure:
            high *= 2.0
        low = 0.0
        for _ in range(60):
            middle = (low + high) / 2.0
            low, high = (middle, high) if failure(middle) > self.noise.failure else (low, middle)
        return (rounding_error + high) / self.scale

    def noise_std(self, summands: int) -> float:
        """The standard deviation of each decoded coordinate's noise: sqrt(2 summands mu) / 2^f.

        The inverse rotation is orthogonal, so it keeps each coordinate's variance.
        """
        return math.sqrt(2.0 * summands * self.noise.mu) / self.scale
