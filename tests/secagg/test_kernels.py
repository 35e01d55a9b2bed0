"""The compiled kernels against plain references: add_rows modulo 2^bits, round_block's exact rounding formula."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedfair.secagg import kernels

WORDS = {32: np.uint32, 64: np.uint64}


def all_ones(bits: int) -> int:
    return (1 << bits) - 1


def add_rows_reference(accumulator: np.ndarray, rows: np.ndarray, negate: list[bool], bits: int) -> list[int]:
    """Word i plus or minus row j's word i, for every row, in Python integers reduced modulo 2^bits once."""
    total = [int(word) for word in accumulator]
    for row, negated in zip(rows, negate, strict=True):
        sign = -1 if negated else 1
        total = [word + sign * int(value) for word, value in zip(total, row[: accumulator.size], strict=False)]
    return [word % (1 << bits) for word in total]


def negate_words(negate: list[bool], bits: int) -> np.ndarray:
    """The kernel's form of the signs: 0 to add, all ones to subtract."""
    return np.array([all_ones(bits) if negated else 0 for negated in negate], dtype=WORDS[bits])


@st.composite
def add_rows_cases(draw: st.DrawFn) -> tuple[int, np.ndarray, np.ndarray, list[bool]]:
    bits = draw(st.sampled_from([32, 64]))
    size = draw(st.integers(0, 9))
    count = draw(st.integers(0, 5))
    spare = draw(st.integers(0, 3))  # rows may be longer than the accumulator
    word = st.integers(0, all_ones(bits))
    accumulator = draw(arrays(WORDS[bits], size, elements=word))
    rows = draw(arrays(WORDS[bits], (count, size + spare), elements=word))
    negate = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    return bits, accumulator, rows, negate


@settings(max_examples=200, deadline=None)
@given(add_rows_cases())
def test_add_rows_adds_or_subtracts_each_row_modulo_2_to_the_bits(
    case: tuple[int, np.ndarray, np.ndarray, list[bool]],
) -> None:
    bits, accumulator, rows, negate = case
    expected = add_rows_reference(accumulator, rows, negate, bits)
    spare = rows[:, accumulator.size :].copy()
    kernels.add_rows()(accumulator, rows, negate_words(negate, bits))
    assert accumulator.tolist() == expected
    assert np.array_equal(rows[:, accumulator.size :], spare)  # rows are only read


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("count", [1, 2, 3])
def test_add_rows_wraps_around_at_both_ends_in_both_directions(bits: int, count: int) -> None:
    """Odd and even row counts (the kernel pairs rows, then takes the last one alone)."""
    top, half = all_ones(bits), 1 << (bits - 1)
    start = np.array([top, 0, half, half - 1, 5], dtype=WORDS[bits])
    ones = np.ones((count, start.size), dtype=WORDS[bits])
    adding = start.copy()
    kernels.add_rows()(adding, ones, negate_words([False] * count, bits))
    assert adding.tolist() == [count - 1, count, half + count, half - 1 + count, 5 + count]
    subtracting = start.copy()
    kernels.add_rows()(subtracting, ones, negate_words([True] * count, bits))
    assert subtracting.tolist() == [top - count, (1 << bits) - count, half - count, half - 1 - count, 5 - count]


@pytest.mark.parametrize("bits", [32, 64])
def test_add_rows_with_mixed_signs_then_the_opposite_signs_restores_the_accumulator(bits: int) -> None:
    rng = np.random.default_rng(bits)
    start = rng.integers(0, all_ones(bits), 17, dtype=WORDS[bits], endpoint=True)
    rows = rng.integers(0, all_ones(bits), (5, 17), dtype=WORDS[bits], endpoint=True)
    negate = [False, True, True, False, True]
    accumulator = start.copy()
    kernels.add_rows()(accumulator, rows, negate_words(negate, bits))
    assert not np.array_equal(accumulator, start)
    kernels.add_rows()(accumulator, rows, negate_words([not negated for negated in negate], bits))
    assert np.array_equal(accumulator, start)


def round_block_reference(
    values: np.ndarray, random: np.ndarray, shift: int, scale: float, bound: float, rounding_bits: int
) -> list[int]:
    """floor((trunc(clip(value) * scale) + (word >> shift)) / 2^K), in Python integers."""
    words = []
    for value, word in zip(values.tolist(), random.tolist(), strict=True):
        fixed = math.trunc(min(max(value, -bound), bound) * scale)  # exact: scale is a power of two
        words.append((fixed + (word >> shift)) >> rounding_bits)  # >> floors negative integers too
    return words


@st.composite
def rounding_cases(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int, int, float, type]:
    """Settings as the encoder makes them: scale = 2^(f + K), shift = 32 - K, and every clipped value times
    2^f well inside ``out`` (int32 for a 32-bit modulus, int64 for a 64-bit one) and times 2^(f + K) below 2^62."""
    out = draw(st.sampled_from([np.int32, np.int64]))
    bound = draw(st.floats(2.0**-10, 2.0**10))
    fractional_bits = draw(st.integers(0, 19 if out is np.int32 else 40))
    rounding_bits = draw(st.integers(10, min(32, 61 - 10 - fractional_bits)))
    special = st.sampled_from([0.0, -0.0, bound, -bound, 5e-324, -5e-324, 1e300, -1e300])
    size = draw(st.integers(0, 12))
    values = draw(arrays(np.float64, size, elements=st.one_of(st.floats(-2 * bound, 2 * bound), special)))
    random = draw(arrays(np.uint32, size, elements=st.integers(0, all_ones(32))))
    return values, random, fractional_bits, rounding_bits, bound, out


@settings(max_examples=300, deadline=None)
@given(rounding_cases())
def test_round_block_writes_the_exact_integer_formula_and_moves_no_value_a_whole_unit(
    case: tuple[np.ndarray, np.ndarray, int, int, float, type],
) -> None:
    values, random, fractional_bits, rounding_bits, bound, out_type = case
    scale = math.ldexp(1.0, fractional_bits + rounding_bits)
    shift = 32 - rounding_bits
    out: np.ndarray = np.empty(values.size, dtype=out_type)
    finite = kernels.round_block()(values, random, np.uint32(shift), scale, bound, np.int64(rounding_bits), out)
    assert finite is True
    assert out.tolist() == round_block_reference(values, random, shift, scale, bound, rounding_bits)
    for value, word in zip(values.tolist(), out.tolist(), strict=True):
        units = math.ldexp(min(max(value, -bound), bound), fractional_bits)
        assert abs(word - units) < 1


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("position", [0, 3, 7])
def test_round_block_reports_a_non_finite_value_wherever_it_is(bad: float, position: int) -> None:
    values = np.linspace(-1.0, 1.0, 8)
    values[position] = bad
    out = np.empty(8, dtype=np.int64)
    finite = kernels.round_block()(values, np.zeros(8, np.uint32), np.uint32(0), 2.0**40, 1.0, np.int64(32), out)
    assert finite is False


def test_round_block_of_no_values_is_finite_and_writes_nothing() -> None:
    out = np.empty(0, dtype=np.int32)
    args = (np.uint32(0), 2.0**32, 1.0, np.int64(32), out)
    assert kernels.round_block()(np.empty(0), np.empty(0, np.uint32), *args) is True


def test_with_no_random_bits_set_round_block_floors_and_with_all_set_it_rounds_up_off_the_grid() -> None:
    """r = 0 gives floor(m / 2^K), r = 2^K - 1 gives ceil(m / 2^K): the two neighbours rounding picks from."""
    values = np.array([0.25, -0.25, 1.0, -1.0, 2.5, -2.5])
    kernel = kernels.round_block()
    for word, expected in ((0, [0, -1, 1, -1, 2, -3]), (all_ones(32), [1, 0, 1, -1, 3, -2])):
        out = np.empty(values.size, dtype=np.int64)
        random = np.full(values.size, word, dtype=np.uint32)
        assert kernel(values, random, np.uint32(0), 2.0**32, 10.0, np.int64(32), out)
        assert out.tolist() == expected


def test_numba_is_imported_on_first_use_of_a_kernel_not_with_fedfair() -> None:
    script = (
        "import sys, fedfair.secagg\n"
        "from fedfair.secagg import kernels\n"
        "before = 'numba' in sys.modules\n"
        "kernels.add_rows()\n"
        "print(before, 'numba' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.split() == ["False", "True"]
