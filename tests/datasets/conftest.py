"""The real datasets the dataset tests share, loaded once per test module."""

from __future__ import annotations

import pandas as pd
import pytest

from fedfair.datasets import Dataset, Schema, load_dataset
from fedfair.datasets.schema import Column
from tests.federations import adult_raw_table


@pytest.fixture(scope="module")
def adult() -> Dataset:
    return load_dataset("adult")


@pytest.fixture(scope="module")
def rand_hie() -> Dataset:
    return load_dataset("rand-hie")


@pytest.fixture(scope="module")
def adult_table() -> pd.DataFrame:
    """Adult's raw table, as an institution's CSV holds it."""
    return adult_raw_table()


@pytest.fixture
def small_schema() -> Schema:
    return Schema(
        label="y",
        classes=("no", "yes"),
        columns=(Column("age", "numeric"), Column("color", "categorical", ("red", "blue"))),
        missing="refuse",
        max_abs=1000.0,
    )
