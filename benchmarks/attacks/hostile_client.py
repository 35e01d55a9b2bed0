"""A client of the Federation service written from ``proto/fedfair.proto`` alone: what an attacker could write.

It imports the generated protobuf/gRPC modules, ``grpc``, ``cryptography``, ``numpy`` and
the standard library, and nothing else of fedfair: no collaborator, no transport helper,
no chunking or binding code. Everything it sends it builds itself, so whatever the
aggregator refuses, it refuses to code that is not ours.

- :class:`Credentials` / :func:`open_channel`: any certificate (or none) against the
  aggregator's TLS port;
- :func:`bind`, :func:`parts`, :func:`plain_payload`: messages as the schema describes them;
- :class:`RawFederation`: the six RPCs taking raw bytes, so any byte string can be a request;
- :func:`ask`: one request, its answer or its status, and how long it took;
- :func:`status_report`, :func:`unknown_field`, :func:`report`: status reports as the schema
  describes them, with whatever else an attacker appends, sent as raw bytes;
- :class:`TaskFollower`: a listed collaborator whose process is the attacker's code;
- :class:`LatencyProbe`, :func:`idle_connections`, :func:`garbage_after_handshake`: the
  denial-of-service measurements.
"""

from __future__ import annotations

import math
import os
import socket
import ssl
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

import grpc
import numpy as np

from fedfair.runtime.transport import fedfair_pb2 as pb
from fedfair.runtime.transport import fedfair_pb2_grpc as pb_grpc

SERVICE = "/fedfair.v1.Federation/"
DEADLINE_SECONDS = 10.0
"""Longest any single request of an attack may take before it counts as a hang."""

AGGREGATOR_NAME = "aggregator"
"""The name in the aggregator's certificate (what the client checks instead of the IP address)."""

Reply = TypeVar("Reply")


@dataclass(frozen=True)
class Credentials:
    """What an attacker presents: the CA it trusts (to reach the server at all) and, optionally,
    a client certificate and its key, as PEM files."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None

    def pem(self) -> tuple[bytes, bytes | None, bytes | None]:
        return (
            self.ca.read_bytes(),
            None if self.cert is None else self.cert.read_bytes(),
            None if self.key is None else self.key.read_bytes(),
        )


def open_channel(address: str, credentials: Credentials, *, server_name: str = AGGREGATOR_NAME) -> grpc.Channel:
    """A TLS channel to the aggregator with these credentials; no limit on what it may send."""
    ca, cert, key = credentials.pem()
    channel_credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    options: list[tuple[str, Any]] = [
        ("grpc.ssl_target_name_override", server_name),
        ("grpc.max_send_message_length", -1),
        ("grpc.max_receive_message_length", 64 << 20),
    ]
    return grpc.secure_channel(address, channel_credentials, options=options)


def stub(channel: grpc.Channel) -> pb_grpc.FederationStub:
    return pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]  # protoc's code is untyped


MASKED_ROUND = (
    "ADVERTISE_KEYS",
    "SHARE_KEYS",
    "CHECK_SHARES",
    "MASKED_INPUT",
    "CONSISTENCY",
    "UNMASK",
    "VERIFY_CLAIM",
    "VERIFY_TAGS",
)
"""The masked round's stages in the order the schema's Binding.step counts them from 1 (0: the download)."""

Stage = tuple[int, int]
"""A stage as the schema binds it: (Stage, step)."""


def named_stage(name: str) -> Stage:
    """A stage by the name the aggregator's logs give it: 'STAGE_TRAIN' (step 0), 'STAGE_EVAL_UNMASK' (6)."""
    if name in ("STAGE_JOIN", "STAGE_TRAIN", "STAGE_EVALUATE"):
        return pb.Stage.Value(name), 0
    evaluation = name.startswith("STAGE_EVAL_")
    step = MASKED_ROUND.index(name.removeprefix("STAGE_EVAL_" if evaluation else "STAGE_")) + 1
    return (pb.STAGE_EVALUATE if evaluation else pb.STAGE_TRAIN), step


def stage_of(binding: pb.Binding) -> Stage:
    """The stage `binding` names."""
    return int(binding.stage), int(binding.step)


def stage_name(at: Stage) -> str:
    """What the aggregator's logs call the masked round's stage `at` (the inverse of :func:`named_stage`)."""
    aggregation, step = at
    if step == 0 or step > len(MASKED_ROUND):
        return pb.Stage.Name(aggregation) + (f" step {step}" if step else "")  # type: ignore[arg-type]
    return ("STAGE_EVAL_" if aggregation == pb.STAGE_EVALUATE else "STAGE_") + MASKED_ROUND[step - 1]


def bind(federation_id: str, round_number: int, at: Stage) -> pb.Binding:
    """A Binding as the schema defines it."""
    aggregation, step = at
    return pb.Binding(federation_id=federation_id, round=round_number, stage=aggregation, step=step)  # type: ignore[arg-type]


WIRE_VERSION = 5
"""The wire version this client speaks, read off the schema's release (an outsider holds no fedfair constant)."""


def join_binding(federation_id: str) -> pb.Binding:
    return bind(federation_id, 0, named_stage("STAGE_JOIN"))


def parts(binding: pb.Binding, payload: bytes, chunk_bytes: int = 1 << 20) -> list[pb.Part]:
    """A payload as the schema says it travels: `count` chunks in index order, each declaring the total."""
    count = max(1, math.ceil(len(payload) / chunk_bytes))
    return [
        pb.Part(
            binding=binding,
            chunk=pb.Chunk(
                index=index,
                count=count,
                total_size=len(payload),
                data=payload[index * chunk_bytes : (index + 1) * chunk_bytes],
            ),
        )
        for index in range(count)
    ]


def part(binding: pb.Binding, index: int, count: int, total: int, data: bytes) -> pb.Part:
    """One chunk with whatever index, count and total the attack wants to claim."""
    return pb.Part(binding=binding, chunk=pb.Chunk(index=index, count=count, total_size=total, data=data))


def plain_payload(vector: np.ndarray, weight: float) -> bytes:
    """A plain-mode training update as the wire contract describes it: w * delta as little-endian float32, then w
    as a little-endian float64 (written here from the contract, not with fedfair's own encoder)."""
    return np.asarray(vector, dtype="<f4").tobytes() + np.array(weight, dtype="<f8").tobytes()


def read_parts(stream: Iterator[pb.Part]) -> bytes:
    """Concatenate a Fetch stream's chunks (the attacker trusts the aggregator's framing)."""
    return b"".join(item.chunk.data for item in stream)


@dataclass(frozen=True)
class Answer:
    """How the aggregator answered one request: "OK" or a status code's name, its details, the time."""

    code: str
    details: str
    seconds: float
    reply: Any = None

    @property
    def ok(self) -> bool:
        return self.code == "OK"

    def describe(self) -> str:
        return "accepted" if self.ok else f"{self.code} {self.details!r}"


def ask(call: Callable[[], Reply]) -> Answer:
    """Run one request; its reply, or the status it ended with."""
    started = time.perf_counter()
    try:
        reply = call()
    except grpc.RpcError as error:
        code = error.code()
        details = error.details()
        return Answer(code.name if code is not None else "UNKNOWN", details or "", time.perf_counter() - started)
    return Answer("OK", "", time.perf_counter() - started, reply)


def submit(channel: grpc.Channel, messages: Sequence[pb.Part], *, deadline: float = DEADLINE_SECONDS) -> Answer:
    """One Submit of exactly these parts."""
    federation = stub(channel)
    return ask(lambda: federation.Submit(iter(messages), timeout=deadline))


def send(channel: grpc.Channel, message: pb.Part, *, deadline: float = DEADLINE_SECONDS) -> Answer:
    """One Send of this part (a whole upload, if it says it is the only one)."""
    federation = stub(channel)
    return ask(lambda: federation.Send(message, timeout=deadline))


def fetch(channel: grpc.Channel, binding: pb.Binding, *, deadline: float = DEADLINE_SECONDS) -> Answer:
    """Fetch the open stage's input; the reply is the reassembled bytes."""
    federation = stub(channel)
    return ask(lambda: read_parts(federation.Fetch(pb.FetchRequest(binding=binding), timeout=deadline)))


def get_plan(channel: grpc.Channel, federation_id: str, *, deadline: float = DEADLINE_SECONDS) -> Answer:
    federation = stub(channel)
    return ask(
        lambda: federation.GetPlan(
            pb.PlanRequest(binding=join_binding(federation_id), wire_version=WIRE_VERSION), timeout=deadline
        )
    )


def status_report(binding: pb.Binding, status: int, epsilon: float | None = None) -> bytes:
    """A StatusReport's bytes: a status about `binding`'s round, and an epsilon if one is given."""
    return pb.StatusReport(binding=binding, status=status, epsilon=epsilon).SerializeToString()  # type: ignore[arg-type]


def unknown_field(number: int, data: bytes) -> bytes:
    """A length-delimited field `number` carrying `data`: appended to a message, a field its schema lacks."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def report(channel: grpc.Channel, data: bytes, *, deadline: float = DEADLINE_SECONDS) -> Answer:
    """One Report whose request is exactly `data` (a StatusReport or anything else); the reply is raw bytes."""
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(SERVICE + "Report")
    return ask(lambda: call(data, timeout=deadline))


class RawFederation:
    """The seven RPCs with no serialisers: requests and replies are raw bytes, so anything can be sent."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.get_plan: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(SERVICE + "GetPlan")
        self.wait_for_tasks: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(
            SERVICE + "WaitForTasks"
        )
        self.download_model: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(
            SERVICE + "DownloadModel"
        )
        self.fetch: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(SERVICE + "Fetch")
        self.submit: grpc.StreamUnaryMultiCallable[bytes, bytes] = channel.stream_unary(SERVICE + "Submit")
        self.send: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(SERVICE + "Send")
        self.report: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(SERVICE + "Report")


# ---------------------------------------------------------------- an insider written by the attacker


@dataclass
class TaskFollower:
    """A collaborator on the plan's list whose process is the attacker's code.

    It fetches the plan, keeps one task stream and hands every task to ``on_task`` (which
    decides what, if anything, to upload); it stops at FINISHED. While it has not answered a
    stage, the aggregator waits for it (up to the stage's deadline), so its attacks meet an
    open stage; once the aggregator refuses one of its uploads it is no longer waited for,
    which is why the scenarios also hold one honest upload back until the attacks are done.
    """

    address: str
    credentials: Credentials
    federation_id: str
    on_task: Callable[[TaskFollower, pb.Task], None]
    channel: grpc.Channel = field(init=False)
    errors: list[str] = field(default_factory=list)
    _thread: threading.Thread | None = None
    _stream: Any = None
    _stopping: bool = False

    def __post_init__(self) -> None:
        self.channel = open_channel(self.address, self.credentials)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hostile-insider", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> bool:
        """Wait for FINISHED (or a failure); False if still running after `timeout` seconds."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def stop(self) -> None:
        self._stopping = True
        if self._stream is not None:
            self._stream.cancel()
        self.channel.close()

    def _run(self) -> None:
        federation = stub(self.channel)
        try:
            federation.GetPlan(
                pb.PlanRequest(binding=join_binding(self.federation_id), wire_version=WIRE_VERSION), timeout=30
            )
            self._stream = federation.WaitForTasks(pb.TaskRequest(after=join_binding(self.federation_id)))
            for task in self._stream:
                if task.action == pb.ACTION_FINISHED:
                    return
                if task.action == pb.ACTION_RUN:
                    self.on_task(self, task)
        except grpc.RpcError as error:
            if not self._stopping:
                self.errors.append(f"task stream ended: {error.code()} {error.details()}")
        except Exception as error:  # noqa: BLE001 -- reported by the scenario, which owns the thread
            self.errors.append(f"{type(error).__name__}: {error}")


# ---------------------------------------------------------------- denial-of-service measurements


@dataclass
class LatencyProbe:
    """Times an honest GetPlan again and again while an attack runs.

    With ``fresh_connections`` every probe dials a new TLS connection (what a collaborator
    that just restarted needs); otherwise all probes share one channel.
    """

    address: str
    credentials: Credentials
    federation_id: str
    interval: float = 0.05
    deadline: float = 5.0
    fresh_connections: bool = False
    samples: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._run, name="latency-probe", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.deadline + 5)

    def _run(self) -> None:
        shared = None if self.fresh_connections else open_channel(self.address, self.credentials)
        try:
            while not self._stop.is_set():
                channel = shared or open_channel(self.address, self.credentials)
                try:
                    self.samples.append(get_plan(channel, self.federation_id, deadline=self.deadline))
                finally:
                    if shared is None:
                        channel.close()
                self._stop.wait(self.interval)
        finally:
            if shared is not None:
                shared.close()

    def summary(self) -> dict[str, Any]:
        """Count, failures and latency quantiles of the probes (failed probes count as their time)."""
        times = sorted(sample.seconds for sample in self.samples)
        failures = [sample.describe() for sample in self.samples if not sample.ok]
        return {
            "probes": len(times),
            "failed": len(failures),
            "failures": sorted(set(failures))[:5],
            "max_seconds": round(times[-1], 4) if times else None,
            "median_seconds": round(statistics.median(times), 4) if times else None,
            "p95_seconds": round(times[min(len(times) - 1, int(0.95 * len(times)))], 4) if times else None,
        }


def idle_connections(address: str, count: int, *, timeout: float = 2.0) -> list[socket.socket]:
    """Open up to `count` TCP connections that never start a TLS handshake; return those that connected."""
    host, port = address.rsplit(":", 1)
    opened: list[socket.socket] = []
    for _ in range(count):
        try:
            opened.append(socket.create_connection((host, int(port)), timeout=timeout))
        except OSError:
            break
    return opened


def garbage_after_handshake(address: str, credentials: Credentials, size: int = 4096) -> str:
    """Complete a TLS handshake with these credentials, then send random bytes instead of HTTP/2.

    Returns what the server did: "closed" (it hung up), "silent" (it kept the connection
    open without answering, within 5 s), or the handshake error.
    """
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(credentials.ca))
    if credentials.cert is not None and credentials.key is not None:
        context.load_cert_chain(str(credentials.cert), str(credentials.key))
    context.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection((host, int(port)), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=AGGREGATOR_NAME) as tls,
        ):
            tls.sendall(os.urandom(size))
            try:
                while tls.recv(4096):
                    pass
            except TimeoutError:
                return "silent"
            except (ssl.SSLError, OSError):
                pass
            return "closed"
    except (ssl.SSLError, OSError) as error:
        return f"handshake failed: {type(error).__name__}"
