"""The plan's [privacy]: noise inside the secure sum of training updates and evaluation answers, calibrated
and charged to each institution's ledger."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from fedfair.cli import main as cli_main
from fedfair.core.config import LocalConfig
from fedfair.core.errors import ConfigError, PrivacyBudgetError
from fedfair.fairness import sums, tail
from fedfair.datasets.schema import Column, Schema
from fedfair.datasets.statistics import NOISED_STATISTICS_FRACTIONAL_BITS
from fedfair.privacy import distributed, rounding
from fedfair.privacy.calibration import threshold_clip
from fedfair.privacy.config import PrivacyConfig
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.privacy.ledger import Charge, Ledger, composed
from fedfair.runtime.collaborator.charges import open_ledger
from fedfair.runtime.collaborator.config import load_collaborator_config
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
    statistics_release,
    training_privacy,
)
from fedfair.secagg import SecurityParameters
from tests.runtime.harness import Processes, new_workspace, thread_federation


def test_one_answer_spends_the_plans_epsilon() -> None:
    settings = PlanPrivacy(report_epsilon=1.0, delta=1e-5, budget=4.0)
    release = answer_release(settings, ())
    # The release carries one record's L2 move in encoded units, inflated (never shrunk) by rounding.
    assert release.l2 >= tail.TailQuery(1.0).sensitivity()[1] * 2**sums.ENCODING.fractional_bits
    spent = distributed.epsilon([release], settings.delta - ROUNDING_BETA)
    assert spent == pytest.approx(1.0, rel=2e-3)  # calibrate's bisection tolerance is 1e-3
    assert distributed.epsilon([release] * 4, settings.delta - ROUNDING_BETA) <= 4.0 + 1e-9  # RDP composes sublinearly


def test_the_honest_survivors_carry_the_whole_noise() -> None:
    release = answer_release(PlanPrivacy(report_epsilon=2.0), ())
    # Five sites, quorum 3, one colluder, the complete graph: the smallest round's t = max(3 // 2 + 1, 1 + 2).
    floor = plan_floor(5, 3, SecurityParameters(max_colluding=1), True)
    assert floor == 3 and plan_floor(5, 3, SecurityParameters(max_colluding=1), False) == 5
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
        ({"mode": "distributed", "epsilon": 30.0, "report_epsilon": 1.0}, True, "budget = 10 is below 30"),
        # Noised training beside exact answers: the answers would decode exactly (issue 93).
        (
            {"mode": "distributed", "epsilon": 3.0},
            True,
            r'mode = "distributed" protects training, but without '
            r"report_epsilon .* go to the aggregator exact; set report_epsilon \(e.g. 1.0\)",
        ),
        ({"mode": "local"}, True, r'mode = "local" protects training, but without report_epsilon'),
        # Red team: without secure aggregation the fix named was report_epsilon, which the next load refused
        # ("remove report_epsilon"): both steps are named now.
        ({"mode": "local"}, False, r"turn \[secure_aggregation\] on and set report_epsilon \(e.g. 1.0\)"),
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


def site_ledger(tmp_path: Path, name: str = "site-1") -> Ledger:
    return Ledger(tmp_path / f"{name}.data.ledger.json", name, {"csv": f"/data/{name}.csv"})


def test_the_ledger_refuses_an_answer_past_the_budget_and_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "site-1.fed.bindings.json"
    release = answer_release(PlanPrivacy(report_epsilon=1.0), ())
    record = InputRecord(path, "fed", ledger=site_ledger(tmp_path))
    # RDP composes answers at 1.0, 1.46, 1.82, ... epsilon: a budget of 1.6 holds two.
    first = record.charge(Charge("evaluate", 1, "m1", release, 1e-5), 1.6)
    second = record.charge(Charge("evaluate", 2, "m2", release, 1e-5), 1.6)
    assert first == pytest.approx(1.0, rel=2e-3) and first < second <= 1.6
    restarted = InputRecord(path, "fed", ledger=site_ledger(tmp_path))
    assert site_ledger(tmp_path).spent(1e-5) == pytest.approx(second, rel=1e-12)
    assert [entry["round"] for entry in site_ledger(tmp_path).releases()] == [1, 2]
    with pytest.raises(
        PrivacyBudgetError,
        match=r"round 3 \(evaluate\) of federation fed would spend epsilon .* past .* budget of 1.6 for this "
        r"data; spent so far: epsilon .* on 2 evaluate answers in fed",
    ):
        restarted.charge(Charge("evaluate", 3, "m3", release, 1e-5), 1.6)
    assert len(site_ledger(tmp_path).releases()) == 2  # a refused answer charges nothing


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
    expected_std = decoded_noise_std(release, plan_floor(3, 2, SecurityParameters(), True), 0, 3)
    assert all(item["noise_std"] == pytest.approx(expected_std, rel=1e-9) for item in evaluations)
    for name in names:
        ledger = open_ledger(load_collaborator_config(workspace.configs[name])).releases()
        assert [entry["round"] for entry in ledger] == [item["round"] for item in evaluations]
        assert all(entry["mu"] == pytest.approx(release.mu) for entry in ledger)


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
        (PrivacyConfig(enabled=True, noise_multiplier=1.0), PlanPrivacy(report_epsilon=1.0), None),
        (PrivacyConfig(enabled=True, noise_multiplier=1.0), PlanPrivacy(mode="local", report_epsilon=1.0), None),
        (PrivacyConfig(), PlanPrivacy(mode="local", report_epsilon=1.0), "its updates would leave un-noised"),
        (
            PrivacyConfig(enabled=True, noise_multiplier=0.0),
            PlanPrivacy(mode="local", report_epsilon=1.0, budget=2.0),
            "noise_multiplier = 0 adds no noise to DP-SGD: its updates would leave clipped but exact, with no finite "
            "epsilon, under a plan whose [privacy] budget is 2; set target_epsilon = 2 or less",
        ),
        (
            PrivacyConfig(enabled=True, target_epsilon=2.0),
            PlanPrivacy(mode="local", report_epsilon=1.0, budget=2.0),
            None,
        ),
        (
            PrivacyConfig(enabled=True, target_epsilon=2.5),
            PlanPrivacy(mode="local", report_epsilon=1.0, budget=2.0),
            "target_epsilon = 2.5 is past the plan's [privacy] budget 2",
        ),
        (
            PrivacyConfig(enabled=True, noise_multiplier=1.0, delta=0.5),
            PlanPrivacy(mode="local", report_epsilon=1.0),
            "delta = 0.5 is above the plan's [privacy] delta 1e-05",
        ),
        (
            PrivacyConfig(enabled=True, noise_multiplier=1.0, delta=1e-7),
            PlanPrivacy(mode="local", report_epsilon=1.0),
            None,
        ),
        (
            PrivacyConfig(enabled=True, noise_multiplier=1.0),
            PlanPrivacy(),
            "local DP-SGD noise to training, and the plan sends the evaluation answers and the table statistics "
            "to the aggregator exact ([privacy] report_epsilon unset); ask the operator for a plan with "
            "report_epsilon",
        ),
    ],
)
def test_a_collaborator_refuses_a_plan_below_its_own_privacy(
    own: PrivacyConfig, plan: PlanPrivacy, refused: str | None
) -> None:
    shortfall = privacy_shortfall(own, plan, secure=True)
    if refused is None:
        assert shortfall is None
    else:
        assert shortfall is not None and refused in shortfall


def test_a_site_without_its_own_dp_sgd_refuses_a_plan_that_leaves_training_noise_to_each_site(
    tmp_path: Path, processes: Processes
) -> None:
    """Red team: a plan's mode = "local" promises each institution's own DP-SGD and nothing else noises training.
    A real site whose config has no [privacy] joined it and would have sent exact updates; it now exits 2 with
    plan-mismatch before anything leaves, naming its config's [privacy] and the operator's mode = "off"."""
    workspace = new_workspace(tmp_path, ["site-a", "site-b"], privacy={"mode": "local", "report_epsilon": 1.0})
    processes.aggregator(workspace)
    site = processes.collaborator(workspace, "site-a")
    assert site.wait(timeout=180) == 2, processes.tail()
    said = "\n".join(site.lines)
    assert "plan-mismatch" in said and 'mode = "local" trains under each institution\'s own DP-SGD' in said, said
    assert "set [privacy] enabled = true" in said and 'ask the operator for mode = "off"' in said
    # Nothing was charged nor kept: the refusal came before the one-input record and the ledger were opened.
    assert not list(tmp_path.rglob("*.bindings.json"))
    assert not open_ledger(load_collaborator_config(workspace.configs["site-a"])).releases()


def test_a_site_states_its_floor_on_a_distributed_plans_noise_in_its_config(tmp_path: Path) -> None:
    """Red team 2 (F4): the refusal of local DP-SGD under a distributed plan names `mode = "distributed"` in the
    site's [privacy], which its config reader refused ("unknown key 'mode'"), so no site could state its floor and
    the epsilon comparison was unreachable. Written in a real collaborator.toml, the floor now holds: the plan's
    epsilon 1 is refused by a site that allows 0.5 and accepted by one that allows 1."""
    workspace = new_workspace(
        tmp_path,
        ["site-a", "site-b"],
        training={"rounds": 2, "local_steps": 1, "batch_fraction": 0.05},
        secure_aggregation={"modulus_bits": 64},
        privacy={"mode": "distributed", "epsilon": 1.0, "report_epsilon": 1.0},
    )
    plan = load_aggregator_plan(workspace.plan)
    path = workspace.configs["site-a"]
    base = path.read_text()
    path.write_text(base + "\n[privacy]\nenabled = true\ntarget_epsilon = 0.5\n")
    refusal = privacy_shortfall(load_collaborator_config(path).privacy, plan.privacy, secure=True)
    assert refusal is not None and 'set mode = "distributed" and a target_epsilon' in refusal
    for allowed, refused in ((0.5, True), (1.0, False)):
        path.write_text(base + f'\n[privacy]\nenabled = true\nmode = "distributed"\ntarget_epsilon = {allowed}\n')
        config = load_collaborator_config(path)
        assert config.privacy.mode == "distributed" and config.privacy.target_epsilon == allowed
        shortfall = privacy_shortfall(config.privacy, plan.privacy, secure=True)
        if refused:
            assert shortfall is not None and "more than this institution's [privacy] allows (epsilon 0.5" in shortfall
        else:
            assert shortfall is None
    path.write_text(base + '\n[privacy]\nenabled = true\nmode = "distributed"\n')
    with pytest.raises(ConfigError, match="set target_epsilon"):
        load_collaborator_config(path)
    path.write_text(base + '\n[privacy]\nenabled = true\nmode = "central"\n')
    with pytest.raises(ConfigError, match="mode"):
        load_collaborator_config(path)


@pytest.mark.slow
def test_sites_stating_a_distributed_floor_train_under_a_plan_within_it(tmp_path: Path) -> None:
    """Red team 2 (F4), end to end: two real collaborators whose collaborator.toml asks for distributed noise at
    epsilon 2 (`mode = "distributed"`, target_epsilon = 2) join a plan of epsilon 2 and train every round inside
    the noised secure sum, each charging one training release a round."""
    names = ["site-a", "site-b"]
    workspace = new_workspace(
        tmp_path,
        names,
        training={"rounds": 2, "local_steps": 1, "batch_fraction": 0.05},
        secure_aggregation={"modulus_bits": 64},
        privacy={"mode": "distributed", "epsilon": 2.0, "max_grad_norm": 5.0, "report_epsilon": 1.0, "budget": 4.0},
    )
    for name in names:
        path = workspace.configs[name]
        path.write_text(path.read_text() + '\n[privacy]\nenabled = true\nmode = "distributed"\ntarget_epsilon = 2.0\n'
                        "budget_epsilon = 4.0\n")  # fmt: skip
    with thread_federation(workspace) as federation:
        federation.join(300)
    assert not federation.errors, federation.errors
    assert [record["status"] for record in read_round_log(workspace.output)] == ["applied", "applied"]
    for name in names:
        trained = [
            entry
            for entry in open_ledger(load_collaborator_config(workspace.configs[name])).releases()
            if entry["kind"] == "train"
        ]
        assert [entry["round"] for entry in trained] == [1, 2]


def test_a_collaborators_own_dp_sgd_joins_a_plan_without_secure_aggregation() -> None:
    """Without secure aggregation no plan can noise the answers, and the aggregator reads each site's answers and
    statistics exact whatever the site does: its own DP-SGD is accepted there, so its updates keep their noise."""
    own = PrivacyConfig(enabled=True, noise_multiplier=1.0)
    assert privacy_shortfall(own, PlanPrivacy(), secure=False) is None
    assert privacy_shortfall(own, PlanPrivacy(), secure=True) is not None


def test_the_ledger_composes_training_rounds_with_their_sampling_and_add_on(tmp_path: Path) -> None:
    """A run's training rounds charged one by one spend exactly what the run's calibration promised, and
    answers on top compose with them; grouping identical rounds changes nothing but the time."""
    noise = distributed.training_noise(3.0, 1e-5, sensitivity=2.0, sampling_rate=0.01, steps=50, dimension=110)
    record = InputRecord(tmp_path / "site-a.fed.bindings.json", "fed", ledger=site_ledger(tmp_path, "site-a"))
    one = dataclasses.replace(noise.release, steps=1)
    for round_number in range(1, 51):
        spent = record.charge(Charge("train", round_number, f"m{round_number}", one, 1e-5, noise.addon / 50), 10.0)
    assert spent == pytest.approx(noise.epsilon(50, 1e-5), rel=1e-9)
    assert spent == pytest.approx(3.0, rel=2e-3)
    answer = answer_release(PlanPrivacy(report_epsilon=0.5), ())
    total = record.charge(Charge("evaluate", 50, "m50", answer, 1e-5, ROUNDING_BETA), 10.0)
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
        privacy={"mode": "distributed", "epsilon": 2.0, "max_grad_norm": 5.0, "report_epsilon": 1.0},
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
        site = open_ledger(load_collaborator_config(workspace.configs[name]))
        trained = [entry for entry in site.releases() if entry["kind"] == "train"]
        assert [entry["round"] for entry in trained] == list(range(1, rounds + 1))
        assert all(entry["sampling_rate"] == pytest.approx(0.05) for entry in trained)
        # Every round is one step of the run the noise was calibrated for: all three spend 3/rounds of it.
        assert plan.privacy.epsilon is not None
        assert 0 < composed(trained, plan.privacy.delta) < plan.privacy.epsilon
        spent = site.spent(plan.privacy.delta)  # with the noised answers the plan needs beside noised training
    page = write_report(workspace.output).read_text()
    assert f"{rounds} training rounds decoded with Skellam noise inside the secure sum" in page
    assert f"standard deviation {stds[0]:.3g} per coordinate" in page and "fedfair collaborator ledger" in page
    assert cli_main(["collaborator", "ledger", "--config", str(workspace.configs["site-a"])]) == 0
    printed = capsys.readouterr().out
    assert f"epsilon {spent:.4g} spent at delta 1e-05 over every federation" in printed
    assert f"federation {plan.federation_id}: epsilon {spent:.4g} alone" in printed
    assert "train          3 releases, rounds 1-3 (Skellam inside the secure sum, Poisson sampling q = 0.05)" in printed


def test_a_training_only_privacy_section_is_shared_and_pinned(tmp_path: Path) -> None:
    """mode = "distributed" travels in the shared plan (and so in the manifest's digest): an aggregator cannot
    serve the same plan without the training noise."""
    workspace = new_workspace(
        tmp_path,
        ["site-a", "site-b", "site-c"],
        training={"local_steps": 1},
        secure_aggregation={"modulus_bits": 64},
        privacy={"mode": "distributed", "epsilon": 2.0, "report_epsilon": 1.0},
    )
    plan = load_aggregator_plan(workspace.plan)
    assert shared_content(plan)["privacy"]["mode"] == "distributed"
    assert shared_content(plan)["privacy"]["epsilon"] == 2.0


def test_the_templates_default_spends_the_evaluation_budget_on_the_final_answer() -> None:
    """The plan `fedfair init` writes noises every evaluation, the final one at report_epsilon and the 9 earlier
    ones (50 rounds, every 5) at interim_report_epsilon: 1.23 of the budget of 10 in all, as its comment says,
    where 10 answers at report_epsilon spent 3.6."""
    plan = load_aggregator_plan(Path(__file__).parents[2] / "aggregator" / "plan.toml", check_manifest=False)
    privacy = plan.privacy
    assert privacy.noised and not privacy.distributed and privacy.budget == 10.0
    assert (privacy.report_epsilon, privacy.interim_report_epsilon) == (1.0, 0.2)
    answers = plan.training.rounds // plan.evaluation.every
    assert answers == 10
    releases = [answer_release(privacy, (), final=False)] * (answers - 1) + [answer_release(privacy, ())]
    spent = distributed.epsilon(releases, privacy.delta - answers * ROUNDING_BETA)
    assert spent == pytest.approx(1.23, abs=0.01) and spent < privacy.budget
    final_only = distributed.epsilon(releases[-1:], privacy.delta - ROUNDING_BETA)
    assert final_only == pytest.approx(1.0, rel=2e-3)


def test_interim_answers_need_a_noised_final_one() -> None:
    with pytest.raises(ConfigError, match="set report_epsilon too"):
        read_plan_privacy("plan.toml", {"privacy": {"interim_report_epsilon": 0.2}}, True, LocalConfig())


@pytest.mark.parametrize(
    ("collaborators", "sections", "floor"),
    [
        # Dropouts allowed: no sum is unmasked below the least threshold of any round.
        (51, {"secure_aggregation": {"max_colluding": 5}}, 15),  # SecAgg+ k = 22: t = (23 + 5) // 2 + 1
        (10, {"secure_aggregation": {"max_colluding": 1}, "quorum": {"min_collaborators": 10}}, 6),
        (10, {"secure_aggregation": {"max_colluding": 1, "threshold": 8}, "quorum": {"min_collaborators": 10}}, 8),
        (3, {"secure_aggregation": {"max_colluding": 0}, "quorum": {"min_collaborators": 2}}, 2),
        # Two sites (init's plan for them): every round at the floor, each site's share the whole charge.
        (2, {"secure_aggregation": {"max_colluding": 0}, "quorum": {"min_collaborators": 2}}, 2),
        # Dropouts none: every collaborator is in every sum.
        (4, {"secure_aggregation": {"dropouts": "none"}, "quorum": {"min_collaborators": 4}}, 4),
    ],
)
def test_the_noise_is_carried_by_the_fewest_survivors_a_round_can_unmask(
    collaborators: int, sections: dict[str, dict[str, object]], floor: int
) -> None:
    learning = read_learning("plan.toml", sections, collaborators)
    assert learning.survivor_floor(collaborators) == floor
    # Calibrated to that floor, the survivors of the smallest sum whose shares no single reader knows carry the
    # whole noise: the aggregator knows its colluders' shares, a survivor its own (one, when no site colludes).
    release = answer_release(PlanPrivacy(report_epsilon=1.0), ())
    colluders = learning.secure_aggregation.max_colluding
    unknown = floor - max(colluders, 1)
    assert unknown * party_mu(release, floor, colluders) == pytest.approx(release.mu, rel=1e-12)


def test_a_plan_without_interim_report_epsilon_keeps_the_digest_it_had_before_the_setting(tmp_path: Path) -> None:
    """Left out of the shared plan when unset, so a noised plan written before the setting existed keeps its
    digest (and its checkpoints resume); set, it travels and is pinned."""
    workspace = new_workspace(tmp_path / "old", ["site-a", "site-b", "site-c"], privacy={"report_epsilon": 1.0})
    old = load_aggregator_plan(workspace.plan)
    assert "interim_report_epsilon" not in shared_content(old)["privacy"]
    assert shared_content(old)["privacy"] == {
        "budget": 10.0, "delta": 1e-05, "epsilon": None, "max_grad_norm": 20.0, "mode": "off", "report_epsilon": 1.0
    }  # fmt: skip
    new = new_workspace(
        tmp_path / "new", ["site-a", "site-b", "site-c"], privacy={"report_epsilon": 1.0, "interim_report_epsilon": 0.2}
    )
    assert shared_content(load_aggregator_plan(new.plan))["privacy"]["interim_report_epsilon"] == 0.2


def test_the_statistics_release_spends_one_answers_epsilon_on_the_schemas_sensitivity() -> None:
    """One record moves the noised statistics of an age (range [0, 120]) and a sex column by L1 = 1 + 3 + 1 = 5
    and L2 = sqrt(5) real units, 2^12 encoded units each, before rounding inflates them; their release
    spends report_epsilon at delta less the rounding's beta, to the calibration's tolerance."""
    schema = Schema(
        "y", ("no", "yes"), (Column("age", "numeric", None, (0.0, 120.0)), Column("sex", "categorical", ("f", "m")))
    )
    release = statistics_release(PlanPrivacy(report_epsilon=1.0), schema)
    scale, dimension = 2.0**NOISED_STATISTICS_FRACTIONAL_BITS, 1 + 3 + 3
    assert release.l1 == 5 * scale + dimension
    assert release.l2 == rounding.rounded_l2(math.sqrt(5) * scale, dimension, ROUNDING_BETA)
    assert 1.0 - 2e-3 <= distributed.epsilon([release], 1e-5 - ROUNDING_BETA) <= 1.0


def test_a_noised_plan_refuses_a_schema_without_public_ranges() -> None:
    schema = {"label": "y", "classes": ["a", "b"], "columns": [{"name": "age", "type": "numeric"}]}
    with pytest.raises(ConfigError, match=r"plan.toml: \[schema\] numeric column\(s\) age state no range"):
        read_learning("plan.toml", {"schema": schema, "privacy": {"report_epsilon": 1.0}}, 3)
    assert read_learning("plan.toml", {"schema": schema}, 3).schema is not None  # exact statistics need none


def test_equal_weights_calibrate_the_training_noise_to_one_records_true_move() -> None:
    """Under equal weights a site sends its update -lr S / b_k with weight 1, so one record moves the sum by
    sqrt((lr C)^2 + (threshold_lr C_c)^2) / b_k, and the noise must cover the smallest batch: 1 / 50 of what
    declared weights (w_k = b_k, one record moving it by the whole) need, here with b = 100, 50, 200. The
    unweighted update keeps its own bound, so the encoder projects equal and declared updates alike."""
    sizes = {"site-a": 2000, "site-b": 1000, "site-c": 4000}
    data: dict[str, dict[str, object]] = {
        "training": {"rounds": 20, "local_steps": 1, "batch_fraction": 0.05},
        "secure_aggregation": {"modulus_bits": 64},
        "privacy": {"mode": "distributed", "epsilon": 2.0, "max_grad_norm": 5.0, "report_epsilon": 1.0},
    }
    equal = read_learning("plan.toml", {**data, "influence": {"weights": "equal", "sizes": sizes}}, 3)
    declared = read_learning("plan.toml", {**data, "influence": {"weights": "declared", "sizes": sizes}}, 3)
    assert equal.influence.weight_per_record(0.05) == 1 / 50 and declared.influence.weight_per_record(0.05) == 1.0
    dimension = 101
    noise, _ = equal.training_noise(3, dimension)
    local, objective = equal.training.local, equal.objective
    threshold = threshold_clip(training_privacy(equal.privacy, 0.05), objective.epsilon, objective.rho)
    exact = math.hypot(local.lr * 5.0, local.threshold_lr * threshold) / 50
    expected = distributed.training_noise(2.0, 1e-5, exact, 0.05, 20, distributed.padded_dimension(dimension))
    assert (noise.fractional_bits, noise.release) == (expected.fractional_bits, expected.release)
    before, _ = declared.training_noise(3, dimension)

    def std(calibrated: distributed.TrainingNoise) -> float:
        return math.sqrt(2.0 * calibrated.release.mu) / 2.0**calibrated.fractional_bits

    # Rounding inflates each sensitivity by about d / 4 units of 2^11 to 2^12: under 1%.
    assert std(noise) == pytest.approx(std(before) / 50, rel=0.01)
    clip = [settings.training_encoding("fed", 3, 1, dimension).noise for settings in (equal, declared)]
    assert clip[0] is not None and clip[1] is not None
    assert clip[0].norm_clip == pytest.approx(clip[1].norm_clip, rel=0.01)
    assert clip[1].norm_clip == pytest.approx(exact * 50, rel=0.01)
    assert (clip[0].weight_per_record, clip[1].weight_per_record) == (1 / 50, 1.0)


@pytest.mark.slow
def test_equal_weights_train_inside_the_secure_sum_with_the_noise_one_record_needs(tmp_path: Path) -> None:
    """Three real collaborators over mutual TLS under equal weights and mode = "distributed": every round
    applies (the encoder bounds the unweighted update at its own scale, not the smaller sensitivity), and
    the mean update carries the noise calibrated to one record's move over the smallest batch."""
    names = ["site-a", "site-b", "site-c"]
    sections: dict[str, dict[str, object]] = {
        "training": {"rounds": 2, "local_steps": 1, "batch_fraction": 0.05},
        "secure_aggregation": {"modulus_bits": 64},
        "privacy": {"mode": "distributed", "epsilon": 2.0, "max_grad_norm": 5.0, "report_epsilon": 1.0},
    }
    # The sizes a workspace declares for Adult's race split (DP fixes each batch from them).
    declared = load_aggregator_plan(new_workspace(tmp_path / "sizes", names, **sections).plan).influence.sizes
    workspace = new_workspace(tmp_path / "equal", names, **sections, influence={"weights": "equal", "sizes": declared})
    with thread_federation(workspace) as federation:
        federation.join(300)
    assert not federation.errors, federation.errors
    plan = federation.plan
    assert plan.influence.weight_per_record(plan.batch_fraction) == 1 / min(
        max(round(0.05 * size), 1) for size in declared.values()
    )
    log = read_round_log(workspace.output)
    assert [record["status"] for record in log] == ["applied", "applied"]
    dimension = plan.model.features * plan.model.classes + plan.model.classes + 1  # theta (logreg) and c
    noise, share = plan.training_noise(3, dimension)
    expected = math.sqrt(2.0 * 3 * share) / 2.0**noise.fractional_bits / 3  # three parties' shares, over W = 3
    assert all(record["mean_update_noise_std"] == pytest.approx(expected, rel=1e-9) for record in log)
