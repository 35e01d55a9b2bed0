"""A site killed after its SHARE upload and restarted keeps no settlement (its update) once the federation ended.

Real processes over loopback mTLS: three sites and the auditor, 2 rounds, the two-verifier input bound, quorum 2.
site-c dies (SIGKILL) right after its round-2 SHARE upload; round 2 does not apply without its tags, the aggregator
and the other sites exit, and site-c is started again. Once the federation is over, no
``site-c.FEDERATION.bounded_settlement`` is left in site-c's folder: however the restarted process ends, it removes a
settlement of a round that ended without it (the red team found it left: FINDINGS.md F2).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfair.runtime.collaborator.kinds.bounded_settlement import SETTLEMENT_SUFFIX
from tests.runtime.conftest import processes  # noqa: F401 -- the runtime tests' fixture of child processes
from tests.runtime.harness import Processes
from tests.runtime.test_bounded_processes import NAMES, bounded_workspace, start_auditor

KILLED = "after-upload:2:STAGE_BOUNDED_SHARE"


@pytest.mark.slow
def test_a_restarted_sites_settlement_is_gone_once_the_federation_ended(
    tmp_path: Path,
    processes: Processes,  # noqa: F811
) -> None:
    workspace = bounded_workspace(
        tmp_path,
        training={"rounds": 2, "local_steps": 1},
        quorum={"min_collaborators": 2, "round_timeout_seconds": 20.0},
    )
    aggregator = processes.aggregator(workspace)
    auditor = start_auditor(processes, workspace)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES[:2]}
    killed = processes.collaborator(workspace, "site-c", fault=KILLED)
    assert killed.wait(240) == -9, processes.tail()
    folder = workspace.configs["site-c"].parent
    assert list(folder.glob(f"site-c.*.{SETTLEMENT_SUFFIX}")), "kept at SHARE, before the kill"
    sites["site-c"] = processes.collaborator(workspace, "site-c")
    statuses = {"aggregator": aggregator.wait(300), "audit-co": auditor.wait(60)}
    statuses.update((name, sites[name].wait(120)) for name in NAMES[:2])
    # The federation is over; the restarted site-c retries the gone aggregator for its start wait, then ends.
    statuses["site-c"] = sites["site-c"].wait(120)
    left = sorted(path.name for path in folder.glob(f"site-c.*.{SETTLEMENT_SUFFIX}"))
    said = "\n".join(sites["site-c"].lines[-12:])
    assert left == [], f"left once the federation ended ({statuses}): {left}; the restarted site-c said:\n{said}"
