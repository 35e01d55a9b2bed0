"""The noised statistics before round 1: the per-record sensitivity their noise is calibrated to
(`statistics_sensitivity`), checked by brute force, and the encoder a noised sum still gives."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest

from fedfair.core.errors import ConfigError
from fedfair.datasets.schema import Column, Schema
from fedfair.datasets.statistics import (
    SPURIOUS_BUCKETS,
    encoder_from_noised_statistics,
    noised_statistics_vector,
    statistics_dimension,
    statistics_sensitivity,
)

SCHEMA = Schema(
    "y",
    ("no", "yes"),
    (
        Column("x", "numeric", None, (-50.0, 50.0)),
        Column("colour", "categorical", ("red", "blue")),
        Column("z", "numeric", None, (0.0, 1.0)),
        Column("town", "categorical", None),
    ),
    missing="impute",
    max_abs=1000.0,
    hash_buckets=16,
)


def table(rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "x": rng.uniform(-50.0, 50.0, rows),
            "colour": rng.choice(np.array(["red", "blue", None], dtype=object), rows),
            "z": np.where(rng.random(rows) < 0.2, np.nan, rng.uniform(0.0, 1.0, rows)),
            "town": rng.choice(["Leeds", "York", "Hull"], rows),
        }
    )


def test_dropping_any_row_moves_the_statistics_by_at_most_the_stated_sensitivity() -> None:
    rows = 40
    cut = table(rows)
    cut.loc[0, "x"] = -50.0  # at the bound: |u| = 1, the most one value can move sum u and sum u^2
    cut.loc[1, "x"] = 900.0  # outside the range: clipped to 50, so it moves them no further
    cut.loc[2, "z"] = 1.0
    l1, l2 = statistics_sensitivity(SCHEMA)
    assert (l1, l2) == (1 + 3 * 2 + 2, math.sqrt(9))
    whole = noised_statistics_vector(SCHEMA, cut)
    assert whole.shape == (statistics_dimension(SCHEMA, noised=True),)
    moved = [np.abs(whole - noised_statistics_vector(SCHEMA, cut.drop(index=row))) for row in range(rows)]
    assert max(float(move.sum()) for move in moved) <= l1 + 1e-12
    assert max(float(np.sqrt((move**2).sum())) for move in moved) <= l2 + 1e-12
    # Rows 0 and 1 each move x's count, sum u and sum u^2 by 1, the count, one colour cell and one
    # town cell by 1, and z's by what their z gives: the bound is reached but for z's part.
    for row in (0, 1):
        z = cut.loc[row, "z"]
        z_part = 0.0 if np.isnan(z) else 1 + abs(2 * z - 1) + (2 * z - 1) ** 2
        assert float(moved[row].sum()) == pytest.approx(1 + 3 + 1 + 1 + z_part, abs=1e-9)


def test_a_noiseless_sum_gives_the_clipped_columns_mean_and_deviation() -> None:
    cut = table(500, seed=1)
    encoder = encoder_from_noised_statistics(SCHEMA, noised_statistics_vector(SCHEMA, cut), 0.0)
    x, z = encoder.columns[0], encoder.columns[2]
    assert x.means[0] == pytest.approx(cut["x"].mean(), abs=1e-9)
    assert x.stds[0] == pytest.approx(cut["x"].std(ddof=0), rel=1e-9)
    assert z.means[0] == pytest.approx(cut["z"].mean(), abs=1e-9)
    # Nothing is withheld: every town is a level, and colour's frequencies are its shares.
    assert len(encoder.columns[3].buckets) == 3
    shares = cut["colour"].value_counts() / len(cut)  # over every row, missing ones included
    assert encoder.columns[1].means[:2] == pytest.approx((shares["red"], shares["blue"]), abs=1e-12)


def test_noise_that_spoils_a_count_or_a_variance_leaves_a_usable_encoder() -> None:
    noise_std = 4.0
    summed = noised_statistics_vector(SCHEMA, table(300, seed=2))
    spoiled = summed.copy()
    x, z = slice(1, 4), slice(7, 10)
    spoiled[x] = [-2.0, 5.0, -3.0]  # a negative count: the range's middle and a uniform spread
    spoiled[z] = [25.0, 30.0, 0.1]  # a mean of u above 1, a mean of u^2 below its square: a negative variance
    spoiled[4] = -6.0  # a negative cell
    encoder = encoder_from_noised_statistics(SCHEMA, spoiled, noise_std)
    assert encoder.columns[0].means == (0.0,)
    assert encoder.columns[0].stds[0] == pytest.approx(50.0 / math.sqrt(3.0), rel=1e-12)
    # Mean of u clamped to 1; variance of u floored at the noise's size in the mean of u^2, noise_std / count.
    assert encoder.columns[2].means == (1.0,)
    assert encoder.columns[2].stds[0] == pytest.approx(0.5 * math.sqrt(noise_std / 25.0))
    assert encoder.columns[1].means[0] == 0.0
    # An empty hash bucket becomes a level only past the count noise alone reaches in SPURIOUS_BUCKETS of
    # the column's 17 cells (16 buckets and missing) on average: z sd, with P(N(0, 1) > z) = SPURIOUS_BUCKETS / 17.
    cut = noise_std * NormalDist().inv_cdf(1.0 - SPURIOUS_BUCKETS / 17)
    town = slice(10, 10 + 16)
    for count, levels in ((cut * 0.99, 3), (cut * 1.01, 16)):
        noisy_town = summed.copy()
        noisy_town[town] = np.where(noisy_town[town] == 0, count, noisy_town[town])
        assert len(encoder_from_noised_statistics(SCHEMA, noisy_town, noise_std).columns[3].buckets) == levels
    no_rows = summed.copy()
    no_rows[0] = 0.4
    with pytest.raises(ConfigError, match=r"count 0.4 rows .* too few rows for the plan's \[privacy\]"):
        encoder_from_noised_statistics(SCHEMA, no_rows, noise_std)


def test_a_numeric_column_without_a_range_cannot_be_noised() -> None:
    unbounded = Schema("y", ("no", "yes"), (Column("age", "numeric"), Column("bmi", "numeric", None, (10.0, 60.0))))
    with pytest.raises(ConfigError, match=r"column\(s\) age state no range.* add range = \[low, high\]"):
        noised_statistics_vector(unbounded, pd.DataFrame({"age": [40.0], "bmi": [22.0]}))
