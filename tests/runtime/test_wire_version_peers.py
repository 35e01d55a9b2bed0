"""Peers of another fedfair wire are refused at their first call: real gRPC over mutual TLS on 127.0.0.1.

Both directions: the aggregator's :class:`Servicer` refuses a GetPlan of another wire version (and records
nothing of the caller), and a collaborator or the auditor stops with ``wire-version-mismatch`` when the aggregator
refuses it or replies in another version. A peer of another release is this release with its constant patched:
the messages are the same but for the version they carry, which is all the check reads.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from fedfair.core.errors import PermanentFailureError
from fedfair.runtime.aggregator import servicer as servicer_module
from fedfair.runtime.peer import connection
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.failures import WIRE_VERSION_MISMATCH
from fedfair.runtime.local.workspace import Workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, plan_digest, shared_settings
from fedfair.runtime.transport import (
    WIRE_VERSION,
    TlsFiles,
    describe_version,
    make_binding,
    pb,
    pb_grpc,
    refusal_details,
    secure_channel,
    server_credentials,
)
from fedfair.runtime.transport import wire_version
from tests.runtime.aggregator.test_servicer import Aggregator, aggregator, certs  # noqa: F401 (the fixtures)
from tests.runtime.harness import new_workspace, refused
from tests.runtime.test_auditor_process import serving
from tests.runtime.test_bounded_round import Federation, bounded  # noqa: F401 (the fixture)
from tests.runtime.test_input_bound import AUDITOR, federation  # noqa: F401 (the fixture)
from tests.runtime.wire_stages import WIRE

OLD = WIRE_VERSION - 1
"""The version of a peer of the previous release (a release that versioned its wire, unlike version 0)."""


@pytest.mark.parametrize("theirs", [0, OLD, WIRE_VERSION + 1])
def test_the_aggregator_refuses_a_caller_of_another_wire_naming_both_versions_and_the_fix(
    aggregator: Aggregator,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
    theirs: int,
) -> None:
    caplog.set_level(logging.INFO, logger="fedfair.aggregator")
    request = pb.PlanRequest(binding=make_binding("", 0, WIRE["STAGE_JOIN"]), wire_version=theirs)
    error = refused(lambda: aggregator.stub("site-a").GetPlan(request, timeout=10), grpc.StatusCode.FAILED_PRECONDITION)
    assert error.details() == refusal_details(WIRE_VERSION, theirs)
    assert f"wire version {WIRE_VERSION}, the caller {describe_version(theirs)}" in (error.details() or "")
    # One line on the aggregator's side, naming the peer; and nothing of its start recorded.
    lines = [record.getMessage() for record in caplog.records if "wire version mismatch" in record.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("refused GetPlan from 'site-a': FAILED_PRECONDITION"), lines
    assert not aggregator.board.starts._began
    # The same caller in this release's version is served at once.
    served = aggregator.stub("site-a").GetPlan(wire_version.plan_request(), timeout=10)
    assert served.wire_version == WIRE_VERSION and served.plan_digest == "digest"


def test_a_collaborator_of_another_wire_stops_when_the_aggregator_refuses_it(
    aggregator: Aggregator,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # This collaborator is of the previous release; the aggregator's servicer keeps its own version.
    monkeypatch.setattr(wire_version, "WIRE_VERSION", OLD)
    monkeypatch.setattr(connection, "WIRE_VERSION", OLD)
    with pytest.raises(PermanentFailureError) as caught:
        connection.get_plan(aggregator.stub("site-a"), "collaborator", aggregator.address)
    assert caught.value.failure is WIRE_VERSION_MISMATCH
    said = str(caught.value)
    assert said.startswith(
        f"wire-version-mismatch: the aggregator at {aggregator.address} speaks fedfair wire version {WIRE_VERSION} "
        f"and this collaborator wire version {OLD}: another fedfair release"
    ), said
    assert "run the same fedfair version at every party" in said


class OtherRelease(pb_grpc.FederationServicer):
    """An aggregator of another release: it serves the plan, in its own wire version."""

    def __init__(self, settings: bytes, digest: str, version: int) -> None:
        self.settings, self.digest, self.version = settings, digest, version

    def GetPlan(self, request: pb.PlanRequest, context: grpc.ServicerContext) -> pb.PlanReply:
        return pb.PlanReply(
            binding=request.binding, settings=self.settings, plan_digest=self.digest, wire_version=self.version
        )


@contextmanager
def other_release(workspace: Workspace, version: int) -> Iterator[None]:
    """`workspace`'s plan served by an aggregator of wire `version`, behind the aggregator's mTLS credentials."""
    plan = load_aggregator_plan(workspace.plan)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_FederationServicer_to_server(  # type: ignore[no-untyped-call]
        OtherRelease(shared_settings(plan), plan_digest(plan), version), server
    )
    server.add_secure_port(workspace.address, server_credentials(TlsFiles.in_folder(workspace.certs, "aggregator")))
    server.start()
    try:
        yield
    finally:
        server.stop(0)


@pytest.mark.parametrize("theirs", [0, OLD])
def test_a_collaborator_stops_on_a_reply_of_another_wire_and_records_nothing(tmp_path: Path, theirs: int) -> None:
    workspace = new_workspace(tmp_path, ["site-a", "site-b"])
    collaborator = Collaborator(load_collaborator_config(workspace.configs["site-a"]))
    files = TlsFiles.in_folder(workspace.certs, "site-a")
    with other_release(workspace, theirs):
        with secure_channel(workspace.address, files, aggregator_name="aggregator") as channel:
            with pytest.raises(PermanentFailureError) as caught:
                collaborator.setup(pb_grpc.FederationStub(channel))  # type: ignore[no-untyped-call]
    assert caught.value.failure is WIRE_VERSION_MISMATCH
    said = str(caught.value)
    assert f"speaks fedfair wire {describe_version(theirs)} and this collaborator wire version {WIRE_VERSION}" in said
    assert "it joined no round and recorded nothing" in said
    assert not list(tmp_path.rglob("*.bindings.json"))


def test_the_auditor_process_of_another_wire_exits_as_on_a_refused_plan(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The aggregator (in this process) is of the next release; the auditor's process is this release's.
    monkeypatch.setattr(servicer_module, "WIRE_VERSION", WIRE_VERSION + 1)
    folder = bounded.folder
    with serving(folder, bounded.loaded, AUDITOR) as address:
        command = [sys.executable, "-m", "fedfair.cli", "auditor", "start", "--aggregator", address]
        command += ["--cert", str(folder / "ca" / f"{AUDITOR}.crt"), "--key", str(folder / AUDITOR / f"{AUDITOR}.key")]
        command += ["--manifest", str(folder / "manifest.toml"), "--folder", str(folder / "logs")]
        finished = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    # The status of every FedfairError (2), as plan-mismatch, and one line naming both versions and the fix.
    assert finished.returncode == 2, finished.stderr
    errors = [line for line in finished.stderr.splitlines() if line.startswith("fedfair: error:")]
    assert len(errors) == 1, finished.stderr
    assert errors[0].startswith(
        f"fedfair: error: wire-version-mismatch: the aggregator at {address} speaks fedfair wire version "
        f"{WIRE_VERSION + 1} and this auditor wire version {WIRE_VERSION}"
    ), errors[0]
    assert "run the same fedfair version at every party" in errors[0]
