"""A site process killed after its SHARE upload and restarted: handed its round's DECIDE while that stage is open.

Real processes over loopback mTLS: three sites and the auditor, the two-verifier input bound, quorum 2. A site dies
(SIGKILL) right after its SHARE upload and is started again. DECIDE is rejoinable
(:attr:`~fedfair.secagg.round.StageSpec.rejoinable`): the aggregator waits for the site until the stage's deadline
and hands its new process the verdict record, which it answers from the settlement it kept at SHARE
(``NAME.FEDERATION.bounded_settlement``): an honest site tags it and the round applies with it; a site the aggregator
framed disputes it, and every other site names the aggregator, not the site. A process started again only after
DECIDE closed sits the round out, as before. However the restarted process ends, no settlement (its update) is left
once the federation is over (the red team found it left: FINDINGS.md F2).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.kinds.bounded_settlement import SETTLEMENT_SUFFIX
from fedfair.runtime.local.workspace import Workspace
from tests.runtime.conftest import processes  # noqa: F401 -- the runtime tests' fixture of child processes
from tests.runtime.harness import Processes, eventually
from tests.runtime.test_bounded_processes import (
    NAMES,
    bounded_workspace,
    checked_every_round,
    forging_aggregator,
    framed_and_cleared,
    start_auditor,
)

KILLED = "after-upload:2:STAGE_BOUNDED_SHARE"
TAKEN_UP = "took up its shared part, kept before its restart, to answer the verdict record"


def settlements(workspace: Workspace, name: str) -> list[str]:
    """The settlement files `name` keeps in its folder."""
    return sorted(path.name for path in workspace.configs[name].parent.glob(f"{name}.*.{SETTLEMENT_SUFFIX}"))


def two_rounds(root: Path, round_timeout: float) -> Workspace:
    """A two-round bounded federation of one local step a round, quorum 2: a round goes on without a lost site
    once the stage waited `round_timeout` seconds for it."""
    return bounded_workspace(
        root,
        training={"rounds": 2, "local_steps": 1},
        quorum={"min_collaborators": 2, "round_timeout_seconds": round_timeout},
    )


def killed_after_share(processes: Processes, workspace: Workspace, name: str, fault: str = KILLED) -> None:  # noqa: F811
    """Start `name` to die right after its SHARE upload (`fault`); it kept its settlement before its parts left."""
    killed = processes.collaborator(workspace, name, fault=fault)
    assert killed.wait(240) == -9, processes.tail()
    assert settlements(workspace, name), "kept at SHARE, before the kill"


@pytest.mark.slow
def test_a_site_restarted_between_share_and_decide_tags_the_record_and_its_round_applies(
    tmp_path: Path,
    processes: Processes,  # noqa: F811
) -> None:
    workspace = two_rounds(tmp_path, round_timeout=120.0)
    aggregator = processes.aggregator(workspace)
    start_auditor(processes, workspace)
    for name in NAMES[:2]:
        processes.collaborator(workspace, name)
    killed_after_share(processes, workspace, "site-c")
    restarted = processes.collaborator(workspace, "site-c")
    processes.finish(aggregator, timeout=300)  # every process exits 0: site-c's record holds its update in both rounds
    log = read_round_log(workspace.output)
    assert [record["status"] for record in log] == ["applied"] * 2, log
    assert all(sorted(record["contributors"]) == list(NAMES) for record in log), log
    assert any(TAKEN_UP in line and "round 2" in line for line in restarted.lines), restarted.lines[-20:]
    checked_every_round(workspace, "site-c", log)  # it verified round 2's total and its chain stepped it
    assert settlements(workspace, "site-c") == []  # the record answered: removed


@pytest.mark.slow
def test_a_site_restarted_after_decide_closed_sits_the_round_out_and_keeps_no_settlement(
    tmp_path: Path,
    processes: Processes,  # noqa: F811
) -> None:
    workspace = two_rounds(tmp_path, round_timeout=10.0)
    aggregator = processes.aggregator(workspace)
    auditor = start_auditor(processes, workspace)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES[:2]}
    killed_after_share(processes, workspace, "site-c")
    # DECIDE waits for site-c until its deadline (10 s), then closes without its tags: round 2 is void.
    untagged = "no tags of the bounded sum's total from site-c"
    assert eventually(lambda: any(untagged in line for line in aggregator.lines), 120), processes.tail()
    sites["site-c"] = processes.collaborator(workspace, "site-c")
    statuses = {"aggregator": aggregator.wait(300), "audit-co": auditor.wait(60)}
    statuses.update((name, sites[name].wait(120)) for name in NAMES[:2])
    # The federation is over; the restarted site-c retries the gone aggregator for its start wait, then ends.
    statuses["site-c"] = sites["site-c"].wait(120)
    log = read_round_log(workspace.output)
    assert [record["status"] for record in log] == ["applied", "aborted"], (statuses, log)
    assert untagged in log[1]["reason"], log[1]
    said = "\n".join(sites["site-c"].lines[-12:])
    assert TAKEN_UP not in "\n".join(sites["site-c"].lines), said
    left = settlements(workspace, "site-c")
    assert left == [], f"left once the federation ended ({statuses}): {left}; the restarted site-c said:\n{said}"


@pytest.mark.slow
def test_a_framed_site_restarted_between_share_and_decide_clears_itself_and_the_aggregator_is_named(
    tmp_path: Path,
    processes: Processes,  # noqa: F811
) -> None:
    """The aggregator moves its own verifier message about honest site-b in round 1 (forging_aggregator.py,
    ``frame``), and site-b dies right after its SHARE upload. Started again, it is handed the verdict record, takes its
    part up from its settlement, finds the aggregator's message is not the one that part gives, and sends the part back
    as its dispute (FRAMED, exit 2): every accepted site is shown the dispute and stops naming the aggregator, none names
    site-b a liar, and the aggregator's round record does not exclude it."""
    framed = "site-b"
    workspace = bounded_workspace(tmp_path, quorum={"min_collaborators": 2, "round_timeout_seconds": 120.0})
    forging_aggregator(processes, workspace, "frame")
    start_auditor(processes, workspace)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES if name != framed}
    killed_after_share(processes, workspace, framed, fault="after-upload:1:STAGE_BOUNDED_SHARE")
    sites[framed] = processes.collaborator(workspace, framed)
    framed_and_cleared(processes, workspace, sites, framed, framed_said=TAKEN_UP)
    assert settlements(workspace, framed) == []  # its dispute was its answer: removed
