"""A site's ledger from its own config: keyed by its data, shown and reset only through its operator's CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from fedfair.cli import main as cli_main
from fedfair.privacy import distributed
from fedfair.privacy.accounting import compute_epsilon
from fedfair.privacy.ledger import Charge
from fedfair.runtime.collaborator.charges import open_ledger
from fedfair.runtime.collaborator.config import CollaboratorConfig, load_collaborator_config
from fedfair.runtime.local.workspace import make_workspace

RELEASE = distributed.Release("skellam", 2e6, 40.0, 10.0, 0.05)
DELTA = 1e-5


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
