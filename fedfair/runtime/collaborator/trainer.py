"""One institution's data and learner: what the collaborator process trains with.

The collaborator builds client i's learner exactly as `simulation.make_learners`
builds it (same model seed, same sampler seed seed * 1_000_003 + i, b_k =
round(batch_fraction * n_k)), which is what makes a federation of processes follow
the in-process simulation step for step.

Data is read in two steps: :func:`read_local_data` before the collaborator dials the
aggregator (a wrong path or an unusable file stops it at once, aggregator up or
not), then :func:`load_local_data` cuts this institution's part once the plan is known.

Why: docs/design.md, "Inside the collaborator".
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from fedfair.core.data import ClientData, client_seed
from fedfair.core.errors import ConfigError, PermanentFailureError
from fedfair.core.local import LocalLearner, RoundTrainer
from fedfair.core.objective import RCVaRThreshold
from fedfair.datasets import DATASETS, Dataset, load_csv, load_dataset, partition
from fedfair.datasets.agreement import batch_shortfall, recoded, site_problems, site_warnings
from fedfair.datasets.encoder import Encoder
from fedfair.datasets.values import check_table
from fedfair.datasets.tabular import as_strings, read_table, split_rows
from fedfair.pki.roster import canonical_json
from fedfair.runtime.collaborator.config import CollaboratorConfig
from fedfair.runtime.composition_counts import CompositionColumn, held_out_levels
from fedfair.runtime.failures import DATA_MISMATCH, LOCAL_DATA
from fedfair.runtime.plan.aggregator_plan import SharedSettings, load_shared_settings
from fedfair.runtime.plan.influence import declared_batch
from fedfair.runtime.plan.privacy import training_privacy

logger = logging.getLogger("fedfair.collaborator")

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
    held_out_levels: np.ndarray | None = None
    """Under a [schema] with [evaluation] composition: each held-out row's level in each composition
    column (`fedfair.runtime.composition_counts.held_out_levels`), rows in the order of `test`."""


def name_seed_index(name: str) -> int:
    """A stable client index for a CSV institution, which has no partition index (from its name)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")


@dataclass(frozen=True)
class LocalTable:
    """This institution's data as read before connecting: a named dataset whole, or a table as it is."""

    dataset: Dataset | None
    raw: pd.DataFrame | None


def read_local_data(config: CollaboratorConfig) -> LocalTable:
    """Read this institution's data before connecting; any problem is a permanent `local-data` failure.

    A named dataset is loaded whole (its partition needs the plan); a table is read as it
    is (a missing file, an unreadable one or one without data rows stops here), and is
    encoded once the plan says how: by its [schema] or, without one, column by column.
    """
    source = config.data
    try:
        if source.dataset is not None:
            return LocalTable(load_dataset(source.dataset), None)
        if source.csv is None:
            raise ConfigError("[data] needs csv or dataset")
        # Mapped as it is read, so that every check and the encoder see the plan's values.
        return LocalTable(None, recoded(read_table(source.csv), source.recode, source.csv.name))
    except ConfigError as error:
        raise PermanentFailureError(LOCAL_DATA, reason=error, config=config.source) from None
    except (OSError, IndexError, ValueError) as error:  # an unreadable file, whatever the loader met
        raise PermanentFailureError(
            LOCAL_DATA, reason=f"{type(error).__name__}: {error}", config=config.source
        ) from None


def _read_csv(config: CollaboratorConfig, seed: int) -> Dataset:
    """A table encoded on its own (plans without a [schema]): load_csv's one-hot and scaling."""
    source = config.data
    if source.csv is None or source.label is None:
        raise PermanentFailureError(
            LOCAL_DATA, reason="[data] label is needed when the plan has no [schema]", config=config.source
        )
    try:
        return load_csv(
            source.csv,
            source.label,
            split_by=source.group,
            features=list(source.features) if source.features else None,
            test_fraction=source.test_fraction,
            seed=seed,
        )
    except ConfigError as error:
        raise PermanentFailureError(LOCAL_DATA, reason=error, config=config.source) from None


@dataclass(frozen=True)
class SchemaTable:
    """This institution's table checked against the plan's [schema], split into train and held-out rows."""

    train: pd.DataFrame
    test: pd.DataFrame
    source: str


def check_schema_table(
    config: CollaboratorConfig, shared: SharedSettings, table: LocalTable, *, warn: bool = False
) -> SchemaTable:
    """Check the table against the plan's [schema] and split it with the plan's seed.

    The split is within each group when [data] group is set. Besides its cells, the table as a whole
    (:mod:`fedfair.datasets.agreement`): a feature column empty in every row and too few training rows
    for the plan's batch are refused; a label of one class is logged as a warning with `warn` (a collaborator's own check, once; a re-read of a
    table already checked, as `fedfair launch`'s baseline does after its rehearsal warned, says nothing).

    Raises:
        PermanentFailureError: ``data-mismatch``, naming the column and the fix.
    """
    schema = shared.schema
    source = config.data
    assert schema is not None
    if table.raw is None or source.csv is None:
        raise PermanentFailureError(
            DATA_MISMATCH, reason="the plan has a [schema], so [data] must name this institution's csv table"
        )
    raw = table.raw
    raw.columns = [str(name) for name in raw.columns]
    try:
        check_table(schema, raw, source.csv.name)
        whole = site_problems(schema, raw)
        if whole:
            raise ConfigError(f"{source.csv.name}: {'; '.join(whole)}")
        if source.group is not None and source.group not in raw.columns:
            raise ConfigError(f"[data] group column {source.group!r} is not in {source.csv.name}; fix [data] group")
    except ConfigError as error:
        raise PermanentFailureError(DATA_MISMATCH, reason=error) from None
    groups = as_strings(raw[source.group]) if source.group is not None else np.zeros(len(raw), dtype=str)
    train_rows, test_rows = split_rows(groups, source.test_fraction, shared.training.seed)
    if len(train_rows) == 0 or len(test_rows) == 0:
        raise PermanentFailureError(
            LOCAL_DATA,
            reason=f"{source.csv.name} has {len(raw)} rows, too few for train and held-out rows",
            config=config.source,
        )
    # A size the plan declares fixes the batch itself (and DP-SGD checks it against the rows held).
    short = (
        None
        if config.name in shared.influence.sizes
        else batch_shortfall(len(train_rows), shared.batch_fraction, source.test_fraction)
    )
    if short is not None:
        raise PermanentFailureError(DATA_MISMATCH, reason=f"{source.csv.name}: {short}")
    for warning in site_warnings(schema, raw) if warn else []:
        logger.warning("%s: %s: %s", config.name, source.csv.name, warning)
    return SchemaTable(raw.iloc[train_rows], raw.iloc[test_rows], source.csv.name)


def check_pinned_table(config: CollaboratorConfig, table: LocalTable) -> None:
    """Before any connection.

    This institution's table checked against the [schema] of the plan its manifest pins, every problem named at
    once (a permanent `data-mismatch`).

    Without a pinned plan, or with one that has no [schema], there is nothing to check yet: the
    aggregator's plan says how the table is read, and it is checked when that plan arrives.
    """
    pin = config.manifest.plan if config.manifest is not None else None
    if pin is None or table.raw is None:
        return
    try:
        shared = load_shared_settings(canonical_json(pin.settings), source="the manifest's pinned plan")
    except ConfigError:
        return  # an unreadable pin is reported when the aggregator's plan is checked against it
    if shared.schema is not None:
        check_schema_table(config, shared, table, warn=True)


def encoded_data(
    config: CollaboratorConfig, table: SchemaTable, encoder: Encoder, composition: Sequence[CompositionColumn] = ()
) -> LocalData:
    """The checked table encoded with the federation's encoder (the same statistics at every site).

    The held-out rows keep their levels in the plan's `composition` columns when it names any.
    """
    parts = []
    for split, rows in (("train", table.train), ("test", table.test)):
        features, labels = encoder.encode(rows, table.source)
        assert labels is not None  # check_schema_table required the label column
        parts.append(ClientData(f"{config.name}-{split}", torch.from_numpy(features), torch.from_numpy(labels).long()))
    levels = held_out_levels(encoder.schema, composition, table.test, table.source) if composition else None
    return LocalData(parts[0], parts[1], name_seed_index(config.name), len(encoder.class_names), None, levels)


def load_local_data(config: CollaboratorConfig, shared: SharedSettings, table: LocalTable | None = None) -> LocalData:
    """This institution's data without a [schema].

    Part `index` of a named dataset's partition, or its own table encoded column by column.

    `table` is what :func:`read_local_data` read before connecting (read here when not given).
    A part that the plan cannot use is a permanent `data-mismatch` failure.
    """
    source = config.data
    table = table if table is not None else read_local_data(config)

    def rows(features: np.ndarray, labels: np.ndarray, split: str) -> ClientData:
        return ClientData(
            f"{config.name}-{split}", torch.from_numpy(np.ascontiguousarray(features)), torch.from_numpy(labels).long()
        )

    if table.dataset is not None:
        dataset = table.dataset
        info = DATASETS.get(source.dataset or "")
        scheme = source.partition or (info.default_partition if info is not None else "iid")
        parts = source.parts or shared.collaborator_count
        splits = partition(dataset, scheme, parts, seed=shared.training.seed, alpha=source.alpha or 0.5)
        index = source.index if source.index is not None else 0
        if index >= len(splits):
            raise PermanentFailureError(
                DATA_MISMATCH,
                reason=f"{config.source}: [data] index = {index} but the partition has {len(splits)} parts",
            )
        split = splits[index]
        train = rows(dataset.x_train[split.train_index], dataset.y_train[split.train_index], "train")
        test = rows(dataset.x_test[split.test_index], dataset.y_test[split.test_index], "test")
        seed_index = index
    else:
        dataset = _read_csv(config, shared.training.seed)
        train = rows(dataset.x_train, dataset.y_train, "train")
        test = rows(dataset.x_test, dataset.y_test, "test")
        seed_index = name_seed_index(config.name)
    if dataset.num_features != shared.model.features or dataset.num_classes != shared.model.classes:
        raise PermanentFailureError(
            DATA_MISMATCH,
            reason=f"it has {dataset.num_features} features and {dataset.num_classes} classes, but the plan's "
            f"model takes {shared.model.features} and {shared.model.classes}",
        )
    return LocalData(train, test, seed_index, dataset.num_classes, dataset.image_shape)


def build_learner(
    data: LocalData, shared: SharedSettings, device: torch.device, allowed: Collection[str] = (), *, name: str
) -> LocalLearner:
    """Institution `name`'s LocalLearner (client `data.seed_index`), built as `simulation.make_learners` builds it.

    The model comes from the plan's seed (so theta_0 is the aggregator's), the sampler
    seed is `core.data.client_seed(seed, index)`, and b_k = round(batch_fraction * n_k) with
    n_k the size the plan's [influence] declares for `name`, else the rows it has.
    A model factory is built only if `allowed` (the institution's own config) names it.
    """
    training = shared.training
    return LocalLearner(
        shared.model.build(seed=training.seed, allowed=allowed).to(device),
        data.train.features,
        data.train.labels,
        min(declared_batch(shared.influence.batch_base(name, data.train.size), shared.batch_fraction), data.train.size),
        training.local,
        threshold=RCVaRThreshold(shared.objective).to(device),
        seed=client_seed(training.seed, data.seed_index),
    )


def round_trainer(learner: LocalLearner, config: CollaboratorConfig, shared: SharedSettings) -> RoundTrainer:
    """The privacy hook's default.

    The plain learner, or DP-SGD when the plan's [privacy] mode is "distributed" or this institution's own
    `[privacy] enabled = true`.

    DP-SGD comes from `fedfair.privacy`. Under the plan's distributed mode it adds no noise of its own
    (the secure sum does) and its spend is the one-input record's ledger
    (:class:`~fedfair.runtime.collaborator.charges.Charges`); under local DP its accountant persists
    beside this config, one file per dataset (NAME.DATA.privacy.json), so a restarted collaborator, or
    one joining another federation with the same data, continues what that data has spent, and its steps stop at
    the plan's [privacy] budget or the institution's own, the lower.
    """
    distributed = shared.privacy.distributed
    if not (distributed or config.privacy.enabled):
        return learner
    if config.name not in shared.influence.sizes:
        # b_k = batch_fraction * n_k from the rows held would put n_k into the batch and the weight,
        # outside the noise; declared, both are constants of the plan.
        raise ConfigError(
            f"{config.name}: [privacy] is on but the plan declares no size for {config.name}, so the batch and "
            "weight would reveal its row count outside the DP noise; ask the operator to declare every "
            "institution's size in the plan's [influence] sizes (and pin it in the manifest)"
        )
    batch = declared_batch(shared.influence.sizes[config.name], shared.batch_fraction)
    if batch > learner.num_samples:
        raise ConfigError(
            f"{config.name}: the plan's declared size {shared.influence.sizes[config.name]} gives a batch of "
            f"{batch}, more than the {learner.num_samples} rows held; DP-SGD samples each row with "
            "probability batch / rows, at most 1: correct [influence] sizes in the plan"
        )
    # Opacus (and the scipy it loads, about 120 MB) comes in only for an institution that uses DP.
    from fedfair.privacy.learner import PrivateLearner
    from fedfair.runtime.collaborator.charges import open_site_accountant

    weight = shared.influence.weight_of(config.name, shared.batch_fraction)
    released = (
        f"weight {weight:g} and expected batch {batch}, fixed by the plan ([influence] {shared.influence.weights} "
        f"weights, declared size {shared.influence.sizes[config.name]}), not by the rows held"
    )
    if distributed:
        return PrivateLearner(
            learner,
            training_privacy(shared.privacy, shared.batch_fraction),
            planned_rounds=shared.training.rounds,
            name=config.name,
            released=released,
        )
    accountant, folded = open_site_accountant(config, shared.federation_id)
    for federation in folded:
        logger.warning(
            "%s: the DP-SGD history of federation %s was kept in its own file; folded into %s, which counts "
            "every federation's spend on this data",
            config.name,
            federation,
            accountant.path,
        )
    return PrivateLearner(
        learner,
        config.privacy,
        accountant=accountant,
        planned_rounds=shared.training.rounds,
        name=config.name,
        released=released,
        plan_budget=shared.privacy.budget,
    )
