"""A site's ledger from its own config: keyed by its data, shown and reset only through its operator's CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from fedfair.cli import main as cli_main
from fedfair.core.errors import PrivacyBudgetError
from fedfair.privacy import distributed
from fedfair.privacy.accounting import compute_epsilon
from fedfair.privacy.ledger import Charge
from fedfair.runtime.collaborator.charges import Charges, open_ledger, open_site_accountant
from fedfair.runtime.collaborator.config import CollaboratorConfig, load_collaborator_config
from fedfair.runtime.collaborator.input_record import InputRecord
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from tests.runtime.harness import new_workspace

RELEASE = distributed.Release("skellam", 2e6, 40.0, 10.0, 0.05)
DELTA = 1e-5
ANSWER = distributed.Release("skellam", 1000.0, 40.0, 10.0)
"""An evaluation answer of epsilon 0.90 alone at DELTA."""
STEPS = distributed.gaussian_release(1.0, 0.01, 100)
"""100 DP-SGD steps at sigma 1, q 0.01: epsilon 1.22 alone by RDP at DELTA."""


@pytest.fixture
def config(tmp_path: Path) -> CollaboratorConfig:
    workspace = make_workspace(tmp_path, ["site-a", "site-b"])
    return load_collaborator_config(workspace.configs["site-a"])


def test_the_ledger_command_shows_each_federations_spend_and_refuses_an_edited_ledger(
    config: CollaboratorConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = open_ledger(config)
    for round_number, federation in enumerate(("first", "first", "second"), start=1):
        ledger.charge(federation, Charge("evaluate", round_number, f"m{round_number}", RELEASE, DELTA), 1e9)
    assert cli_main(["collaborator", "ledger", "--config", str(config.source)]) == 0
    shown = capsys.readouterr().out
    total = distributed.epsilon([dataclasses.replace(RELEASE, steps=3)], DELTA)
    assert f"epsilon {total:.4g} spent at delta 1e-05 over every federation" in shown
    assert "federation first: epsilon" in shown and "federation second: epsilon" in shown
    document = json.loads(ledger.path.read_text())
    document["entries"][1]["mu"] = 4e6  # in range, so only the chain can tell
    ledger.path.write_text(json.dumps(document))
    assert cli_main(["collaborator", "ledger", "--config", str(config.source)]) == 2
    said = capsys.readouterr().err
    assert f"{ledger.path}: entry 2: its prev is not the hash of the entry before it" in said, said


def test_only_a_confirmed_reset_starts_the_ledger_again_and_it_is_logged(
    config: CollaboratorConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = open_ledger(config)
    ledger.charge("first", Charge("train", 1, "m1", RELEASE, DELTA), 1e9)
    reset = ["collaborator", "reset-ledger", "--config", str(config.source), "--reason", "new cohort"]
    assert cli_main(reset) == 2
    assert "nothing reset" in capsys.readouterr().err
    assert open_ledger(config).spent(DELTA) == pytest.approx(distributed.epsilon([RELEASE], DELTA))
    assert cli_main([*reset, "--confirm"]) == 0
    again = open_ledger(config)
    assert again.spent(DELTA) == 0.0 and again.resets == 1 and again.count("first") == 1
    logged = (config.source.parent / "site-a.log").read_text()
    assert f"privacy ledger {ledger.path} reset by its operator (new cohort)" in logged
    assert cli_main(["collaborator", "ledger", "--config", str(config.source)]) == 0
    assert "reset 1 time(s) by its operator" in capsys.readouterr().out


def test_a_per_federation_record_of_before_is_folded_in_with_a_warning(
    config: CollaboratorConfig, caplog: pytest.LogCaptureFixture
) -> None:
    release = {"kind": "evaluate", "round": 1, "model": "m", "mechanism": "skellam", "mu": 2e6, "l1": 40.0,
               "l2": 10.0, "sampling_rate": 0.05, "addon": 0.0, "delta": DELTA}  # fmt: skip
    record = {"format": "fedfair-bindings", "version": 2, "latest": 1, "inputs": {}, "kept": {}, "trainings": 0,
              "thresholds": {}, "releases": [release]}  # fmt: skip
    (config.source.parent / "site-a.old.bindings.json").write_text(json.dumps(record))
    ledger = open_ledger(config)
    assert [entry["federation"] for entry in ledger.releases()] == ["old"]
    assert "the privacy releases of federation old were kept in its record only; folded into" in caplog.text


def test_the_ledger_command_shows_the_sites_own_dp_sgd_spend_too(
    config: CollaboratorConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    """Local DP-SGD is accounted per dataset as well: a per-federation file of before is folded in and shown,
    with its epsilon computed as the accountant computes it."""
    (config.source.parent / "site-a.old.privacy.json").write_text(
        '{"format": "fedfair-privacy-accountant", "version": 2, "federation": "old", "rounds": 2, '
        '"history": [[1.0, 0.05, 10]]}'
    )
    assert cli_main(["collaborator", "ledger", "--config", str(config.source)]) == 0
    shown = capsys.readouterr().out
    epsilon = compute_epsilon(1.0, 0.05, 10, config.privacy.delta)
    assert (
        f"DP-SGD on this data (local), epsilon {epsilon:.4g} at delta {config.privacy.delta:g} over 10 steps" in shown
    )
    assert "federation old: 2 rounds" in shown


def test_a_named_datasets_ledger_composes_its_own_dp_sgd_steps(config: CollaboratorConfig) -> None:
    """Red team 2 (F2): a site whose [data] names a dataset partition (what `make_workspace` and the built-in
    launches write) had a ledger without its DP-SGD steps: 0.90 for the answer alone where the composition is 1.45,
    and an answer that fits only without the steps admitted under a budget of 1."""
    assert config.data.csv is None and config.data.dataset == "adult"
    accountant, _ = open_site_accountant(config, "fed-one")
    accountant.spend(1.0, 0.01, 100)
    joint = distributed.epsilon([ANSWER, STEPS], DELTA)
    assert distributed.epsilon([ANSWER], DELTA) < 1.0 < joint == pytest.approx(1.45, abs=0.01)
    with pytest.raises(PrivacyBudgetError, match="DP-SGD"):
        open_ledger(config).charge("fed-one", Charge("evaluate", 1, "m", ANSWER, DELTA), 1.0)
    spent = open_ledger(config).charge("fed-one", Charge("evaluate", 1, "m", ANSWER, DELTA), 1e9)
    assert spent == pytest.approx(joint, rel=1e-9)


def test_the_ledger_holds_a_site_to_its_target_epsilon_when_it_sets_no_budget(tmp_path: Path) -> None:
    """Red team 2 (F5): with target_epsilon = 1 and no budget_epsilon the site's budget is 1 ("with a target and no
    budget the target is the budget"), not the plan's 10: two answers of 0.90 each (1.31 together) passed before."""
    workspace = new_workspace(tmp_path, ["site-a", "site-b"], privacy={"mode": "local", "report_epsilon": 1.0})
    path = workspace.configs["site-a"]
    path.write_text(path.read_text() + "\n[privacy]\nenabled = true\ntarget_epsilon = 1.0\n")
    config = load_collaborator_config(path)
    plan = load_aggregator_plan(workspace.plan)
    assert plan.privacy.budget == 10.0
    record = InputRecord(tmp_path / "site-a.bindings.json", plan.federation_id, ledger=open_ledger(config))
    charges = Charges(config, plan, record)
    assert charges.budget == 1.0
    record.charge(Charge("evaluate", 1, "m1", ANSWER, DELTA), charges.budget)
    with pytest.raises(PrivacyBudgetError, match="past this institution.s budget of 1 for this data"):
        record.charge(Charge("evaluate", 2, "m2", ANSWER, DELTA), charges.budget)
