"""One institution's data and learner: what the collaborator process trains with.

The collaborator builds client i's learner exactly as `simulation.make_learners`
builds it (same model seed, same sampler seed seed * 1_000_003 + i, b_k =
round(batch_fraction * n_k)), which is what makes a federation of processes follow
the in-process simulation step for step.

The privacy hook lives here too: a `TrainerFactory` turns the plain `LocalLearner`
into what trains each round; the default, :func:`round_trainer`, wraps it in
`fedfair.privacy.learner.PrivateLearner` when the institution's `[privacy]` says so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fedfair.core.data import ClientData, client_seed, local_batch_size
from fedfair.core.errors import ConfigError
from fedfair.core.local import LocalLearner, RoundTrainer
from fedfair.core.objective import RCVaRThreshold
from fedfair.datasets import DATASETS, load_csv, load_dataset, partition
from fedfair.privacy.accounting import PrivacyAccountant
from fedfair.privacy.learner import PrivateLearner
from fedfair.runtime.collaborator.config import CollaboratorConfig
from fedfair.runtime.plan import SharedSettings

TrainerFactory = Callable[[LocalLearner, CollaboratorConfig, SharedSettings], RoundTrainer]
"""The privacy hook: (learner, this collaborator's config, the plan's settings) -> the round trainer."""


@dataclass(frozen=True)
class LocalData:
    """This institution's training and held-out rows, and its index among the plan's clients."""

    train: ClientData
    test: ClientData
    seed_index: int
    num_classes: int
    image_shape: tuple[int, ...] | None


def name_seed_index(name: str) -> int:
    """A stable client index for a CSV institution, which has no partition index (from its name)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")


def load_local_data(config: CollaboratorConfig, shared: SharedSettings) -> LocalData:
    """This institution's data: part `index` of a named dataset's partition, or its own table."""
    source = config.data

    def rows(features: np.ndarray, labels: np.ndarray, split: str) -> ClientData:
        return ClientData(
            f"{config.name}-{split}", torch.from_numpy(np.ascontiguousarray(features)), torch.from_numpy(labels).long()
        )

    if source.dataset is not None:
        dataset = load_dataset(source.dataset)
        info = DATASETS.get(source.dataset)
        scheme = source.partition or (info.default_partition if info is not None else "iid")
        parts = source.parts or shared.collaborator_count
        splits = partition(dataset, scheme, parts, seed=shared.training.seed, alpha=source.alpha or 0.5)
        index = source.index if source.index is not None else 0
        if index >= len(splits):
            raise ConfigError(f"{config.source}: [data] index = {index} but the partition has {len(splits)} parts")
        split = splits[index]
        train = rows(dataset.x_train[split.train_index], dataset.y_train[split.train_index], "train")
        test = rows(dataset.x_test[split.test_index], dataset.y_test[split.test_index], "test")
        seed_index = index
    else:
        if source.csv is None or source.label is None:
            raise ConfigError(f"{config.source}: [data] needs csv and label")
        dataset = load_csv(
            source.csv,
            source.label,
            split_by=source.group,
            features=list(source.features) if source.features else None,
            seed=shared.training.seed,
        )
        train = rows(dataset.x_train, dataset.y_train, "train")
        test = rows(dataset.x_test, dataset.y_test, "test")
        seed_index = name_seed_index(config.name)
    if dataset.num_features != shared.model.features or dataset.num_classes != shared.model.classes:
        raise ConfigError(
            f"{config.source}: this institution's data has {dataset.num_features} features and "
            f"{dataset.num_classes} classes, but the plan's model takes {shared.model.features} and "
            f"{shared.model.classes}; align the data's columns with the plan (or the plan's [model])"
        )
    return LocalData(train, test, seed_index, dataset.num_classes, dataset.image_shape)


def build_learner(data: LocalData, shared: SharedSettings, device: torch.device) -> LocalLearner:
    """Client `data.seed_index`'s LocalLearner, built as `simulation.make_learners` builds it.

    The model comes from the plan's seed (so theta_0 is the aggregator's), the sampler
    seed is `core.data.client_seed(seed, index)`, and b_k = round(batch_fraction * n_k).
    """
    training = shared.training
    return LocalLearner(
        shared.model.build(seed=training.seed).to(device),
        data.train.features,
        data.train.labels,
        local_batch_size(data.train.size, training.batch_fraction),
        training.local_config(),
        threshold=RCVaRThreshold(shared.objective).to(device),
        seed=client_seed(training.seed, data.seed_index),
    )


def round_trainer(learner: LocalLearner, config: CollaboratorConfig, shared: SharedSettings) -> RoundTrainer:
    """The privacy hook's default: the plain learner, or DP-SGD when `[privacy] enabled = true`.

    DP-SGD comes from `fedfair.privacy`; its accountant persists beside this config
    (NAME.privacy.json), so a restarted collaborator remembers what it has spent.
    """
    if not config.privacy.enabled:
        return learner
    accountant = PrivacyAccountant(config.source.parent / f"{config.name}.privacy.json")
    return PrivateLearner(
        learner, config.privacy, accountant=accountant, planned_rounds=shared.training.rounds, name=config.name
    )
