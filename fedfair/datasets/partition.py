"""Splitting one Dataset into federated clients (institutions), each with its own train and test rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.datasets.dataset import Dataset

OTHER = "Other"
SCHEMES = ("iid", "dirichlet", "class")


@dataclass(frozen=True, eq=False)
class ClientSplit:
    """One client's rows: sorted int64 indices into the dataset's train and test arrays."""

    name: str
    train_index: np.ndarray
    test_index: np.ndarray


def partition(
    dataset: Dataset, scheme: str, num_clients: int, *, seed: int = 0, alpha: float = 0.5
) -> list[ClientSplit]:
    """Split ``dataset`` into ``num_clients`` clients; every train and test row goes to exactly one client.

    ``scheme`` is one of:

    - an attribute column (e.g. "race", "sex", "site"): one client per group, the
      ``num_clients - 1`` largest groups (by training rows) each on their own and the
      rest merged into "Other" (a group itself called "Other" always joins it), as
      the paper splits race into White / Black / Other. Test rows follow their group.
    - "class": one class per client; needs ``num_clients == num_classes``.
    - "dirichlet": label skew; each class is divided among the clients in proportions
      drawn from Dirichlet(``alpha``) (smaller alpha, more skew). A client's test rows
      use its training proportions, so its held-out data looks like its own data.
      Every client gets at least one row of each split.
    - "iid": a uniformly random, near-equal split of each of train and test.

    The result is the same for the same dataset, scheme, clients, seed and alpha.
    """
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
        raise ConfigError(f"number of clients must be a positive integer, got {num_clients!r}")
    if num_clients > len(dataset.y_train) or num_clients > len(dataset.y_test):
        raise ConfigError(
            f"{num_clients} clients is more than {dataset.name}'s {len(dataset.y_train):,} train / "
            f"{len(dataset.y_test):,} test rows; use fewer clients"
        )
    if scheme in dataset.attributes_train:
        return _by_column(dataset, scheme, num_clients)
    if scheme == "class":
        return _by_class(dataset, num_clients)
    if scheme == "dirichlet":
        if not alpha > 0:
            raise ConfigError(f"dirichlet alpha must be positive, got {alpha}; try 0.5 (skewed) or 100 (near iid)")
        return _dirichlet(dataset, num_clients, np.random.default_rng(seed), alpha)
    if scheme == "iid":
        return _iid(dataset, num_clients, np.random.default_rng(seed))
    columns = list(dataset.attributes_train)
    raise ConfigError(
        f"unknown partition scheme {scheme!r} for {dataset.name}; use one of: {', '.join(SCHEMES)}"
        + (f", or a column: {', '.join(columns)}" if columns else " (it has no group columns)")
    )


def _by_column(dataset: Dataset, column: str, num_clients: int) -> list[ClientSplit]:
    train_values = dataset.attributes_train[column]
    test_values = dataset.attributes_test[column]
    groups, counts = np.unique(train_values, return_counts=True)
    if num_clients > len(groups):
        raise ConfigError(
            f"column {column!r} has only {len(groups)} groups ({', '.join(groups)}); "
            f"use at most {len(groups)} clients or another scheme"
        )
    # Largest groups first; ties broken by name so the order never depends on the data's order.
    by_size = sorted(zip(groups.tolist(), counts.tolist()), key=lambda item: (-item[1], item[0]))
    if num_clients == len(groups):
        own = [group for group, _ in by_size]
    else:
        own = [group for group, _ in by_size if group != OTHER][: num_clients - 1]
    unplaced = np.setdiff1d(np.unique(test_values), own)
    if num_clients == len(groups) and len(unplaced):
        raise ConfigError(
            f"column {column!r} value {unplaced[0]!r} appears only in the test split, so no client owns it; "
            f"use fewer than {num_clients} clients so it joins {OTHER!r}"
        )
    clients = [
        ClientSplit(group, np.flatnonzero(train_values == group), np.flatnonzero(test_values == group)) for group in own
    ]
    if num_clients < len(groups):
        clients.append(
            ClientSplit(OTHER, np.flatnonzero(~np.isin(train_values, own)), np.flatnonzero(~np.isin(test_values, own)))
        )
    return clients


def _by_class(dataset: Dataset, num_clients: int) -> list[ClientSplit]:
    if num_clients != dataset.num_classes:
        raise ConfigError(
            f"scheme 'class' gives each client one class, so it needs {dataset.num_classes} clients for "
            f"{dataset.name}, not {num_clients}; use 'dirichlet' for label skew with other client counts"
        )
    return [
        ClientSplit(f"class {name}", np.flatnonzero(dataset.y_train == label), np.flatnonzero(dataset.y_test == label))
        for label, name in enumerate(dataset.class_names)
    ]


def _dirichlet(dataset: Dataset, num_clients: int, rng: np.random.Generator, alpha: float) -> list[ClientSplit]:
    shares = rng.dirichlet(np.full(num_clients, alpha), size=dataset.num_classes)
    owners = [_deal_by_shares(labels, shares, rng) for labels in (dataset.y_train, dataset.y_test)]
    return [
        ClientSplit(f"client {k}", np.flatnonzero(owners[0] == k), np.flatnonzero(owners[1] == k))
        for k in range(num_clients)
    ]


def _deal_by_shares(labels: np.ndarray, shares: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The client of each row: each class's rows, shuffled, cut in the class's Dirichlet proportions.

    A client left with no rows takes one from the client holding the most, so no
    client is empty (``partition`` has checked there are enough rows).
    """
    num_clients = shares.shape[1]
    owner = np.empty(len(labels), dtype=np.int64)
    for label, class_shares in enumerate(shares):
        rows = rng.permutation(np.flatnonzero(labels == label))
        cuts = np.round(np.cumsum(class_shares)[:-1] * len(rows)).astype(np.int64)
        for client, part in enumerate(np.split(rows, cuts)):
            owner[part] = client
    sizes = np.bincount(owner, minlength=num_clients)
    for empty in np.flatnonzero(sizes == 0):
        donor = int(np.argmax(sizes))
        owner[rng.choice(np.flatnonzero(owner == donor))] = empty
        sizes[donor] -= 1
        sizes[empty] += 1
    return owner


def _iid(dataset: Dataset, num_clients: int, rng: np.random.Generator) -> list[ClientSplit]:
    parts = [np.array_split(rng.permutation(len(y)), num_clients) for y in (dataset.y_train, dataset.y_test)]
    return [
        ClientSplit(f"client {k}", np.sort(parts[0][k]).astype(np.int64), np.sort(parts[1][k]).astype(np.int64))
        for k in range(num_clients)
    ]
