"""The aggregator's service under hostile clients: real gRPC over real mutual TLS on 127.0.0.1.

The server is the aggregator's own (`Servicer` over a `Board` and a `StageGate`, served by
`federation_server`); the clients hold certificates from the federation's CA (site-a,
site-b, site-c on the plan's list, mallory not), or none at all.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from fedfair import pki
from fedfair.runtime.aggregator.board import Board
from fedfair.runtime.observe.events import EventLog, read_events
from fedfair.runtime.output_folder import PAST_ROUNDS_NAME
from fedfair.runtime.aggregator.limits import BUSY, Hold, RefusalLog, worker_threads
from fedfair.runtime.rate_limits import RateLimit
from fedfair.runtime.aggregator.past_rounds import KEPT_ROUNDS, PastRounds
from fedfair.runtime.aggregator.servicer import (
    INTERNAL_ERROR,
    INVALID_UPLOAD,
    TOO_MANY_PAST_FETCHES,
    TOO_MANY_REPORTS,
    Servicer,
    federation_server,
)
from fedfair.runtime.transport import (
    DEFAULT_CHUNK_BYTES,
    MALFORMED_MESSAGE,
    NOT_EXPECTED,
    NOT_PERMITTED,
    PeerAuthenticator,
    StageGate,
    TlsFiles,
    channel_options,
    make_binding,
    payload_parts,
    pb,
    pb_grpc,
    plan_request,
    secure_channel,
    server_credentials,
    server_options,
)
from fedfair.secagg.verify_messages import AggregateClaim
from fedfair.secagg.wire import Header, Stage
from tests.runtime.harness import eventually, refused
from fedfair.runtime.transport import TRAIN, WireStage
from fedfair.runtime.contract import EVALUATION, TRAINING, Aggregations
from tests.runtime.wire_stages import WIRE

NAMES = ("site-a", "site-b", "site-c")
FEDERATION = "f"
JOIN = make_binding(FEDERATION, 0, WIRE["STAGE_JOIN"])
TIMEOUT = 10
"""Each RPC's deadline (s): a call that waited on what it must not (a slot, a starved worker) ends
DEADLINE_EXCEEDED instead of its answer, so no test here needs a stopwatch."""


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("certs")
    pki.init_ca(folder)
    pki.issue(folder, "aggregator", "aggregator", hosts=["127.0.0.1"])
    for name in (*NAMES, "mallory"):
        pki.issue(folder, "collaborator", name)
    return folder


@dataclass
class Aggregator:
    """The aggregator's service on a loopback port, and what the tests reach into."""

    servicer: Servicer
    board: Board
    gate: StageGate
    address: str
    certs: Path
    output: Path

    def stub(self, name: str) -> pb_grpc.FederationStub:
        files = TlsFiles.in_folder(self.certs, name)
        return pb_grpc.FederationStub(secure_channel(self.address, files, aggregator_name="aggregator"))

    def channel(self, name: str) -> grpc.Channel:
        return secure_channel(self.address, TlsFiles.in_folder(self.certs, name), aggregator_name="aggregator")

    def stub_without_certificate(self) -> pb_grpc.FederationStub:
        credentials = grpc.ssl_channel_credentials(root_certificates=(self.certs / "ca.crt").read_bytes())
        channel = grpc.secure_channel(self.address, credentials, options=channel_options(aggregator_name="aggregator"))
        return pb_grpc.FederationStub(channel)


@pytest.fixture()
def aggregator(certs: Path, tmp_path: Path) -> Iterator[Aggregator]:
    board = Board("digest")
    gate = StageGate(FEDERATION, name=Aggregations(TRAINING, EVALUATION).name)
    gate.open(0, WIRE["STAGE_JOIN"])
    authenticator = PeerAuthenticator(pki.load_certificate(certs / "ca.crt"), NAMES)
    servicer = Servicer(board, gate, authenticator, b"{}", events=EventLog(tmp_path))
    server = federation_server(servicer, len(NAMES), server_options())
    port = server.add_secure_port("127.0.0.1:0", server_credentials(TlsFiles.in_folder(certs, "aggregator")))
    server.start()
    yield Aggregator(servicer, board, gate, f"127.0.0.1:{port}", certs, tmp_path)
    board.close()
    server.stop(grace=None).wait()


def tasks() -> pb.TaskRequest:
    return pb.TaskRequest(after=JOIN)


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """No log record carries a traceback, and gRPC never reported an exception of ours."""
    assert not [record for record in caplog.records if record.exc_info], "a traceback was logged"
    assert "Traceback" not in caplog.text
    assert "Exception calling application" not in caplog.text and "Exception deserializing" not in caplog.text
    assert "Exception iterating responses" not in caplog.text


def refusal_lines(caplog: pytest.LogCaptureFixture, rpc: str) -> list[str]:
    lines = [record.getMessage() for record in caplog.records if record.name == "fedfair.aggregator"]
    return [line for line in lines if line.startswith(f"refused {rpc} ")]


# ---------------------------------------------------------------- streams cannot starve the server


def test_streams_opened_and_cancelled_in_a_loop_cannot_starve_an_honest_get_plan(aggregator: Aggregator) -> None:
    """site-c (on the plan) and mallory (not) each open and cancel 50 task streams in a loop, and 50
    more at once held open (the reported attack); a caller without a certificate tries too. Meanwhile
    site-a's task stream stays up and every GetPlan of site-a answers within its deadline: the bursts
    hold their streams until site-a's calls are done, so a GetPlan that waited for them would never end."""
    assert worker_threads(len(NAMES)) < 100  # the pool is sized for the roster, not for the attackers
    honest = aggregator.stub("site-a")
    honest.GetPlan(plan_request(FEDERATION), timeout=TIMEOUT)  # the TLS session is up before timing
    honest_stream = honest.WaitForTasks(tasks())
    assert eventually(lambda: "site-a" in aggregator.board.connected())

    def churn(stub: pb_grpc.FederationStub) -> None:
        for _ in range(50):
            call = stub.WaitForTasks(tasks())
            time.sleep(0.02)
            call.cancel()

    opened, done = threading.Semaphore(0), threading.Event()

    def burst(stub: pb_grpc.FederationStub) -> None:
        calls = [stub.WaitForTasks(tasks()) for _ in range(50)]
        opened.release()
        done.wait(6 * TIMEOUT)  # a bound for a failing test only: site-a's calls end first, or fail
        for call in calls:
            call.cancel()

    stubs = (aggregator.stub("site-c"), aggregator.stub("mallory"), aggregator.stub_without_certificate())
    churners = [threading.Thread(target=churn, args=(stub,), daemon=True) for stub in stubs]
    bursts = [threading.Thread(target=burst, args=(stub,), daemon=True) for stub in stubs]
    for attacker in churners + bursts:
        attacker.start()
    for _ in bursts:
        assert opened.acquire(timeout=6 * TIMEOUT)
    answered = 0
    while answered < 10 or any(churner.is_alive() for churner in churners):
        honest.GetPlan(plan_request(FEDERATION), timeout=TIMEOUT)  # starved, it ends DEADLINE_EXCEEDED
        answered += 1
    assert all(burst.is_alive() for burst in bursts)  # every answer came while the bursts held their streams
    done.set()

    # Every cancelled stream gave back its thread and its count; site-a's stream is untouched.
    assert eventually(lambda: aggregator.servicer.quotas.held("site-c", Hold.TASK_STREAM) == 0)
    assert eventually(lambda: aggregator.board.connected() == {"site-a"})
    aggregator.board.new_round(1)
    aggregator.board.publish(["site-a"], make_binding(FEDERATION, 1, WIRE["STAGE_TRAIN"]), pb.ACTION_RUN)
    assert WireStage.of(next(honest_stream).binding) == TRAIN
    honest_stream.cancel()


def test_a_caller_over_its_limit_is_refused_at_once_and_a_slot_frees_when_a_call_ends(
    aggregator: Aggregator,
) -> None:
    servicer, stub = aggregator.servicer, aggregator.stub("site-b")
    streams = [stub.WaitForTasks(tasks()) for _ in range(2)]
    assert eventually(lambda: servicer.quotas.held("site-b", Hold.TASK_STREAM) == 2)
    error = refused(lambda: next(stub.WaitForTasks(tasks(), timeout=TIMEOUT)), grpc.StatusCode.RESOURCE_EXHAUSTED)
    # Refused at once: while both streams still held their slots, not once one was given back.
    assert error.details() == BUSY and servicer.quotas.held("site-b", Hold.TASK_STREAM) == 2
    streams[0].cancel()
    assert eventually(lambda: servicer.quotas.held("site-b", Hold.TASK_STREAM) == 1)
    streams.append(stub.WaitForTasks(tasks()))
    assert eventually(lambda: servicer.quotas.held("site-b", Hold.TASK_STREAM) == 2)

    # Uploads: two that have not sent a byte yet hold both of site-b's upload slots.
    binding = make_binding(FEDERATION, 1, WIRE["STAGE_ADVERTISE_KEYS"])
    go = threading.Event()

    def stalled() -> Iterator[pb.Part]:
        go.wait(TIMEOUT)
        yield from payload_parts(binding, b"keys")

    uploads = [stub.Submit.future(stalled(), timeout=TIMEOUT) for _ in range(2)]
    assert eventually(lambda: servicer.quotas.held("site-b", Hold.UPLOAD) == 2)
    error = refused(
        lambda: stub.Submit(payload_parts(binding, b"keys"), timeout=TIMEOUT), grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    assert error.details() == BUSY and servicer.quotas.held("site-b", Hold.UPLOAD) == 2  # the stalled two hold on
    # Another name has its own slots: site-c is not refused for site-b's uploads (only for the stage).
    refused(
        lambda: aggregator.stub("site-c").Submit(payload_parts(binding, b"keys"), timeout=TIMEOUT),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    go.set()
    for upload in uploads:
        assert upload.exception() is not None  # no stage is open: refused, and the slot is given back
    assert eventually(lambda: servicer.quotas.held("site-b", Hold.UPLOAD) == 0)
    for call in streams:
        call.cancel()
    assert eventually(lambda: servicer.quotas.held("site-b", Hold.TASK_STREAM) == 0)


def kept_round(aggregator: Aggregator, monkeypatch: pytest.MonkeyPatch) -> tuple[pb.FetchRequest, list[Path]]:
    """Round 1 applied with its parameters kept (past-rounds/), and every file of it the aggregator reads from now."""
    past = PastRounds(aggregator.output)
    binding = make_binding(FEDERATION, 1, WIRE["STAGE_ADVERTISE_KEYS"])
    past.opened(binding, b"round 1's parameters")
    past.ended(1, True, (), NAMES)
    aggregator.board.past_rounds = past
    reads: list[Path] = []
    read_bytes = Path.read_bytes

    def counted(path: Path) -> bytes:
        if PAST_ROUNDS_NAME in path.parts:
            reads.append(path)
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", counted)
    return pb.FetchRequest(binding=binding), reads


def fetched(stub: pb_grpc.FederationStub, request: pb.FetchRequest) -> bytes:
    return b"".join(part.chunk.data for part in stub.Fetch(request, timeout=TIMEOUT))


def test_a_fetch_of_a_past_round_over_the_callers_download_limit_reads_no_file(
    aggregator: Aggregator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller's limit is checked before the kept input is read: a flood of fetches makes the aggregator read
    nothing (issue 98), where it read the file and only then refused."""
    request, reads = kept_round(aggregator, monkeypatch)
    stub, quotas = aggregator.stub("site-b"), aggregator.servicer.quotas
    with quotas.hold("site-b", Hold.DOWNLOAD), quotas.hold("site-b", Hold.DOWNLOAD):  # its two downloads under way
        for _ in range(5):
            error = refused(lambda: fetched(stub, request), grpc.StatusCode.RESOURCE_EXHAUSTED)
            assert error.details() == BUSY
        assert reads == []
        assert fetched(aggregator.stub("site-a"), request) == b"round 1's parameters"  # another name's own slots
    assert fetched(stub, request) == b"round 1's parameters"
    assert len(reads) == 2 and quotas.held("site-b", Hold.DOWNLOAD) == 0


def test_fetches_of_past_rounds_are_read_at_each_callers_rate(
    aggregator: Aggregator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At once, every kept input of every kept round; past that, a caller's fetches are refused unread."""
    servicer = aggregator.servicer
    assert servicer.past_round_reads.burst == KEPT_ROUNDS * len(TRAINING.specs)  # a catch-up of every kept round
    servicer.past_round_reads = RateLimit(per_second=0.001, burst=2)
    request, reads = kept_round(aggregator, monkeypatch)
    flooder = aggregator.stub("site-c")
    assert fetched(flooder, request) == fetched(flooder, request) == b"round 1's parameters"
    for _ in range(5):
        error = refused(lambda: fetched(flooder, request), grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert error.details() == TOO_MANY_PAST_FETCHES
    assert len(reads) == 2
    # A round not kept is the live gate's to refuse: no file, and none of the caller's allowance.
    unkept = pb.FetchRequest(binding=make_binding(FEDERATION, 2, WIRE["STAGE_ADVERTISE_KEYS"]))
    refused(lambda: fetched(aggregator.stub("site-a"), unkept), grpc.StatusCode.FAILED_PRECONDITION)
    assert fetched(aggregator.stub("site-a"), request) == b"round 1's parameters"  # another name has its own
    assert len(reads) == 3


def test_callers_without_an_admitted_certificate_never_wait(
    aggregator: Aggregator, caplog: pytest.LogCaptureFixture
) -> None:
    """No certificate: the TLS handshake fails and no handler runs (nothing logged). A certificate
    from the CA whose name is not on the plan: refused before anything waits, with one line."""
    with caplog.at_level(logging.DEBUG, logger="fedfair.aggregator"):
        anonymous = aggregator.stub_without_certificate()
        refused(lambda: anonymous.GetPlan(plan_request(FEDERATION), timeout=TIMEOUT), grpc.StatusCode.UNAVAILABLE)
        refused(lambda: next(anonymous.WaitForTasks(tasks(), timeout=TIMEOUT)), grpc.StatusCode.UNAVAILABLE)
        assert not [record for record in caplog.records if record.name == "fedfair.aggregator"]
        # PERMISSION_DENIED, not DEADLINE_EXCEEDED: the stream was refused, not left waiting for a task.
        error = refused(
            lambda: next(aggregator.stub("mallory").WaitForTasks(tasks(), timeout=TIMEOUT)),
            grpc.StatusCode.PERMISSION_DENIED,
        )
        assert error.details() == NOT_PERMITTED
    assert not aggregator.board.connected()
    [line] = refusal_lines(caplog, "WaitForTasks")
    assert "certificate 'mallory' (not admitted)" in line and "PERMISSION_DENIED" in line
    no_traceback(caplog)


# ---------------------------------------------------------------- one refusal path


@pytest.fixture(scope="module")
def certificate(certs: Path) -> bytes:
    """A real DER certificate, the kind a key advertisement carries."""
    return pki.load_certificate(certs / "site-a.crt").public_bytes(serialization.Encoding.DER)


def test_an_upload_that_breaks_a_parser_is_refused_generically_and_frees_its_slot(
    aggregator: Aggregator, certificate: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """The reported attack: a mutated certificate inside an upload made the certificate parser raise;
    the caller read the parser's text, the slot stayed taken and the stage ran to its deadline.

    Now: a generic INVALID_ARGUMENT, one log line naming site-a, the RPC and the parser's error; the
    slot is free for site-a's corrected retry; and site-b, refused and silent, does not hold the stage."""
    board, gate = aggregator.board, aggregator.gate
    streams = {name: aggregator.stub(name).WaitForTasks(tasks()) for name in ("site-a", "site-b")}
    assert eventually(lambda: board.connected() == set(streams))
    board.new_round(1)
    binding = gate.open(1, WIRE["STAGE_ADVERTISE_KEYS"], timeout_seconds=600.0, participants=streams)

    def absorb(peer: str, payload: bytes) -> None:
        x509.load_der_x509_certificate(payload)

    board.open_stage(binding, streams, b"", absorb, max_upload_bytes=1 << 16, timeout=600.0)
    waiter = threading.Thread(target=board.wait_stage, daemon=True)
    waiter.start()
    mutated = bytearray(certificate)
    mutated[4] ^= 0xFF
    site_a, site_b = aggregator.stub("site-a"), aggregator.stub("site-b")
    with caplog.at_level(logging.INFO):
        error = refused(
            lambda: site_a.Submit(payload_parts(binding, bytes(mutated)), timeout=TIMEOUT),
            grpc.StatusCode.INVALID_ARGUMENT,
        )
        assert error.details() == INVALID_UPLOAD
        receipt = site_a.Submit(payload_parts(binding, certificate), timeout=TIMEOUT)
        assert receipt.received_size == len(certificate)
        refused(
            lambda: site_b.Submit(payload_parts(binding, b"\x30\x03abc"), timeout=TIMEOUT),
            grpc.StatusCode.INVALID_ARGUMENT,
        )
        waiter.join(TIMEOUT)  # the stage's deadline is 600 s: ending before TIMEOUT, it did not wait for it
        assert not waiter.is_alive()  # site-b was refused and does not retry: nobody is owed anything
    assert board.close_stage()[0] == {"site-a"}
    first, second = refusal_lines(caplog, "Submit")
    assert first.startswith(
        "refused Submit from 'site-a' (round 1 STAGE_ADVERTISE_KEYS): INVALID_ARGUMENT: ValueError: "
    )
    assert "asn1" in first.lower() and "\n" not in first and len(first) < 300
    assert second.startswith("refused Submit from 'site-b' ")
    no_traceback(caplog)
    for call in streams.values():
        call.cancel()


def test_a_one_part_send_is_an_upload_with_the_gate_and_limits_of_a_submit(
    aggregator: Aggregator, caplog: pytest.LogCaptureFixture
) -> None:
    """Send carries a whole payload in one part: it is absorbed and receipted like a Submit stream of
    that part, and refused where that stream would be (a part of a longer payload, a second upload
    of the stage, a name the stage does not expect, a stage that is not open)."""
    board, gate = aggregator.board, aggregator.gate
    board.new_round(1)
    binding = gate.open(1, WIRE["STAGE_ADVERTISE_KEYS"], timeout_seconds=600.0, participants=["site-a", "site-b"])
    absorbed: list[tuple[str, bytes]] = []
    board.open_stage(
        binding,
        ["site-a", "site-b"],
        b"",
        lambda peer, payload: absorbed.append((peer, payload)),
        max_upload_bytes=1000,
        timeout=600.0,
    )
    site_a, site_b, site_c = (aggregator.stub(name) for name in ("site-a", "site-b", "site-c"))
    first_of_four = next(payload_parts(binding, b"keys and more", 4))
    [part] = payload_parts(binding, b"keys")
    [later] = payload_parts(make_binding(FEDERATION, 1, WIRE["STAGE_SHARE_KEYS"]), b"keys")
    with caplog.at_level(logging.INFO):
        error = refused(lambda: site_a.Send(first_of_four, timeout=TIMEOUT), grpc.StatusCode.INVALID_ARGUMENT)
        assert error.details() == MALFORMED_MESSAGE
        receipt = site_a.Send(part, timeout=TIMEOUT)  # the refused part did not use up site-a's turn
        assert (receipt.binding, receipt.received_size) == (binding, 4)
        assert receipt.sha256 == hashlib.sha256(b"keys").digest()
        refused(lambda: site_a.Send(part, timeout=TIMEOUT), grpc.StatusCode.FAILED_PRECONDITION)
        refused(lambda: site_a.Submit(iter([part]), timeout=TIMEOUT), grpc.StatusCode.FAILED_PRECONDITION)
        refused(lambda: site_c.Send(part, timeout=TIMEOUT), grpc.StatusCode.FAILED_PRECONDITION)
        refused(lambda: site_b.Send(later, timeout=TIMEOUT), grpc.StatusCode.FAILED_PRECONDITION)
    assert absorbed == [("site-a", b"keys")]
    assert board.close_stage() == ({"site-a"}, 4)
    lines = refusal_lines(caplog, "Send")
    assert len(lines) == 4
    assert lines[0] == (
        "refused Send from 'site-a': INVALID_ARGUMENT: WireError: the payload stopped after 1 of 4 chunks"
    )
    no_traceback(caplog)


def test_an_upload_after_its_stage_closed_is_logged_quietly_only_for_a_peer_it_awaited(
    aggregator: Aggregator, caplog: pytest.LogCaptureFixture
) -> None:
    """A stage closes once it has enough answers (UNMASK at t of n), so the others' uploads arrive
    late every round: the aggregator logs those at INFO, not as warnings an operator must read.
    The caller hears the same refusal either way, and a replay or a name the stage never
    awaited is still a warning."""
    board, gate = aggregator.board, aggregator.gate
    board.new_round(1)
    binding = gate.open(1, WIRE["STAGE_UNMASK"], timeout_seconds=600.0, participants=["site-a", "site-b"])
    board.open_stage(
        binding, ["site-a", "site-b"], b"", lambda peer, payload: None, max_upload_bytes=1000, timeout=600.0
    )
    [part] = payload_parts(binding, b"shares")
    site_a, site_b, site_c = (aggregator.stub(name) for name in ("site-a", "site-b", "site-c"))
    site_a.Send(part, timeout=TIMEOUT)
    board.close_stage()
    gate.close()
    with caplog.at_level(logging.DEBUG):
        late = refused(lambda: site_b.Send(part, timeout=TIMEOUT), grpc.StatusCode.FAILED_PRECONDITION)
        replay = refused(lambda: site_a.Send(part, timeout=TIMEOUT), grpc.StatusCode.FAILED_PRECONDITION)
        stranger = refused(lambda: site_c.Send(part, timeout=TIMEOUT), grpc.StatusCode.FAILED_PRECONDITION)
    assert late.details() == replay.details() == stranger.details() == NOT_EXPECTED
    records = [record for record in caplog.records if record.getMessage().startswith("refused Send ")]
    assert [(record.getMessage().split("'")[1], record.levelno) for record in records] == [
        ("site-b", logging.DEBUG),  # a late upload is usual: not shown at the default level
        ("site-a", logging.WARNING),
        ("site-c", logging.WARNING),
    ]
    assert "late: round 1 STAGE_UNMASK had already closed" in records[0].getMessage()
    no_traceback(caplog)


def test_malformed_messages_get_one_generic_status_and_no_traceback(
    aggregator: Aggregator, caplog: pytest.LogCaptureFixture
) -> None:
    """Bytes that are no protobuf message, and chunks over the aggregator's limits: the caller hears
    MALFORMED_MESSAGE (no limit, no parser text); the log keeps the detail on one line."""
    aggregator.board.new_round(1)
    binding = aggregator.gate.open(1, WIRE["STAGE_ADVERTISE_KEYS"], timeout_seconds=600.0)
    aggregator.board.open_stage(
        binding, ["site-a"], b"", lambda peer, payload: None, max_upload_bytes=1000, timeout=600.0
    )
    channel = aggregator.channel("site-a")
    garbage = b"\xff\xff\xff"
    with caplog.at_level(logging.INFO):
        for call in (
            lambda: channel.unary_unary("/fedfair.v1.Federation/GetPlan")(garbage, timeout=TIMEOUT),
            lambda: next(channel.unary_stream("/fedfair.v1.Federation/WaitForTasks")(garbage, timeout=TIMEOUT)),
            lambda: next(channel.unary_stream("/fedfair.v1.Federation/Fetch")(garbage, timeout=TIMEOUT)),
            lambda: channel.stream_unary("/fedfair.v1.Federation/Submit")(iter([garbage]), timeout=TIMEOUT),
            lambda: channel.unary_unary("/fedfair.v1.Federation/Send")(garbage, timeout=TIMEOUT),
            # Declares 4096 bytes, over this stage's limit of 1000.
            lambda: pb_grpc.FederationStub(channel).Submit(
                iter([pb.Part(binding=binding, chunk=pb.Chunk(index=0, count=1, total_size=4096, data=bytes(4096)))]),
                timeout=TIMEOUT,
            ),
            lambda: pb_grpc.FederationStub(channel).Send(
                pb.Part(binding=binding, chunk=pb.Chunk(index=0, count=1, total_size=4096, data=bytes(4096))),
                timeout=TIMEOUT,
            ),
        ):
            error = refused(call, grpc.StatusCode.INVALID_ARGUMENT)
            assert error.details() == MALFORMED_MESSAGE
    rpcs = ("GetPlan", "WaitForTasks", "Fetch", "Submit", "Send")
    lines = [line for rpc in rpcs for line in refusal_lines(caplog, rpc)]
    assert len(lines) == 7 and all("WireError" in line for line in lines)
    assert sum("DecodeError" in line for line in lines) == 5
    assert any("over the limit of 1000" in line for line in lines)  # the detail stays here
    no_traceback(caplog)
    # The refused upload gave back site-a's slot: its genuine upload is admitted.
    assert pb_grpc.FederationStub(channel).Submit(payload_parts(binding, b"keys"), timeout=TIMEOUT).received_size == 4


def test_a_failure_of_the_aggregator_itself_tells_the_caller_nothing(
    aggregator: Aggregator, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    aggregator.gate.open(1, WIRE["STAGE_TRAIN"])

    def broken(binding: pb.Binding) -> list[pb.ModelPart]:
        raise RuntimeError("/var/lib/fedfair/models: disk unreadable")

    monkeypatch.setattr(aggregator.board.offers, "model", broken)
    request = pb.FetchRequest(binding=make_binding(FEDERATION, 1, WIRE["STAGE_TRAIN"]))
    with caplog.at_level(logging.INFO):
        error = refused(
            lambda: list(aggregator.stub("site-a").DownloadModel(request, timeout=TIMEOUT)), grpc.StatusCode.INTERNAL
        )
    assert error.details() == INTERNAL_ERROR
    [line] = refusal_lines(caplog, "DownloadModel")
    assert line.endswith("INTERNAL: RuntimeError: /var/lib/fedfair/models: disk unreadable")
    assert [record.levelno for record in caplog.records if record.name == "fedfair.aggregator"] == [logging.ERROR]
    no_traceback(caplog)


# ---------------------------------------------------------------- what the operator sees


def status(round_number: int, kind: pb.CollaboratorStatus, epsilon: float | None = None) -> pb.StatusReport:
    report = pb.StatusReport(binding=make_binding(FEDERATION, round_number, WIRE["STAGE_TRAIN"]), status=kind)
    if epsilon is not None:
        report.epsilon = epsilon
    return report


def aggregator_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "fedfair.aggregator"]


def test_a_status_report_is_logged_with_the_certified_name_and_recorded(
    aggregator: Aggregator, caplog: pytest.LogCaptureFixture
) -> None:
    """Report over mTLS: one line naming the certificate's name, a ``status`` event, the epsilon kept for
    the round events; the open stage is untouched (no gate slot taken, nothing delivered)."""
    caplog.set_level(logging.INFO, logger="fedfair.aggregator")
    aggregator.board.new_round(4)
    aggregator.gate.open(4, WIRE["STAGE_MASKED_INPUT"], participants=NAMES)
    stub = aggregator.stub("site-a")
    receipt = stub.Report(status(4, pb.COLLABORATOR_STATUS_BUDGET_SPENT), timeout=TIMEOUT)
    assert receipt.binding.round == 4
    stub.Report(status(3, pb.COLLABORATOR_STATUS_PRIVACY_SPENT_REPORT, 1.25), timeout=TIMEOUT)
    assert "round 4: site-a declines to train: its privacy budget is spent" in aggregator_lines(caplog)
    assert "round 3: site-a reports its privacy spending (epsilon spent 1.25)" in aggregator_lines(caplog)
    assert aggregator.board.epsilons() == {"site-a": 1.25}
    assert aggregator.gate.submitted() == frozenset()
    statuses = [event for event in read_events(aggregator.output) if event["event"] == "status"]
    assert [(e["round"], e["name"], e["status"], e["epsilon"]) for e in statuses] == [
        (4, "site-a", "budget_spent", None),
        (3, "site-a", "privacy_spent_report", 1.25),
    ]


def test_a_status_report_outside_the_federation_or_malformed_is_refused(
    aggregator: Aggregator, caplog: pytest.LogCaptureFixture
) -> None:
    aggregator.board.new_round(2)
    stub = aggregator.stub("site-b")
    foreign = status(2, pb.COLLABORATOR_STATUS_BUDGET_SPENT)
    foreign.binding.federation_id = "other"
    for report in (foreign, status(3, pb.COLLABORATOR_STATUS_BUDGET_SPENT)):  # another federation, a future round
        refused(lambda report=report: stub.Report(report, timeout=TIMEOUT), grpc.StatusCode.FAILED_PRECONDITION)
    for report in (
        status(2, pb.COLLABORATOR_STATUS_UNSPECIFIED),
        status(2, pb.COLLABORATOR_STATUS_PRIVACY_SPENT_REPORT, float("nan")),
        status(2, pb.COLLABORATOR_STATUS_PRIVACY_SPENT_REPORT, -1.0),
    ):
        error = refused(lambda report=report: stub.Report(report, timeout=TIMEOUT), grpc.StatusCode.INVALID_ARGUMENT)
        assert error.details() == MALFORMED_MESSAGE
    refused(
        lambda: aggregator.stub("mallory").Report(status(2, pb.COLLABORATOR_STATUS_BUDGET_SPENT), timeout=TIMEOUT),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    assert aggregator.board.epsilons() == {}
    refusals = [event for event in read_events(aggregator.output) if event["event"] == "refusal"]
    assert [event["name"] for event in refusals] == ["site-b"] * 5 + [None]
    assert len(refusal_lines(caplog, "Report")) == 6
    no_traceback(caplog)


def test_status_reports_are_rate_limited_per_name(aggregator: Aggregator) -> None:
    aggregator.servicer.report_rate = RateLimit(per_second=0.001, burst=2)
    report = status(0, pb.COLLABORATOR_STATUS_BUDGET_SPENT)
    flooder = aggregator.stub("site-c")
    flooder.Report(report, timeout=TIMEOUT)
    flooder.Report(report, timeout=TIMEOUT)
    error = refused(lambda: flooder.Report(report, timeout=TIMEOUT), grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert error.details() == TOO_MANY_REPORTS
    aggregator.stub("site-a").Report(report, timeout=TIMEOUT)  # another name has its own allowance


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_refusal_log_admits_a_burst_per_caller_then_counts_what_it_leaves_out() -> None:
    clock = FakeClock()
    log = RefusalLog(RateLimit(per_second=1.0, burst=3, clock=clock))
    assert [log.admit("site-a") for _ in range(5)] == [0, 0, 0, None, None]
    assert log.admit("site-b") == 0  # its own allowance
    # Callers without a listed name share one allowance, so new addresses do not buy new lines.
    assert [log.admit(None) for _ in range(4)] == [0, 0, 0, None]
    clock.now = 1.0  # one token back
    assert [log.admit("site-a"), log.admit("site-a")] == [2, None]
    assert log.admit(None) == 1
    clock.now = 100.0  # back to the full burst, never more
    assert [log.admit("site-a") for _ in range(4)] == [1, 0, 0, None]


def test_a_caller_refused_in_a_loop_cannot_flood_the_log_and_every_refusal_is_counted(
    aggregator: Aggregator, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    aggregator.servicer.refusal_log = RefusalLog(RateLimit(per_second=1.0, burst=5, clock=clock))
    aggregator.servicer.report_rate = RateLimit(burst=100)  # the reports' own limit is another test's
    flooder = aggregator.stub("site-b")
    malformed = status(0, pb.COLLABORATOR_STATUS_UNSPECIFIED)
    for _ in range(50):
        error = refused(lambda: flooder.Report(malformed, timeout=TIMEOUT), grpc.StatusCode.INVALID_ARGUMENT)
        assert error.details() == MALFORMED_MESSAGE  # refusing never depends on logging
    assert len(refusal_lines(caplog, "Report")) == 5
    clock.now = 1.0
    refused(lambda: flooder.Report(malformed, timeout=TIMEOUT), grpc.StatusCode.INVALID_ARGUMENT)
    lines = refusal_lines(caplog, "Report")
    assert len(lines) == 6
    assert lines[-1].startswith("refused Report from 'site-b'")
    assert lines[-1].endswith("(45 more refusals of this caller since its last line were not logged)")
    events = [event for event in read_events(aggregator.output) if event["event"] == "refusal"]
    assert [event["unlogged"] for event in events] == [0] * 5 + [45]
    # Another caller is not silenced by the flood.
    refused(lambda: aggregator.stub("site-a").Report(malformed, timeout=TIMEOUT), grpc.StatusCode.INVALID_ARGUMENT)
    assert refusal_lines(caplog, "Report")[-1].startswith("refused Report from 'site-a'")
    no_traceback(caplog)


def test_connects_and_departures_are_logged_once_with_the_certified_name(
    aggregator: Aggregator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fedfair.aggregator")
    stub = aggregator.stub("site-a")
    stub.GetPlan(plan_request(FEDERATION), timeout=TIMEOUT)
    stream = stub.WaitForTasks(tasks(), timeout=TIMEOUT)
    assert eventually(lambda: aggregator.board.connected() == {"site-a"})
    stub.GetPlan(plan_request(FEDERATION), timeout=TIMEOUT)
    stream.cancel()
    assert eventually(lambda: not aggregator.board.connected())
    assert eventually(lambda: "site-a disconnected" in aggregator_lines(caplog))
    again = stub.WaitForTasks(tasks(), timeout=TIMEOUT)
    assert eventually(lambda: any(line.startswith("site-a reconnected") for line in aggregator_lines(caplog)))
    again.cancel()
    lines = [line for line in aggregator_lines(caplog) if line.startswith("site-a")]
    assert lines[:3] == [
        "site-a connected (1 of 3 collaborators have a task stream)",  # counting itself: its stream, not GetPlan
        "site-a disconnected",
        "site-a reconnected (1 of 3 collaborators have a task stream)",
    ]

    def site_a_events() -> list[str]:
        return [event["event"] for event in read_events(aggregator.output) if event.get("name") == "site-a"]

    # The event is written just after the log line, on the RPC's thread: wait for it rather than race it.
    assert eventually(lambda: len(site_a_events()) >= 3)
    assert site_a_events()[:3] == ["connect", "disconnect", "connect"]


def test_each_site_fetches_its_own_claim_in_pieces_as_the_bytes_of_that_claim(aggregator: Aggregator) -> None:
    """A re-checked VERIFY's per-site claims are held as pieces (views of the server's vectors, issue 97), never
    serialised whole; what each site fetches over TLS is byte for byte its claim's encoding, in several chunks."""
    board, gate = aggregator.board, aggregator.gate
    board.new_round(1)
    binding = gate.open(1, WIRE["STAGE_VERIFY_CLAIM"], timeout_seconds=600.0, participants=list(NAMES))
    words = DEFAULT_CHUNK_BYTES  # 2 bytes a word: every vector spans two chunks or more
    generator = np.random.default_rng(97)
    summed = generator.integers(0, 1 << 16, words, dtype=np.uint16)
    carries = generator.integers(0, 3, words, dtype=np.uint16)
    masked = [generator.integers(0, 1 << 16, words, dtype=np.uint16) for _ in NAMES]
    header = Header(FEDERATION, 1, Stage.VERIFY, bytes(32))
    claims = {
        name: AggregateClaim(header, summed, (masked[(at + 1) % 3], masked[(at + 2) % 3]), carries=carries)
        for at, name in enumerate(NAMES)
    }
    board.open_stage(
        binding,
        NAMES,
        {name: claim.to_pieces() for name, claim in claims.items()},
        lambda peer, payload: None,
        max_upload_bytes=1,
        timeout=600.0,
    )
    for name, claim in claims.items():
        parts = list(aggregator.stub(name).Fetch(pb.FetchRequest(binding=binding), timeout=TIMEOUT))
        assert len(parts) >= 4
        assert b"".join(part.chunk.data for part in parts) == claim.to_bytes(), name
