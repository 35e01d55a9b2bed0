"""The per-record sensitivity of the statistics a sum reveals (`statistics_sensitivity`), by brute force:
drop each row of a table and measure how far the joined statistics move, in real units."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from fedfair.datasets.schema import Column, Schema
from fedfair.datasets.statistics import (
    MAX_SITE_ROWS,
    join_limbs,
    limb_count,
    statistics_sensitivity,
    statistics_slices,
    statistics_vector,
)

SCHEMA = Schema(
    "y",
    ("no", "yes"),
    (Column("x", "numeric"), Column("colour", "categorical", ("red", "blue")), Column("z", "numeric")),
    missing="impute",
    max_abs=50.0,
    fraction_bits=4,
    min_category_count=1,  # no site suppression: the bound is stated for whole counts
)


def joined(table: pd.DataFrame) -> np.ndarray:
    """The statistics in real units: row count; per numeric column count, sum x, sum x^2; per categorical its cells."""
    vector = statistics_vector(SCHEMA, table)
    scale = 2.0**SCHEMA.fraction_bits
    largest = math.ceil(SCHEMA.max_abs * scale)
    sums, squares = limb_count(MAX_SITE_ROWS * largest), limb_count(MAX_SITE_ROWS * largest * largest)
    found = [vector[0]]
    for column, where in statistics_slices(SCHEMA):
        part = [int(value) for value in vector[where]]
        if column.kind == "numeric":
            total, square = join_limbs(part[1 : 1 + sums]), join_limbs(part[1 + sums : 1 + sums + squares])
            found += [part[0], total / scale, square / scale**2]
        else:
            found += part
    return np.array(found, dtype=np.float64)


def test_dropping_any_row_moves_the_statistics_by_at_most_the_stated_sensitivity() -> None:
    rng = np.random.default_rng(0)
    rows = 40
    table = pd.DataFrame(
        {
            "x": rng.uniform(-50.0, 50.0, rows),
            "colour": rng.choice(["red", "blue", None], rows),
            "z": np.where(rng.random(rows) < 0.2, np.nan, rng.uniform(-1.0, 1.0, rows)),
        }
    )
    table.loc[0, "x"] = -50.0  # a value at the bound, the most one record can move a sum of squares
    l1, l2 = statistics_sensitivity(SCHEMA)
    largest = SCHEMA.max_abs + 2.0 ** -(SCHEMA.fraction_bits + 1)
    assert l1 == 1 + 2 * (1 + largest + largest**2) + 1
    whole = joined(table)
    moved = [np.abs(whole - joined(table.drop(index=row))) for row in range(rows)]
    assert max(float(move.sum()) for move in moved) <= l1
    assert max(float(np.sqrt((move**2).sum())) for move in moved) <= l2
    # The row at the bound comes within a unit of the L1 bound's numeric part for its column.
    assert float(moved[0].sum()) >= 1 + 1 + SCHEMA.max_abs + SCHEMA.max_abs**2
