"""Fixed-point encoding of weighted updates into integers modulo 2^k.

A party's input is ``weight * delta`` (each coordinate of ``delta`` clipped to ``[-clip, clip]``)
plus the weight as one extra coordinate, times 2^f, stochastically rounded and stored in two's
complement modulo 2^k; the server decodes the sums and divides. :func:`check_no_wraparound`
refuses configurations whose worst case could wrap, so the only error left is rounding: below
``n * 2^-f`` per coordinate of a sum of n inputs. Why the rounding draws AES keystream words, and
how the encoder walks the vector, is in docs/design.md ("Inside secure aggregation").
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.privacy.rounding import largest_total
from fedfair.secagg import prg
from fedfair.secagg.noise import WEIGHT_STREAM, NoiseConfig, NoisyEncoding
from fedfair.secagg.pieces import FLOATS, Blocks, Pieces, gathered, placed
from fedfair.secagg.rounder import RANDOM_BITS, StochasticRounder

Weights = tuple[float, ...]
"""Every party's agreed weight, or () when the plan does not fix them (:attr:`EncodingConfig.weights`)."""

MODULUS_BITS = (16, 32, 64)
"""Supported word sizes k: 16 bits a coordinate on the wire where the plan's range fits, 32 or 64 where it does not."""

_WORD_TYPES: dict[int, tuple[type[np.unsignedinteger], type[np.signedinteger]]] = {
    16: (np.uint16, np.int16),
    32: (np.uint32, np.int32),
    64: (np.uint64, np.int64),
}
"""The unsigned word and its signed view, by k."""

_FLOAT_EXACT_BITS = 52
"""A scaled per-party value must stay below 2^52 so float64 holds its integer part and
at least one fractional bit exactly; beyond that rounding would not be unbiased. It also
leaves at least 10 bits of int64 room below a unit for the integer rounding."""

_MAX_FRACTIONAL_BITS = 128
"""Keeps 2^f a normal float64 with room to spare; finer steps have no use."""

_INT64_BITS = 63
"""Magnitude bits of an int64: a scaled value plus its random offset must stay below 2^63."""

_BLOCK = 1 << 18
"""Coordinates encoded per step: a cipher call and a kernel call. The cipher gives the GIL up on
every call (see ``prg.BLOCK_BYTES``), so few calls keep encoding off the convoy of threads
waiting to get it back (2^16-coordinate blocks were markedly slower among threads, 2^20 no
faster than 2^18); 2^18 keeps the block's random words (1 MiB) in the last-level cache until the
kernel reads them."""


@dataclass(frozen=True)
class EncodingConfig:
    """How inputs are quantised.

    clip: largest absolute value of one coordinate of the *unweighted* update delta.
    max_weight: largest weight a party may send.
    fractional_bits: f, the number of binary digits kept after the point.
    modulus_bits: k, the word size of the masked vector (16, 32 or 64).
    noise: distributed DP (:class:`fedfair.secagg.noise.NoiseConfig`): each party rotates, rounds and
        noises its vector, so the decoded sum carries Skellam noise; None (the default) for exact sums.
    weights: every party's agreed weight, when the plan fixes them (declared sizes): a sum's range is then
        bounded by the largest of them that one sum can hold, not by parties times max_weight; () when not agreed.
    """

    clip: float
    max_weight: float
    fractional_bits: int
    modulus_bits: int = 32
    noise: NoiseConfig | None = None
    weights: Weights = ()

    def __post_init__(self) -> None:
        # A tuple whatever came in (a JSON round trip gives a list), so that equal configurations compare equal.
        object.__setattr__(self, "weights", tuple(float(weight) for weight in self.weights))

    def to_document(self) -> dict[str, Any]:
        """This configuration as JSON values (a noise rotation key in hex), as :meth:`of_document` reads it."""
        document = asdict(self)
        noise = document["noise"]
        if noise is not None and noise["rotation_key"] is not None:
            noise["rotation_key"] = noise["rotation_key"].hex()
        return document

    @classmethod
    def of_document(cls, document: dict[str, Any]) -> EncodingConfig:
        """The configuration :meth:`to_document` wrote (KeyError, TypeError, ValueError: not one it wrote)."""
        document = dict(document)
        noise = document.pop("noise", None)
        if noise is not None:
            noise = dict(noise)
            key = noise.pop("rotation_key", None)
            noise = NoiseConfig(**noise, rotation_key=None if key is None else bytes.fromhex(str(key)))
        return cls(**document, noise=noise)


@dataclass(frozen=True)
class Decoded:
    """A decoded secure sum.

    weighted_sum: sum over parties of clip(weight * delta), float64.
    total_weight: sum of the weights.
    error_bound: bound on the absolute error of every coordinate of ``weighted_sum``
        and of ``total_weight``, relative to the exact sums of the clipped inputs; with noise, a
        bound that holds except with probability ``NoiseConfig.failure``.
    clip: the clip range, which bounds every coordinate of the true weighted mean.
    noise_std: the standard deviation of the noise in each coordinate of ``weighted_sum`` (0 without).
    """

    weighted_sum: np.ndarray
    total_weight: float
    error_bound: float
    clip: float
    noise_std: float = 0.0

    def mean(self) -> np.ndarray:
        """The weighted mean update ``weighted_sum / total_weight``."""
        if self.total_weight <= 0:
            raise ConfigError("the total weight is not positive, so there is no mean; give parties positive weights")
        return self.weighted_sum / self.total_weight

    def mean_error_bound(self) -> float:
        """Bound on every coordinate's error in :meth:`mean`.

        With S' = S + e_S and W' = W + e_W (|e_S|, |e_W| <= b):
        S'/W' - S/W = (e_S - (S/W) e_W) / W', and |S/W| <= clip, so the error is at
        most b (1 + clip) / W'.
        """
        if self.total_weight <= 0:
            raise ConfigError("the total weight is not positive, so there is no mean; give parties positive weights")
        return self.error_bound * (1.0 + self.clip) / self.total_weight


def largest_safe_fractional_bits(
    clip: float, modulus_bits: int, parties: int, max_weight: float, weights: Weights = ()
) -> int:
    """The largest f that :func:`check_no_wraparound` accepts, or -1 if none does."""
    _check_knobs(clip, 0, modulus_bits, parties, max_weight)
    f = min(_MAX_FRACTIONAL_BITS, _FLOAT_EXACT_BITS - math.floor(math.log2(_magnitude(clip, max_weight))))
    while f >= 0 and not _fits(clip, f, modulus_bits, parties, max_weight, weights=weights):
        f -= 1
    return f


def check_no_wraparound(
    clip: float,
    fractional_bits: int,
    modulus_bits: int,
    parties: int,
    max_weight: float,
    weights: Weights = (),
) -> None:
    """Refuse a configuration whose worst-case sum could wrap around modulo 2^k.

    Each party contributes at most :func:`largest_party_value` in absolute value per
    coordinate (at its agreed weight, with ``weights``); the sum of ``parties`` of them
    (the largest, with ``weights``) must stay below 2^(k-1) to be read back as a signed integer.

    Raises:
        ConfigError: naming the knob to change, when the sum could wrap (or a knob is out of range).
    """
    _check_knobs(clip, fractional_bits, modulus_bits, parties, max_weight)
    if _fits(clip, fractional_bits, modulus_bits, parties, max_weight, weights=weights):
        return
    best = largest_safe_fractional_bits(clip, modulus_bits, parties, max_weight, weights)
    fix = f"lower fractional_bits to at most {best}" if best >= 0 else "lower clip or max_weight"
    if modulus_bits < 64:
        fix += " or set modulus_bits=64"
    raise ConfigError(
        f"the sum of {parties} inputs with clip={clip:g}, max_weight={max_weight:g}, fractional_bits={fractional_bits} "
        f"could wrap around modulo 2^{modulus_bits} or exceed float64 precision; {fix}"
    )


def largest_party_value(clip: float, fractional_bits: int, max_weight: float) -> int:
    """Largest absolute encoded value one party can produce in one coordinate.

    The weighted coordinates are at most ``clip * max_weight`` and the weight coordinate
    at most ``max_weight``, times 2^f, rounded up; one unit of slack covers float
    rounding in ``clip * weight``.
    """
    return math.ceil(math.ldexp(_magnitude(clip, max_weight), fractional_bits)) + 1


def _magnitude(clip: float, max_weight: float) -> float:
    return max(clip, 1.0) * max_weight


def _fits(
    clip: float, fractional_bits: int, modulus_bits: int, parties: int, max_weight: float, *, weights: Weights
) -> bool:
    if math.ldexp(_magnitude(clip, max_weight), fractional_bits) > 2.0**_FLOAT_EXACT_BITS:
        return False
    # Exact integer arithmetic: float rounding must not decide a wraparound check.
    most = parties * largest_party_value(clip, fractional_bits, max_weight)
    if weights:  # agreed weights: the parties largest of them, if less
        values = (largest_party_value(clip, fractional_bits, weight) for weight in weights)
        most = min(most, int(largest_total(values, parties)))
    return most < 1 << (modulus_bits - 1)


def weight_fractional_bits(config: EncodingConfig, parties: int) -> int:
    """The weight coordinate's fractional bits: the most, up to f, at which a sum of ``parties`` weights fits.

    F without noise (the range check covers the weight). Noised coordinates fit by their rotated norm, so at 2^f
    the weight word would bind first (3 sites of batch 875 in 16-bit words: f <= 3).

    Raises:
        ConfigError: not even whole units of weight fit the words.
    """
    bits = config.fractional_bits
    while bits >= 0 and not _fits(1.0, bits, config.modulus_bits, parties, config.max_weight, weights=config.weights):
        bits -= 1
    if bits < 0:
        raise ConfigError(
            f"a sum of {parties} weights up to max_weight={config.max_weight:g} does not fit 2^{config.modulus_bits} "
            "words; agree the weights in the plan, lower max_weight or raise modulus_bits"
        )
    return bits


def _check_knobs(clip: float, fractional_bits: int, modulus_bits: int, parties: int, max_weight: float) -> None:
    if modulus_bits not in MODULUS_BITS:
        raise ConfigError(f"modulus_bits={modulus_bits} is not supported; use 16, 32 or 64")
    if (
        not isinstance(fractional_bits, int)
        or isinstance(fractional_bits, bool)
        or not 0 <= fractional_bits <= _MAX_FRACTIONAL_BITS
    ):
        raise ConfigError(f"fractional_bits={fractional_bits!r} must be an integer from 0 to {_MAX_FRACTIONAL_BITS}")
    if not (math.isfinite(clip) and clip > 0):
        raise ConfigError(f"clip={clip!r} must be a positive finite number")
    if not (math.isfinite(max_weight) and max_weight > 0):
        raise ConfigError(f"max_weight={max_weight!r} must be a positive finite number")
    if parties < 1:
        raise ConfigError(f"parties={parties} must be at least 1")


class Encoder:
    """Encodes one party's weighted update and decodes a sum of up to ``parties`` of them."""

    def __init__(self, config: EncodingConfig, parties: int) -> None:
        self._noisy: NoisyEncoding | None = None
        if not all(0.0 < weight <= config.max_weight for weight in config.weights):
            raise ConfigError(f"agreed weights must be in (0, max_weight = {config.max_weight:g}]; raise max_weight")
        if config.noise is None:
            check_no_wraparound(
                config.clip, config.fractional_bits, config.modulus_bits, parties, config.max_weight, config.weights
            )
        else:
            knobs = (config.clip, config.max_weight, config.fractional_bits, config.modulus_bits, parties)
            self._noisy = NoisyEncoding(config.noise, *knobs, config.weights)
        # The weight coordinate's own scale (f without noise); the noised ones have their own range check.
        self.weight_bits = weight_fractional_bits(config, parties)
        self.config = config
        self.parties = parties
        self.dtype: type[np.unsignedinteger]
        self._signed: type[np.signedinteger]
        self.dtype, self._signed = _WORD_TYPES[config.modulus_bits]
        self._scale = math.ldexp(1.0, config.fractional_bits)
        largest = largest_party_value(config.clip, config.fractional_bits, config.max_weight)
        # Every scaled value is at most `largest` units, so with (largest + 1) 2^K <= 2^63 the
        # value times 2^K plus a K-bit random offset fits int64. A 32-bit modulus keeps
        # largest < 2^31, hence K = 32; a 64-bit one may reach 2^52 + 1 (the float64 limit
        # check_no_wraparound enforces), which still leaves K >= 10. A 16-bit one keeps K = 32.
        self.rounding_bits = min(RANDOM_BITS, _INT64_BITS - largest.bit_length())
        """K: bits kept below one unit before stochastic rounding; the rounding bias is below 2^-K units."""

    def encoded_dimension(self, dimension: int) -> int:
        """The coordinates an update of ``dimension`` coordinates takes in an encoding (its words less the weight's).

        D, or with rotation d padded to a power of two. A secure-aggregation round's dimension.
        """
        if self._noisy is not None and dimension != self._noisy.noise.dimension:
            raise ConfigError(
                f"the noise was configured for updates of {self._noisy.noise.dimension} coordinates, not {dimension}"
            )
        return self._noisy.size if self._noisy is not None else dimension

    def encode(
        self,
        weighted_vector: np.ndarray | Pieces,
        weight: float,
        randomness_key: bytes | None = None,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Encode ``weighted_vector`` (= weight * delta) and ``weight`` as d + 1 words mod 2^k.

        A float32 or float64 vector is read as it is, block by block (a float32 model's update is not
        copied into float64 first: each value widens exactly as it is rounded); any other type is
        converted to float64. :class:`Pieces` are read a piece at a time, in order, and give the same words
        as their values whole (the rounding's random words follow the coordinates, not the pieces); only a
        noised encoding, whose rotation mixes every coordinate, gathers them into one vector first.

        ``randomness_key`` (32 bytes) fixes the stochastic rounding for reproducible runs;
        by default a fresh key is drawn from the OS.

        ``out`` (d + 1 contiguous, writable words of :attr:`dtype`), when given, receives the
        encoding and is returned. A party that encodes every round can hand in the same buffer:
        its words then land in memory the process already holds, whereas a new array can come
        as fresh pages the kernel must fault in one by one, which on a virtual machine can cost
        more than the encoding itself. If encoding fails (a NaN), ``out`` holds unspecified words.
        """
        vector: np.ndarray | None = None
        if isinstance(weighted_vector, Pieces):
            sliced: Pieces = weighted_vector
        else:
            vector = np.asarray(weighted_vector)
            if vector.dtype not in FLOATS:
                vector = vector.astype(np.float64)
            if vector.ndim != 1:
                raise ConfigError(f"the update must be a 1-D vector, got shape {vector.shape}; flatten it first")
            sliced = Blocks(vector)
        size = sliced.size
        if not (math.isfinite(weight) and 0 <= weight <= self.config.max_weight):
            raise ConfigError(
                f"weight={weight!r} is outside [0, max_weight={self.config.max_weight:g}]; "
                "raise max_weight in the encoding config"
            )
        words = self.encoded_dimension(size) + 1
        if out is None:
            encoded = np.empty(words, dtype=self.dtype)
        else:
            wrong = [
                what
                for what, failed in (
                    (f"of shape {out.shape}", out.shape != (words,)),
                    (f"of {out.dtype.name}", out.dtype != self.dtype),
                    ("not contiguous", not out.flags.c_contiguous),
                    ("read-only", not out.flags.writeable),
                )
                if failed
            ]
            if wrong:
                raise ConfigError(
                    f"the output buffer must be {words} contiguous, writable {np.dtype(self.dtype).name} "
                    f"words (the encoded dimension plus one), but it is {', '.join(wrong)}; allocate it with "
                    "numpy.empty(encoder.encoded_dimension(d) + 1, dtype=encoder.dtype)"
                )
            encoded = out
        if self._noisy is not None:
            whole = vector if vector is not None else gathered(sliced, _BLOCK)
            return self._encode_noised(whole, weight, randomness_key or os.urandom(prg.KEY_BYTES), encoded)
        # Every encoded value is below 2^(k-1) in magnitude (check_no_wraparound), so the
        # signed view takes it directly and its bits are the two's complement modulo 2^k.
        signed = encoded.view(self._signed)
        rounder = StochasticRounder(
            randomness_key or os.urandom(prg.KEY_BYTES),
            min(encoded.size, _BLOCK),
            self.config.fractional_bits,
            self.rounding_bits,
        )
        bound = self.config.clip * weight
        for start, piece in placed(sliced, _BLOCK):
            if not rounder.round_into(piece, signed[start : start + piece.size], bound):
                raise ConfigError("the update has NaN or infinite coordinates; fix the local training step")
        rounder.round_into(np.array([weight]), signed[-1:], math.inf)
        return encoded

    def _encode_noised(self, vector: np.ndarray, weight: float, key: bytes, encoded: np.ndarray) -> np.ndarray:
        """The noise step (:class:`NoisyEncoding`) for the update, then the weight stochastically rounded.

        The weight is not noised (weights are agreed). Returns `encoded`, filled in place, chunk by chunk.
        """
        assert self._noisy is not None
        self._noisy.encode_into(vector, weight, key, encoded[:-1])
        # The weight (below 2^52 units at its own scale) rounds with 53 random bits of its own stream.
        uniform = int.from_bytes(prg.Keystream(key, WEIGHT_STREAM).read(8), "little") >> 11
        units = math.ldexp(weight, self.weight_bits)
        encoded[-1:].view(self._signed)[0] = math.floor(units + math.ldexp(uniform, -53))
        return encoded

    def decode(self, encoded_sum: np.ndarray, summands: int) -> Decoded:
        """Decode a sum of ``summands`` encoded inputs into the weighted sum and total weight."""
        if not 1 <= summands <= self.parties:
            raise ConfigError(
                f"summands={summands} must be between 1 and {self.parties}, the parties the encoding allows"
            )
        values = self._scaled(encoded_sum)
        if self._noisy is not None:
            rotated = values[:-1]
            # Float64 error of the conversion (half an ulp of the largest value) through the inverse
            # rotation (sqrt(m) of them per coordinate), and of the rotation's own log2(m) stages.
            largest = max(float(rotated.max()), -float(rotated.min()))  # no temporary of m values
            floats = math.sqrt(rotated.size) * largest * 2.0**-53 + 4.0 * (
                math.log2(rotated.size) + 2.0
            ) * 2.0**-52 * float(np.linalg.norm(rotated))
            return Decoded(
                weighted_sum=self._noisy.decode(rotated),
                total_weight=math.ldexp(float(values[-1]), self.config.fractional_bits - self.weight_bits),
                error_bound=self.error_bound(summands) + floats,
                clip=self.config.clip,
                noise_std=self._noisy.noise_std(summands),
            )
        return Decoded(
            weighted_sum=values[:-1],
            total_weight=float(values[-1]),
            error_bound=self.error_bound(summands),
            clip=self.config.clip,
        )

    @property
    def decodes_by_slice(self) -> bool:
        """Whether :meth:`decode_slice` can decode part of a sum: without noise (a rotation mixes every coordinate)."""
        return self._noisy is None

    def decode_slice(self, encoded_sum: np.ndarray, start: int, stop: int) -> np.ndarray:
        """Values [start, stop) of :meth:`decode`'s ``weighted_sum`` of `encoded_sum`, the same bits, alone.

        Raises:
            ConfigError: a noised encoding (:attr:`decodes_by_slice` is False: decode the whole sum), or a span
                outside the sum's coordinates (its words less the weight's).
        """
        if self._noisy is not None:
            raise ConfigError("a noised sum is rotated, so it decodes whole: call decode, not decode_slice")
        if not 0 <= start <= stop < len(encoded_sum):
            raise ConfigError(
                f"[{start}, {stop}) is not within the {len(encoded_sum) - 1} coordinates of the sum; "
                "slice the weighted sum, not its weight"
            )
        return self._scaled(encoded_sum[start:stop])

    def _scaled(self, words: np.ndarray) -> np.ndarray:
        """`words` as signed values over 2^f, float64."""
        values = np.asarray(words, dtype=self.dtype).view(self._signed).astype(np.float64)
        values *= 1.0 / self._scale  # a power of two: exact, and no second vector of d values
        return values

    def error_bound(self, summands: int) -> float:
        """Bound on the absolute error of each decoded coordinate of a sum of ``summands`` inputs.

        Every input's stochastic rounding moves each coordinate by less than one unit
        (2^-f). Converting the signed sum to float64 is exact below 2^53; above, which only
        a 64-bit modulus allows, it adds up to half an ulp of the largest possible sum.
        """
        config = self.config
        if self._noisy is not None:
            return max(self._noisy.noise_bound(summands), math.ldexp(summands, -self.weight_bits))
        largest_sum = summands * largest_party_value(config.clip, config.fractional_bits, config.max_weight)
        conversion = 0.0 if largest_sum <= 2**53 else 2.0 ** (math.ceil(math.log2(largest_sum)) - 53)
        return (summands + conversion) / self._scale
