"""Known groups held out: each group's risk read off per-row losses, held to closed forms on Adult's test rows."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from fedfair.core.errors import ConfigError
from fedfair.core.objective import cvar
from fedfair.datasets import load_dataset
from fedfair.fairness.references import base_rate_losses
from fedfair.research import stopping
from fedfair.research.experiment import load_federation
from fedfair.research.flags import config_from_flags
from fedfair.research.known_groups import fedminmax_reference, group_risks, known_group_rows
from fedfair.research.minimax import GroupedFederation
from fedfair.research.paper_splits import paper_split
from fedfair.research.profiles import PROFILES
from fedfair.research.study import Point, Study


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


def test_fedminmax_told_sex_is_stopped_and_tested_on_adults_test_rows(tmp_path: Path) -> None:
    # Real runs, cut short: one stopping run to a 20-round ceiling, then the two test seeds to its stop round.
    study = Study("adult", PROFILES["tuned"], ("fedsrcvar", "fedavg"), split=paper_split("adult"))
    start = Point(1.0, step=0.01, adversary_lr=0.1)
    reference = fedminmax_reference(study, "sex", 0.1, start, tmp_path, 1, 0, ceilings=(20,))
    told = dataclasses.replace(study, groups="sex")
    # Only FedMinMax's runs are told the column; it trains on Adult's sex groups (the sites are race's).
    assert "--groups" not in study.base("fedavg", 0.1, 0) and "--groups" not in told.base("fedavg", 0.1, 0)
    flags = told.validation_run("fedminmax", 0.1, start).flags
    federation = load_federation(config_from_flags(flags))
    assert isinstance(federation, GroupedFederation) and federation.group_names == ("Female", "Male")
    assert reference.choice["method"] == "FedMinMax (knows sex)" and reference.choice["max_rounds"] == 20
    stop = int(reference.choice["stop_round"])
    assert 10 <= stop <= 20 and stop % stopping.CHECK_EVERY == 0
    assert [row["seed"] for row in reference.held_out] == [0, 1]
    # The kept row losses are the held-out rows' whose worst decile the row reports (kept as float32).
    adult = load_dataset("adult")
    for row, losses in zip(reference.held_out, reference.losses, strict=True):
        assert row["method"] == "FedMinMax (knows sex)" and row["stop_round"] == stop
        assert losses.size == adult.y_test.size
        assert cvar(losses, 0.1) == pytest.approx(row["held_out_worst_risk"], abs=1e-5)
    assert not np.array_equal(reference.losses[0], reference.losses[1])  # two seeds, two models
