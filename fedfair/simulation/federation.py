"""The in-process engine's data: K collaborators' tensors in one process, no network.

`Federation` holds each collaborator's training and held-out rows; the caller's own data
comes as tensor pairs or DataLoader-like iterables of (features, labels) batches
(`federation_from_clients`), a partition of a built-in dataset as numpy arrays
(`federation_from_arrays`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedfair.core.data import ClientData
from fedfair.core.errors import ConfigError

DTYPES = {"float32": torch.float32, "float64": torch.float64}
"""The precisions a federation's model and data may train in, by name."""

ModelFactory = Callable[[], nn.Module]
"""Builds a fresh model; called under the training seed for the template and for each collaborator."""

Batches = tuple[torch.Tensor, torch.Tensor] | Iterable[Sequence[torch.Tensor]]
"""One collaborator's data: a (features, labels) pair, or an iterable of such batches (a DataLoader)."""


@dataclass(frozen=True)
class Federation:
    """The collaborators' training data and held-out data, plus the task's shape."""

    train: tuple[ClientData, ...]
    test: tuple[ClientData, ...]
    num_features: int
    num_classes: int
    image_shape: tuple[int, ...] | None = None

    def pooled(self, split: str = "train") -> ClientData:
        """All collaborators' data in one place: only the centralized yardsticks use this."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got '{split}'")
        parts = self.train if split == "train" else self.test
        return ClientData(
            name="pooled",
            features=torch.cat([part.features for part in parts]),
            labels=torch.cat([part.labels for part in parts]),
        )


def federation_from_arrays(
    names: Sequence[str],
    train: Sequence[tuple[np.ndarray, np.ndarray]],
    test: Sequence[tuple[np.ndarray, np.ndarray]],
    num_classes: int,
    image_shape: tuple[int, ...] | None = None,
) -> Federation:
    """Wrap per-client numpy arrays (features, labels) as a Federation."""

    def wrap(name: str, arrays: tuple[np.ndarray, np.ndarray]) -> ClientData:
        features, labels = arrays
        return ClientData(name, torch.from_numpy(np.ascontiguousarray(features)), torch.from_numpy(labels).long())

    train_parts = tuple(wrap(name, arrays) for name, arrays in zip(names, train, strict=True))
    test_parts = tuple(wrap(name, arrays) for name, arrays in zip(names, test, strict=True))
    return Federation(train_parts, test_parts, int(train[0][0].shape[1]), num_classes, image_shape)


def client_tensors(name: str, data: Batches) -> ClientData:
    """A collaborator's data as one pair of tensors: a pair as given, or a loader's batches joined.

    The federation draws its own mini-batches (b_k proportional to n_k, seeded per
    collaborator, as the real process does), so a loader only delivers the rows once.
    """
    features: torch.Tensor
    labels: torch.Tensor
    if isinstance(data, tuple) and len(data) == 2 and all(isinstance(part, torch.Tensor) for part in data):
        features, labels = torch.as_tensor(data[0]), torch.as_tensor(data[1])
    else:
        feature_parts: list[torch.Tensor] = []
        label_parts: list[torch.Tensor] = []
        for batch in data:
            if len(batch) != 2:
                raise ConfigError(
                    f"client '{name}': a data batch has {len(batch)} parts; yield (features, labels) pairs"
                )
            feature_parts.append(torch.as_tensor(batch[0]))
            label_parts.append(torch.as_tensor(batch[1]))
        if not feature_parts:
            raise ConfigError(f"client '{name}' has no data; give every client at least one batch")
        features, labels = torch.cat(feature_parts), torch.cat(label_parts)
    if features.dim() < 2 or features.shape[0] != labels.shape[0]:
        raise ConfigError(
            f"client '{name}': features {tuple(features.shape)} and labels {tuple(labels.shape)} must have one row "
            "per sample (features [n, ...], labels [n])"
        )
    return ClientData(name, features, labels)


def federation_from_clients(
    train: Sequence[Batches], test: Sequence[Batches] = (), names: Sequence[str] | None = None
) -> Federation:
    """A Federation of the caller's own tensors or loaders, one entry per collaborator.

    Class labels (integers) give num_classes = largest label + 1, which only the built-in
    models use; a model factory decides its own outputs.
    """
    if not train:
        raise ConfigError("no clients given; pass one (features, labels) pair or loader per collaborator")
    names = list(names) if names is not None else [f"client-{index}" for index in range(len(train))]
    if len(names) != len(train) or (test and len(test) != len(train)):
        raise ConfigError(
            f"{len(train)} clients need as many names and held-out sets; got {len(names)} and {len(test)}"
        )
    train_parts = tuple(client_tensors(name, data) for name, data in zip(names, train))
    test_parts = tuple(client_tensors(name, data) for name, data in zip(names, test))
    labels = torch.cat([part.labels for part in train_parts])
    num_classes = int(labels.max()) + 1 if not labels.is_floating_point() else 1
    return Federation(train_parts, test_parts, int(train_parts[0].features[0].numel()), num_classes)


HISTORY_ROWS = 20_000


def history_sample(federation: Federation, limit: int = HISTORY_ROWS) -> ClientData:
    """The pooled training rows the per-round history is measured on.

    All of them, or an even spread of `limit` rows for large data, so recording does not dominate the run (the
    final report always uses every row).
    """
    pooled = federation.pooled("train")
    if pooled.size <= limit:
        return pooled
    rows = torch.linspace(0, pooled.size - 1, limit).long()
    return ClientData(name="pooled-sample", features=pooled.features[rows], labels=pooled.labels[rows])
