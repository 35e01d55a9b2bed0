"""`fedfair stop OUTPUT_DIR`: a running aggregator stops as at Ctrl-C, and says so; a stopped one is not stopped twice."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from fedfair import cli
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
