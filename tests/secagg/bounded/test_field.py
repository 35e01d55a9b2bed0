"""F_(2^52 - 47): every kernel against Python's exact integers, on edge values, random ones and hypothesis draws."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ProtocolError
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.field import P
from tests.secagg.bounded.roundkit import packed_raw

EDGES = [0, 1, 2, (1 << 26) - 1, 1 << 26, (1 << 26) + 1, (1 << 32) + 1, 1 << 51, P // 2, P // 2 + 1, P - 2, P - 1]
"""Values at the kernels' seams: the 26-bit halves a product is formed from, half of p, and p's neighbours."""

ELEMENTS = st.integers(0, P - 1)
VECTORS = st.lists(ELEMENTS, min_size=1, max_size=40)


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


def test_the_modulus_is_the_largest_prime_below_2_to_the_52() -> None:
    """p = 2^52 - 47 is prime (Miller-Rabin with the first 12 prime bases is exact below 3.3 10^24) and no odd
    number between it and 2^52 is: the fold constant is the least one."""

    def prime(n: int) -> bool:
        odd, twos = n - 1, 0
        while odd % 2 == 0:
            odd, twos = odd // 2, twos + 1
        for base in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
            x = pow(base, odd, n)
            if x in (1, n - 1):
                continue
            for _ in range(twos - 1):
                x = x * x % n
                if x == n - 1:
                    break
            else:
                return False
        return True

    assert P == (1 << field.ELEMENT_BITS) - field.FOLD and prime(P)
    assert not any(prime((1 << field.ELEMENT_BITS) - c) for c in range(1, field.FOLD, 2))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(ELEMENTS, ELEMENTS), min_size=1, max_size=40))
def test_products_sums_and_differences_match_python_integers(pairs: list[tuple[int, int]]) -> None:
    a = np.array([x for x, _ in pairs], dtype=np.uint64)
    b = np.array([y for _, y in pairs], dtype=np.uint64)
    assert field.multiply(a, b).tolist() == [x * y % P for x, y in pairs]
    assert field.add(a, b).tolist() == [(x + y) % P for x, y in pairs]
    assert field.subtract(a, b).tolist() == [(x - y) % P for x, y in pairs]
    assert field.dot(a, b) == sum(x * y for x, y in pairs) % P


@settings(max_examples=100, deadline=None)
@given(VECTORS, st.integers(1, 5), st.data())
def test_row_combinations_and_products_with_a_transpose_match_python_integers(
    weights: list[int], columns: int, data: st.DataObject
) -> None:
    rows = [data.draw(st.lists(ELEMENTS, min_size=columns, max_size=columns)) for _ in weights]
    matrix = np.array(rows, dtype=np.uint64)
    assert field.combine_rows(np.array(weights, dtype=np.uint64), matrix).tolist() == [
        sum(w * row[k] for w, row in zip(weights, rows)) % P for k in range(columns)
    ]
    assert field.matmul_transposed(matrix.T, matrix.T).tolist() == [
        [sum(rows[m][i] * rows[m][j] for m in range(len(rows))) % P for j in range(columns)] for i in range(columns)
    ]


@settings(max_examples=100, deadline=None)
@given(st.lists(VECTORS.filter(lambda v: len(v) >= 2), min_size=1, max_size=4).map(lambda vs: [v[:2] for v in vs]))
def test_extension_of_lines_continues_them(lines: list[list[int]]) -> None:
    """Two points per column fix a line: extend gives its value at t = 2 (at two points N - 1 = 1 more)."""
    columns = np.array(lines, dtype=np.uint64).T.copy()
    assert field.extend(columns).tolist() == [[(2 * second - first) % P for first, second in lines]]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, P - 1))
def test_an_inverse_times_its_element_is_one(value: int) -> None:
    assert value * field.inverse(value) % P == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(P // 2), P // 2), max_size=40))
def test_signed_values_round_trip_and_a_value_beyond_half_p_is_refused(values: list[int]) -> None:
    assert field.from_signed(values).tolist() == [v % P for v in values]
    assert field.to_signed(field.from_signed(values)).tolist() == values
    with pytest.raises(ValueError, match="does not fit the field"):
        field.from_signed([*values, P // 2 + 1])


@settings(max_examples=200, deadline=None)
@given(st.lists(ELEMENTS, max_size=60))
def test_wire_packing_round_trips_any_elements(values: list[int]) -> None:
    elements = np.array(values, dtype=np.uint64)
    data = field.to_wire(elements)
    assert len(data) == field.wire_bytes(len(values)) == (52 * len(values) + 7) // 8
    assert field.from_wire(data, "a test vector").tolist() == values


@settings(max_examples=100, deadline=None)
@given(st.lists(ELEMENTS, min_size=1, max_size=20), st.data())
def test_a_packed_value_at_or_above_p_is_refused(values: list[int], data: st.DataObject) -> None:
    """Every 52-bit value from p to 2^52 - 1 fits the packing but is no element: from_wire refuses it."""
    index = data.draw(st.integers(0, len(values) - 1))
    values[index] = data.draw(st.integers(P, (1 << 52) - 1))
    with pytest.raises(ProtocolError, match="not a field element"):
        field.from_wire(packed_raw(values), "a test vector")


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
def test_wire_packing_takes_52_bits_an_element_and_round_trips(count: int) -> None:
    elements = np.concatenate([_random(count, count), np.array(EDGES, dtype=np.uint64)])[:count]
    data = field.to_wire(elements)
    assert len(data) == (52 * count + 7) // 8 == field.wire_bytes(count)
    assert np.array_equal(field.from_wire(data, "a test vector"), elements)


def test_wire_packing_refuses_p_spare_bits_and_lengths_no_count_packs_to() -> None:
    with pytest.raises(ProtocolError, match="a test vector holds a value that is not a field element"):
        field.from_wire(packed_raw([3, P, 5]), "a test vector")
    one = bytearray(field.to_wire(np.array([P - 1], dtype=np.uint64)))  # 52 bits in 7 bytes: 4 spare
    one[-1] |= 0x80
    with pytest.raises(ProtocolError, match="spare bits"):
        field.from_wire(bytes(one), "a test vector")
    with pytest.raises(ProtocolError, match="not a whole number of 52-bit elements"):
        field.from_wire(bytes(8), "a test vector")  # 7 bytes hold one element, 13 two: 8 holds no count


@pytest.mark.parametrize("value", [P, 1 << 52, (1 << 52) | 3, (1 << 64) - 1])
def test_to_wire_refuses_a_value_that_is_not_an_element(value: int) -> None:
    """Packed, 2^52 + 3 then 0 would be the canonical bytes of 3 then 1: its top bits spill into the next element."""
    with pytest.raises(ValueError, match="to_wire takes field elements"):
        field.to_wire(np.array([value, 0], dtype=np.uint64))


@pytest.mark.parametrize("value", [-(1 << 63), (1 << 63) - 1, -(P // 2) - 1])
def test_from_signed_refuses_int64s_extremes_whose_magnitude_overflows(value: int) -> None:
    """|int64's minimum| overflows back to itself in numpy: the check must not pass it as small."""
    with pytest.raises(ValueError, match="does not fit the field"):
        field.from_signed(np.array([0, value], dtype=np.int64))


@pytest.mark.parametrize("value", [1 << 63, -(1 << 63) - 1, 1 << 100])
def test_from_signed_names_a_value_beyond_int64_as_not_fitting(value: int) -> None:
    with pytest.raises(ValueError, match="does not fit the field"):
        field.from_signed([1, value])


KNOWN_FIRST_TWO = [611901339567344, 975153202459207]
"""The first two elements of seed 32 x "k", purpose "purpose" (AES-256-CTR under SHA-256 of the label): the low 52
bits of the first two words (the 61-bit field's vector here was 865303029794702576, 2144688575830815303)."""


COMPILED_IN_A_ROUND = """
from numba.core.dispatcher import Dispatcher
from fedfair.core.errors import ProtocolError
from fedfair.secagg.bounded import field
from tests.secagg.bounded.roundkit import simulated
from tests.secagg.bounded.test_round import WEIGHTS, at_bound

loops = {name: value for name, value in vars(field.loops()).items()
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


LOADED_BY_THE_RUNTIME = """
import sys
from fedfair.runtime.aggregator import start
from fedfair.runtime.collaborator import client
from fedfair.secagg.bounded import field
print("numba" in sys.modules)
field.dot(field.from_signed([1, -2]), field.from_signed([3, 4]))
print("numba" in sys.modules)
"""


def test_the_runtime_loads_numba_only_when_a_field_loop_runs() -> None:
    """Every runtime process imports the field (the bounded kind registers beside the others), but numba costs it
    about 60 MB of resident memory (issue 97: the plain round's peak): the loops' module, and numba, load at the
    first loop a process runs."""
    ran = subprocess.run([sys.executable, "-c", LOADED_BY_THE_RUNTIME], capture_output=True, text=True, check=True)
    assert ran.stdout.split() == ["False", "True"], ran.stdout
