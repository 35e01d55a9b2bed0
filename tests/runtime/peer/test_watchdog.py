"""Waits with an end: a collaborator says how long it has waited on its aggregator, and gives up.

The silent aggregator is the real mTLS gRPC server with the real servicer (`serve`: it answers
GetPlan and holds task streams open, but no round ever runs), and in the process test the real
`fedfair aggregator start` waiting for a quorum that never comes.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from fedfair.core.errors import FailureError, PermanentFailureError
from fedfair.runtime.aggregator.network import serve
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.peer.retries import STARTING_SECONDS, Backoff, RetryPolicy, Target
from fedfair.runtime.peer.watchdog import Watchdog
from fedfair.runtime.failures import AGGREGATOR_UNREACHABLE, plan_changed
from fedfair.runtime.local.processes import start_aggregator, start_collaborator
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, plan_digest, shared_settings
from fedfair.runtime.transport import WIRE_VERSION, TlsFiles, make_binding, pb, pb_grpc, server_credentials
from tests.runtime.harness import eventually, new_workspace
from tests.runtime.wire_stages import WIRE

NAMES = ["site-a", "site-b", "site-c"]
LIMIT = 2.0
QUICK = RetryPolicy(max_wait_seconds=60.0, base_seconds=0.05, cap_seconds=0.2)


def with_idle_timeout(path: Path, seconds: float) -> None:
    path.write_text(
        path.read_text().replace("[collaborator]\n", f"[collaborator]\nidle_timeout_seconds = {seconds}\n", 1)
    )


def test_the_watchdog_reports_a_wait_and_expires_it_but_not_during_own_work(caplog: pytest.LogCaptureFixture) -> None:
    """On a clock the test moves (the watchdog's thread still looks every limit / 16 s of real time): a line at
    each quarter of the limit, the expiry at the limit, none of it while this collaborator works. The times are
    binary fractions, so the watchdog's differences are exact."""
    now = [0.0]
    expired = threading.Event()
    watchdog = Watchdog("site-a", "127.0.0.1:1", 0.5, expired.set, role="collaborator", clock=lambda: now[0])

    def reports() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith("site-a: waiting for round 3")]

    with caplog.at_level(logging.INFO, logger="fedfair.collaborator"), watchdog.watching():
        with watchdog.working():  # training for longer than the limit is no wait on the aggregator
            now[0] = 1.0
            time.sleep(0.2)  # the watchdog looks several times meanwhile (a loaded machine can only make it fewer)
        assert not expired.is_set() and not caplog.records
        watchdog.waiting_for("round 3 STAGE_TRAIN's input")
        for quarter in (1, 2, 3):  # one line at each quarter of the limit, in turn
            now[0] = 1.0 + quarter * 0.125
            assert eventually(lambda quarter=quarter: len(reports()) == quarter), caplog.text
        assert not expired.is_set()
        now[0] = 1.5
        assert expired.wait(60)
    assert watchdog.expired is not None
    message = str(watchdog.expired)
    assert message.startswith("aggregator-silent: no progress for 0.5 s") and "round 3 STAGE_TRAIN's input" in message
    assert "idle_timeout_seconds = 0.5" in message
    assert all(r.levelno == logging.INFO for r in reports())
    lasted = [re.search(r"aggregator for ([0-9.]+) s \(it gives up after 0.5 s", r.getMessage())[1] for r in reports()]
    assert lasted == ["0.1", "0.2", "0.4"], lasted  # 0.125, 0.25, 0.375 s to a tenth


def test_a_silent_aggregator_ends_the_collaborator_with_a_clear_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    workspace = new_workspace(tmp_path, NAMES)
    with_idle_timeout(workspace.configs["site-a"], LIMIT)
    plan = load_aggregator_plan(workspace.plan)
    network = serve(plan, plan_digest(plan))
    try:
        collaborator = Collaborator(load_collaborator_config(workspace.configs["site-a"]), retry=QUICK)
        with caplog.at_level(logging.INFO, logger="fedfair.collaborator"):
            with pytest.raises(PermanentFailureError) as caught:
                collaborator.run()
            ended = time.time()
    finally:
        network.stop()
    # Joining (data, plan) comes before the wait is timed: the bound is on the wait alone. Not before the
    # limit; the upper bound, ten times the limit, only tells the watchdog from a wait without end.
    joined = [r.created for r in caplog.records if "joined federation" in r.getMessage()]
    assert joined, caplog.text
    assert LIMIT <= ended - joined[-1] < 10 * LIMIT, ended - joined[-1]
    assert str(caught.value).startswith("aggregator-silent: ") and "the first task" in str(caught.value)
    assert "waiting for the first task from the aggregator for" in caplog.text


class StallingAggregator(pb_grpc.FederationServicer):
    """Serves the plan and one TRAIN task, then stalls the model's download (it never sends a part)."""

    def __init__(self, settings: bytes, digest: str) -> None:
        self.settings, self.digest = settings, digest
        self.stalled = threading.Event()

    def GetPlan(self, request: pb.PlanRequest, context: grpc.ServicerContext) -> pb.PlanReply:
        return pb.PlanReply(
            binding=request.binding, settings=self.settings, plan_digest=self.digest, wire_version=WIRE_VERSION
        )

    def WaitForTasks(self, request: pb.TaskRequest, context: grpc.ServicerContext) -> Iterator[pb.Task]:
        binding = make_binding(request.after.federation_id, 1, WIRE["STAGE_TRAIN"])
        yield pb.Task(binding=binding, action=pb.ACTION_RUN, deadline_seconds=30.0, plan_digest=self.digest)
        while context.is_active():
            time.sleep(0.05)

    def DownloadModel(self, request: pb.FetchRequest, context: grpc.ServicerContext) -> Iterator[pb.ModelPart]:
        self.stalled.set()
        while context.is_active():
            time.sleep(0.05)
        yield from ()


def test_a_stalled_download_ends_the_collaborator_at_its_idle_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, a stalled download ended at its 60 s deadline and fell back into the same silent wait."""
    workspace = new_workspace(tmp_path, NAMES, secure_aggregation={"enabled": False}, quorum={"min_collaborators": 1})
    with_idle_timeout(workspace.configs["site-a"], LIMIT)
    plan = load_aggregator_plan(workspace.plan)
    stalling = StallingAggregator(shared_settings(plan), plan_digest(plan))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_FederationServicer_to_server(stalling, server)  # type: ignore[no-untyped-call]
    server.add_secure_port(workspace.address, server_credentials(TlsFiles.in_folder(workspace.certs, "aggregator")))
    server.start()
    try:
        collaborator = Collaborator(load_collaborator_config(workspace.configs["site-a"]), retry=QUICK)
        with (
            caplog.at_level(logging.INFO, logger="fedfair.collaborator"),
            pytest.raises(PermanentFailureError) as caught,
        ):
            collaborator.run()
        ended = time.time()
    finally:
        server.stop(0)
    assert stalling.stalled.is_set()
    message = str(caught.value)
    assert message.startswith("aggregator-silent: ") and "round 1 STAGE_TRAIN's input" in message
    stalled_at = [r.created for r in caplog.records if "waiting for round 1 STAGE_TRAIN's input" in r.getMessage()]
    assert stalled_at, caplog.text  # it said what it waited for while it waited
    assert ended - stalled_at[0] < 10 * LIMIT  # the idle timeout, not the download's 60 s deadline
    assert "CANCELLED" not in caplog.text  # the cut RPC is not reported as the aggregator's refusal


def test_retry_lines_are_info_while_the_aggregator_may_be_starting_then_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = Target("127.0.0.1:1", TlsFiles.in_folder(tmp_path, "site-a"), "aggregator")
    policy = RetryPolicy(base_seconds=0.001, cap_seconds=0.001)
    backoff = Backoff(policy, "site-a", threading.Event(), target, "site-a", role="collaborator")
    backoff.reached = True  # an outage after the aggregator answered once (before it, see test_retries.py)
    down = FailureError(AGGREGATOR_UNREACHABLE, address=target.address, reason="connection refused")
    changed = plan_changed("collaborator", "x", "y")
    with caplog.at_level(logging.INFO, logger="fedfair.collaborator"):
        backoff.retry(0, time.monotonic(), down, "dialling")
        backoff.retry(1, time.monotonic() - STARTING_SECONDS, down, "dialling")
        backoff.retry(0, time.monotonic(), changed, "fetching the plan")  # not the aggregator starting: a warning
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.WARNING, logging.WARNING]
    assert caplog.records[0].getMessage().startswith("site-a: aggregator-unreachable: ")


@pytest.mark.slow
def test_a_collaborator_process_exits_non_zero_when_its_aggregator_never_sends_a_task(tmp_path: Path) -> None:
    """The real CLI: the aggregator waits for a quorum of three, only one collaborator comes."""
    workspace = new_workspace(tmp_path, NAMES, quorum={"min_collaborators": 3})
    with_idle_timeout(workspace.configs["site-a"], 3.0)
    aggregator = start_aggregator(workspace)
    try:
        child = start_collaborator(workspace, "site-a")
        assert child.wait(90) == 2
    finally:
        aggregator.kill()
    lines = "\n".join(child.lines)
    assert "aggregator-silent: no progress for 3." in lines and "idle_timeout_seconds = 3" in lines
    assert "Traceback" not in lines
