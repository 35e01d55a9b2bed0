"""The real datasets the dataset tests share, loaded once per test module."""

from __future__ import annotations

import pytest

from fedfair.datasets import Dataset, load_dataset


@pytest.fixture(scope="module")
def adult() -> Dataset:
    return load_dataset("adult")


@pytest.fixture(scope="module")
def rand_hie() -> Dataset:
    return load_dataset("rand-hie")
