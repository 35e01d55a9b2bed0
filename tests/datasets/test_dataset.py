"""The in-memory dataset: a mis-assembled one is refused naming the split and the array, and describe() sums it up."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.datasets.dataset import Dataset


def small(**changes: Any) -> Dataset:
    """Five training and three test rows of two features, two classes and a 'site' column, with `changes` applied."""
    fields: dict[str, Any] = {
        "name": "toy",
        "x_train": np.zeros((5, 2), dtype=np.float32),
        "y_train": np.array([0, 1, 1, 0, 1], dtype=np.int64),
        "x_test": np.ones((3, 2), dtype=np.float32),
        "y_test": np.array([1, 0, 1], dtype=np.int64),
        "num_classes": 2,
        "feature_names": ["age", "dose"],
        "class_names": ["no", "yes"],
        "attributes_train": {"site": np.array(["a", "b", "b", "c", "b"])},
        "attributes_test": {"site": np.array(["a", "a", "c"])},
    }
    return Dataset(**{**fields, **changes})


def test_a_well_formed_dataset_builds_and_counts_its_features() -> None:
    assert small().num_features == 2
    wider = small(
        x_train=np.zeros((5, 3), dtype=np.float32),
        x_test=np.zeros((3, 3), dtype=np.float32),
        feature_names=["a", "b", "c"],
    )
    assert wider.num_features == 3


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"x_train": np.zeros((5, 2), dtype=np.float64)}, "toy: x_train must be float32 [n, 2]"),
        ({"x_test": np.zeros(3, dtype=np.float32)}, "toy: x_test must be float32 [n, 2]"),
        ({"x_test": np.zeros((3, 4), dtype=np.float32)}, "toy: x_test must be float32 [n, 2]"),
        ({"feature_names": ["age"]}, "toy: x_train must be float32 [n, 1]"),
        ({"y_train": np.zeros(5, dtype=np.int32)}, "toy: y_train must be int64 with one entry per row"),
        ({"y_test": np.zeros(4, dtype=np.int64)}, "toy: y_test must be int64 with one entry per row"),
        ({"y_test": np.zeros((3, 1), dtype=np.int64)}, "toy: y_test must be int64 with one entry per row"),
        ({"attributes_train": {"site": np.array(["a"] * 4)}}, "toy: every train attribute needs one entry per row"),
        (
            {"attributes_test": {"site": np.array(["a"] * 3), "sex": np.array(["f"] * 2)}},
            "toy: every test attribute needs one entry per row",
        ),
        ({"class_names": ["no", "yes", "maybe"]}, "toy: class_names must have num_classes entries"),
    ],
)
def test_a_mis_assembled_dataset_is_refused_naming_the_dataset_split_and_array(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        small(**changes)


def test_an_empty_split_is_well_formed_and_describes_without_dividing_by_zero() -> None:
    empty = small(
        x_train=np.zeros((0, 2), dtype=np.float32),
        y_train=np.zeros(0, dtype=np.int64),
        attributes_train={"site": np.array([], dtype=str)},
    )
    lines = empty.describe().splitlines()
    assert lines[0] == "toy: 0 train / 3 test rows, 2 features, 2 classes"
    assert lines[1] == "  train labels: no 0.0%, yes 0.0%"


def test_datasets_compare_by_identity_since_arrays_have_no_single_truth_value() -> None:
    first, second = small(), small()
    assert first == first and first != second
    assert len({first, second}) == 2


def test_describe_gives_sizes_label_shares_and_groups_largest_first() -> None:
    rows = 1234
    dataset = small(
        x_train=np.zeros((rows, 2), dtype=np.float32),
        y_train=np.array([0] * 925 + [1] * 309, dtype=np.int64),
        attributes_train={"site": np.array(["b"] * 600 + ["a"] * 600 + ["c"] * 34)},
        image_shape=(1, 1, 2),
    )
    assert dataset.describe().splitlines() == [
        "toy: 1,234 train / 3 test rows, 2 features, 2 classes, images 1x1x2",
        "  train labels: no 75.0%, yes 25.0%",  # 925 / 1234 = 74.96%, 309 / 1234 = 25.04%
        "  site: a 600, b 600, c 34",  # a tie keeps the groups' sorted order
    ]


@settings(max_examples=40, deadline=None)
@given(sites=st.lists(st.sampled_from("abcdefghijkl"), min_size=1, max_size=60))
def test_describe_lists_at_most_eight_groups_by_falling_count_and_says_how_many_it_left_out(sites: list[str]) -> None:
    n = len(sites)
    dataset = small(
        x_train=np.zeros((n, 2), dtype=np.float32),
        y_train=np.zeros(n, dtype=np.int64),
        attributes_train={"site": np.array(sites)},
    )
    line = dataset.describe().splitlines()[2]
    assert line.startswith("  site: ")
    listed, _, rest = line.removeprefix("  site: ").partition(", ...")
    pairs = [entry.split(" ") for entry in listed.split(", ")]
    counts = [int(count) for _, count in pairs]
    groups = len(set(sites))
    assert len(pairs) == min(groups, 8)
    assert counts == sorted(counts, reverse=True)
    assert all(sites.count(group) == count for group, count in zip([group for group, _ in pairs], counts))
    if groups > 8:
        assert rest == f" ({groups} groups)"
    else:
        assert rest == "" and sum(counts) == n
