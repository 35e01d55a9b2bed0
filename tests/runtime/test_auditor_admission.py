"""The aggregator admits the plan's auditor at its own stages only: real gRPC over real mutual TLS on 127.0.0.1.

The server is the aggregator's own (:class:`Servicer` over a :class:`Board` and a :class:`StageGate`); the clients
hold certificates of the federation's CA: the sites, the plan's auditor (role "auditor"), and another auditor the
plan does not name. Each refusal names its problem to the holder of the certificate.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from fedfair import pki
from tests.runtime.wire_stages import BOUNDED_TRAINING
from fedfair.runtime.aggregator.board import Board
from fedfair.runtime.aggregator.servicer import Servicer, federation_server
from fedfair.runtime.transport import (
    NOT_PERMITTED,
    PeerAuthenticator,
    StageGate,
    TlsFiles,
    make_binding,
    payload_parts,
    pb,
    pb_grpc,
    plan_request,
    secure_channel,
    server_credentials,
    server_options,
)
from tests.runtime.harness import eventually, refused
from tests.runtime.wire_stages import WIRE

SITES = ("site-a", "site-b")
AUDITOR = "audit-co"
FEDERATION = "f"
JOIN = make_binding(FEDERATION, 0, WIRE["STAGE_JOIN"])
TIMEOUT = 10
"""Each RPC's deadline (s): a refused call answers at once; a wrongly admitted one would wait, then fail."""
DENIED = grpc.StatusCode.PERMISSION_DENIED


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("certs")
    pki.init_ca(folder)
    pki.issue(folder, "aggregator", "aggregator", hosts=["127.0.0.1"])
    for name in (*SITES, "mallory"):
        pki.issue(folder, "collaborator", name)
    for name in (AUDITOR, "other-audit"):
        pki.issue(folder, "auditor", name)
    return folder


@dataclass
class Aggregator:
    """The aggregator's service on a loopback port, admitting `auditor` (None: the plan names none)."""

    servicer: Servicer
    board: Board
    gate: StageGate
    address: str
    certs: Path
    received: dict[str, bytes] = field(default_factory=dict)
    """What the open stage's handler took, by peer."""

    def stub(self, name: str) -> pb_grpc.FederationStub:
        role = "auditor" if "audit" in name else "collaborator"
        channel = secure_channel(
            self.address, TlsFiles.in_folder(self.certs, name), aggregator_name="aggregator", role=role
        )
        return pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]


def serve(certs: Path, auditor: str | None) -> tuple[Aggregator, grpc.Server]:
    board = Board("digest")
    gate = StageGate(FEDERATION)
    gate.open(0, WIRE["STAGE_JOIN"])
    ca = pki.load_certificate(certs / "ca.crt")
    admits = None if auditor is None else PeerAuthenticator(ca, (auditor,), "auditor")
    if admits is not None:
        board.verifiers = admits.allowed_names
    servicer = Servicer(board, gate, PeerAuthenticator(ca, SITES), b"{}", auditor=admits, training=BOUNDED_TRAINING)
    server = federation_server(servicer, len(SITES), server_options())
    port = server.add_secure_port("127.0.0.1:0", server_credentials(TlsFiles.in_folder(certs, "aggregator")))
    server.start()
    return Aggregator(servicer, board, gate, f"127.0.0.1:{port}", certs), server


@pytest.fixture()
def aggregator(certs: Path) -> Iterator[Aggregator]:
    served, server = serve(certs, AUDITOR)
    yield served
    served.board.close()
    server.stop(grace=None).wait()


def open_stage(aggregator: Aggregator, stage: pb.Stage, peers: tuple[str, ...], inputs: bytes) -> pb.Binding:
    """Open round 1's `stage` for `peers`, as the driver does; its uploads are kept in `aggregator.received`."""
    aggregator.board.new_round(1)
    binding = aggregator.gate.open(1, stage, timeout_seconds=600.0, participants=peers)
    aggregator.board.open_stage(
        binding, peers, inputs, aggregator.received.__setitem__, max_upload_bytes=1 << 16, timeout=600.0
    )
    return binding


def test_the_auditor_is_admitted_at_its_stage_and_is_never_a_collaborator(aggregator: Aggregator) -> None:
    auditor = aggregator.stub(AUDITOR)
    assert auditor.GetPlan(plan_request(), timeout=TIMEOUT).settings == b"{}"
    site = aggregator.stub("site-a").WaitForTasks(pb.TaskRequest(after=JOIN))
    stream = auditor.WaitForTasks(pb.TaskRequest(after=JOIN))
    assert eventually(lambda: aggregator.board.connected() == {"site-a"})
    # Its stream counts for the stages that expect it, but never toward a round's quorum or roster.
    assert aggregator.board.wait_for_connected(2, 0.2) == {"site-a"}
    parameters = b"the round's public parameters"
    binding = open_stage(aggregator, WIRE["STAGE_BOUNDED_AUDITOR_KEY"], (AUDITOR,), parameters)
    task = next(stream)
    assert (task.binding, task.action) == (binding, pb.ACTION_RUN)
    fetched = b"".join(part.chunk.data for part in auditor.Fetch(pb.FetchRequest(binding=binding), timeout=TIMEOUT))
    assert (task.input or fetched) == parameters
    waiter = threading.Thread(target=aggregator.board.wait_stage, daemon=True)
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()  # the stage waits for the auditor's round key
    receipt = auditor.Submit(payload_parts(binding, b"round key"), timeout=TIMEOUT)
    assert receipt.received_size == len(b"round key")
    waiter.join(TIMEOUT)
    assert not waiter.is_alive() and aggregator.received == {AUDITOR: b"round key"}
    assert aggregator.board.close_stage()[0] == {AUDITOR}
    for call in (site, stream):
        call.cancel()


def test_the_auditor_is_refused_everywhere_else_naming_why(aggregator: Aggregator) -> None:
    auditor = aggregator.stub(AUDITOR)
    binding = open_stage(aggregator, WIRE["STAGE_BOUNDED_SHARE"], SITES, b"")
    error = refused(lambda: auditor.Submit(payload_parts(binding, b"share"), timeout=TIMEOUT), DENIED)
    said = error.details()
    assert "the auditor 'audit-co' uploads and fetches only at the bounded sum's auditor stages" in said
    assert "STAGE_BOUNDED_ROSTERS" in said and said.endswith("not at STAGE_BOUNDED_SHARE")
    error = refused(lambda: auditor.Send(next(payload_parts(binding, b"share")), timeout=TIMEOUT), DENIED)
    assert "not at STAGE_BOUNDED_SHARE" in error.details()
    refused(lambda: list(auditor.Fetch(pb.FetchRequest(binding=binding), timeout=TIMEOUT)), DENIED)
    train = make_binding(FEDERATION, 1, WIRE["STAGE_TRAIN"])
    error = refused(lambda: list(auditor.DownloadModel(pb.FetchRequest(binding=train), timeout=TIMEOUT)), DENIED)
    assert "the auditor 'audit-co' is no collaborator: it downloads no model" in error.details()
    report = pb.StatusReport(binding=train, status=pb.COLLABORATOR_STATUS_PRIVACY_SPENT_REPORT)
    error = refused(lambda: auditor.Report(report, timeout=TIMEOUT), DENIED)
    assert "it reports no status" in error.details()
    assert aggregator.received == {}


def test_a_collaborator_is_refused_at_the_auditors_stages(aggregator: Aggregator) -> None:
    # As BOUNDED_ROUND declares who uploads in each stage: the auditor alone in four, both in DECIDE.
    admission = aggregator.servicer.admission
    assert admission.auditor_only_stages == {
        WIRE["STAGE_BOUNDED_AUDITOR_KEY"],
        WIRE["STAGE_BOUNDED_ROSTERS"],
        WIRE["STAGE_BOUNDED_MESSAGES"],
        WIRE["STAGE_BOUNDED_TOTAL"],
    }
    assert admission.auditor_stages == admission.auditor_only_stages | {WIRE["STAGE_BOUNDED_DECIDE"]}
    site = aggregator.stub("site-a")
    binding = open_stage(aggregator, WIRE["STAGE_BOUNDED_TOTAL"], (AUDITOR, "site-a"), b"reveal")
    error = refused(lambda: site.Submit(payload_parts(binding, b"a total"), timeout=TIMEOUT), DENIED)
    assert error.details() == (
        "not permitted: STAGE_BOUNDED_TOTAL is the auditor's stage of the bounded sum; 'site-a' is a collaborator, "
        "which uploads and fetches only at the sites' stages"
    )
    refused(lambda: list(site.Fetch(pb.FetchRequest(binding=binding), timeout=TIMEOUT)), DENIED)
    assert aggregator.received == {}


def test_at_decide_the_auditor_uploads_its_tags_beside_the_sites(aggregator: Aggregator) -> None:
    binding = open_stage(aggregator, WIRE["STAGE_BOUNDED_DECIDE"], (AUDITOR, "site-a"), b"the verdict record")
    for peer in (AUDITOR, "site-a"):
        stub = aggregator.stub(peer)
        fetched = b"".join(part.chunk.data for part in stub.Fetch(pb.FetchRequest(binding=binding), timeout=TIMEOUT))
        assert fetched == b"the verdict record"
        stub.Submit(payload_parts(binding, f"{peer}'s tags".encode()), timeout=TIMEOUT)
    assert aggregator.received == {AUDITOR: b"audit-co's tags", "site-a": b"site-a's tags"}


def test_another_auditors_certificate_is_refused_naming_its_holder(aggregator: Aggregator, certs: Path) -> None:
    other = aggregator.stub("other-audit")
    error = refused(lambda: other.GetPlan(plan_request(), timeout=TIMEOUT), DENIED)
    assert error.details().startswith("not permitted: 'other-audit' holds an auditor's certificate, but this ")
    assert AUDITOR not in error.details()  # the plan's auditor is not told to an outsider
    stream = other.WaitForTasks(pb.TaskRequest(after=JOIN))
    refused(lambda: next(stream), DENIED)
    # A plan that names no auditor admits none.
    served, server = serve(certs, None)
    try:
        error = refused(lambda: served.stub(AUDITOR).GetPlan(plan_request(), timeout=TIMEOUT), DENIED)
        assert "'audit-co' holds an auditor's certificate" in error.details()
        assert served.stub("site-a").GetPlan(plan_request(), timeout=TIMEOUT).settings == b"{}"
        # A stranger's certificate still hears the generic refusal, which names no one.
        error = refused(lambda: served.stub("mallory").GetPlan(plan_request(), timeout=TIMEOUT), DENIED)
        assert error.details() == NOT_PERMITTED
    finally:
        served.board.close()
        server.stop(grace=None).wait()
