"""Known groups held out: each group's risk read off per-row losses, held to closed forms on Adult's test rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedfair.core.errors import ConfigError
from fedfair.datasets import load_dataset
from fedfair.fairness.references import base_rate_losses
from fedfair.research.known_groups import group_risks, known_group_rows


def test_the_base_rates_risk_on_each_sex_is_that_groups_cross_entropy_against_the_training_shares() -> None:
    # A closed form: a group whose rows are share q above 50K loses -(q ln p + (1 - q) ln(1 - p)), p the training
    # share, whatever the model did elsewhere.
    adult = load_dataset("adult")
    losses, _ = base_rate_losses(adult.y_train, adult.y_test, 2)
    sex = adult.attributes_test["sex"]
    p = float(np.mean(adult.y_train))
    risks = group_risks(losses, sex)
    assert sorted(risks) == ["Female", "Male"]
    for group, (count, risk) in risks.items():
        q = float(np.mean(adult.y_test[sex == group]))
        assert count == int((sex == group).sum())
        assert risk == pytest.approx(-(q * math.log(p) + (1 - q) * math.log(1 - p)), abs=1e-12)
    # Men earn above 50K more often (about 30% against 11%): the rarer label is theirs, so is the higher risk.
    rows = known_group_rows("base rate", "", losses, {"sex": sex})
    assert [row["group"] for row in rows if row["worst"]] == ["Male"]
    assert sum(row["held_out_rows"] for row in rows) == adult.y_test.size


def test_a_group_per_loss_is_needed() -> None:
    with pytest.raises(ConfigError, match="one group per loss"):
        group_risks(np.zeros(3), np.array(["a", "b"]))
