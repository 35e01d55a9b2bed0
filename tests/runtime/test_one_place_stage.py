"""A stage added in one place runs through a real federation: three sites and an aggregator, as processes.

The echo stage (tests/secagg/echo_round.py: one specification, its client step, its server's receive) is
installed as the last stage of every evaluation by each party's own process (tests/runtime/echo_party.py);
the aggregator's driver and the collaborators' steps loop over the round's declaration, real gRPC over
loopback mutual TLS carries it, and nothing the runtime imports names it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from fedfair.runtime.local.processes import Child, aggregator_command, child_environment, collaborator_command
from tests.runtime.harness import Processes, new_workspace

NAMES = ("site-a", "site-b", "site-c")
ECHO_PARTY = Path(__file__).with_name("echo_party.py")
REPOSITORY = Path(__file__).resolve().parents[2]


def echo_party(processes: Processes, label: str, command: list[str], watch: str | None = None) -> Child:
    """Start `command` (a fedfair command line) as a party whose evaluations run the echo round."""
    arguments = command[command.index("fedfair.cli") + 1 :]
    path = os.pathsep.join(filter(None, (str(REPOSITORY), os.environ.get("PYTHONPATH"))))
    child = Child(
        label,
        [sys.executable, str(ECHO_PARTY), *arguments],
        env=child_environment({"PYTHONPATH": path}),
        sink=processes.log,
        watch=watch,
    )
    processes.children.append(child)
    return child


@pytest.mark.slow
def test_an_evaluation_runs_a_stage_added_in_one_place(tmp_path: Path, processes: Processes) -> None:
    workspace = new_workspace(tmp_path, NAMES, training={"rounds": 1}, quorum={"min_collaborators": 3})
    aggregator = echo_party(processes, "aggregator", aggregator_command(workspace), watch="listening on port")
    assert aggregator.seen.wait(120) and aggregator.process.poll() is None, processes.tail()
    for name in NAMES:
        echo_party(processes, name, collaborator_command(workspace, name))
    processes.finish(aggregator)
    said = "\n".join(aggregator.lines)
    # The evaluation of round 1 is session 3 (2 r + 1): every site echoed the aggregator's call.
    assert "session 3: echoed by site-a, site-b, site-c" in said, processes.tail()
    assert (workspace.output / "rounds.jsonl").read_text().count('"status": "applied"') == 1
