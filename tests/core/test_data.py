"""A collaborator's samples and the batch-size and seed rules shared by the simulation and the runtime."""

from __future__ import annotations

import pytest
import torch

from fedfair.core.data import (
    ClientData,
    client_batch_sizes,
    client_seed,
    local_batch_size,
)
from fedfair.core.errors import ConfigError


def test_batch_sizes_are_proportional_and_sum_to_total() -> None:
    sizes = [27_000, 3_000, 1_500]
    shares = client_batch_sizes(sizes, 256)
    assert sum(shares) == 256
    assert all(abs(share - 256 * size / sum(sizes)) < 1 for share, size in zip(shares, sizes))
    assert client_batch_sizes([5, 3], 0) == [5, 3]
    assert client_batch_sizes([1000, 2], 3) == [2, 1]


@pytest.mark.parametrize(("total", "fragment"), [(2, "smaller than the 3 clients"), (10_000, "exceeds")])
def test_impossible_batch_sizes_are_refused(total: int, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        client_batch_sizes([100, 50, 20], total)


def test_local_batch_size_is_the_rounded_fraction_within_one_and_all() -> None:
    assert local_batch_size(600, 0.1) == 60
    assert local_batch_size(5, 0.01) == 1 and local_batch_size(10, 1.0) == 10


def test_client_seeds_differ_per_client_and_per_run_seed() -> None:
    seeds = {client_seed(seed, index) for seed in range(3) for index in range(50)}
    assert len(seeds) == 150


def test_client_size_counts_its_samples() -> None:
    data = ClientData(name="site-a", features=torch.zeros(7, 3), labels=torch.zeros(7, dtype=torch.long))
    assert data.size == 7
