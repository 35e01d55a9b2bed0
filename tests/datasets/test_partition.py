"""Partitions into clients are exact covers, repeat for a seed, and explain bad requests."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ConfigError
from fedfair.datasets import ClientSplit, Dataset, partition
from tests.datasets.helpers import assert_exact_cover


def same_partition(first: list[ClientSplit], second: list[ClientSplit]) -> bool:
    return all(
        a.name == b.name and np.array_equal(a.train_index, b.train_index) and np.array_equal(a.test_index, b.test_index)
        for a, b in zip(first, second, strict=True)
    )


def test_race_partition_gives_white_black_other_like_the_paper(adult: Dataset) -> None:
    clients = partition(adult, "race", 3)
    assert [client.name for client in clients] == ["White", "Black", "Other"]
    assert_exact_cover(adult, clients)
    race = adult.attributes_train["race"]
    assert np.all(race[clients[1].train_index] == "Black")
    assert set(race[clients[2].train_index]) == {"Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"}
    assert all(len(client.test_index) > 0 for client in clients)


def test_column_partition_with_one_client_per_group(adult: Dataset) -> None:
    clients = partition(adult, "sex", 2)
    assert [client.name for client in clients] == ["Male", "Female"]
    assert_exact_cover(adult, clients)


@pytest.mark.parametrize(("scheme", "num_clients"), [("iid", 7), ("dirichlet", 5), ("class", 2)])
def test_partitions_cover_every_row_once_and_repeat_for_a_seed(adult: Dataset, scheme: str, num_clients: int) -> None:
    clients = partition(adult, scheme, num_clients, seed=3)
    assert len(clients) == num_clients
    assert_exact_cover(adult, clients)
    assert same_partition(clients, partition(adult, scheme, num_clients, seed=3))
    if scheme != "class":
        assert not same_partition(clients, partition(adult, scheme, num_clients, seed=4))


def test_dirichlet_skews_labels_and_leaves_no_client_empty(adult: Dataset) -> None:
    clients = partition(adult, "dirichlet", 40, alpha=0.05)
    assert_exact_cover(adult, clients)
    assert all(len(client.train_index) > 0 and len(client.test_index) > 0 for client in clients)
    positive_shares = [adult.y_train[client.train_index].mean() for client in clients]
    assert max(positive_shares) - min(positive_shares) > 0.5


def test_dirichlet_test_rows_follow_the_clients_training_label_mix(adult: Dataset) -> None:
    for client in partition(adult, "dirichlet", 4, alpha=0.3, seed=1):
        train_share = adult.y_train[client.train_index].mean()
        test_share = adult.y_test[client.test_index].mean()
        assert abs(train_share - test_share) < 0.05


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.integers(0, 3), min_size=8, max_size=120),
    groups=st.lists(st.sampled_from(["a", "b", "c", "Other", "d"]), min_size=120, max_size=120),
    num_clients=st.integers(1, 4),
    scheme=st.sampled_from(["iid", "dirichlet", "group"]),
    alpha=st.floats(0.01, 100.0),
    seed=st.integers(0, 2**16),
)
def test_any_partition_covers_every_row_once(
    labels: list[int], groups: list[str], num_clients: int, scheme: str, alpha: float, seed: int
) -> None:
    y = np.array(labels, dtype=np.int64)
    half = len(y) // 2
    group = np.array(groups[: len(y)])
    dataset = Dataset(
        name="synthetic",
        x_train=np.zeros((half, 1), dtype=np.float32),
        y_train=y[:half],
        x_test=np.zeros((len(y) - half, 1), dtype=np.float32),
        y_test=y[half:],
        num_classes=4,
        feature_names=["x"],
        class_names=["0", "1", "2", "3"],
        attributes_train={"group": group[:half]},
        attributes_test={"group": group[half:]},
    )
    try:
        clients = partition(dataset, scheme, num_clients, seed=seed, alpha=alpha)
    except ConfigError:
        # Only a group split can be impossible: more clients than groups, or a test-only group.
        assert scheme == "group"
        return
    assert len(clients) == num_clients
    assert_exact_cover(dataset, clients)
    assert all(len(client.train_index) > 0 for client in clients)


def test_iid_clients_are_near_equal(adult: Dataset) -> None:
    sizes = [len(client.train_index) for client in partition(adult, "iid", 7)]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(
    ("scheme", "num_clients", "kwargs", "message"),
    [
        ("race2", 3, {}, (r"unknown partition scheme 'race2' for adult; use one of: iid, dirichlet, class, "
                          r"or a column: race, sex, native-country")),
        ("class", 3, {}, r"needs 2 clients for adult, not 3; use 'dirichlet'"),
        ("sex", 3, {}, r"column 'sex' has only 2 groups \(Female, Male\); use at most 2 clients"),
        ("dirichlet", 3, {"alpha": 0.0}, r"dirichlet alpha must be positive"),
        ("iid", 0, {}, r"number of clients must be a positive integer"),
        ("iid", 20_000, {}, r"20000 clients is more than adult's 32,561 train / 16,281 test rows"),
    ],
)  # fmt: skip
def test_bad_partition_requests_are_explained(
    adult: Dataset, scheme: str, num_clients: int, kwargs: dict, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        partition(adult, scheme, num_clients, **kwargs)
    assert "\n" not in str(raised.value)
