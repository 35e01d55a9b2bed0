"""A site that missed a verified round catches up and rejoins; a forged past round is refused (issue 98).

Real processes over loopback mutual TLS: site-c is killed (SIGKILL) in round 2 of 4, right before its tag of the
claimed sum. Round 2 applies (site-a and site-b re-sum it), so site-c's chain holds no verified sum of round 2 and,
restarted, could check no later model: before, it sat out rounds 3 and 4 and ended ``model-unchecked`` with no
bundle. The quorum is all three, so round 3 waits for site-c's restart. Now site-c fetches round 2's kept inputs,
checks the sum as a survivor would, steps its chain, and trains rounds 3 and 4 on models it checked: it ends with
exit 0, the same bundle as the others and nothing sat out. Against an aggregator that keeps a forged claim of round
2 for it (tests/runtime/forging_aggregator.py, ``past``), site-c refuses round 2 (FORGED) and keeps no bundle.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.outcome import OUTCOME_SUFFIX, OutcomeRecord
from fedfair.runtime.local.workspace import Workspace
from fedfair.runtime.output_folder import PAST_ROUNDS_NAME
from tests.runtime.harness import Processes, new_workspace

NAMES = ("site-a", "site-b", "site-c")
ROUNDS = 4
MISSED = 2
KILLED = f"before-upload:{MISSED}:STAGE_VERIFY_CLAIM"


def workspace_of(tmp_path: Path) -> Workspace:
    """Three sites, 4 rounds, every round waiting for all three (so round 3 waits for site-c's restart)."""
    return new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": ROUNDS, "server_momentum": 0.0, "local_steps": 1},
        quorum={"min_collaborators": 3, "round_timeout_seconds": 60.0},
    )


def outcome(workspace: Workspace, name: str) -> OutcomeRecord:
    config = workspace.configs[name]
    return OutcomeRecord(next(config.parent.glob(f"{name}.*.{OUTCOME_SUFFIX}")), 0)


def bundle_digest(workspace: Workspace, name: str) -> str:
    (bundle,) = workspace.configs[name].parent.glob(f"{name}.*.model_bundle.pt")
    return hashlib.sha256(bundle.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_site_killed_for_a_round_catches_up_and_ends_with_the_others(tmp_path: Path, processes: Processes) -> None:
    workspace = workspace_of(tmp_path)
    aggregator = processes.aggregator(workspace)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES[:2]}
    killed = processes.collaborator(workspace, "site-c", fault=KILLED)
    assert killed.wait(120) == -9, processes.tail()
    sites["site-c"] = processes.collaborator(workspace, "site-c")
    assert aggregator.wait(240) == 0, processes.tail()
    log = read_round_log(workspace.output)
    assert [(record["round"], record["status"]) for record in log] == [(n, "applied") for n in range(1, ROUNDS + 1)]
    assert log[MISSED - 1]["contributors"] == list(NAMES), log[MISSED - 1]  # site-c masked its input, then died
    for record in log[MISSED:]:
        assert record["contributors"] == list(NAMES), record  # it rejoined at round 3 and trained every later round
    for name, site in sites.items():
        assert site.wait(60) == 0, processes.tail()
        kept = outcome(workspace, name)
        assert kept.refusal is None and kept.sat_out == {}, (name, kept.sat_out)
    said = [line for line in sites["site-c"].lines if "caught up" in line]
    assert len(said) == 1 and f"round {MISSED}: caught up" in said[0], said
    assert len({bundle_digest(workspace, name) for name in NAMES}) == 1
    # Every site verified round 4 (the last), so no kept round is left for anyone.
    assert not any((workspace.output / PAST_ROUNDS_NAME).iterdir())


@pytest.mark.slow
def test_a_forged_round_it_missed_is_refused(tmp_path: Path, processes: Processes) -> None:
    workspace = workspace_of(tmp_path)
    processes.forging_aggregator(workspace, str(MISSED), "past")
    for name in NAMES[:2]:
        processes.collaborator(workspace, name)
    killed = processes.collaborator(workspace, "site-c", fault=KILLED)
    assert killed.wait(120) == -9, processes.tail()
    restarted = processes.collaborator(workspace, "site-c")
    assert restarted.wait(180) == 2, processes.tail()
    said = "\n".join(restarted.lines)
    assert f"aggregate-refused: round {MISSED}:" in said and "FORGED" in said, said[-3000:]
    record = outcome(workspace, "site-c")
    assert record.refusal is not None and (record.refusal.round, record.refusal.reason) == (MISSED, "FORGED")
    assert "is not the sum of the survivors' masked inputs" in record.refusal.detail
    assert not list(workspace.configs["site-c"].parent.glob("site-c.*model_bundle*"))
