"""A site that missed a bounded round catches up and rejoins (issues 98 and 94): real processes over loopback mTLS.

Three sites and an auditor, 4 rounds, every round waiting for all three. site-c is killed (SIGKILL) in round 2 right
after it uploads its tags, before it verifies the total (which would step its chain): round 2 applies with its input
(the others verify the total), but site-c's chain holds no verified total of round 2, so, restarted, it could check
no later model. Before, it sat out
rounds 3 and 4 and ended ``model-unchecked`` with no bundle. Now it fetches round 2's kept SHARE opening, verdict
record and tag set, checks them as an accepted site would (every accepted site's and the auditor's signed tags over
the record), applies the server step to the total itself, trains rounds 3 and 4 on models it checked, and ends
with exit 0 and the others' bundle.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.kinds.bounded import RECORD_SUFFIX
from fedfair.runtime.local.processes import Child
from fedfair.runtime.local.workspace import Workspace
from tests.runtime.harness import Processes
from tests.runtime.test_bounded_processes import NAMES, bounded_workspace, start_auditor
from tests.runtime.test_catch_up import MISSED, caught_up_with_the_others, outcome

ROUNDS = 4
KILLED = f"after-upload:{MISSED}:STAGE_BOUNDED_DECIDE"


def workspace_of(tmp_path: Path) -> Workspace:
    """Three sites and the auditor, 4 rounds, every round waiting for all three (round 3 waits for site-c)."""
    return bounded_workspace(
        tmp_path,
        training={"rounds": ROUNDS, "local_steps": 1},
        quorum={"min_collaborators": 3, "round_timeout_seconds": 60.0},
    )


def killed_and_restarted(processes: Processes, workspace: Workspace) -> dict[str, Child]:
    """site-a and site-b, and site-c started again after its kill in round 2."""
    sites = {name: processes.collaborator(workspace, name) for name in NAMES[:2]}
    killed = processes.collaborator(workspace, "site-c", fault=KILLED)
    assert killed.wait(240) == -9, processes.tail()
    sites["site-c"] = processes.collaborator(workspace, "site-c")
    return sites


@pytest.mark.slow
def test_a_site_killed_in_a_bounded_round_catches_up_and_ends_with_the_others(
    tmp_path: Path, processes: Processes
) -> None:
    workspace = workspace_of(tmp_path)
    aggregator = processes.aggregator(workspace)
    auditor = start_auditor(processes, workspace)
    sites = killed_and_restarted(processes, workspace)
    assert aggregator.wait(400) == 0, processes.tail()
    assert auditor.wait(60) == 0, processes.tail()
    log = read_round_log(workspace.output)
    assert [(record["round"], record["status"]) for record in log] == [(n, "applied") for n in range(1, ROUNDS + 1)]
    for record in log:  # site-c's input is in round 2 (it tagged, then died), and it trained every later round
        assert sorted(record["contributors"]) == list(NAMES), record
    caught_up_with_the_others(processes, workspace, sites)
    assert not any("model-unchecked" in line for line in sites["site-c"].lines), sites["site-c"].lines[-20:]
    # site-c keeps the verdict record of the round it checked as a bystander, as a participant keeps its own.
    folder = workspace.configs["site-c"].parent
    assert len(list(folder.glob(f"site-c.*.round-{MISSED}.{RECORD_SUFFIX}"))) == 1


@pytest.mark.slow
def test_a_kept_tag_set_short_of_a_sites_tags_is_refused(tmp_path: Path, processes: Processes) -> None:
    """The aggregator keeps round 2's tag set less site-a's signed tags for a site that missed it
    (forging_aggregator.py, ``bounded-past``), while every party of the round was shown them all: site-c cannot check
    the total, refuses round 2 (MISSING_TAG), stops with exit 2 and keeps no bundle."""
    workspace = workspace_of(tmp_path)
    processes.forging_aggregator(workspace, str(MISSED), "bounded-past")
    start_auditor(processes, workspace)
    restarted = killed_and_restarted(processes, workspace)["site-c"]
    assert restarted.wait(240) == 2, processes.tail()
    said = "\n".join(restarted.lines)
    assert f"aggregate-refused: round {MISSED}:" in said and "MISSING_TAG" in said, said[-3000:]
    record = outcome(workspace, "site-c")
    assert record.refusal is not None and (record.refusal.round, record.refusal.reason) == (MISSED, "MISSING_TAG")
    assert "a round it missed" in record.refusal.detail and "party 1" in record.refusal.detail, record.refusal.detail
    assert not list(workspace.configs["site-c"].parent.glob("site-c.*model_bundle*"))
