"""Shared fixtures: real federations cut from the bundled Adult data."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fedfair.datasets import load_dataset, partition
from fedfair.simulation import Federation, federation_from_arrays


def adult_by_race(caps: Sequence[int] | None = None) -> Federation:
    """Adult split into White / Black / Other collaborators, each optionally cut to its first rows."""
    dataset = load_dataset("adult")
    splits = partition(dataset, "race", 3, seed=0)
    limits = list(caps) if caps is not None else [None] * len(splits)
    train = [(dataset.x_train[s.train_index[:cap]], dataset.y_train[s.train_index[:cap]]) for s, cap in zip(splits, limits)]
    test = [(dataset.x_test[s.test_index[:cap]], dataset.y_test[s.test_index[:cap]]) for s, cap in zip(splits, limits)]
    return federation_from_arrays([s.name for s in splits], train, test, dataset.num_classes, dataset.image_shape)


@pytest.fixture(scope="session")
def adult_federation() -> Federation:
    """The full Adult federation by race (uneven: most rows are in the White client)."""
    return adult_by_race()


@pytest.fixture(scope="session")
def small_adult_federation() -> Federation:
    """A few hundred Adult rows per client with deliberately uneven sizes, for exactness tests."""
    return adult_by_race((600, 250, 120))
