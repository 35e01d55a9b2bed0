"""`fedfair stop OUTPUT_DIR`: a running aggregator stops as at Ctrl-C, and says so; a stopped one is not stopped twice.

A site stopped by SIGTERM is that stop too: its closing line, exit 143.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from fedfair import cli
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.observe.status import federation_state
from tests.runtime.harness import Processes, eventually, new_workspace


@pytest.mark.slow
def test_fedfair_stop_stops_a_waiting_aggregator_with_its_closing_line_and_refuses_a_second_stop(
    tmp_path: Path, processes: Processes, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = new_workspace(tmp_path, ["site-a", "site-b"])
    aggregator = processes.aggregator(workspace)  # no collaborator: it waits for the quorum, no deadline
    assert eventually(
        lambda: (workspace.output / "events.jsonl").exists() and federation_state(workspace.output).running
    )
    assert cli.main(["stop", str(workspace.output)]) == 0
    closing = "stopped by SIGTERM before the first round was checkpointed; start again without --resume"
    assert capsys.readouterr().out.strip().endswith(closing)
    assert aggregator.wait(60) == 128 + signal.SIGTERM
    assert closing in aggregator.lines[-1]
    state = federation_state(workspace.output)
    assert (state.running, state.stopped, state.exit_status) == (False, closing, 143)

    assert cli.main(["stop", str(workspace.output)]) == 2
    error = capsys.readouterr().err
    assert f"no aggregator runs for {workspace.output} (it is stopped;" in error and "nothing to stop" in error


@pytest.mark.slow
def test_a_site_stopped_by_sigterm_mid_federation_says_how_to_rejoin_and_exits_143(
    tmp_path: Path, processes: Processes
) -> None:
    """SIGTERM (systemd, Docker, `timeout`) to a collaborator process once a round applied: the stop Ctrl-C is, its
    last line names the signal and how to rejoin, and its status is 143 as docs/operations.md's table says."""
    workspace = new_workspace(tmp_path, ["site-a", "site-b"], training={"rounds": 2000})
    processes.aggregator(workspace)
    sites = {name: processes.collaborator(workspace, name) for name in ("site-a", "site-b")}
    assert eventually(lambda: len(read_round_log(workspace.output)) >= 1, 180), processes.tail()
    sites["site-b"].process.send_signal(signal.SIGTERM)
    assert sites["site-b"].wait(60) == 128 + signal.SIGTERM, processes.tail()
    closing = "site-b: stopped by SIGTERM; what it holds of the federation is kept beside its config: start it again"
    assert closing in sites["site-b"].lines[-1], sites["site-b"].lines[-3:]
