"""h̄ and the base rate, the constants every fairness table is read against, held to their closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedfair.core.errors import ConfigError
from fedfair.datasets import load_dataset
from fedfair.fairness import pooled
from fedfair.fairness.references import (
    BASE_RATE,
    UNIFORM,
    base_rate_report,
    reference_reports,
    uniform_report,
    uniform_risk,
)
from fedfair.fairness.tail import class_prior_worst_risk


@pytest.mark.parametrize("classes", [2, 10])
@pytest.mark.parametrize("rho", [0.1, 0.3, 1.0])
def test_the_uniform_classifier_loses_ln_k_on_every_row(classes: int, rho: float) -> None:
    # A model at zero logits is h̄: torch's own cross-entropy gives ln K on every row, whatever its label.
    labels = torch.arange(1000) % classes
    losses = torch.nn.functional.cross_entropy(
        torch.zeros(1000, classes, dtype=torch.float64), labels, reduction="none"
    )
    assert np.allclose(losses.numpy(), math.log(classes), rtol=0, atol=1e-12)
    report = uniform_report(classes, rho)
    exact = pooled.group_risk_report(losses.numpy(), np.ones(1000), rho)
    assert report.worst_risk == pytest.approx(exact.worst_risk, abs=1e-12) == uniform_risk(classes)
    assert report.mean_risk == pytest.approx(exact.mean_risk, abs=1e-12)
    assert report.disparity == pytest.approx(0.0, abs=1e-12)
    # Ties broken at random: accuracy 1/K, every row's expected error (K-1)/K, the worst group's too.
    assert report.accuracy == pytest.approx(1 / classes) and report.worst_error == pytest.approx(1 - 1 / classes)


def test_the_base_rate_loses_the_label_entropy_on_the_rows_its_shares_come_from() -> None:
    # Adult's held-out labels: 76.4% at most 50K. Shares read from the same rows give the entropy exactly.
    labels = load_dataset("adult").y_test
    shares = np.bincount(labels, minlength=2) / labels.size
    entropy = -float(np.sum(shares * np.log(shares)))
    report = base_rate_report(labels, labels, 2, 0.1)
    assert report.mean_risk == pytest.approx(entropy, abs=1e-12)
    assert report.accuracy == pytest.approx(float(shares.max()), abs=1e-12)
    # At rho 0.1, below the minority's share, the worst tenth is all minority rows: -ln of its share, every error.
    assert shares.min() > 0.1
    assert report.worst_risk == pytest.approx(-math.log(float(shares.min())), abs=1e-12)
    assert report.worst_error == pytest.approx(1.0, abs=1e-12)
    # At rho 0.3, above it, the tail takes the minority whole then majority rows: the noised report's closed form.
    counts = np.bincount(labels, minlength=2)
    assert base_rate_report(labels, labels, 2, 0.3).worst_risk == pytest.approx(
        class_prior_worst_risk(counts, 0.3), abs=1e-12
    )
    # Below h̄ on the mean (entropy < ln 2), above it on the worst tenth: the two constants bound different figures.
    assert report.mean_risk < uniform_risk(2) < report.worst_risk


def test_the_base_rate_reads_its_shares_from_the_training_rows() -> None:
    adult = load_dataset("adult")
    report = reference_reports(adult.y_train, adult.y_test, 2, 0.1)[BASE_RATE]
    train_shares = np.bincount(adult.y_train, minlength=2) / adult.y_train.size
    test_shares = np.bincount(adult.y_test, minlength=2) / adult.y_test.size
    # Cross-entropy of the test labels against the training shares: at least the test entropy (Gibbs).
    cross = -float(np.sum(test_shares * np.log(train_shares)))
    assert report.mean_risk == pytest.approx(cross, abs=1e-12)
    assert report.mean_risk >= -float(np.sum(test_shares * np.log(test_shares)))


def test_a_class_absent_from_the_prior_rows_counts_once() -> None:
    report = base_rate_report(np.zeros(99, dtype=int), np.array([0, 1]), 2, 0.5)
    assert report.worst_risk == pytest.approx(math.log(100.0))  # the absent class at 1/100, never 0


def test_bad_labels_are_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="class indices 0 .. 1"):
        base_rate_report(np.array([0, 2]), np.array([0, 1]), 2, 0.1)
    with pytest.raises(ConfigError, match="labels is empty"):
        base_rate_report(np.array([0, 1]), np.array([], dtype=int), 2, 0.1)
    with pytest.raises(ConfigError, match="rho must be in"):
        uniform_report(2, 0.0)


def test_the_references_are_named_for_the_tables() -> None:
    assert list(reference_reports(np.array([0, 1]), np.array([0, 1]), 2, 0.1)) == [UNIFORM, BASE_RATE]
