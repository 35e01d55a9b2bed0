"""Issue 98's acceptance: a wrong port gives its named error within 60 s of the operator's command, before any round.

One collaborator whose [collaborator] aggregator names a port nothing listens on, started with `fedfair collaborator
start` as the docs say, every other setting as the workspace writes it (`[retry] start_wait_seconds` at its default).
The clock runs from the command to the exit: the wait counts from the process's start, not from its first line (the
red team measured 58 s of imports and data before that line on a loaded 2-core machine, and 119.6 s in all when the
60 s wait counted from it).
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from fedfair.runtime.peer.retries import DEFAULT_RETRY_POLICY
from fedfair.runtime.local.processes import FEDFAIR_COMMAND, child_environment
from fedfair.runtime.local.workspace import free_port
from tests.runtime.harness import new_workspace

NAMED_WITHIN_SECONDS = 60.0
"""The issue's bound, from the operator's command to the named error."""


@pytest.mark.slow
def test_a_wrong_port_is_named_within_60_s_of_the_command(tmp_path: Path) -> None:
    workspace = new_workspace(tmp_path, ["site-a", "site-b", "site-c"], training={"rounds": 1})
    config = workspace.configs["site-a"]
    wrong = f"127.0.0.1:{free_port()}"
    config.write_text(config.read_text().replace(workspace.address, wrong))
    began = time.monotonic()
    ended = subprocess.run(
        [*FEDFAIR_COMMAND, "collaborator", "start", "--config", str(config)],
        capture_output=True,
        text=True,
        env=child_environment(),
        timeout=600,
    )
    waited = time.monotonic() - began
    assert ended.returncode == 2, ended.stderr[-2000:]
    errors = [
        line for line in ended.stderr.splitlines() if line.startswith("fedfair: error: aggregator-never-answered")
    ]
    assert len(errors) == 1 and wrong in errors[0], ended.stderr[-2000:]
    # It waited the default wait counted from its start (not less: an aggregator starting late is still found) and
    # said so: "for N s since this collaborator started", N the default, however long its imports took.
    assert waited >= DEFAULT_RETRY_POLICY.start_wait_seconds, waited
    said = re.search(r"for (\d+) s since this collaborator started", errors[0])
    wait = DEFAULT_RETRY_POLICY.start_wait_seconds
    assert said is not None and wait <= int(said[1]) <= wait + 2, errors[0]  # + its last second's try, rounded
    assert waited <= NAMED_WITHIN_SECONDS, f"the named error came {waited:.1f} s after the command"
