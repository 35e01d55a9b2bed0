"""A collaborator says, before its first dial, what it waits for, how long, and how to stop."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from fedfair.core.errors import PermanentFailureError
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.peer.retries import RetryPolicy
from fedfair.runtime.failures import NEVER_ANSWERED
from fedfair.runtime.observe.logs import Console
from tests.runtime.harness import new_workspace

NAMES = ["site-a", "site-b"]


def test_a_port_nobody_serves_is_announced_as_a_wait_before_the_first_dial(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    workspace = new_workspace(tmp_path, NAMES)  # nobody serves its address
    # attempts=0: the first failed dial ends the wait, so the test waits on no clock; the stated bound is the
    # policy's start_wait_seconds, what an operator's [retry] sets.
    policy = RetryPolicy(start_wait_seconds=123.0, attempts=0)
    collaborator = Collaborator(load_collaborator_config(workspace.configs["site-a"]), retry=policy)
    log = logging.getLogger("fedfair.collaborator")
    console_text = io.StringIO()
    console = Console("site-a", console_text)  # the console as `collaborator start` has it, not verbose
    log.addHandler(console)
    caplog.clear()  # what loading the config said (no manifest) is not the run's
    try:
        with (
            caplog.at_level(logging.INFO, logger="fedfair.collaborator"),
            pytest.raises(PermanentFailureError) as ended,
        ):
            collaborator.run()
    finally:
        log.removeHandler(console)
    assert ended.value.failure is NEVER_ANSWERED
    lines = [record.getMessage() for record in caplog.records]
    first = lines[0]
    assert first == (
        f"site-a: connecting to the aggregator at {workspace.address}; waiting up to 123 s for it to answer "
        "(Ctrl-C stops)"
    )
    # The console shows it first too: not a file-only line.
    assert console_text.getvalue().splitlines()[0] == first
    # The wait it announced ends in the one-line error that names what the dial met.
    assert "connection refused" in str(ended.value) and "raise [retry] start_wait_seconds" in str(ended.value)
