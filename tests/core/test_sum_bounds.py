"""The bounds of a decoded training sum read in one pass: the same verdicts as each bound's own pass, each slice read
once (a site decoding by slice decodes its sum once for both)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedfair.core import sum_bounds
from fedfair.core.sum_bounds import DecodedSum, encoding_breach, extent, influence_breach, sum_breach

CLIP, NORM = 0.5, 1.0
NAMES = ("a", "b")


def counted(values: np.ndarray, total: float = 2.0) -> tuple[DecodedSum, list[tuple[int, int]]]:
    """A sum of two inputs over `values` whose every read is recorded."""
    reads: list[tuple[int, int]] = []

    def read(start: int, stop: int) -> np.ndarray:
        reads.append((start, stop))
        return values[start:stop]

    return DecodedSum(read, values.size, total, 1e-9, 2), reads


def separate(decoded: DecodedSum, parameters: int) -> str | None:
    return encoding_breach(decoded, CLIP) or influence_breach(decoded, 2.0, NORM, parameters, NAMES)


@pytest.mark.parametrize(
    "change",
    ["honest", "outside the clip", "NaN in a late slice", "Inf", "too long", "wrong weight"],
)
def test_one_pass_gives_each_bounds_own_verdict_reading_each_slice_once(
    change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sum_bounds, "_SLICE", 7)
    parameters = 40  # 41 steps (delta theta, delta c) of 45 values: the last 4 are outside the norm's sum
    values = np.random.default_rng(3).uniform(-0.02, 0.02, parameters + 5)
    total = 2.0
    if change == "outside the clip":
        values[30] = CLIP * total * 1.01
    elif change == "NaN in a late slice":
        values[43] = math.nan
    elif change == "Inf":
        values[3] = -math.inf
    elif change == "too long":
        values[:20] = 0.9 * CLIP * total
    elif change == "wrong weight":
        total = 2.5
    decoded, reads = counted(values, total)
    verdict = sum_breach(decoded, CLIP, 2.0, NORM, parameters, NAMES)
    starts = [start for start, _ in reads]
    assert starts == list(range(0, values.size, 7)) or (change == "wrong weight" and reads == [])  # once each
    assert verdict == separate(counted(values, total)[0], parameters)
    assert (verdict is None) is (change == "honest")


def test_the_squares_are_the_first_steps_values_alone_and_the_same_sum_either_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A site's one pass and the aggregator's influence check alone sum the same slices: the same float, bit for bit."""
    monkeypatch.setattr(sum_bounds, "_SLICE", 7)
    values = np.random.default_rng(4).standard_normal(50)
    both = extent(counted(values)[0], 33)
    alone, reads = counted(values)
    squares_alone = extent(alone, 33, extremes=False)
    assert (
        both.squares
        == squares_alone.squares
        == sum(float(np.einsum("i,i->", piece, piece)) for piece in np.split(values[:33], range(7, 33, 7)))
    )
    assert reads[-1] == (28, 33) and squares_alone.largest == 0.0
    assert both.largest == float(np.abs(values).max())
