"""A restarted site rejoins before the quorum wait gives up, however long its start (issue 79).

Real processes over loopback mutual TLS, three sites of which two run, quorum 2, a round timeout of 8 s.
site-b dies (kill -9) in round 2 before it masks its input and is started again three round timeouts later: a start slower than the
round timeout, as on a loaded machine. Before, round 3's quorum wait ended after 8 s and lost the federation;
now the wait goes on while site-b is starting (its stream ended in this process), and every later round applies
with it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fedfair.runtime.aggregator.checkpoint import read_round_log
from tests.runtime.harness import Processes, new_workspace

NAMES = ("site-a", "site-b", "site-c")
TIMEOUT = 8.0
ROUNDS = 4


@pytest.mark.slow
def test_a_site_restarting_slower_than_the_round_timeout_rejoins(tmp_path: Path, processes: Processes) -> None:
    workspace = new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": ROUNDS},
        quorum={"min_collaborators": 2, "round_timeout_seconds": TIMEOUT, "aborted_rounds_allowed": 1},
    )
    aggregator = processes.aggregator(workspace)
    processes.collaborator(workspace, "site-a")
    crashed = processes.collaborator(workspace, "site-b", fault="before-upload:2:STAGE_MASKED_INPUT")
    assert crashed.wait(180) == -9, processes.tail()
    time.sleep(3 * TIMEOUT)  # its start takes longer than the round timeout
    processes.collaborator(workspace, "site-b")
    assert aggregator.wait(240) == 0, processes.tail()

    log = read_round_log(workspace.output)
    assert [record["round"] for record in log] == list(range(1, ROUNDS + 1)), log
    assert log[1]["status"] == "aborted", log[1]  # the round site-b died in
    for record in log[2:]:
        assert record["status"] == "applied" and "site-b" in record["contributors"], record
    assert "which is starting" in processes.log.getvalue(), processes.tail()
