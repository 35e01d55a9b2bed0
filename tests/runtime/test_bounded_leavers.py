"""A site lost at DECIDE in a bounded federation gives nobody its update (issue 80): real processes over loopback mTLS.

Site-c dies (kill -9) in round 1 right before it uploads its tags of the verdict record. Nobody can check the total
without them, so round 1 is void and the model stays, though the aggregator and the auditor already formed the total
with site-c's input in it. What round 2 may do depends on whether it sends new inputs:

- Under distributed DP each round's input is trained afresh and charged: round 2 applies without site-c.
- Without noise every site sends its kept input on the unchanged model again, bound to round 1's roster. A total
  of those inputs over site-a and site-b would be round 1's total less site-c's exact update. So the aggregator
  waits once for site-c and voids round 2 naming it (lost for good). Where site-c returns, it checks round 2's
  model (the plan's initial one: it verified no total) and re-sends its kept input: the auditor totals the same
  inputs over the same sites again, and round 2 applies. A total over fewer sites the auditor withholds
  (:meth:`~fedfair.runtime.auditor.kinds.bounded.AuditorRounds._check_inputs_totalled_before`,
  tests/runtime/test_bounded_rerun.py).

A site the aggregator sends a tampered verdict record refuses it and stops (FORGED, exit 2) before its tags: it is such
a leaver, and what round 2 may do is the same.

A site lost after its tags (before its own verdict at VERIFY) costs no round: its tags are in, so every other site
verifies the total, and round 2 applies without it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfair.runtime.aggregator.checkpoint import read_round_log
from tests.runtime.harness import Processes
from tests.runtime.test_bounded_plan import DP
from tests.runtime.test_bounded_processes import NAMES, ROUNDS, bounded_workspace, forging_aggregator, start_auditor

TIMEOUT = 10.0
"""The round timeout: how long round 2 waits once for a lost site bound to round 1's total."""
QUORUM = {"min_collaborators": 2, "round_timeout_seconds": TIMEOUT}
BEFORE_TAGS = "before-upload:1:STAGE_BOUNDED_DECIDE"


@pytest.mark.slow
@pytest.mark.parametrize("leaver", ["noised", "lost", "restarted"])
def test_a_site_lost_before_its_tags_voids_that_round_and_no_later_total_subtracts_it(
    tmp_path: Path, processes: Processes, leaver: str
) -> None:
    privacy = {"privacy": DP["privacy"]} if leaver == "noised" else {}
    workspace = bounded_workspace(tmp_path, quorum=QUORUM, **privacy)
    aggregator = processes.aggregator(workspace)
    auditor = start_auditor(processes, workspace)
    stayed = {name: processes.collaborator(workspace, name) for name in NAMES[:2]}
    lost = processes.collaborator(workspace, "site-c", fault=BEFORE_TAGS)
    assert lost.wait(180) == -9, processes.tail()
    if leaver == "restarted":
        returned = processes.collaborator(workspace, "site-c")
    # Round 1 aborted, and the plan allows none ([quorum] aborted_rounds_allowed = 0): exit 3.
    assert aggregator.wait(300) == 3, processes.tail()
    log = read_round_log(workspace.output)
    assert [record["round"] for record in log] == list(range(1, ROUNDS + 1)), log
    first, second = log
    assert first["status"] == "aborted" and "no tags of the bounded sum's total from site-c" in first["reason"], first
    if leaver == "noised":  # round 2's inputs are new: it applies over the two that stayed
        assert second["status"] == "applied" and sorted(second["contributors"]) == ["site-a", "site-b"], second
        return
    if leaver == "restarted":  # the same inputs over the same sites: totalled again, and round 2 applies
        assert second["status"] == "applied" and sorted(second["contributors"]) == list(NAMES), second
        assert returned.wait(120) == 3, processes.tail()  # round 1 aborted: exit 3, as every party
        said = "\n".join(returned.lines)
        assert "round 2 is run again on the model already trained on; re-sending the kept update" in said, said
        assert "model-unchecked" not in said, said  # round 2's model is the plan's initial one: it checked it
        assert not any("withholds" in line for line in auditor.lines), auditor.lines[-20:]
        return
    assert second["status"] == "aborted" and second["model_sha256"] == first["model_sha256"], log
    assert "site-c is not connected" in second["reason"], second
    assert any("waiting up to" in line and "for site-c" in line for line in aggregator.lines), processes.tail()
    for name, site in stayed.items():
        # Round 2 was void before any task; its evaluation is of the model each site checked for round 1.
        assert site.wait(120) == 3, (name, processes.tail())
        said = "\n".join(site.lines)
        assert "round 2 STAGE_TRAIN" not in said and "not contributing" not in said, said
        assert "model-unchecked" not in said, said


@pytest.mark.slow
def test_a_site_lost_before_its_verdict_costs_no_round(tmp_path: Path, processes: Processes) -> None:
    workspace = bounded_workspace(tmp_path, quorum=QUORUM)
    aggregator = processes.aggregator(workspace)
    start_auditor(processes, workspace)
    for name in NAMES[:2]:
        processes.collaborator(workspace, name)
    lost = processes.collaborator(workspace, "site-c", fault="before-upload:1:STAGE_BOUNDED_VERIFY")
    assert lost.wait(180) == -9, processes.tail()
    assert aggregator.wait(300) == 0, processes.tail()
    log = read_round_log(workspace.output)
    assert [record["status"] for record in log] == ["applied"] * ROUNDS, log
    assert sorted(log[0]["contributors"]) == list(NAMES), log[0]  # its tags were in: its input is in the sum
    assert sorted(log[1]["contributors"]) == ["site-a", "site-b"], log[1]


@pytest.mark.slow
@pytest.mark.parametrize("noised", [True, False], ids=["noised", "plain"])
def test_a_record_tampered_for_one_site_costs_that_site_and_its_round_where_inputs_are_noised(
    tmp_path: Path, processes: Processes, noised: bool
) -> None:
    """Issue 94: the aggregator moves a byte of the total in the record it sends site-c alone (forging_aggregator.py,
    ``tamper-one``). Site-c refuses it (FORGED, exit 2) and tags nothing, so round 1 is void for everyone. Under
    distributed DP round 2 applies over site-a and site-b: the record cost site-c and one round. Without noise round 2
    would be round 1's total less site-c's exact update, so it is void too (docs/security.md, "A record refused by one
    site")."""
    privacy = {"privacy": DP["privacy"]} if noised else {}
    workspace = bounded_workspace(tmp_path, quorum=QUORUM, **privacy)
    aggregator = forging_aggregator(processes, workspace, "tamper-one")
    start_auditor(processes, workspace)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES}
    assert sites["site-c"].wait(240) == 2, processes.tail()
    said = "\n".join(sites["site-c"].lines)
    assert "aggregate-refused: round 1:" in said and "FORGED" in said, said[-3000:]
    assert "not signed by the aggregator for this round" in said, said[-3000:]
    assert aggregator.wait(300) == 3, processes.tail()  # round 1 aborted, and the plan allows none
    first, second = read_round_log(workspace.output)
    assert first["status"] == "aborted" and "no tags of the bounded sum's total from site-c" in first["reason"], first
    # Site-c withdrew as it stopped: DECIDE, which waits for a site whose stream ended (a restart may take it up), did
    # not wait its deadline for it.
    assert first["answer_seconds"]["STAGE_BOUNDED_DECIDE"]["site-c"] is not None, first["answer_seconds"]
    if noised:
        assert second["status"] == "applied" and sorted(second["contributors"]) == ["site-a", "site-b"], second
    else:
        assert second["status"] == "aborted" and second["model_sha256"] == first["model_sha256"], second
        assert "site-c is not connected" in second["reason"], second
    for name in NAMES[:2]:
        assert sites[name].wait(120) == 3, (name, processes.tail())
