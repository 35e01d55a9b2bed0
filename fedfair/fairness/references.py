"""The two constant predictors every fairness table is read against: the uniform classifier h̄ and the base rate.

h̄ predicts 1/K for every class, for everyone: its cross-entropy is ln K on every row, so its mean risk and its
worst-group risk at every rho are ln K. The paper draws it in its figures and shows (its Remark on the critical rho)
that for small rho and epsilon the minimax-fair model *is* h̄: a method whose worst-group risk is above ln K is
beaten, on the very figure the table ranks by, by a model that learnt nothing. The base-rate predictor predicts
each class at its share of the training rows: the best constant for the mean risk (its mean log loss on the rows
its shares come from is their label entropy), with the majority class's accuracy. Both are exact and cheap on any
held-out split, so every table of worst-group risks carries them as rows (issue 96).
"""

from __future__ import annotations

import math
import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.fairness.report import GroupRiskReport

UNIFORM = "uniform (h̄)"
"""The uniform classifier's name in every table."""

BASE_RATE = "base rate"
"""The base-rate (class-prior) predictor's name in every table."""


def uniform_risk(num_classes: int) -> float:
    """Ln K: the cross-entropy of the uniform classifier on K classes, whatever the data.

    A binary model with one logit is uniform at logit 0, with the same ln 2.

    Raises:
        ConfigError: fewer than one class.
    """
    if num_classes < 1:
        raise ConfigError(f"the uniform classifier needs at least one class, got {num_classes}")
    return math.log(max(num_classes, 2))


def uniform_report(num_classes: int, rho: float) -> GroupRiskReport:
    """h̄'s report at `rho` on any rows: every risk ln K; its 0-1 error with its ties broken at random.

    h̄ ties every class, so it has no prediction of its own: its error is the expected one of a uniformly random
    pick, (K - 1) / K on every row, hence its accuracy 1 / K and a worst-group error equal to its mean. (A model
    at logit 0 that breaks the tie towards class 0 would instead read class 0's share, which the base rate's
    row already shows when class 0 is the majority.)
    """
    if not 0.0 < rho <= 1.0:
        raise ConfigError(f"rho must be in (0, 1], got {rho}; it is the protected group fraction, e.g. --rho 0.3")
    risk = uniform_risk(num_classes)
    classes = max(num_classes, 2)
    error = (classes - 1) / classes
    return GroupRiskReport.from_risks(
        rho=rho, mean_risk=risk, worst_risk=risk, best_risk=risk, mean_error=error, worst_error=error, best_error=error
    )


def base_rate_report(prior_labels: np.ndarray, labels: np.ndarray, num_classes: int, rho: float) -> GroupRiskReport:
    """The base-rate predictor's exact report at `rho` on the rows labelled `labels`.

    It predicts class k at its share of `prior_labels` (the training rows: what a federation knows before it trains),
    so a row of class k loses -ln p_k and is right when k is the most common class there. A class absent from
    `prior_labels` counts once, as :func:`fedfair.fairness.tail.class_prior_worst_risk` counts it, so no class is
    predicted at 0 (an infinite loss on a held-out row of it).

    Raises:
        ConfigError: empty rows, or a label outside 0 .. `num_classes` - 1.
    """
    from fedfair.fairness import pooled  # torch, through core: not for the report's names of these rows

    losses, correct = base_rate_losses(prior_labels, labels, num_classes)
    return pooled.group_risk_report(losses, correct, rho)


def base_rate_losses(prior_labels: np.ndarray, labels: np.ndarray, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """The base-rate predictor's loss and correctness on each row labelled `labels` (`base_rate_report`'s rows).

    Raises:
        ConfigError: empty rows, or a label outside 0 .. `num_classes` - 1.
    """
    classes = max(num_classes, 2)
    prior, held = _labels("prior_labels", prior_labels, classes), _labels("labels", labels, classes)
    counts = np.maximum(np.bincount(prior, minlength=classes).astype(np.float64), 1.0)
    shares = counts / counts.sum()
    return -np.log(shares[held]), held == int(np.argmax(shares))


def _labels(name: str, labels: np.ndarray, classes: int) -> np.ndarray:
    array = np.asarray(labels).reshape(-1)
    if array.size == 0:
        raise ConfigError(f"{name} is empty: the base rate is read from the rows' labels")
    if not np.issubdtype(array.dtype, np.integer) or array.min() < 0 or array.max() >= classes:
        raise ConfigError(f"{name} must be class indices 0 .. {classes - 1}; encode the labels as the model's classes")
    return array.astype(np.int64)


def reference_reports(
    prior_labels: np.ndarray, labels: np.ndarray, num_classes: int, rho: float
) -> dict[str, GroupRiskReport]:
    """h̄'s and the base rate's reports at `rho` on the rows labelled `labels`, by their table names."""
    return {
        UNIFORM: uniform_report(num_classes, rho),
        BASE_RATE: base_rate_report(prior_labels, labels, num_classes, rho),
    }
