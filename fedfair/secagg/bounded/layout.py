"""The circuit's sizes for one (dimension, bound), and the soundness they give.

A party's input x (d integers in the encoded scale) is shared with a witness: the m bits of the slack
B^2 - ||x||^2 and, for each of k range tests, the bits of <z_j, x> + T, z_j in {-1, 0, 1}^d drawn from the
hash of x's shares. The tests keep ||x||^2, computed in F_p, from wrapping: a field element that squares
to a small residue is not a small vector. :attr:`Layout.pass_probability` bounds one test's chance of
passing an input that could wrap (1/2 per coordinate beyond 2T; Paley-Zygmund when 4 d T^2 >= p); an
honest input fails a test w.p. below 2 exp(-TAU^2 / 2), and its prover then redraws, so completeness is
exact. The argument is in docs/security.md ("Bounded inputs (two verifiers)").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from fractions import Fraction

from fedfair.core.errors import ConfigError
from fedfair.secagg.bounded.field import FOLD, P

TAU = 10
"""T >= TAU B: an honest test fails with probability 2 exp(-50) < 2^-71, and the prover then redraws."""

TEST_SECURITY_BITS = 64
"""The range tests' soundness per attempt: a report with ||x||^2 >= L passes all k tests w.p. <= 2^-64."""

QUERIES = 2
"""Random points at which the gadget polynomial is checked: each fails w.p. <= 2 (N - 1) / (p - 2N) < 2^-43."""

DEFAULT_POINTS = 256
"""N: interpolation points of the wire polynomials (QUERIES wire seeds, then N - QUERIES gadget calls).

The prover's cost is about 2 N multiplications per wire value (extending N values to 2N - 1 points), a
verifier's message about 4 d / (N - 2) elements, the proof 2N - 1 polynomial values. 256 keeps a message near
1.6% of the input (64 kept it near 6.3%: the record, two messages per site, was then 42-65% of a site's
download at d = 10^5) for 384 more proof elements up (3 KB) and a prover about twice as slow, still near 0.05 s
at d = 10^5. The gadget identity's error grows with N: (2 (N - 1) / (p - 2N))^QUERIES < 2^-86, far below the
range tests' 2^-64 (:attr:`Layout.soundness_error`)."""


def squared_bound(update_norm: float, weight: float, fractional_bits: int) -> int:
    """B^2 in the encoded scale: floor((update_norm weight 2^f)^2), computed exactly from the floats."""
    if not (math.isfinite(update_norm) and update_norm > 0 and math.isfinite(weight) and weight > 0):
        raise ConfigError(f"update_norm={update_norm!r} and weight={weight!r} must be positive and finite")
    scaled = Fraction(update_norm) * Fraction(weight) * (1 << fractional_bits)
    return math.floor(scaled * scaled)


def largest_dimension(bound_sq: int) -> int:
    """The most coordinates a :class:`Layout` holds at squared bound `bound_sq` (0: the bound fits at none).

    The bound's own limit: the slack's 2^m and 2 T^2 below p (Paley-Zygmund's theta < 1). Then the projections
    <z_j, x> + T must not wrap: 4 d T < p (the per-coordinate route, 4 d T^2 below p - 2^m, is stricter in d).
    """
    offset = _test_offset(bound_sq)
    wrap = P - (1 << bound_sq.bit_length())
    if wrap <= 0 or 2 * offset * offset >= wrap:
        return 0
    return (P - 1) // (4 * offset)


def _test_offset(bound_sq: int) -> int:
    """T, a power of two at least TAU B."""
    return 1 << math.ceil(math.log2(TAU * math.isqrt(bound_sq) + TAU + 1))


@dataclass(frozen=True)
class Layout:
    """The shapes both verifiers and the prover agree on for one (d, B^2): the plan fixes them.

    dimension: d, coordinates of x.
    bound_sq: B^2, the largest squared norm accepted (encoded scale).
    points: N, interpolation points of each wire polynomial.
    """

    dimension: int
    bound_sq: int
    points: int = DEFAULT_POINTS

    def __post_init__(self) -> None:
        if self.dimension < 1:
            raise ConfigError(f"dimension={self.dimension} must be at least 1")
        if self.bound_sq < 1:
            raise ConfigError(f"bound_sq={self.bound_sq} must be at least 1: raise the bound or fractional_bits")
        if self.points < QUERIES + 1:
            raise ConfigError(f"points={self.points} must be at least {QUERIES + 1}")
        if self.pass_probability < 1:
            return
        largest = largest_dimension(self.bound_sq)
        if largest == 0:
            raise ConfigError(
                f"a squared bound of 2^{math.log2(self.bound_sq):.1f} leaves the range tests no room below "
                f"p = 2^52 - {FOLD} (it must stay below about 2^43); lower fractional_bits or update_norm"
            )
        raise ConfigError(
            f"a model of dimension {self.dimension:,} at a squared bound of 2^{math.log2(self.bound_sq):.1f} is too "
            f"large for the range tests: their projections need 4 d T < p = 2^52 - {FOLD} (T = "
            f"2^{self.test_bits - 1}), so at most {largest:,} coordinates fit at this bound; use fewer fractional "
            "bits, a smaller update_norm (each bit or halving of the bound doubles the coordinates that fit), or a "
            "smaller model"
        )

    @property
    def norm_bits(self) -> int:
        """m: bits of the slack B^2 - ||x||^2, which lies in [0, B^2]."""
        return self.bound_sq.bit_length()

    @property
    def test_offset(self) -> int:
        """T, a power of two at least TAU B: a test proves <z_j, x> + T in [0, 2T)."""
        return _test_offset(self.bound_sq)

    @property
    def test_bits(self) -> int:
        """Bits of <z_j, x> + T."""
        return self.test_offset.bit_length()

    @cached_property
    def pass_probability(self) -> float:
        """q: an upper bound on the chance that one test passes an input whose squared norm could wrap."""
        offset = self.test_offset
        wrap = P - (1 << self.norm_bits)  # L: ||x||^2 + slack < p whenever ||x||^2 < L
        if wrap <= 0:  # the slack alone may reach p: no squared norm is safe from wrapping
            return 1.0
        if 4 * self.dimension * offset * offset < wrap:
            return 0.5
        theta = 2 * offset * offset / wrap
        if theta >= 1 or 4 * self.dimension * offset >= P:
            return 1.0
        return max(0.5, 1 - (1 - theta) ** 2 / 3)

    @cached_property
    def tests(self) -> int:
        """k: range tests that bring a wrapping input's chance of passing below 2^-TEST_SECURITY_BITS."""
        return math.ceil(TEST_SECURITY_BITS / -math.log2(self.pass_probability))

    @property
    def witness_bits(self) -> int:
        """Bits in the witness: the slack's, then each test's."""
        return self.norm_bits + self.tests * self.test_bits

    @property
    def input_length(self) -> int:
        """Elements of a shared input: x, then the witness bits."""
        return self.dimension + self.witness_bits

    @property
    def calls(self) -> int:
        """M = N - QUERIES gadget calls, each one point of the wire polynomials (the first QUERIES hold seeds)."""
        return self.points - QUERIES

    @cached_property
    def chunk(self) -> int:
        """c: products per gadget call, the least with x's calls and two of the bits' blocks within M calls."""
        chunk = max(1, -(-(self.dimension + 2 * self.witness_bits) // self.calls))
        while self.square_calls_for(chunk) + 2 * self.bit_calls_for(chunk) > self.calls:
            chunk += 1
        return chunk

    def square_calls_for(self, chunk: int) -> int:
        """Calls that hold x's squares at ``chunk`` products a call."""
        return -(-self.dimension // chunk)

    def bit_calls_for(self, chunk: int) -> int:
        """Calls that hold one weighted copy of the bit checks at ``chunk`` products a call."""
        return -(-self.witness_bits // chunk)

    @property
    def wire_seeds(self) -> int:
        """Elements of a proof's wire seeds: QUERIES for each of 2c wires (each share expands from a seed)."""
        return 2 * QUERIES * self.chunk

    @property
    def polynomial_values(self) -> int:
        """Elements of the gadget polynomial in a proof: its values at the 2N - 1 points 0 to 2N - 2."""
        return 2 * self.points - 1

    @property
    def proof_length(self) -> int:
        """Elements of a proof: its wire seeds, then the gadget polynomial's values."""
        return self.wire_seeds + self.polynomial_values

    @property
    def outputs(self) -> int:
        """Circuit outputs, each zero for a valid input: the norm equation, two bit checks, k tests."""
        return 3 + self.tests

    @property
    def soundness_error(self) -> float:
        """Chance that one attempt at a report with ||x||^2 > B^2 is accepted (union of the parts).

        Range tests 2^-64 (joint randomness), two independent bit checks 1/p^2 (joint randomness), the
        gadget identity at QUERIES points (the verifiers' query seed) (2(N - 1) / (p - 2N))^QUERIES each.
        """
        identity = (2 * (self.points - 1) / (P - 2 * self.points)) ** QUERIES
        return self.pass_probability**self.tests + 1 / P**2 + identity
