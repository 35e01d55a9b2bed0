"""A bounded federation loses its auditor for a while, as processes: it costs at most a round (issue 94).

The auditor is killed (SIGKILL: nothing said to the aggregator) once round 1 is applied, and started again 30 s
later from its kept folder. Meanwhile the aggregator waits for it before the next round and `fedfair status` says
so; the round the kill caught is void (an auditor lost mid-round voids it, as a site does: docs/operations.md), and
the federation goes on from the auditor's kept state: its noise secret unchanged, its first totals kept with the
later ones. The plan allows that one round (`[quorum] aborted_rounds_allowed = 1`), so every process exits 0.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.auditor.totals import NOISE_SECRET_NAME, TOTALS_NAME
from fedfair.runtime.observe.status import federation_state
from tests.runtime.harness import Processes, eventually
from tests.runtime.test_bounded_processes import AUDITOR, NAMES, bounded_workspace, start_auditor

ROUNDS = 4
AUDITOR_LOST_SECONDS = 30.0


@pytest.mark.slow
def test_an_auditor_killed_and_restarted_30_s_later_costs_at_most_a_round(tmp_path: Path, processes: Processes) -> None:
    workspace = bounded_workspace(
        tmp_path, training={"rounds": ROUNDS, "local_steps": 1}, quorum={"aborted_rounds_allowed": 1}
    )
    folder = workspace.root / AUDITOR
    aggregator = processes.aggregator(workspace)
    auditor = start_auditor(processes, workspace)
    sites = [processes.collaborator(workspace, name) for name in NAMES]

    def applied() -> list[int]:
        log = read_round_log(workspace.output) if (workspace.output / "rounds.jsonl").exists() else []
        return [record["round"] for record in log if record["status"] == "applied"]

    assert eventually(lambda: 1 in applied(), 240), processes.tail()
    secret = (folder / NOISE_SECRET_NAME).read_bytes()
    auditor.process.kill()
    auditor.wait(10)
    lost = time.monotonic()

    def status_waits_for_the_auditor() -> bool:
        waiting = federation_state(workspace.output).waiting
        return waiting is not None and (waiting.goal, waiting.missing) == ("the auditor", (AUDITOR,))

    assert eventually(status_waits_for_the_auditor, AUDITOR_LOST_SECONDS), processes.tail()
    time.sleep(max(AUDITOR_LOST_SECONDS - (time.monotonic() - lost), 0.0))
    restarted = start_auditor(processes, workspace)
    processes.finish(aggregator, timeout=600)
    assert restarted.wait(60) == 0, processes.tail()
    assert [site.process.returncode for site in sites] == [0] * len(NAMES), processes.tail()
    log = read_round_log(workspace.output)
    statuses = [record["status"] for record in log]
    assert len(log) == ROUNDS and statuses.count("applied") >= ROUNDS - 1, statuses
    assert all(sorted(record["contributors"]) == list(NAMES) for record in log if record["status"] == "applied"), log
    # Its kept state carried on: the same noise secret, and round 1's total first among one per model totalled (a
    # void round's total, if the kill came after it, stands for the round run again on its model).
    assert (folder / NOISE_SECRET_NAME).read_bytes() == secret
    totalled = [entry["round"] for entry in json.loads((folder / TOTALS_NAME).read_text())]
    assert totalled[0] == 1 and len(totalled) == statuses.count("applied"), (totalled, statuses)
