"""The in-process federation's data: from tensors, loaders or arrays, refused when malformed, pooled and sampled."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedfair.core.data import ClientData
from fedfair.core.errors import ConfigError
from fedfair.simulation.federation import (
    Federation,
    federation_from_arrays,
    federation_from_clients,
    history_sample,
)


def client_pair(rows: int, seed: int, features: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, features, generator=generator), torch.randint(0, 3, (rows,), generator=generator)


def batches(pair: tuple[torch.Tensor, torch.Tensor], size: int) -> list[list[torch.Tensor]]:
    """The rows in batches of ``size`` (the last one shorter), each a list as a DataLoader yields it."""
    features, labels = pair
    return [[features[start : start + size], labels[start : start + size]] for start in range(0, len(labels), size)]


def numbered(rows: int, offset: int = 0) -> ClientData:
    """A client whose feature row i is offset + i and whose label is the same number, to trace rows."""
    values = torch.arange(offset, offset + rows)
    return ClientData(f"client-{offset}", values.to(torch.float64).unsqueeze(1), values)


def test_held_out_sets_from_one_shot_batch_generators_equal_the_tensor_pairs() -> None:
    train = [client_pair(7, 0), client_pair(5, 1)]
    test = [client_pair(4, 2), client_pair(3, 3)]
    from_pairs = federation_from_clients(train, test)
    from_batches = federation_from_clients(
        [iter(batches(pair, 3)) for pair in train], [iter(batches(pair, 2)) for pair in test]
    )
    for split in ("train", "test"):
        for mine, theirs in zip(getattr(from_pairs, split), getattr(from_batches, split), strict=True):
            assert mine.name == theirs.name
            assert torch.equal(mine.features, theirs.features) and torch.equal(mine.labels, theirs.labels)
    assert [part.name for part in from_pairs.test] == ["client-0", "client-1"]


def test_names_label_both_splits_and_the_task_shape_comes_from_the_data() -> None:
    images = torch.zeros(4, 1, 2, 3)
    federation = federation_from_clients(
        [(images, torch.tensor([0, 1, 0, 1])), (images, torch.tensor([4, 0, 0, 0]))],
        [(images, torch.tensor([0, 0, 0, 0])), (images, torch.tensor([1, 1, 1, 1]))],
        names=["north", "south"],
    )
    assert [part.name for part in federation.train] == [part.name for part in federation.test] == ["north", "south"]
    assert federation.num_features == 6  # one row's elements, however shaped
    assert federation.num_classes == 5  # the largest training label + 1, though classes 2 and 3 never occur


def test_floating_point_labels_make_one_output() -> None:
    features = torch.zeros(3, 2)
    federation = federation_from_clients([(features, torch.tensor([0.5, 7.0, -1.0]))])
    assert federation.num_classes == 1


@pytest.mark.parametrize(
    ("train", "test", "names", "match"),
    [
        ([], (), None, "no clients given"),
        ([client_pair(3, 0), client_pair(3, 1)], (), ["only-one"], "2 clients need as many names .* got 1 and 0"),
        ([client_pair(3, 0), client_pair(3, 1)], [client_pair(3, 2)], None, "2 clients need as many .* got 2 and 1"),
        ([client_pair(3, 0), []], (), ["a", "b"], "client 'b' has no data"),
        ([(torch.zeros(3), torch.zeros(3))], (), None, r"client 'client-0': features \(3,\) and labels \(3,\)"),
        ([(torch.zeros(3, 2), torch.zeros(4))], (), None, "must have one row per sample"),
        ([client_pair(3, 0)], [(torch.zeros(2, 3), torch.zeros(5))], None, "must have one row per sample"),
    ],
    ids=["no clients", "too few names", "too few test sets", "empty loader", "1-D features", "row counts", "test rows"],
)
def test_malformed_federations_are_refused_with_a_message_naming_the_problem(
    train: list[object], test: list[object], names: list[str] | None, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        federation_from_clients(train, test, names)  # type: ignore[arg-type]


def test_pooled_data_is_every_clients_rows_in_client_order_for_either_split() -> None:
    federation = Federation(
        train=(numbered(3, 0), numbered(2, 10)), test=(numbered(1, 20), numbered(2, 30)), num_features=1, num_classes=40
    )
    train = federation.pooled()
    assert train.name == "pooled" and train.labels.tolist() == [0, 1, 2, 10, 11]
    assert train.features.squeeze(1).tolist() == [0.0, 1.0, 2.0, 10.0, 11.0]
    assert federation.pooled("test").labels.tolist() == [20, 30, 31]
    with pytest.raises(ValueError, match="split must be 'train' or 'test', got 'validation'"):
        federation.pooled("validation")


def test_history_sample_keeps_every_row_up_to_the_limit() -> None:
    federation = Federation((numbered(4, 0), numbered(3, 100)), (), 1, 200)
    sample = history_sample(federation, limit=7)
    assert sample.name == "pooled" and sample.labels.tolist() == [0, 1, 2, 3, 100, 101, 102]


@pytest.mark.parametrize("limit", [2, 5, 10, 99])
def test_history_sample_of_large_data_is_an_even_spread_from_the_first_row_to_the_last(limit: int) -> None:
    federation = Federation((numbered(60, 0), numbered(40, 1000)), (), 1, 2000)
    pooled = federation.pooled()
    sample = history_sample(federation, limit=limit)
    assert sample.name == "pooled-sample" and sample.size == limit
    rows = [pooled.labels.tolist().index(label) for label in sample.labels.tolist()]
    assert rows[0] == 0 and rows[-1] == pooled.size - 1
    gaps = np.diff(rows)
    assert gaps.min() >= 1 and gaps.max() - gaps.min() <= 1  # distinct rows, as evenly spaced as integers allow
    assert torch.equal(sample.features.squeeze(1), sample.labels.to(torch.float64))  # rows stay whole


def test_arrays_become_contiguous_tensors_with_long_labels_and_the_first_clients_width() -> None:
    features = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]  # a non-contiguous view, 2 columns
    labels = np.array([0, 1, 1], dtype=np.int32)
    federation = federation_from_arrays(["a", "b"], [(features, labels)] * 2, [(features, labels)] * 2, 2, (1, 2))
    part = federation.train[0]
    assert part.features.is_contiguous() and part.features.tolist() == features.tolist()
    assert part.labels.dtype == torch.long and part.labels.tolist() == [0, 1, 1]
    assert (federation.num_features, federation.num_classes, federation.image_shape) == (2, 2, (1, 2))
    assert [part.name for part in federation.test] == ["a", "b"]
    with pytest.raises(ValueError):
        federation_from_arrays(["a"], [(features, labels)] * 2, [(features, labels)] * 2, 2)
