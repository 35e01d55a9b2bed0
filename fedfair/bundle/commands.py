"""What `fedfair predict` and `fedfair evaluate` do: use a model bundle on an institution's own table.

The command lines themselves are :mod:`fedfair.cli.predict` (light, so their ``--help`` does not
load PyTorch). A bundle whose model comes from a factory ("package.module:function") is used only when the
user names that factory with ``--allow-factory`` (``allowed`` in Python): the name comes from
the bundle's file, and importing it runs code, so the bundle can never consent on its own.

Why: docs/design.md, "Inside the model bundle".
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from fedfair.bundle.composition import worst_group_composition
from fedfair.bundle.format import Bundle, describe_architecture, load_bundle
from fedfair.core.data import ClientData
from fedfair.core.errors import ConfigError, FactoryNotAllowedError
from fedfair.core.evaluation import Evaluation, evaluate
from fedfair.core.models import flat_parameters, predict
from fedfair.datasets.encoder import Encoder

# The package's one CSV/Parquet reader, so a table reads here exactly as it does for training.
from fedfair.fairness.pooled import group_risk_report
from fedfair.fairness.composition import CellShare
from fedfair.fairness.report import GroupRiskReport

PREDICTION_COLUMN = "prediction"
PROBABILITY_PREFIX = "probability_"

logger = logging.getLogger("fedfair.bundle")


def bundle_encoder(bundle: Bundle) -> Encoder:
    """The federation's encoder saved in the bundle: its schema and the global statistics."""
    if bundle.encoder is None:
        raise ConfigError(
            "the model bundle has no encoder: its model was trained on already-encoded arrays (a built-in "
            "dataset), so it cannot read a table; use a bundle from a federation whose plan has a [schema]"
        )
    return Encoder.from_mapping(bundle.encoder, "the model bundle")


def encode_table(
    bundle: Bundle, table: pd.DataFrame, source: str, *, unseen: dict[str, dict[str, int]] | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The table's features (and labels, None without the label column) as the bundle's encoder makes them.

    With `unseen`, categories the federation never listed are encoded as none of them and recorded there.
    """
    features, labels = bundle_encoder(bundle).encode(table, source, unseen=unseen)
    expected = bundle.architecture.get("features")
    if expected is not None and features.shape[1] != expected:
        raise ConfigError(
            f"{source} encodes to {features.shape[1]} features but the bundle's model "
            f"{describe_architecture(bundle.architecture)} takes {expected}; the bundle is inconsistent, "
            "copy it again from the aggregator's output"
        )
    return features, labels


@torch.no_grad()
def class_probabilities(model: nn.Module, features: np.ndarray, chunk: int = 65536) -> np.ndarray:
    """Each row's probability of each class, shape (rows, classes), float64.

    One logit is a binary model (probability of class 1 = sigmoid), several are softmax.
    """
    parameter = next(model.parameters())
    parts = []
    for start in range(0, len(features), chunk):
        batch = torch.as_tensor(features[start : start + chunk]).to(parameter.device, parameter.dtype)
        logits = model(batch)
        if logits.shape[-1] == 1:
            positive = torch.sigmoid(logits.squeeze(-1))
            parts.append(torch.stack([1.0 - positive, positive], dim=-1).double().cpu())
        else:
            parts.append(torch.softmax(logits, dim=-1).double().cpu())
    return torch.cat(parts).numpy()


@torch.no_grad()
def predictions(bundle: Bundle, table: pd.DataFrame, source: str, *, allowed: Collection[str] = ()) -> pd.DataFrame:
    """One row per table row, in order: the predicted class name and ``probability_<class>`` per class.

    ``allowed``: the model factories the user trusts (:meth:`Bundle.build_model`).
    """
    unseen: dict[str, dict[str, int]] = {}
    features, _ = encode_table(bundle, table, source, unseen=unseen)
    for column, values in unseen.items():
        listed = ", ".join(f"{value!r} ({count:,} row{'s' if count != 1 else ''})" for value, count in values.items())
        logger.warning(
            "%s: column %r holds categories the model was not trained on: %s; those cells are encoded as none "
            "of its categories",
            source,
            column,
            listed,
        )
    model = bundle.build_model(allowed=allowed)
    names = bundle_encoder(bundle).class_names
    probabilities = class_probabilities(model, features)
    if probabilities.shape[1] != len(names):
        raise ConfigError(
            f"the bundle's model gives {probabilities.shape[1]} class scores but its encoder names "
            f"{len(names)} classes ({', '.join(names)}); the bundle is inconsistent, copy it again"
        )
    parameter = next(model.parameters())
    logits = model(torch.as_tensor(features).to(parameter.device, parameter.dtype))
    chosen = predict(logits).cpu().numpy()
    frame = pd.DataFrame({PREDICTION_COLUMN: np.asarray(names, dtype=object)[chosen]})
    for index, name in enumerate(names):
        frame[PROBABILITY_PREFIX + name] = probabilities[:, index]
    return frame


def evaluation_rho(bundle: Bundle, rho: float | None) -> float:
    """``rho`` when given, else the rho of the plan the bundle's model was trained with."""
    rho = bundle.rho if rho is None else rho
    if rho is None:
        raise ConfigError("the model bundle's plan names no objective rho; pass --rho, e.g. --rho 0.3")
    return rho


def table_losses(bundle: Bundle, table: pd.DataFrame, source: str, *, allowed: Collection[str] = ()) -> Evaluation:
    """Per-sample loss and correctness of the bundle's model on every row of a labelled table, in row order.

    No row is dropped: the encoder refuses a missing label and refuses or imputes a missing
    feature, so the i-th loss is the i-th row's. ``allowed``: as for :meth:`Bundle.build_model`.
    """
    features, labels = encode_table(bundle, table, source)
    if labels is None:
        raise ConfigError(
            f"{source} has no label column, so there is nothing to evaluate against; "
            "add the label column, or use `fedfair predict` for unlabelled rows"
        )
    model = bundle.build_model(allowed=allowed)
    data = ClientData(source, torch.as_tensor(features), torch.as_tensor(labels))
    return evaluate(model, flat_parameters(model), data)


def evaluate_table(
    bundle: Bundle, table: pd.DataFrame, source: str, rho: float | None = None, *, allowed: Collection[str] = ()
) -> GroupRiskReport:
    """Pooled group risks of the bundle's model on a labelled table, at ``rho`` (default: the plan's).

    ``allowed``: the model factories the user trusts (:meth:`Bundle.build_model`).
    """
    rho = evaluation_rho(bundle, rho)
    result = table_losses(bundle, table, source, allowed=allowed)
    return group_risk_report(result.losses, result.correct, rho)


def evaluate_composition(
    bundle: Bundle,
    table: pd.DataFrame,
    source: str,
    columns: Sequence[str],
    rho: float | None = None,
    *,
    allowed: Collection[str] = (),
) -> tuple[GroupRiskReport, list[CellShare]]:
    """:func:`evaluate_table`'s report and, from the same losses, the worst rho-fraction's composition.

    The composition is by ``columns`` of ``table`` (:func:`fedfair.bundle.composition.worst_group_composition`).
    """
    rho = evaluation_rho(bundle, rho)
    result = table_losses(bundle, table, source, allowed=allowed)
    schema = bundle_encoder(bundle).schema
    shares = worst_group_composition(result.losses, rho, table, columns, schema, source)
    return group_risk_report(result.losses, result.correct, rho), shares


def allowed_bundle(path: Path, allowed: Collection[str]) -> Bundle:
    """The bundle at ``path``, refused up front if its model comes from a factory not in ``allowed``.

    Bundle.build_model enforces the same rule; checking here as well refuses before a possibly
    large table is read, and the message can name the exact flag to add.
    """
    bundle = load_bundle(path)
    if bundle.factory is not None and bundle.factory not in allowed:
        raise FactoryNotAllowedError(
            f"model bundle {path} builds its model with factory '{bundle.factory}', which is code, so it was not "
            "imported: a bundle's file cannot allow a factory, only you can. If you trust that function and its "
            f"package is installed here, run again with --allow-factory {bundle.factory}"
        )
    return bundle
