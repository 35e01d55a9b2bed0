"""Checks the dataset tests share."""

from __future__ import annotations

import numpy as np

from fedfair.datasets import ClientSplit, Dataset


def assert_exact_cover(dataset: Dataset, clients: list[ClientSplit]) -> None:
    """Every train and every test row belongs to exactly one client."""
    for split, size in (("train", len(dataset.y_train)), ("test", len(dataset.y_test))):
        indices = np.concatenate([getattr(client, f"{split}_index") for client in clients])
        assert indices.dtype == np.int64
        assert np.array_equal(np.sort(indices), np.arange(size)), split
