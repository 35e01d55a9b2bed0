"""The aggregator process in threads of the test: one owner per folder and port, the start-up wait,
the operator's log lines and its events stream, exclusions and re-admissions, over real gRPC and
mutual TLS on loopback.

The start-up test starts the collaborators 3 s after the aggregator; the acceptance's 30 s
is the same code path (the wait has no deadline), only longer.
"""

from __future__ import annotations

import fcntl
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedfair import cli
from fedfair.core.errors import ConfigError, QuorumError, QuorumReason
from fedfair.runtime.aggregator import quorum
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.aggregator.checkpoint import (
    Checkpoint,
    append_round_log,
    read_round_log,
    save_checkpoint,
)
from fedfair.cli.aggregator import readmit
from fedfair.runtime.observe.events import read_events
from fedfair.runtime.observe.status import federation_state
from fedfair.runtime.aggregator.loop import excluded_in
from fedfair.runtime.aggregator.network import serve
from fedfair.runtime.aggregator.start import run_aggregator
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.local.workspace import Workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, plan_digest
from tests.runtime.harness import lock_attempts, new_workspace

NAMES = ["site-a", "site-b", "site-c"]
LATE = 3.0  # seconds the collaborators arrive after the aggregator


class Background:
    """run_aggregator (or anything) in a thread, its result or error kept for the test."""

    def __init__(self, target: Any) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._body, args=(target,), daemon=True)
        self.thread.start()

    def _body(self, target: Any) -> None:
        try:
            self.result = target()
        except BaseException as error:  # noqa: BLE001 -- handed to the test
            self.error = error


@pytest.fixture()
def workspace(tmp_path: Path) -> Workspace:
    return new_workspace(tmp_path, NAMES, training={"rounds": 2}, secure_aggregation={"enabled": False})


@pytest.fixture()
def quick_reports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(quorum, "WAIT_REPORT_SECONDS", 0.5)
    yield


def aggregator_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "fedfair.aggregator"]


def wait_for_line(caplog: pytest.LogCaptureFixture, text: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not any(text in line for line in aggregator_lines(caplog)):
        assert time.monotonic() < end, f"no line with {text!r}"
        time.sleep(0.05)


@pytest.mark.slow
def test_an_early_aggregator_waits_names_who_is_missing_owns_its_folder_and_port_then_trains(
    workspace: Workspace, caplog: pytest.LogCaptureFixture, quick_reports: None
) -> None:
    caplog.set_level(logging.INFO)
    plan = load_aggregator_plan(workspace.plan)
    first = Background(lambda: run_aggregator(plan))
    wait_for_line(caplog, "listening on port")

    # A second aggregator on the same folder, fresh or resuming, is refused at once (its one try at the
    # folder's lock did not wait for the holder), naming the first.
    for resume in (False, True):
        with (
            lock_attempts() as attempts,
            pytest.raises(ConfigError, match=r"another aggregator \(PID \d+\) is running on .*--output"),
        ):
            run_aggregator(plan, resume=resume)
        assert attempts == [fcntl.LOCK_EX | fcntl.LOCK_NB]
    # One on the same port (another folder) fails to listen at once: the port is not shared.
    with pytest.raises(ConfigError, match=r"cannot listen on 127\.0\.0\.1:\d+: the port is in use"):
        serve(plan, plan_digest(plan))

    wait_for_line(
        caplog,
        "round 1: waiting for the quorum: 0 of 3 collaborators connected, missing site-a, site-b, site-c; no deadline",
    )
    time.sleep(LATE)
    assert first.thread.is_alive() and first.error is None  # still waiting, no deadline
    collaborators = [Collaborator(load_collaborator_config(path)) for path in workspace.configs.values()]
    threads = [threading.Thread(target=c.run, daemon=True) for c in collaborators]
    for thread in threads:
        thread.start()
    first.thread.join(120)
    assert not first.thread.is_alive() and first.error is None, first.error
    for thread in threads:
        thread.join(30)

    lines = aggregator_lines(caplog)
    for name in NAMES:
        assert any(line.startswith(f"{name} connected (") for line in lines)
    log = read_round_log(plan.aggregator.output)
    assert [record["status"] for record in log] == ["applied", "applied"]
    assert log[0]["participants"] == NAMES  # the federation started whole

    # events.jsonl parses line by line: one round event per round, with participants and timings.
    events = read_events(plan.aggregator.output)
    kinds = [event["event"] for event in events]
    assert kinds[0] == "start" and kinds.count("finish") == 1 and kinds.count("connect") == 3
    assert set(kinds[kinds.index("finish") + 1 :]) <= {"disconnect"}  # the collaborators hang up last
    rounds = [event for event in events if event["event"] == "round"]
    assert [event["round"] for event in rounds] == [1, 2]
    for event in rounds:
        assert event["participants"] == NAMES and event["contributors"] == NAMES
        assert event["seconds"]["STAGE_MASKED_INPUT"] > 0 and event["seconds"]["total"] > 0
        assert event["bytes"] > 0 and event["epsilon"] == {}
    assert rounds[0]["objective"] is None and rounds[1]["objective"]["round"] == 2  # evaluated after the last


def test_a_startup_deadline_ends_with_advice_that_works_without_a_checkpoint(
    workspace: Workspace, quick_reports: None, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = load_aggregator_plan(workspace.plan)
    with pytest.raises(QuorumError) as failed:
        run_aggregator(plan, startup_timeout=1.0)
    message = str(failed.value)
    assert failed.value.reason is QuorumReason.NOT_REACHED
    assert message.startswith(
        "round 1: only 0 of the 3 collaborators connected within 1 s, below the quorum of 1 "
        "(missing: site-a, site-b, site-c). Nothing was trained yet."
    )
    assert "again, without --resume (there is no checkpoint yet)" in message
    # `fedfair status` says why it stopped, the error and its fix, as the aggregator's last event recorded it.
    state = federation_state(plan.aggregator.output)
    assert (state.running, state.stopped, state.exit_status) == (False, message, 2)
    assert cli.main(["status", str(plan.aggregator.output)]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert "stopped (exit 2)" in shown[0] and f"  stopped: {message}" in shown, shown
    # The lock went with the process's run: the next start may take the folder.
    with pytest.raises(QuorumError):
        run_aggregator(plan, startup_timeout=0.1)


def test_exclusions_and_readmissions_apply_in_round_log_order() -> None:
    records = [
        {"round": 1, "status": "aborted", "excluded": {"site-c": "sent a bad unmask share"}},
        {"round": 2, "status": "applied", "readmitted": ["site-c"]},
        {"round": 3, "status": "applied", "evaluation": {"status": "done", "excluded": {"site-b": "accused"}}},
        {"round": 4, "status": "aborted", "excluded": {"site-c": "accused"}, "readmitted": ["site-b"]},
    ]
    assert excluded_in(records[:1]) == {"site-c": "sent a bad unmask share"}
    assert excluded_in(records[:2]) == {}
    assert excluded_in(records[:3]) == {"site-b": "accused"}
    assert excluded_in(records) == {"site-c": "accused"}


@pytest.mark.slow
def test_a_readmitted_collaborator_takes_part_again_after_resume(tmp_path: Path) -> None:
    """About 3 s: a run checkpointed at round 1 with site-c excluded, resumed with --readmit site-c."""
    workspace = new_workspace(tmp_path, NAMES, training={"rounds": 2}, secure_aggregation={"enabled": False})
    plan = load_aggregator_plan(workspace.plan)
    output = plan.aggregator.output
    append_round_log(output, {"round": 1, "status": "aborted", "excluded": {"site-c": "sent a bad unmask share"}})
    save_checkpoint(output, Checkpoint(1, initial_state(plan), plan_digest(plan)))
    readmit(plan, ["site-c"])
    # The checkpoint is made here, so the collaborators hold no record of round 1: their operators accept that.
    collaborators = [
        Collaborator(load_collaborator_config(path), reset_state=True) for path in workspace.configs.values()
    ]
    threads = [threading.Thread(target=c.run, daemon=True) for c in collaborators]
    for thread in threads:
        thread.start()
    run_aggregator(plan, resume=True)
    for thread in threads:
        thread.join(30)
    resumed = read_round_log(output)[-1]
    assert resumed["round"] == 2 and resumed["participants"] == NAMES and resumed["contributors"] == NAMES
    assert excluded_in(read_round_log(output)) == {}  # and a later resume keeps it in
