"""The client's side: encode an update within its bound, share it with a witness, and prove it.

The aggregator (the leader) receives an explicit share of the input and of the proof's polynomial values, a
seed its share of the proof's wire seeds expands from, and a blind; the auditor (the helper) receives a 32-byte
seed from which its shares expand, so its download does not grow with d. The wire seeds need only be uniform
and unknown to each verifier alone, so both shares of them can be pseudorandom: the prover draws the
aggregator's from a seed too, and its part carries 32 bytes where it carried 4 c elements (53 kB at d = 10^5).
Joint randomness comes in two steps (Fiat-Shamir), so that a client cannot choose its input after seeing its
tests: the range tests from the hashes of x's shares, then the bit weights from the hashes of the witness's
shares too. Each hash of the leader's share is keyed by a secret blind: the auditor, who knows its own share,
cannot test guesses of x against it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.secagg.bounded import field, flp
from fedfair.secagg.bounded.layout import Layout

SEED_BYTES = 32
"""Bytes of the auditor's seed, of a blind and of each joint-randomness part."""

REDRAWS = 16
"""Fresh blinds an honest prover may draw when one of its tests would fail (each time w.p. < 2^-64)."""

Witness = Callable[[Layout, np.ndarray, np.ndarray], np.ndarray]
"""``witness(layout, x, projections) -> bits``: the witness from x and its tests' values (both signed)."""


@dataclass(frozen=True)
class Parts:
    """One share's joint-randomness parts: the hash binding its x share, and the one binding its witness share."""

    tests: bytes
    witness: bytes


@dataclass(frozen=True)
class LeaderShare:
    """What the aggregator receives: its input share, its proof share, its blind, and the auditor's parts as claimed.

    inputs: its share of x and the witness bits.
    wire_seed: the seed its share of the proof's wire seeds expands from (:func:`leader_wire_seeds`).
    values: its share of the gadget polynomial's values at 0 to 2N - 2, the rest of the proof.
    """

    inputs: np.ndarray
    wire_seed: bytes
    values: np.ndarray
    blind: bytes
    peer_parts: Parts

    def fits(self, layout: Layout) -> bool:
        """Whether its vectors have ``layout``'s lengths (x and the witness; 2N - 1 polynomial values)."""
        return self.inputs.shape == (layout.input_length,) and self.values.shape == (layout.polynomial_values,)

    def proof(self, layout: Layout) -> np.ndarray:
        """Its whole proof share for ``layout``: the wire seeds' share, expanded, then the polynomial values."""
        return np.concatenate([leader_wire_seeds(layout, self.wire_seed), self.values])

    def wire_bytes(self) -> int:
        """Bytes of the share's payload on the wire (elements at 52 bits, the wire seed, blind and parts)."""
        return field.wire_bytes(self.inputs.size) + field.wire_bytes(self.values.size) + 4 * SEED_BYTES


@dataclass(frozen=True)
class HelperShare:
    """What the auditor receives: the seed its shares expand from, and the aggregator's parts as claimed."""

    seed: bytes
    peer_parts: Parts

    def wire_bytes(self) -> int:
        """Bytes of the share's payload on the wire."""
        return 3 * SEED_BYTES

    def to_bytes(self) -> bytes:
        """Its seed, then the two parts claimed for the aggregator (what the auditor's seal holds)."""
        return self.seed + self.peer_parts.tests + self.peer_parts.witness

    @classmethod
    def from_bytes(cls, data: bytes) -> HelperShare | None:
        """Parse :meth:`to_bytes`; None when ``data`` is not three :data:`SEED_BYTES` strings."""
        if len(data) != 3 * SEED_BYTES:
            return None
        return cls(data[:SEED_BYTES], Parts(data[SEED_BYTES : 2 * SEED_BYTES], data[2 * SEED_BYTES :]))


def encode_within_bound(vector: np.ndarray, bound_sq: int, fractional_bits: int, randomness_key: bytes) -> np.ndarray:
    """Fixed-point integers of ``vector`` 2^f, stochastically rounded, with squared norm at most ``bound_sq``.

    Rounding up can push a vector at its bound just over it; then the coordinates rounded away from zero
    are rounded toward it instead, largest first, until the norm fits (truncation alone fits any vector
    whose exact norm does).

    Raises:
        ConfigError: the vector is not finite, or its norm exceeds the bound even truncated.
    """
    scaled = np.ldexp(np.asarray(vector, dtype=np.float64), fractional_bits)
    if not np.all(np.isfinite(scaled)) or np.max(np.abs(scaled), initial=0.0) >= 2.0**52:
        raise ConfigError("the update is not finite, or too large for its fractional bits; clip it first")
    uniforms = field.random_elements(randomness_key, b"rounding", scaled.size).astype(np.float64) / field.P
    rounded = np.floor(scaled + uniforms).astype(np.int64)
    truncated = np.trunc(scaled).astype(np.int64)
    excess = _squared_norm(rounded) - bound_sq
    if excess > 0:
        saved = rounded * rounded - truncated * truncated
        order = np.argsort(-saved, kind="stable")
        enough = int(np.searchsorted(np.cumsum(saved[order]), excess)) + 1
        rounded[order[:enough]] = truncated[order[:enough]]
    if _squared_norm(rounded) > bound_sq:
        raise ConfigError(
            f"the update's squared norm {_squared_norm(truncated)} exceeds the bound {bound_sq} in the encoded "
            "scale; clip it to the plan's update_norm times its weight"
        )
    return rounded


def honest_witness(layout: Layout, x: np.ndarray, projections: np.ndarray) -> np.ndarray:
    """The witness bits: the slack B^2 - ||x||^2, then <z_j, x> + T per test, little-endian.

    Raises:
        ConfigError: the input is over its bound, or a test value is out of range (a liar's input).
    """
    slack = layout.bound_sq - _squared_norm(x)
    offset = layout.test_offset
    if slack < 0 or np.any(np.abs(projections) >= offset):
        raise ConfigError(f"the input's squared norm exceeds its bound B^2 = {layout.bound_sq}; clip the update")
    values = [slack, *(int(value) + offset for value in projections)]
    widths = [layout.norm_bits] + [layout.test_bits] * layout.tests
    return np.array([(value >> bit) & 1 for value, width in zip(values, widths) for bit in range(width)], np.uint64)


def make_report(
    layout: Layout, inputs: np.ndarray, witness: Witness = honest_witness
) -> tuple[LeaderShare, HelperShare]:
    """Share ``inputs`` (d field elements, :func:`field.from_signed` of the encoded update) and prove it.

    ``witness`` is the honest one but for tests, which hand in a liar's.
    """
    if inputs.shape != (layout.dimension,):
        raise ConfigError(f"the input has shape {inputs.shape}, the layout {layout.dimension} coordinates")
    seed = os.urandom(SEED_BYTES)
    helper_inputs, helper_proof = helper_expansion(layout, seed)
    helper_parts = seed_parts(seed)
    leader_x = field.subtract(inputs, helper_inputs[: layout.dimension])
    x = field.to_signed(inputs)
    for _ in range(REDRAWS):
        blind = os.urandom(SEED_BYTES)
        tests_part = leader_part(blind, b"tests", leader_x)
        trits = field.trit_codes(tests_seed(tests_part, helper_parts.tests), b"trits", layout.tests * layout.dimension)
        projections = field.to_signed(field.signed_projections(inputs, trits, layout.tests))
        if np.all(np.abs(projections) < layout.test_offset):
            break
    bits = witness(layout, x, projections)
    leader_witness = field.subtract(bits, helper_inputs[layout.dimension :])
    parts = Parts(tests_part, leader_part(blind, b"witness", leader_witness))
    bit_weights = joint_bit_weights(layout, parts, helper_parts)
    wire_seed = os.urandom(SEED_BYTES)
    seeds = layout.wire_seeds
    wire_seeds = field.add(leader_wire_seeds(layout, wire_seed), helper_proof[:seeds])
    proof = flp.prove(layout, np.concatenate([inputs, bits]), bit_weights, wire_seeds)
    values = field.subtract(proof[seeds:], helper_proof[seeds:])
    leader = LeaderShare(np.concatenate([leader_x, leader_witness]), wire_seed, values, blind, helper_parts)
    return leader, HelperShare(seed, parts)


def leader_wire_seeds(layout: Layout, wire_seed: bytes) -> np.ndarray:
    """The aggregator's share of the proof's wire seeds (2 QUERIES c elements), expanded from its ``wire_seed``."""
    return field.random_elements(wire_seed, b"leader wire seeds", layout.wire_seeds)


def helper_expansion(layout: Layout, seed: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The auditor's input and proof shares, expanded from its seed."""
    return (
        field.random_elements(seed, b"helper inputs", layout.input_length),
        field.random_elements(seed, b"helper proof", layout.proof_length),
    )


def leader_part(blind: bytes, purpose: bytes, share: np.ndarray) -> bytes:
    """A joint-randomness part of the leader's share: SHA-256 of a label, the blind and the share's elements."""
    digest = hashlib.sha256(b"fedfair bounded v1 part\x00" + purpose + b"\x00" + blind)
    digest.update(np.ascontiguousarray(share, dtype="<u8").data)
    return digest.digest()


def seed_parts(seed: bytes) -> Parts:
    """The auditor's parts: its seed fixes both of its shares, so they hash the seed."""
    return Parts(
        hashlib.sha256(b"fedfair bounded v1 seed part\x00tests\x00" + seed).digest(),
        hashlib.sha256(b"fedfair bounded v1 seed part\x00witness\x00" + seed).digest(),
    )


def tests_seed(leader_tests_part: bytes, helper_tests_part: bytes) -> bytes:
    """The range tests' seed, from the two x parts."""
    return hashlib.sha256(b"fedfair bounded v1 tests\x00" + leader_tests_part + helper_tests_part).digest()


def joint_bit_weights(layout: Layout, leader: Parts, helper: Parts) -> np.ndarray:
    """The two bit checks' weight vectors (2 x witness bits), from every part."""
    seed = hashlib.sha256(
        b"fedfair bounded v1 joint\x00" + tests_seed(leader.tests, helper.tests) + leader.witness + helper.witness
    ).digest()
    return field.random_elements(seed, b"bit weights", 2 * layout.witness_bits).reshape(2, -1)


def _squared_norm(x: np.ndarray) -> int:
    """||x||^2 exactly: int64 blocks whose sums cannot overflow, or Python integers for a liar's huge values."""
    largest = int(np.max(np.abs(x), initial=0))
    if largest >= 1 << 31:
        return sum(int(value) * int(value) for value in x)
    block = 1 << max(0, 62 - 2 * largest.bit_length())  # each square < 2^(2 bits), a block's sum < 2^62
    squares = x.astype(np.int64) ** 2
    return sum(int(squares[start : start + block].sum()) for start in range(0, x.size, block))
