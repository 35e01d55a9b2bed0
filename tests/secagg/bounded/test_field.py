"""F_(2^61 - 1): every kernel against Python's exact integers, on edge values and random ones."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from fedfair.core.errors import ProtocolError
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.field import P

EDGES = [0, 1, 2, (1 << 32) - 1, 1 << 32, (1 << 32) + 1, (1 << 60), P - 2, P - 1]


def _random(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, P, count, dtype=np.uint64)


def test_products_of_edge_values_match_python_integers() -> None:
    a = np.array([x for x in EDGES for _ in EDGES], dtype=np.uint64)
    b = np.array([y for _ in EDGES for y in EDGES], dtype=np.uint64)
    assert [int(v) for v in field.multiply(a, b)] == [int(x) * int(y) % P for x, y in zip(a, b)]


def test_dot_and_matrix_kernels_match_python_integers() -> None:
    a, b = _random(1000, 1), _random(1000, 2)
    assert field.dot(a, b) == sum(int(x) * int(y) for x, y in zip(a, b)) % P
    left, right = _random(35, 3).reshape(5, 7), _random(21, 4).reshape(3, 7)
    product = field.matmul_transposed(left, right)
    expected = [[sum(int(left[i, t]) * int(right[j, t]) for t in range(7)) % P for j in range(3)] for i in range(5)]
    assert product.tolist() == expected
    weights = _random(3, 5)
    assert field.combine_rows(weights, right).tolist() == [
        sum(int(weights[m]) * int(right[m, k]) for m in range(3)) % P for k in range(7)
    ]


def test_extension_by_differences_evaluates_each_column_polynomial_beyond_its_points() -> None:
    # Columns of the polynomials c0 + c1 t + ... + c7 t^7 at t = 0..7, extended to t = 8..14.
    coefficients = _random(8 * 5, 7).reshape(8, 5)

    def at(t: int) -> list[int]:
        return [sum(int(coefficients[k, column]) * t**k for k in range(8)) % P for column in range(5)]

    columns = np.array([at(t) for t in range(8)], dtype=np.uint64)
    assert field.extend(columns).tolist() == [at(t) for t in range(8, 15)]
    wide = np.tile(columns, (1, 300))  # more columns than one block of the kernel
    assert field.extend(wide).tolist() == [at(t) * 300 for t in range(8, 15)]


def test_addition_subtraction_and_signed_round_trip() -> None:
    a, b = np.array(EDGES, dtype=np.uint64), np.array(EDGES[::-1], dtype=np.uint64)
    assert field.add(a, b).tolist() == [(int(x) + int(y)) % P for x, y in zip(a, b)]
    assert field.subtract(a, b).tolist() == [(int(x) - int(y)) % P for x, y in zip(a, b)]
    signed = np.array([-(P // 2), -1, 0, 1, P // 2], dtype=np.int64)
    assert field.from_signed(signed).tolist() == [v % P for v in signed.tolist()]
    assert field.to_signed(field.from_signed(signed)).tolist() == signed.tolist()


def test_signed_projections_follow_the_trit_codes() -> None:
    values, tests = _random(50, 6), 7
    codes = field.trit_codes(b"s" * 32, b"trits", 50 * tests)
    trits = [
        ((int(codes[t >> 2]) >> (2 * (t & 3))) & 1) - ((int(codes[t >> 2]) >> (2 * (t & 3) + 1)) & 1)
        for t in range(350)
    ]
    expected = [sum(trits[i * tests + j] * int(values[i]) for i in range(50)) % P for j in range(tests)]
    assert field.signed_projections(values, codes, tests).tolist() == expected
    # -1, 0, 1 with probabilities 1/4, 1/2, 1/4: over 40,000 trits each share is within 6 sigma (sigma < 0.0025).
    many = field.trit_codes(b"t" * 32, b"trits", 40_000)
    low, high = many[:, None] >> np.arange(0, 8, 2) & 1, many[:, None] >> np.arange(1, 8, 2) & 1
    z = (low.astype(int) - high.astype(int)).reshape(-1)
    assert abs(np.mean(z == 0) - 0.5) < 0.015 and abs(np.mean(z == 1) - 0.25) < 0.015


def test_expansion_is_a_fixed_function_of_the_seed() -> None:
    first = field.random_elements(b"k" * 32, b"purpose", 5)
    assert first.tolist() == field.random_elements(b"k" * 32, b"purpose", 8)[:5].tolist()
    assert first.tolist() != field.random_elements(b"k" * 32, b"other", 5).tolist()
    assert all(0 <= int(v) < P for v in first)
    # A known-answer vector: both verifiers and every later version must expand a seed alike.
    assert first.tolist()[:2] == KNOWN_FIRST_TWO


def test_inverse_of_zero_is_refused() -> None:
    assert field.inverse(12345) * 12345 % P == 1
    with pytest.raises(ZeroDivisionError):
        field.inverse(P)


@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 64, 1001])
def test_wire_packing_takes_61_bits_an_element_and_round_trips(count: int) -> None:
    elements = np.concatenate([_random(count, count), np.array(EDGES, dtype=np.uint64)])[:count]
    data = field.to_wire(elements)
    assert len(data) == (61 * count + 7) // 8 == field.wire_bytes(count)
    assert np.array_equal(field.from_wire(data, "a test vector"), elements)


def test_wire_packing_refuses_p_spare_bits_and_lengths_no_count_packs_to() -> None:
    with pytest.raises(ProtocolError, match="a test vector holds a value that is not a field element"):
        field.from_wire(field.to_wire(np.array([3, P, 5], dtype=np.uint64)), "a test vector")
    one = bytearray(field.to_wire(np.array([P - 1], dtype=np.uint64)))  # 61 bits in 8 bytes: 3 spare
    one[-1] |= 0x80
    with pytest.raises(ProtocolError, match="spare bits"):
        field.from_wire(bytes(one), "a test vector")
    with pytest.raises(ProtocolError, match="not a whole number of 61-bit elements"):
        field.from_wire(bytes(9), "a test vector")  # 8 bytes hold one element, 16 two: 9 holds no count


KNOWN_FIRST_TWO = [865303029794702576, 2144688575830815303]
"""The first two elements of seed 32 x "k", purpose "purpose" (AES-256-CTR under SHA-256 of the label)."""


COMPILED_IN_A_ROUND = """
from numba.core.dispatcher import Dispatcher
from fedfair.core.errors import ProtocolError
from fedfair.secagg.bounded import field
from tests.secagg.bounded.roundkit import simulated
from tests.secagg.bounded.test_round import WEIGHTS, at_bound

loops = {name: value for name, value in vars(field).items()
         if isinstance(value, Dispatcher) and value.targetoptions.get("inline") != "always"}
print(len(loops), sorted(name for name, loop in loops.items() if loop.signatures))
field.compile_kernels()
compiled = {name: len(loop.signatures) for name, loop in loops.items()}
print(sorted(name for name, count in compiled.items() if not count))
trace = simulated({party: at_bound(party, weight) for party, weight in WEIGHTS.items()}, WEIGHTS)
assert trace.result is not None
print(sorted(name for name, loop in loops.items() if len(loop.signatures) > compiled[name]))
"""


def test_compile_kernels_leaves_no_loop_for_a_round_to_compile() -> None:
    """In a fresh interpreter, where no loop has run, compile_kernels compiles (or loads from numba's cache) every
    compiled loop of the module with the types a round calls it with: a whole bounded round then compiles nothing
    (issue 94: round 1's SHARE waited for every site to compile, ~30 s). A read-only or strided array is another type
    to numba, compiled anew at its first call. The always-inlined helpers have no code of their own."""
    ran = subprocess.run([sys.executable, "-c", COMPILED_IN_A_ROUND], capture_output=True, text=True, check=True)
    lines = ran.stdout.split("\n")
    count, compiled_before = lines[0].split(" ", 1)
    assert int(count) >= 6 and compiled_before == "[]", lines
    assert lines[1] == "[]", lines  # none left uncompiled
    assert lines[2] == "[]", lines  # none compiled again for other types in the round
