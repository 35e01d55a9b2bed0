"""Transport: real gRPC over real mutual TLS on 127.0.0.1, certificates from fedfair.pki.

A small test servicer implements the real Federation service with the transport
helpers (PeerAuthenticator, StageGate, chunking), the way the aggregator will.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization

from fedfair import pki
from fedfair.core.errors import ConfigError, RefusedError, WireError
from fedfair.runtime.transport import (
    MALFORMED_MESSAGE,
    NOT_EXPECTED,
    NOT_PERMITTED,
    PeerAuthenticator,
    StageGate,
    TlsFiles,
    Uploader,
    channel_options,
    check_tls_files,
    describe_binding,
    make_binding,
    model_parts,
    payload_parts,
    pb,
    pb_grpc,
    plan_request,
    read_model,
    read_payload,
    receive_upload,
    secure_channel,
    server_credentials,
    server_options,
)
from fedfair.runtime.transport.stage_gate import abort
from fedfair.runtime.transport.chunks import digest
from tests.runtime.harness import refused
from fedfair.runtime.transport import TRAIN, WireStage
from fedfair.runtime.contract import TRAINING
from tests.runtime.wire_stages import WIRE

FEDERATION = "test-federation"
CHUNK = 1024  # small, so payloads span many chunks
RPC_TIMEOUT = 10


# ---------------------------------------------------------------- certificates


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One federation (aggregator, alpha, beta, mallory), another CA, and an expired alpha."""
    root = tmp_path_factory.mktemp("pki")
    federation = root / "federation"
    pki.init_ca(federation)
    pki.issue(federation, "aggregator", "aggregator")
    for name in ("alpha", "beta", "mallory"):
        pki.issue(federation, "collaborator", name)

    other = root / "other"
    pki.init_ca(other)
    pki.issue(other, "collaborator", "alpha")

    # alpha's certificate from the right CA, but with a validity window in the past.
    expired = root / "expired"
    expired.mkdir()
    ca_certificate = pki.load_certificate(federation / "ca.crt")
    ca_key = pki.load_private_key(federation / "ca.key")
    key = pki.load_private_key(federation / "alpha.key")
    request = pki.create_request("alpha", key)
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    certificate = pki.sign_request(request, ca_certificate, ca_key, "collaborator", days=2, not_before=past)
    (expired / "alpha.crt").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return root


def raw_credentials(ca: Path, cert: Path | None = None, key: Path | None = None) -> grpc.ChannelCredentials:
    """Credentials as an attacker would build them: no checks of ours in the way."""
    return grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None,
    )


# ---------------------------------------------------------------- a test servicer


class TestServicer(pb_grpc.FederationServicer):
    """The real service with test behaviour, built only from the transport helpers."""

    __test__ = False  # not a pytest class

    def __init__(self, certs: Path) -> None:
        ca_certificate = pki.load_certificate(certs / "federation" / "ca.crt")
        self.auth = PeerAuthenticator(ca_certificate, ["alpha", "beta"])
        self.gate = StageGate(FEDERATION)
        self.gate.open(0, WIRE["STAGE_JOIN"])
        self.theta = np.random.default_rng(0).standard_normal(3000).astype(np.float32)
        self.c = 0.75
        self.relay = bytes(range(256)) * 20
        self.uploads: dict[tuple[str, int, WireStage], bytes] = {}
        self.calls: Counter[str] = Counter()
        self.implements_send = True
        self.identities: list[str] = []
        self.tasks: list[pb.Task] = []
        self.changed = threading.Condition()

    def identify(self, context: grpc.ServicerContext) -> str:
        try:
            name = self.auth.identify(context)
        except RefusedError as rejected:
            abort(rejected, context)
        self.identities.append(name)
        return name

    def publish(self, round_number: int, stage: WireStage, action: int = pb.ACTION_RUN) -> pb.Binding:
        binding = (
            self.gate.open(round_number, stage)
            if action == pb.ACTION_RUN
            else make_binding(FEDERATION, round_number, stage)
        )
        with self.changed:
            self.tasks.append(pb.Task(binding=binding, action=action, deadline_seconds=30.0, plan_digest="d"))
            self.changed.notify_all()
        return binding

    def GetPlan(self, request: pb.PlanRequest, context: grpc.ServicerContext) -> pb.PlanReply:
        self.identify(context)
        try:
            self.gate.check_federation(request.binding)
        except RefusedError as rejected:
            abort(rejected, context)
        return pb.PlanReply(binding=request.binding, settings=b"{}", plan_digest="d")

    def WaitForTasks(self, request: pb.TaskRequest, context: grpc.ServicerContext) -> Iterator[pb.Task]:
        self.identify(context)
        after = (request.after.round, WireStage.of(request.after))
        sent = 0
        while context.is_active():
            with self.changed:
                self.changed.wait_for(lambda seen=sent: len(self.tasks) > seen, timeout=1.0)
                pending = self.tasks[sent:]
            for task in pending:
                sent += 1
                if (task.binding.round, WireStage.of(task.binding)) > after:
                    yield task
                if task.action == pb.ACTION_FINISHED:
                    return

    def DownloadModel(self, request: pb.FetchRequest, context: grpc.ServicerContext) -> Iterator[pb.ModelPart]:
        self.identify(context)
        try:
            self.gate.check_read(request.binding)
        except RefusedError as rejected:
            abort(rejected, context)
        yield from model_parts(request.binding, self.theta, self.c, chunk_bytes=CHUNK)

    def Fetch(self, request: pb.FetchRequest, context: grpc.ServicerContext) -> Iterator[pb.Part]:
        self.identify(context)
        try:
            self.gate.check_read(request.binding)
        except RefusedError as rejected:
            abort(rejected, context)
        yield from payload_parts(request.binding, self.relay, chunk_bytes=CHUNK)

    def Send(self, request: pb.Part, context: grpc.ServicerContext) -> pb.Receipt:
        self.calls["Send"] += 1
        if not self.implements_send:  # as an aggregator older than Send answers
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        return self._receive(iter([request]), context)

    def Submit(self, request_iterator: Iterator[pb.Part], context: grpc.ServicerContext) -> pb.Receipt:
        self.calls["Submit"] += 1
        return self._receive(request_iterator, context)

    def _receive(self, request_iterator: Iterator[pb.Part], context: grpc.ServicerContext) -> pb.Receipt:
        name = self.identify(context)
        try:
            binding, data = receive_upload(
                request_iterator, self.gate, name, max_total_bytes=64 * CHUNK, max_chunk_bytes=CHUNK
            )
        except RefusedError as rejected:
            abort(rejected, context)
        except WireError:
            # What was wrong is for the receiver's log; the sender hears nothing it could probe limits with.
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, MALFORMED_MESSAGE)
        self.uploads[(name, binding.round, WireStage.of(binding))] = data
        return pb.Receipt(binding=binding, received_size=len(data), sha256=digest(data))


@pytest.fixture(scope="module")
def federation(certs: Path) -> Iterator[tuple[TestServicer, int]]:
    servicer = TestServicer(certs)
    # A message limit just above one chunk, so the gRPC limit itself is exercised too.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=server_options(CHUNK + 512))
    pb_grpc.add_FederationServicer_to_server(servicer, server)
    port = server.add_secure_port(
        "127.0.0.1:0", server_credentials(TlsFiles.in_folder(certs / "federation", "aggregator"))
    )
    server.start()
    yield servicer, port
    server.stop(grace=None)


@pytest.fixture()
def alpha(certs: Path, federation: tuple[TestServicer, int]) -> Iterator[pb_grpc.FederationStub]:
    _, port = federation
    channel = secure_channel(f"127.0.0.1:{port}", TlsFiles.in_folder(certs / "federation", "alpha"))
    yield pb_grpc.FederationStub(channel)
    channel.close()


def stub_with(port: int, credentials: grpc.ChannelCredentials, **options: str) -> pb_grpc.FederationStub:
    return pb_grpc.FederationStub(
        grpc.secure_channel(f"127.0.0.1:{port}", credentials, options=channel_options(**options))
    )


def join_request() -> pb.PlanRequest:
    return plan_request(FEDERATION)


# ---------------------------------------------------------------- mutual TLS and identity


def test_mtls_connects_and_identity_comes_from_the_certificate(
    certs: Path, federation: tuple[TestServicer, int], alpha: pb_grpc.FederationStub
) -> None:
    servicer, _ = federation
    reply = alpha.GetPlan(join_request(), timeout=RPC_TIMEOUT)
    assert reply.plan_digest == "d"
    certificate = pki.load_certificate(certs / "federation" / "alpha.crt")
    assert servicer.identities[-1] == pki.name_from_certificate(certificate) == "alpha"
    assert check_tls_files(TlsFiles.in_folder(certs / "federation", "alpha"), "collaborator") == "alpha"
    with pytest.raises(ConfigError, match="not issued for the aggregator role"):
        check_tls_files(TlsFiles.in_folder(certs / "federation", "alpha"), "aggregator")
    unmask = make_binding(FEDERATION, 3, WIRE["STAGE_UNMASK"])
    assert describe_binding(unmask) == "round 3 STAGE_TRAIN step 6"  # as the wire binds it
    assert describe_binding(unmask, TRAINING.name) == "round 3 STAGE_UNMASK"  # as its round kind names it


def test_the_aggregator_name_is_checked_by_the_collaborator(certs: Path, federation: tuple[TestServicer, int]) -> None:
    _, port = federation
    files = TlsFiles.in_folder(certs / "federation", "beta")
    with secure_channel(f"localhost:{port}", files, aggregator_name="aggregator") as channel:
        assert pb_grpc.FederationStub(channel).GetPlan(join_request(), timeout=RPC_TIMEOUT).plan_digest == "d"
    with secure_channel(f"127.0.0.1:{port}", files, aggregator_name="hospital-z") as channel:
        refused(
            lambda: pb_grpc.FederationStub(channel).GetPlan(join_request(), timeout=RPC_TIMEOUT),
            grpc.StatusCode.UNAVAILABLE,
        )


def test_no_client_certificate_fails_the_handshake(certs: Path, federation: tuple[TestServicer, int]) -> None:
    _, port = federation
    stub = stub_with(port, raw_credentials(certs / "federation" / "ca.crt"))
    refused(lambda: stub.GetPlan(join_request(), timeout=RPC_TIMEOUT), grpc.StatusCode.UNAVAILABLE)


def test_a_certificate_from_another_ca_fails_the_handshake(certs: Path, federation: tuple[TestServicer, int]) -> None:
    _, port = federation
    other = certs / "other"
    stub = stub_with(port, raw_credentials(certs / "federation" / "ca.crt", other / "alpha.crt", other / "alpha.key"))
    refused(lambda: stub.GetPlan(join_request(), timeout=RPC_TIMEOUT), grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(ConfigError, match="does not verify"):  # and our own helper refuses to use it
        secure_channel(
            "127.0.0.1:1", TlsFiles(certs / "federation" / "ca.crt", other / "alpha.crt", other / "alpha.key")
        )


def test_an_expired_certificate_fails_the_handshake(certs: Path, federation: tuple[TestServicer, int]) -> None:
    _, port = federation
    ca, expired, key = (
        certs / "federation" / "ca.crt",
        certs / "expired" / "alpha.crt",
        certs / "federation" / "alpha.key",
    )
    stub = stub_with(port, raw_credentials(ca, expired, key))
    refused(lambda: stub.GetPlan(join_request(), timeout=RPC_TIMEOUT), grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(ConfigError, match="the certificate of alpha expired on "):  # named by our own check
        secure_channel("127.0.0.1:1", TlsFiles(ca, expired, key))


def test_the_aggregator_certificate_cannot_act_as_a_client(certs: Path, federation: tuple[TestServicer, int]) -> None:
    _, port = federation
    folder = certs / "federation"
    stub = stub_with(port, raw_credentials(folder / "ca.crt", folder / "aggregator.crt", folder / "aggregator.key"))
    refused(lambda: stub.GetPlan(join_request(), timeout=RPC_TIMEOUT), grpc.StatusCode.UNAVAILABLE)


def test_a_valid_certificate_not_on_the_allow_list_gets_a_generic_refusal(
    certs: Path, federation: tuple[TestServicer, int]
) -> None:
    _, port = federation
    folder = certs / "federation"
    stub = stub_with(port, raw_credentials(folder / "ca.crt", folder / "mallory.crt", folder / "mallory.key"))
    error = refused(lambda: stub.GetPlan(join_request(), timeout=RPC_TIMEOUT), grpc.StatusCode.PERMISSION_DENIED)
    assert error.details() == NOT_PERMITTED
    assert "mallory" not in error.details()
    task_error = refused(
        lambda: next(stub.WaitForTasks(pb.TaskRequest(after=join_request().binding), timeout=RPC_TIMEOUT)),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    assert task_error.details() == NOT_PERMITTED


def test_a_remembered_certificate_is_refused_once_its_validity_window_has_passed(
    certs: Path, federation: tuple[TestServicer, int], alpha: pb_grpc.FederationStub
) -> None:
    """The authenticator checks a certificate in full once, then only its window and the allow-list."""
    servicer, _ = federation
    certificate = pki.load_certificate(certs / "federation" / "alpha.crt")
    now = [dt.datetime.now(dt.UTC)]
    ca_certificate = pki.load_certificate(certs / "federation" / "ca.crt")
    remembering = PeerAuthenticator(ca_certificate, ["alpha", "beta"], clock=lambda: now[0])
    original, servicer.auth = servicer.auth, remembering
    try:
        assert alpha.GetPlan(join_request(), timeout=RPC_TIMEOUT).plan_digest == "d"
        assert servicer.identities[-1] == "alpha"
        now[0] = certificate.not_valid_after_utc + dt.timedelta(seconds=1)
        error = refused(lambda: alpha.GetPlan(join_request(), timeout=RPC_TIMEOUT), grpc.StatusCode.PERMISSION_DENIED)
        assert error.details() == NOT_PERMITTED
        # Back inside the window (the full check passes again), and the allow-list still applies.
        now[0] = dt.datetime.now(dt.UTC)
        assert alpha.GetPlan(join_request(), timeout=RPC_TIMEOUT).plan_digest == "d"
        servicer.auth = PeerAuthenticator(ca_certificate, ["beta"], clock=lambda: now[0])
        refused(lambda: alpha.GetPlan(join_request(), timeout=RPC_TIMEOUT), grpc.StatusCode.PERMISSION_DENIED)
    finally:
        servicer.auth = original


# ---------------------------------------------------------------- a round over the wire


def test_a_round_over_the_wire(federation: tuple[TestServicer, int], alpha: pb_grpc.FederationStub) -> None:
    servicer, _ = federation
    stream = alpha.WaitForTasks(pb.TaskRequest(after=join_request().binding), timeout=RPC_TIMEOUT)
    # The task arrives when the aggregator opens the stage: the collaborator waits on the stream.
    threading.Timer(0.05, servicer.publish, args=(1, WIRE["STAGE_TRAIN"])).start()
    task = next(stream)
    assert (task.action, task.binding.round, WireStage.of(task.binding)) == (pb.ACTION_RUN, 1, TRAIN)
    assert task.binding.federation_id == FEDERATION

    theta, c = read_model(
        alpha.DownloadModel(pb.FetchRequest(binding=task.binding), timeout=RPC_TIMEOUT),
        task.binding,
        max_values=servicer.theta.size,
        max_chunk_bytes=CHUNK,
    )
    assert c == servicer.c and theta.dtype == np.float32 and np.array_equal(theta, servicer.theta)

    share = servicer.publish(1, WIRE["STAGE_SHARE_KEYS"])
    assert next(stream).binding == share
    relayed = read_payload(
        alpha.Fetch(pb.FetchRequest(binding=share), timeout=RPC_TIMEOUT),
        max_total_bytes=64 * CHUNK,
        max_chunk_bytes=CHUNK,
        binding=share,
    )[1]
    assert relayed == servicer.relay

    payload = np.random.default_rng(1).bytes(10 * CHUNK + 17)
    receipt = alpha.Submit(payload_parts(share, payload, CHUNK), timeout=RPC_TIMEOUT)
    assert receipt.received_size == len(payload) and receipt.sha256 == digest(payload)
    assert servicer.uploads[("alpha", 1, WIRE["STAGE_SHARE_KEYS"])] == payload

    # The same upload again is a replay; an upload for a closed stage is late.
    error = refused(
        lambda: alpha.Submit(payload_parts(share, payload, CHUNK), timeout=RPC_TIMEOUT),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert error.details() == NOT_EXPECTED
    servicer.publish(1, WIRE["STAGE_MASKED_INPUT"])
    assert WireStage.of(next(stream).binding) == WIRE["STAGE_MASKED_INPUT"]
    refused(
        lambda: alpha.Submit(payload_parts(share, b"late", CHUNK), timeout=RPC_TIMEOUT),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    wrong = make_binding("another-federation", 1, WIRE["STAGE_MASKED_INPUT"])
    refused(
        lambda: alpha.Submit(payload_parts(wrong, b"x", CHUNK), timeout=RPC_TIMEOUT),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    refused(
        lambda: list(
            alpha.DownloadModel(
                pb.FetchRequest(binding=make_binding(FEDERATION, 2, WIRE["STAGE_TRAIN"])), timeout=RPC_TIMEOUT
            )
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
    )

    # A malformed upload is refused with one generic message.
    masked = make_binding(FEDERATION, 1, WIRE["STAGE_MASKED_INPUT"])
    parts = list(payload_parts(masked, bytes(3 * CHUNK), CHUNK))
    parts[1].chunk.total_size += 1
    error = refused(lambda: alpha.Submit(iter(parts), timeout=RPC_TIMEOUT), grpc.StatusCode.INVALID_ARGUMENT)
    assert error.details() == MALFORMED_MESSAGE

    servicer.publish(1, WIRE["STAGE_CONSISTENCY"], pb.ACTION_FINISHED)
    assert next(stream).action == pb.ACTION_FINISHED
    assert list(stream) == []


def test_oversized_chunks_are_refused_on_the_wire(
    federation: tuple[TestServicer, int], alpha: pb_grpc.FederationStub
) -> None:
    servicer, _ = federation
    binding = servicer.publish(5, WIRE["STAGE_ADVERTISE_KEYS"])
    # Larger than the receiver's chunk limit, but within gRPC's message limit: our check.
    big = pb.Part(binding=binding, chunk=pb.Chunk(index=0, count=1, total_size=CHUNK + 100, data=bytes(CHUNK + 100)))
    error = refused(lambda: alpha.Submit(iter([big]), timeout=RPC_TIMEOUT), grpc.StatusCode.INVALID_ARGUMENT)
    assert error.details() == MALFORMED_MESSAGE and str(CHUNK) not in error.details()  # the limit stays private
    # Larger than the gRPC message limit: refused by gRPC before any servicer code runs.
    huge = pb.Part(binding=binding, chunk=pb.Chunk(index=0, count=1, total_size=8 * CHUNK, data=bytes(8 * CHUNK)))
    refused(lambda: alpha.Submit(iter([huge]), timeout=RPC_TIMEOUT), grpc.StatusCode.RESOURCE_EXHAUSTED)
    # Declaring more than the receiver takes is refused before any data is buffered.
    declared = pb.Part(binding=binding, chunk=pb.Chunk(index=0, count=1000, total_size=1000 * CHUNK, data=bytes(CHUNK)))
    refused(lambda: alpha.Submit(iter([declared]), timeout=RPC_TIMEOUT), grpc.StatusCode.INVALID_ARGUMENT)
    # A failed upload does not use up the peer's turn: a correct retry is accepted, once.
    assert alpha.Submit(payload_parts(binding, b"keys", CHUNK), timeout=RPC_TIMEOUT).received_size == 4
    refused(
        lambda: alpha.Submit(payload_parts(binding, b"keys", CHUNK), timeout=RPC_TIMEOUT),
        grpc.StatusCode.FAILED_PRECONDITION,
    )


def test_upload_sends_a_payload_of_one_chunk_unary_and_streams_a_longer_one(
    federation: tuple[TestServicer, int], alpha: pb_grpc.FederationStub
) -> None:
    servicer, _ = federation
    sizes = {WIRE["STAGE_ADVERTISE_KEYS"]: CHUNK, WIRE["STAGE_SHARE_KEYS"]: CHUNK + 1, WIRE["STAGE_CHECK_SHARES"]: 0}
    for stage, size in sizes.items():
        binding = servicer.publish(6, stage)
        payload = np.random.default_rng(size).bytes(size)
        before = servicer.calls.copy()
        seen: list[pb.Part] = []
        receipt = Uploader(alpha).upload(binding, payload, timeout=RPC_TIMEOUT, chunk_bytes=CHUNK, on_part=seen.append)
        assert (receipt.received_size, receipt.sha256) == (size, digest(payload))
        assert servicer.uploads[("alpha", 6, stage)] == payload
        assert b"".join(part.chunk.data for part in seen) == payload
        assert servicer.calls - before == Counter({"Send" if size <= CHUNK else "Submit": 1})
        assert len(seen) == max(1, math.ceil(size / CHUNK))


def test_upload_falls_back_to_a_submit_stream_for_an_aggregator_without_send(
    federation: tuple[TestServicer, int], alpha: pb_grpc.FederationStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    servicer, _ = federation
    monkeypatch.setattr(servicer, "implements_send", False)
    uploader = Uploader(alpha)
    binding = servicer.publish(8, WIRE["STAGE_ADVERTISE_KEYS"])
    before = servicer.calls.copy()
    receipt = uploader.upload(binding, b"keys", timeout=RPC_TIMEOUT, chunk_bytes=CHUNK)
    assert (receipt.received_size, servicer.uploads[("alpha", 8, WIRE["STAGE_ADVERTISE_KEYS"])]) == (4, b"keys")
    assert servicer.calls - before == Counter({"Send": 1, "Submit": 1})
    # The connection's aggregator has no Send: later small uploads over it do not ask again.
    binding = servicer.publish(8, WIRE["STAGE_SHARE_KEYS"])
    before = servicer.calls.copy()
    seen: list[pb.Part] = []
    uploader.upload(binding, b"shares", timeout=RPC_TIMEOUT, chunk_bytes=CHUNK, on_part=seen.append)
    assert servicer.uploads[("alpha", 8, WIRE["STAGE_SHARE_KEYS"])] == b"shares"
    assert servicer.calls - before == Counter({"Submit": 1})
    assert [part.chunk.data for part in seen] == [b"shares"]
    # Any other refusal of a Send is the caller's to handle, not a reason to try a Submit; a new
    # connection (perhaps to an upgraded aggregator) tries Send again.
    monkeypatch.setattr(servicer, "implements_send", True)
    before = servicer.calls.copy()
    with pytest.raises(grpc.RpcError) as refusal:
        Uploader(alpha).upload(binding, b"keys", timeout=RPC_TIMEOUT, chunk_bytes=CHUNK)  # alpha already uploaded
    assert refusal.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert servicer.calls - before == Counter({"Send": 1})
