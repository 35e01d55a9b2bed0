"""The plan's [privacy]: noise inside the secure sum of every evaluation answer, calibrated and charged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from fedfair.core.errors import ConfigError
from fedfair.fairness import sums
from fedfair.privacy import distributed
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.record import BudgetSpent, InputRecord
from fedfair.runtime.report_privacy import (
    ROUNDING_BETA,
    ReportPrivacy,
    answer_release,
    decoded_noise_std,
    party_mu,
    plan_floor,
    read_report_privacy,
)
from tests.runtime.harness import new_workspace, thread_federation


def test_one_answer_spends_the_plans_epsilon() -> None:
    settings = ReportPrivacy(report_epsilon=1.0, delta=1e-5, report_budget=4.0)
    release = answer_release(settings, ())
    # The release carries one record's L2 move in encoded units, inflated (never shrunk) by rounding.
    assert release.l2 >= sums.RECORD_L2 * 2**sums.ENCODING.fractional_bits
    spent = distributed.epsilon([release], settings.delta - ROUNDING_BETA)
    assert spent == pytest.approx(1.0, rel=2e-3)  # calibrate's bisection tolerance is 1e-3
    assert distributed.epsilon([release] * 4, settings.delta - ROUNDING_BETA) <= 4.0 + 1e-9  # RDP composes sublinearly


def test_the_honest_survivors_carry_the_whole_noise() -> None:
    release = answer_release(ReportPrivacy(report_epsilon=2.0), ())
    floor = plan_floor(5, max_colluding=1, tolerates_dropouts=True)
    assert floor == 3 and plan_floor(5, 1, tolerates_dropouts=False) == 5
    share = party_mu(release, floor, colluders=1)
    assert (floor - 1) * share == pytest.approx(release.mu, rel=1e-12)
    # The decoded sum of all five parties carries 5 shares: variance 2 * 5 * share, in real units.
    expected = math.sqrt(2 * 5 * share) / 2**sums.ENCODING.fractional_bits
    assert decoded_noise_std(release, floor, 1, 5) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("section", "secure", "message"),
    [
        ({"report_epsilon": 1.0}, False, r"\[secure_aggregation\] is off"),
        ({"report_epsilon": 2.0, "report_budget": 1.0}, True, "report_budget = 1 is below report_epsilon = 2"),
        ({"report_epsilon": 1e-4}, True, "report_epsilon = 0.0001: no noise reaches epsilon 0.0001"),
        ({"report_epsilon": -1.0}, True, "report_epsilon"),
        ({"delta": 0.5, "report_epsilon": 1.0}, True, "delta"),
        ({"report_epsilon": 1.0, "epsilon": 1.0}, True, "epsilon"),
    ],
)
def test_a_privacy_section_that_cannot_hold_is_refused(section: dict[str, float], secure: bool, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_report_privacy("plan.toml", {"privacy": section}, secure)


def test_without_the_section_reports_are_exact() -> None:
    assert not read_report_privacy("plan.toml", {}, True).noised


def test_the_ledger_refuses_an_answer_past_the_budget_and_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "site-1.fed.bindings.json"
    release = answer_release(ReportPrivacy(report_epsilon=1.0), ())
    record = InputRecord(path, "fed")
    # RDP composes answers at 1.0, 1.46, 1.82, ... epsilon: a budget of 1.6 holds two.
    first = record.charge("evaluate", 1, "m1", release, 1e-5, 1.6)
    second = record.charge("evaluate", 2, "m2", release, 1e-5, 1.6)
    assert first == pytest.approx(1.0, rel=2e-3) and first < second <= 1.6
    restarted = InputRecord(path, "fed")
    assert restarted.spent(1e-5) == pytest.approx(second, rel=1e-12)
    assert [entry["round"] for entry in restarted.ledger()] == [1, 2]
    with pytest.raises(BudgetSpent, match=r"round 3 \(evaluate\) would spend epsilon .* past .* budget of 1.6; "
                       r"spent so far: epsilon .* on 2 evaluate answers"):
        restarted.charge("evaluate", 3, "m3", release, 1e-5, 1.6)
    assert len(InputRecord(path, "fed").ledger()) == 2  # a refused answer charges nothing


@pytest.mark.slow
def test_a_noised_federation_reports_with_the_noise_each_site_charged(tmp_path: Path) -> None:
    """Three real collaborators over mutual TLS with [privacy] report_epsilon: each adds its share of the
    noise and charges its ledger once per evaluation; the aggregator reports with the noise's standard
    deviation, so no exact sum of held-out losses is decoded."""
    names = ["site-a", "site-b", "site-c"]
    workspace = new_workspace(
        tmp_path,
        names,
        # Averaging from round 0, each evaluation's model differs (an unchanged model would get its kept bits).
        training={"rounds": 2, "average_from": 0.0},
        evaluation={"every": 1},
        privacy={"report_epsilon": 1.0, "report_budget": 3.0},
    )
    with thread_federation(workspace) as federation:
        federation.join(300)
    assert not federation.errors, federation.errors
    evaluations = [record["evaluation"] for record in read_round_log(workspace.output) if "evaluation" in record]
    assert evaluations and all(item["status"] == "done" for item in evaluations)
    release = answer_release(ReportPrivacy(report_epsilon=1.0), ())
    expected_std = decoded_noise_std(release, plan_floor(3, 0, True), 0, 3)
    assert all(item["noise_std"] == pytest.approx(expected_std, rel=1e-9) for item in evaluations)
    for name in names:
        path = workspace.configs[name].parent / f"{name}.{federation.plan.federation_id}.bindings.json"
        ledger = json.loads(path.read_text())["releases"]
        assert [entry["round"] for entry in ledger] == [item["round"] for item in evaluations]
        assert all(np.isclose(entry["mu"], release.mu) for entry in ledger)
