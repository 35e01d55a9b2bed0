"""The fully linear proof: the circuit's wires, the prover, each verifier's linear query, the decision.

One gadget, G(a, b) = sum_k a_k b_k over c products, called M = N - 1 times: on x's squares, then on the
bit checks b_t r_t (b_t - 1) twice, with two weight vectors r from the joint randomness. The outputs (the
norm equation, the two bit checks, each range test) are linear in the gadget outputs and the input, and
zero for a valid input. The prover interpolates each wire through random seeds (one per query point) and
its call values, and sends p = G(wires) as its values at points 0 to 2N - 2; a verifier reads the
gadget outputs from its proof share and, at query points unknown to the prover, its shares of
the wires and of p. Summed, G(wires(r)) = p(r) holds for a false p at at most 2(N - 1) points r; the
seeds make the wire values at r uniform (docs/security.md, "Bounded inputs (two verifiers)").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.field import P
from fedfair.secagg.bounded.layout import QUERIES, Layout


@dataclass(frozen=True)
class Randomness:
    """What one report's circuit is drawn with: joint randomness from its shares' hashes, the query points.

    bit_weights: 2 x (witness bits) elements, the two bit checks' weights.
    trits: the range tests' z_j, as :func:`field.trit_codes` bytes (coordinate i's tests at i k to i k + k - 1).
    query_points: QUERIES points outside 0..2N - 2, from the verifiers' query seed.
    """

    bit_weights: np.ndarray
    trits: np.ndarray
    query_points: tuple[int, ...]


@dataclass(frozen=True)
class VerifierShare:
    """One verifier's share of the values the decision needs.

    outputs: the circuit outputs' shares (3 + k elements).
    wire_values: QUERIES x 2c elements, the wires' shares at each query point.
    polynomial_values: QUERIES elements, the gadget polynomial's share at each query point.
    """

    outputs: np.ndarray
    wire_values: np.ndarray
    polynomial_values: np.ndarray


def query_points(layout: Layout, query_seed: bytes) -> tuple[int, ...]:
    """QUERIES points in [2N - 1, p) from the verifiers' shared query seed (outside every interpolation point)."""
    low = 2 * layout.points - 1
    raw = field.random_elements(query_seed, b"query points", QUERIES)
    return tuple(low + int(value) % (P - low) for value in raw)


def witness_powers(bits: int) -> np.ndarray:
    """1, 2, ..., 2^(bits - 1) as elements: a bit vector's dot with them is its number."""
    return np.array([1 << bit for bit in range(bits)], dtype=np.uint64)


def wire_rows(layout: Layout, inputs: np.ndarray, bit_weights: np.ndarray, leader: bool) -> tuple[np.ndarray, ...]:
    """The M x c call values of the a and b wires, from an input (leader=True) or an input share.

    The constant in b_t - 1 is added by one share only, the leader's (the prover's whole input counts as it).
    """
    chunk, calls = layout.chunk, layout.calls
    square_calls, bit_calls = layout.square_calls_for(chunk), layout.bit_calls_for(chunk)
    x, bits = inputs[: layout.dimension], inputs[layout.dimension :]
    shifted = field.subtract(bits, np.ones_like(bits)) if leader else bits
    a_rows = np.zeros((calls, chunk), dtype=np.uint64)
    b_rows = np.zeros((calls, chunk), dtype=np.uint64)
    a_rows.reshape(-1)[: x.size] = x
    b_rows.reshape(-1)[: x.size] = x
    for copy in range(2):
        start = (square_calls + copy * bit_calls) * chunk
        a_rows.reshape(-1)[start : start + bits.size] = bits
        b_rows.reshape(-1)[start : start + bits.size] = field.multiply(bit_weights[copy], shifted)
    return a_rows, b_rows


def lagrange_at(count: int, point: int) -> np.ndarray:
    """L_j(point) for the Lagrange basis on the points 0, ..., count - 1 (barycentric form)."""
    point %= P
    if point < count:
        unit = np.zeros(count, dtype=np.uint64)
        unit[point] = 1
        return unit
    whole = 1
    for node in range(count):
        whole = whole * (point - node) % P
    factorials = [1] * count
    for node in range(1, count):
        factorials[node] = factorials[node - 1] * node % P
    denominators = [factorials[node] * factorials[count - 1 - node] * (point - node) % P for node in range(count)]
    # One inversion for all of them (Montgomery's trick): at N = 256 a verifier's query needs 767 inverses per point,
    # each a 52-bit exponentiation, which cost it more than its linear algebra below d = 10^5.
    prefix = [1] * (count + 1)
    for node, denominator in enumerate(denominators):
        prefix[node + 1] = prefix[node] * denominator % P
    remaining = field.inverse(prefix[count])  # the inverse of every denominator's product
    inverses = [0] * count
    for node in range(count - 1, -1, -1):
        inverses[node] = remaining * prefix[node] % P
        remaining = remaining * denominators[node] % P
    basis = []
    for node in range(count):
        sign = -1 if (count - 1 - node) % 2 else 1
        basis.append(sign * whole * inverses[node] % P)
    return np.array(basis, dtype=np.uint64)


def prove(layout: Layout, inputs: np.ndarray, bit_weights: np.ndarray, wire_seeds: np.ndarray) -> np.ndarray:
    """The proof for ``inputs`` (the whole input): the wire seeds, then p at points 0 to 2N - 2.

    ``wire_seeds`` must be 2 QUERIES c uniform elements the verifiers never see whole: each wire's QUERIES
    seeds (its values at points 0 to QUERIES - 1) mask its values at the QUERIES query points jointly.
    """
    chunk = layout.chunk
    a_rows, b_rows = wire_rows(layout, inputs, bit_weights, leader=True)
    seeds = wire_seeds.reshape(2, QUERIES, chunk)
    a_wires = np.vstack([seeds[0], a_rows])  # N x c: the seeds, then one point per call
    b_wires = np.vstack([seeds[1], b_rows])
    a_all = np.vstack([a_wires, field.extend(a_wires)])  # (2N - 1) x c: every wire at 0..2N - 2
    b_all = np.vstack([b_wires, field.extend(b_wires)])
    values = np.array([field.dot(a_all[point], b_all[point]) for point in range(a_all.shape[0])], dtype=np.uint64)
    return np.concatenate([wire_seeds, values])


def query(layout: Layout, inputs: np.ndarray, proof: np.ndarray, randomness: Randomness, leader: bool) -> VerifierShare:
    """One verifier's share: linear in its ``inputs`` and ``proof`` shares (plus the leader's constants)."""
    chunk, points, tests = layout.chunk, layout.points, layout.tests
    square_calls, bit_calls = layout.square_calls_for(chunk), layout.bit_calls_for(chunk)
    a_rows, b_rows = wire_rows(layout, inputs, randomness.bit_weights, leader)
    seeds, values = proof[: layout.wire_seeds].reshape(2, QUERIES, chunk), proof[layout.wire_seeds :]
    gadget = values[QUERIES:points]
    x = inputs[: layout.dimension]
    norm_bits = inputs[layout.dimension : layout.dimension + layout.norm_bits]
    test_bits = inputs[layout.dimension + layout.norm_bits :].reshape(tests, layout.test_bits)
    leader_constant = 1 if leader else 0
    norm = (
        _sum(gadget[:square_calls])
        + field.dot(norm_bits, witness_powers(layout.norm_bits))
        - leader_constant * layout.bound_sq
    )
    checks = [_sum(gadget[square_calls + copy * bit_calls : square_calls + (copy + 1) * bit_calls]) for copy in (0, 1)]
    claimed = field.matmul_transposed(test_bits, witness_powers(layout.test_bits)[None, :])[:, 0]
    offsets = field.from_signed([leader_constant * layout.test_offset] * tests)
    tested = field.add(field.subtract(field.signed_projections(x, randomness.trits, tests), claimed), offsets)
    outputs = np.concatenate([np.array([field.element(norm), *checks], dtype=np.uint64), tested])
    wire_values = np.empty((QUERIES, 2 * chunk), dtype=np.uint64)
    polynomial_values = np.empty(QUERIES, dtype=np.uint64)
    for index, point in enumerate(randomness.query_points):
        basis = lagrange_at(points, point)
        for half, rows in enumerate((a_rows, b_rows)):
            at_point = field.combine_rows(basis[QUERIES:], rows)
            seed_term = field.combine_rows(basis[:QUERIES], seeds[half])
            wire_values[index, half * chunk : (half + 1) * chunk] = field.add(at_point, seed_term)
        polynomial_values[index] = field.dot(lagrange_at(2 * points - 1, point), values)
    return VerifierShare(outputs, wire_values, polynomial_values)


def failures(layout: Layout, first: VerifierShare, second: VerifierShare) -> list[str]:
    """What the two shares, summed, show to be false: [] when the input is valid (the decision)."""
    outputs = field.add(first.outputs, second.outputs)
    found = []
    if outputs[0]:
        found.append("norm: ||x||^2 plus the claimed slack is not B^2")
    if outputs[1] or outputs[2]:
        found.append("bits: a witness bit is not 0 or 1")
    failed_tests = np.flatnonzero(outputs[3:])
    if failed_tests.size:
        found.append(f"range: {failed_tests.size} of {layout.tests} tests' claimed values are not <z_j, x> + T")
    wires = field.add(first.wire_values, second.wire_values)
    polynomial = field.add(first.polynomial_values, second.polynomial_values)
    chunk = layout.chunk
    for index in range(QUERIES):
        if field.dot(wires[index, :chunk], wires[index, chunk:]) != int(polynomial[index]):
            found.append(f"gadget: the proof's polynomial is not the circuit's at query point {index}")
    return found


def _sum(elements: np.ndarray) -> int:
    return sum(int(value) for value in elements) % P
