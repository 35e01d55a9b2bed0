"""Real federations cut from the bundled Adult data, shared by the fixtures and the runtime tests."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from fedfair.datasets import load_dataset, partition
from fedfair.datasets.builtin import adult_table
from fedfair.datasets.registry import dataset_info
from fedfair.simulation.federation import Federation, federation_from_arrays


def adult_by_race(caps: Sequence[int] | None = None) -> Federation:
    """Adult split into White / Black / Other collaborators, each optionally cut to its first rows."""
    dataset = load_dataset("adult")
    splits = partition(dataset, "race", 3, seed=0)
    limits = list(caps) if caps is not None else [None] * len(splits)
    train = [
        (dataset.x_train[s.train_index[:cap]], dataset.y_train[s.train_index[:cap]]) for s, cap in zip(splits, limits)
    ]
    test = [(dataset.x_test[s.test_index[:cap]], dataset.y_test[s.test_index[:cap]]) for s, cap in zip(splits, limits)]
    return federation_from_arrays([s.name for s in splits], train, test, dataset.num_classes, dataset.image_shape)


def adult_raw_table() -> pd.DataFrame:
    """adult.data as raw text and numbers, as an institution's export of it would read (and the
    built-in loader reads it): what the schema and bundle tests give institutions as their tables."""
    return adult_table(dataset_info("adult"))
