"""Known groups held out: each group's risk read off per-row losses, held to closed forms on Adult's test rows."""

from __future__ import annotations

import base64
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from fedfair.core.errors import ConfigError
from fedfair.core.objective import cvar
from fedfair.datasets import load_dataset
from fedfair.fairness.references import base_rate_losses, uniform_report
from fedfair.research import stopping
from fedfair.research.experiment import load_federation
from fedfair.research.flags import config_from_flags
from fedfair.research.known_groups import fedminmax_reference, group_risks, known_group_rows, worst_group
from fedfair.research.reproduce import read_csv, write_csv
from fedfair.research.runs import row_errors
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


def test_the_base_rates_error_on_each_sex_is_that_groups_share_of_the_minority_label() -> None:
    # The base rate predicts the training majority (at most 50K) for everyone: a group's error rate is its share
    # above 50K, about 30% of men and 11% of women, and the groups' errors weighted by their rows are its mean error.
    adult = load_dataset("adult")
    losses, correct = base_rate_losses(adult.y_train, adult.y_test, 2)
    sex = adult.attributes_test["sex"]
    rows = known_group_rows("base rate", "", losses, {"sex": sex}, ~correct)
    for row in rows:
        assert row["error"] == pytest.approx(float(np.mean(adult.y_test[sex == row["group"]])), abs=1e-12)
    weighted = sum(row["error"] * row["held_out_rows"] for row in rows) / adult.y_test.size
    assert weighted == pytest.approx(1.0 - float(np.mean(correct)), abs=1e-12)
    assert all(row["error"] == "" for row in known_group_rows("base rate", "", losses, {"sex": sex}))


def test_a_models_worst_known_group_is_averaged_over_its_seeds_as_the_csv_reads(tmp_path: Path) -> None:
    # Two "seeds" of known risks: the base rate (worst on men, who are above 50K more often: its loss and its error
    # are highest there) and h̄ (ln 2 and one half on every row, so every group ties).
    adult = load_dataset("adult")
    sex = adult.attributes_test["sex"]
    losses, correct = base_rate_losses(adult.y_train, adult.y_test, 2)
    uniform = uniform_report(2, 0.1)
    rows = known_group_rows("model", 0, losses, {"sex": sex}, ~correct) + known_group_rows(
        "model", 1, np.full(sex.size, uniform.mean_risk), {"sex": sex}, np.full(sex.size, uniform.mean_error)
    )
    rows += known_group_rows("unknown errors", 0, losses, {"sex": sex})
    table = read_csv(write_csv(tmp_path / "known_groups.csv", rows))
    men = sex == "Male"
    worst = worst_group(table, "model", "sex")
    assert worst is not None
    assert worst.risk == pytest.approx((float(losses[men].mean()) + math.log(2)) / 2, abs=1e-12)
    assert worst.groups == ("Male", "Female")
    assert worst.error == pytest.approx((float(np.mean(adult.y_test[men])) + 0.5) / 2, abs=1e-12)
    unknown = worst_group(table, "unknown errors", "sex")
    assert unknown is not None and unknown.error is None
    assert worst_group(table, "model", "race") is None and worst_group(table, "nobody", "sex") is None


def kept(probabilities: list[float], classes: int, mean_error: float) -> dict[str, object]:
    """A run's result as the cache keeps it: its rows' losses -ln p of the true class, as float32."""
    losses = -np.log(np.asarray(probabilities, dtype=np.float64)).astype("<f4")
    return {"row_losses": base64.b64encode(losses.tobytes()).decode(), "classes": classes, "mean_error": mean_error}


def test_two_classes_errors_are_the_rows_whose_true_class_is_below_one_half() -> None:
    errors = row_errors(kept([0.9, 0.3, 0.51, 0.49], 2, 0.5))
    assert errors is not None and errors.tolist() == [False, True, False, True]


def test_errors_are_not_read_off_losses_that_cannot_say_them() -> None:
    # Three classes: p 0.4 may win (0.3, 0.3 elsewhere) or lose (0.6 elsewhere); ln 2 decides nothing.
    assert row_errors(kept([0.9, 0.4], 3, 0.5)) is None
    # The run's own error rate says one error where the losses say two: a tie the rounding hid, not guessed at.
    assert row_errors(kept([0.3, 0.4], 2, 0.5)) is None


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
    for row, losses, errors in zip(reference.held_out, reference.losses, reference.errors, strict=True):
        assert row["method"] == "FedMinMax (knows sex)" and row["stop_round"] == stop
        assert losses.size == adult.y_test.size
        assert cvar(losses, 0.1) == pytest.approx(row["held_out_worst_risk"], abs=1e-5)
        # Its errors, read off the losses, count exactly the run's own misclassified rows.
        assert errors is not None and int(errors.sum()) == round((1.0 - row["held_out_accuracy"]) * losses.size)
    assert not np.array_equal(reference.losses[0], reference.losses[1])  # two seeds, two models
