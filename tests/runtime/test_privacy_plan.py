"""The plan's [privacy]: noise inside the secure sum of training updates and evaluation answers, calibrated
and charged to each institution's ledger."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from fedfair.cli import main as cli_main
from fedfair.core.config import LocalConfig
from fedfair.core.errors import ConfigError, PrivacyBudgetError
from fedfair.fairness import sums
from fedfair.privacy import distributed
from fedfair.privacy.config import PrivacyConfig
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.input_record import InputRecord
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, shared_content
from fedfair.runtime.report.page import write_report
from fedfair.runtime.plan.learning_settings import read_learning
from fedfair.runtime.plan.privacy import (
    ROUNDING_BETA,
    PlanPrivacy,
    answer_release,
    decoded_noise_std,
    party_mu,
    plan_floor,
    privacy_shortfall,
    read_plan_privacy,
)
from tests.runtime.harness import new_workspace, thread_federation


def test_one_answer_spends_the_plans_epsilon() -> None:
    settings = PlanPrivacy(report_epsilon=1.0, delta=1e-5, budget=4.0)
    release = answer_release(settings, ())
    # The release carries one record's L2 move in encoded units, inflated (never shrunk) by rounding.
    assert release.l2 >= sums.RECORD_L2 * 2**sums.ENCODING.fractional_bits
    spent = distributed.epsilon([release], settings.delta - ROUNDING_BETA)
    assert spent == pytest.approx(1.0, rel=2e-3)  # calibrate's bisection tolerance is 1e-3
    assert distributed.epsilon([release] * 4, settings.delta - ROUNDING_BETA) <= 4.0 + 1e-9  # RDP composes sublinearly


def test_the_honest_survivors_carry_the_whole_noise() -> None:
    release = answer_release(PlanPrivacy(report_epsilon=2.0), ())
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
        ({"report_epsilon": 2.0, "budget": 1.0}, True, "budget = 1 is below 2"),
        ({"report_epsilon": 1e-4}, True, "report_epsilon = 0.0001: no noise reaches epsilon 0.0001"),
        ({"report_epsilon": -1.0}, True, "report_epsilon"),
        ({"delta": 0.5, "report_epsilon": 1.0}, True, "delta"),
        ({"report_epsilon": 1.0, "epsilon": 1.0}, True, 'epsilon is the training target of mode = "distributed"'),
        ({"mode": "distributed"}, True, "set epsilon"),
        ({"mode": "distributed", "epsilon": 3.0}, False, r"\[secure_aggregation\] is off"),
        ({"mode": "central", "epsilon": 3.0}, True, "mode"),
        ({"mode": "distributed", "epsilon": 30.0}, True, "budget = 10 is below 30"),
    ],
)
def test_a_privacy_section_that_cannot_hold_is_refused(section: dict[str, float], secure: bool, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_plan_privacy("plan.toml", {"privacy": section}, secure, LocalConfig())


@pytest.mark.parametrize(
    ("local", "message"),
    [
        (LocalConfig(local_steps=3), "local_steps = 1"),
        (LocalConfig(drift_correction="scaffold"), 'drift_correction = "none"'),
    ],
)
def test_distributed_training_needs_one_step_a_round(local: LocalConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_plan_privacy("plan.toml", {"privacy": {"mode": "distributed", "epsilon": 3.0}}, True, local)


def test_without_the_section_reports_are_exact() -> None:
    plan = read_plan_privacy("plan.toml", {}, True, LocalConfig())
    assert not plan.noised and not plan.distributed


def test_the_ledger_refuses_an_answer_past_the_budget_and_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "site-1.fed.bindings.json"
    release = answer_release(PlanPrivacy(report_epsilon=1.0), ())
    record = InputRecord(path, "fed")
    # RDP composes answers at 1.0, 1.46, 1.82, ... epsilon: a budget of 1.6 holds two.
    first = record.charge("evaluate", 1, "m1", release, 1e-5, 1.6)
    second = record.charge("evaluate", 2, "m2", release, 1e-5, 1.6)
    assert first == pytest.approx(1.0, rel=2e-3) and first < second <= 1.6
    restarted = InputRecord(path, "fed")
    assert restarted.spent(1e-5) == pytest.approx(second, rel=1e-12)
    assert [entry["round"] for entry in restarted.ledger()] == [1, 2]
    with pytest.raises(
        PrivacyBudgetError,
        match=r"round 3 \(evaluate\) would spend epsilon .* past .* budget of 1.6; "
        r"spent so far: epsilon .* on 2 evaluate answers",
    ):
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
        privacy={"report_epsilon": 1.0, "budget": 3.0},
    )
    with thread_federation(workspace) as federation:
        federation.join(300)
    assert not federation.errors, federation.errors
    evaluations = [record["evaluation"] for record in read_round_log(workspace.output) if "evaluation" in record]
    assert evaluations and all(item["status"] == "done" for item in evaluations)
    release = answer_release(PlanPrivacy(report_epsilon=1.0), ())
    expected_std = decoded_noise_std(release, plan_floor(3, 0, True), 0, 3)
    assert all(item["noise_std"] == pytest.approx(expected_std, rel=1e-9) for item in evaluations)
    for name in names:
        path = workspace.configs[name].parent / f"{name}.{federation.plan.federation_id}.bindings.json"
        ledger = json.loads(path.read_text())["releases"]
        assert [entry["round"] for entry in ledger] == [item["round"] for item in evaluations]
        assert all(np.isclose(entry["mu"], release.mu) for entry in ledger)


@pytest.mark.parametrize(
    ("own", "plan", "refused"),
    [
        (PrivacyConfig(), PlanPrivacy(mode="distributed", epsilon=3.0), None),
        (
            PrivacyConfig(enabled=True, mode="distributed", target_epsilon=3.0),
            PlanPrivacy(mode="distributed", epsilon=3.0),
            None,
        ),
        (
            PrivacyConfig(enabled=True, mode="distributed", target_epsilon=1.0),
            PlanPrivacy(mode="distributed", epsilon=3.0),
            "spends epsilon 3 at delta 1e-05, more than this institution's",
        ),
        (
            PrivacyConfig(enabled=True, mode="distributed", target_epsilon=3.0, delta=1e-7),
            PlanPrivacy(mode="distributed", epsilon=3.0),
            "delta 1e-07",
        ),
        (
            PrivacyConfig(enabled=True, mode="distributed", target_epsilon=3.0),
            PlanPrivacy(),
            'plan\'s [privacy] mode is "off"',
        ),
        (
            PrivacyConfig(enabled=True, noise_multiplier=1.0),
            PlanPrivacy(mode="distributed", epsilon=3.0),
            "local DP-SGD",
        ),
        (PrivacyConfig(enabled=True, noise_multiplier=1.0), PlanPrivacy(), None),
    ],
)
def test_a_collaborator_refuses_a_plan_below_its_own_privacy(
    own: PrivacyConfig, plan: PlanPrivacy, refused: str | None
) -> None:
    shortfall = privacy_shortfall(own, plan)
    if refused is None:
        assert shortfall is None
    else:
        assert shortfall is not None and refused in shortfall


def test_the_ledger_composes_training_rounds_with_their_sampling_and_add_on(tmp_path: Path) -> None:
    """A run's training rounds charged one by one spend exactly what the run's calibration promised, and
    answers on top compose with them; grouping identical rounds changes nothing but the time."""
    noise = distributed.training_noise(3.0, 1e-5, sensitivity=2.0, sampling_rate=0.01, steps=50, dimension=110)
    record = InputRecord(tmp_path / "site-a.fed.bindings.json", "fed")
    one = dataclasses.replace(noise.release, steps=1)
    for round_number in range(1, 51):
        spent = record.charge("train", round_number, f"m{round_number}", one, 1e-5, 10.0, addon=noise.addon / 50)
    assert spent == pytest.approx(noise.epsilon(50, 1e-5), rel=1e-9)
    assert spent == pytest.approx(3.0, rel=2e-3)
    answer = answer_release(PlanPrivacy(report_epsilon=0.5), ())
    total = record.charge("evaluate", 50, "m50", answer, 1e-5, 10.0, addon=ROUNDING_BETA)
    ungrouped = distributed.epsilon([one] * 50 + [answer], 1e-5 - noise.addon - ROUNDING_BETA)
    assert spent < total == pytest.approx(ungrouped, rel=1e-9)


@pytest.mark.slow
def test_a_distributed_dp_federation_trains_inside_the_noised_secure_sum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three real collaborators over mutual TLS under [privacy] mode = "distributed": every round applies,
    each collaborator charges one training release a round before sending it, the aggregator records the
    noise it decoded, and what the rounds spent is the plan's epsilon scaled to the rounds run."""
    names = ["site-a", "site-b", "site-c"]
    rounds = 3
    workspace = new_workspace(
        tmp_path,
        names,
        training={"rounds": rounds, "local_steps": 1, "batch_fraction": 0.05},
        secure_aggregation={"modulus_bits": 64},
        privacy={"mode": "distributed", "epsilon": 2.0, "max_grad_norm": 5.0},
    )
    with thread_federation(workspace) as federation:
        federation.join(300)
    assert not federation.errors, federation.errors
    log = read_round_log(workspace.output)
    assert [record["status"] for record in log] == ["applied"] * rounds
    stds = [record["mean_update_noise_std"] for record in log]
    assert all(std > 0 for std in stds) and len(set(stds)) == 1  # the same calibrated noise every round
    plan = federation.plan
    for name in names:
        path = workspace.configs[name].parent / f"{name}.{plan.federation_id}.bindings.json"
        ledger = json.loads(path.read_text())["releases"]
        assert [(entry["kind"], entry["round"]) for entry in ledger] == [("train", r) for r in range(1, rounds + 1)]
        assert all(entry["sampling_rate"] == pytest.approx(0.05) for entry in ledger)
        # Every round is one step of the run the noise was calibrated for: all three spend 3/rounds of it.
        spent = InputRecord(path, plan.federation_id).spent(plan.privacy.delta)
        assert 0 < spent < plan.privacy.epsilon
    page = write_report(workspace.output).read_text()
    assert f"{rounds} training rounds decoded with Skellam noise inside the secure sum" in page
    assert f"standard deviation {stds[0]:.3g} per coordinate" in page and "fedfair collaborator ledger" in page
    assert cli_main(["collaborator", "ledger", "--config", str(workspace.configs["site-a"])]) == 0
    printed = capsys.readouterr().out
    assert f"epsilon {spent:.4g} spent at delta 1e-05" in printed
    assert "train          3 releases, rounds 1-3 (Skellam inside the secure sum, Poisson sampling q = 0.05)" in printed
    assert cli_main(["collaborator", "ledger", "--config", str(workspace.configs["site-a"]), "--federation", "x"]) == 2
    assert "no record site-a.x.bindings.json" in capsys.readouterr().err


def test_a_training_only_privacy_section_is_shared_and_pinned(tmp_path: Path) -> None:
    """mode = "distributed" without report_epsilon still travels in the shared plan (and so in the manifest's
    digest): an aggregator cannot serve the same plan without the training noise."""
    workspace = new_workspace(
        tmp_path,
        ["site-a", "site-b", "site-c"],
        training={"local_steps": 1},
        secure_aggregation={"modulus_bits": 64},
        privacy={"mode": "distributed", "epsilon": 2.0},
    )
    plan = load_aggregator_plan(workspace.plan)
    assert shared_content(plan)["privacy"]["mode"] == "distributed"
    assert shared_content(plan)["privacy"]["epsilon"] == 2.0


def test_the_templates_default_noises_every_evaluation_within_its_stated_budget() -> None:
    """The plan `fedfair init` writes noises evaluations by default, and its 10 evaluations (50 rounds, every 5)
    spend about 3.6 of the budget of 10, as its comment says."""
    plan = load_aggregator_plan(Path(__file__).parents[2] / "aggregator" / "plan.toml", check_manifest=False)
    privacy = plan.privacy
    assert privacy.noised and not privacy.distributed and privacy.budget == 10.0
    answers = plan.training.rounds // plan.evaluation.every
    assert answers == 10
    spent = distributed.epsilon([answer_release(privacy, ())] * answers, privacy.delta - answers * ROUNDING_BETA)
    assert spent == pytest.approx(3.6, abs=0.05) and spent < privacy.budget


@pytest.mark.parametrize(
    ("collaborators", "sections", "floor"),
    [
        # Dropouts allowed: no sum is unmasked below the least threshold of any round.
        (51, {"secure_aggregation": {"max_colluding": 5}}, 15),  # SecAgg+ k = 22: t = (23 + 5) // 2 + 1
        (10, {"secure_aggregation": {"max_colluding": 1}, "quorum": {"min_collaborators": 10}}, 6),
        (10, {"secure_aggregation": {"max_colluding": 1, "threshold": 8}, "quorum": {"min_collaborators": 10}}, 8),
        (3, {"secure_aggregation": {"max_colluding": 0}, "quorum": {"min_collaborators": 2}}, 2),
        # Dropouts none: every collaborator is in every sum.
        (4, {"secure_aggregation": {"dropouts": "none"}, "quorum": {"min_collaborators": 4}}, 4),
    ],
)
def test_the_noise_is_carried_by_the_fewest_survivors_a_round_can_unmask(
    collaborators: int, sections: dict[str, dict[str, object]], floor: int
) -> None:
    learning = read_learning("plan.toml", sections, collaborators)
    assert learning.survivor_floor(collaborators) == floor
    # Calibrated to that floor, the honest survivors of the smallest sum carry the whole noise.
    release = answer_release(PlanPrivacy(report_epsilon=1.0), ())
    colluders = learning.secure_aggregation.max_colluding
    assert (floor - colluders) * party_mu(release, floor, colluders) == pytest.approx(release.mu, rel=1e-12)
