"""What the aggregator refuses, one test each, against a live federation over loopback mTLS.

The aggregator and three collaborators run in threads of this process (real gRPC
server, real mutual TLS, real `Collaborator` objects). The collaborators are held
just after the aggregator opens round 2's ADVERTISE_KEYS stage, so every attack
below meets a stage that is open and waiting; then they are released and the round
must complete with all three genuine contributions, untouched by the attacks.

The attacks that get refused use site-a's own certificate, so the aggregator charges
each refusal to site-a: a refused peer is not waited for unless it is uploading
again (see `fedfair.runtime.aggregator.board`). site-a is therefore released first,
and the others once its genuine upload is in.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives import serialization

from fedfair import pki
from fedfair.core.errors import RefusedError, RoundAbortedError
from fedfair.core.update import Update
from fedfair.fairness import sums
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.aggregator.checks import SumOutcome, check_decoded_update, decode_plain
from fedfair.runtime.aggregator.servicer import INVALID_UPLOAD, Servicer
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.trainer import round_trainer
from fedfair.runtime.contract import EVALUATION, TRAINING, RoundParameters
from fedfair.runtime.failures import EXIT_INCOMPLETE
from fedfair.runtime.local.workspace import Workspace, make_workspace
from fedfair.runtime.transport.chunks import plain_upload
from fedfair.runtime.transport import (
    INLINE_INPUT_BYTES,
    DEFAULT_CHUNK_BYTES,
    MALFORMED_MESSAGE,
    NOT_EXPECTED,
    NOT_PERMITTED,
    Pieces,
    TlsFiles,
    channel_options,
    make_binding,
    payload_parts,
    pb,
    pb_grpc,
    plan_request,
    read_payload,
    secure_channel,
)
from fedfair.secagg import Client, EncodingConfig
from tests.runtime.harness import (
    ThreadFederation,
    new_workspace,
    plan_sections,
    refused,
    thread_federation,
)
from fedfair.runtime.transport import WireStage
from tests.runtime.wire_stages import WIRE

pytestmark = pytest.mark.slow  # a live federation in threads, held mid-round
NAMES = ["site-a", "site-b", "site-c"]
FEDERATION = "fedfair-launch"
TIMEOUT = 20


class Hold:
    """Pauses every collaborator when it receives the task for `stage` of round 2, and taps site-a's uploads."""

    def __init__(self, stage: pb.Stage = WIRE["STAGE_ADVERTISE_KEYS"]) -> None:
        self.stage = stage
        self.released: dict[str, threading.Event] = {name: threading.Event() for name in NAMES}
        self.arrived: dict[str, threading.Event] = {name: threading.Event() for name in NAMES}
        self.uploads: list[tuple[pb.Binding, bytes]] = []
        self.site_a_uploaded = threading.Event()

    def install(self, name: str, collaborator: Collaborator) -> None:
        step, submit = collaborator.step, collaborator.submit

        def held_step(stub: pb_grpc.FederationStub, task: pb.Task) -> None:
            if (task.binding.round, WireStage.of(task.binding)) == (2, self.stage):
                self.arrived[name].set()
                self.released[name].wait(120)
            step(stub, task)

        def tapped_submit(stub: pb_grpc.FederationStub, binding: pb.Binding, payload: bytes) -> None:
            if name == "site-a":
                self.uploads.append((binding, payload))
            submit(stub, binding, payload)
            if name == "site-a" and (binding.round, WireStage.of(binding)) == (2, self.stage):
                self.site_a_uploaded.set()

        collaborator.step = held_step  # type: ignore[method-assign]
        collaborator.submit = tapped_submit  # type: ignore[method-assign]

    def wait_until_held(self) -> None:
        for event in self.arrived.values():
            assert event.wait(120), "the federation did not reach round 2"

    def release(self) -> None:
        """site-a first; the others once its genuine upload is in (it was refused under its name before)."""
        self.released["site-a"].set()
        self.site_a_uploaded.wait(30)
        for event in self.released.values():
            event.set()


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Workspace, ThreadFederation, Hold]]:
    root = tmp_path_factory.mktemp("rejections")
    workspace = new_workspace(root, NAMES, training={"rounds": 3}, quorum={"min_collaborators": 3})
    _extra_credentials(workspace)
    hold = Hold()
    with thread_federation(workspace, collaborator=hold.install) as federation:
        hold.wait_until_held()
        yield workspace, federation, hold
        hold.release()
        federation.join()


def _extra_credentials(workspace: Workspace) -> None:
    """mallory: a valid certificate of the federation's CA for a name the plan does not list. (A missing,
    foreign or expired certificate fails the handshake itself: tests/runtime/transport/test_grpc.py.)"""
    pki.issue(workspace.certs, "collaborator", "mallory")


def raw_stub(workspace: Workspace, cert: Path | None = None, key: Path | None = None) -> pb_grpc.FederationStub:
    """A client built the way an attacker would, with none of our own checks in the way."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(workspace.certs / "ca.crt").read_bytes(),
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None,
    )
    channel = grpc.secure_channel(workspace.address, credentials, options=channel_options(aggregator_name="aggregator"))
    return pb_grpc.FederationStub(channel)


def as_site_a(workspace: Workspace) -> pb_grpc.FederationStub:
    files = TlsFiles.in_folder(workspace.certs, "site-a")
    return pb_grpc.FederationStub(secure_channel(workspace.address, files, aggregator_name="aggregator"))


def join_request() -> pb.PlanRequest:
    return plan_request(FEDERATION)


ADVERTISE = make_binding(FEDERATION, 2, WIRE["STAGE_ADVERTISE_KEYS"])


# ---------------------------------------------------------------- who may talk at all


def test_a_valid_certificate_not_in_the_plan_gets_a_generic_refusal(
    held: tuple[Workspace, ThreadFederation, Hold],
) -> None:
    workspace, _, _ = held
    stub = raw_stub(workspace, workspace.certs / "mallory.crt", workspace.certs / "mallory.key")
    for call in (
        lambda: stub.GetPlan(join_request(), timeout=TIMEOUT),
        lambda: next(stub.WaitForTasks(pb.TaskRequest(after=join_request().binding), timeout=TIMEOUT)),
        lambda: stub.Submit(payload_parts(ADVERTISE, b"x"), timeout=TIMEOUT),
        lambda: list(stub.Fetch(pb.FetchRequest(binding=ADVERTISE), timeout=TIMEOUT)),
    ):
        error = refused(call, grpc.StatusCode.PERMISSION_DENIED)
        assert error.details() == NOT_PERMITTED and "mallory" not in error.details()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_openssl_without_a_client_certificate_fails_the_handshake(
    held: tuple[Workspace, ThreadFederation, Hold],
) -> None:
    workspace, _, _ = held

    def handshake(*credentials: str) -> int:
        # TLS 1.2, where the client certificate is part of the handshake itself (TLS 1.3 refuses it just after).
        command = ["openssl", "s_client", "-tls1_2", "-alpn", "h2", "-connect", workspace.address,
                   "-CAfile", str(workspace.certs / "ca.crt"), *credentials]  # fmt: skip
        result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False)
        return result.returncode

    assert handshake() != 0
    assert handshake("-cert", str(workspace.certs / "site-a.crt"), "-key", str(workspace.certs / "site-a.key")) == 0


# ---------------------------------------------------------------- what an allowed peer may not do


def test_a_peer_cannot_upload_into_another_peers_slot(held: tuple[Workspace, ThreadFederation, Hold]) -> None:
    """No message has a name field; the party a message names must be the certificate's.

    site-a, holding only its own key and site-b's public certificate, forges site-b's
    advertisement (site-b's party id and credential) and submits it on its own channel.
    """
    workspace, _, _ = held
    stub = as_site_a(workspace)
    _, inputs = read_payload(
        stub.Fetch(pb.FetchRequest(binding=ADVERTISE), timeout=TIMEOUT), max_total_bytes=1 << 20, binding=ADVERTISE
    )
    parameters = RoundParameters.from_bytes(inputs)
    config = parameters.secagg_config(FEDERATION, TRAINING)
    site_b_certificate = pki.load_certificate(workspace.certs / "site-b.crt").public_bytes(serialization.Encoding.DER)
    forged = Client(
        config,
        "site-b",
        pki.load_private_key(workspace.certs / "site-a.key"),
        site_b_certificate,
        pki.credential_verifier(pki.load_certificate(workspace.certs / "ca.crt")),
    )
    error = refused(
        lambda: stub.Submit(payload_parts(ADVERTISE, forged.advertise().to_bytes()), timeout=TIMEOUT),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert error.details() == INVALID_UPLOAD and "site" not in error.details()
    # The refusal freed site-a's own slot and took nothing from site-b: both still upload
    # their genuine keys when released (checked by the last test of this module).


def test_a_replayed_submission_is_refused(held: tuple[Workspace, ThreadFederation, Hold]) -> None:
    workspace, _, hold = held
    stub = as_site_a(workspace)
    earlier = [(binding, payload) for binding, payload in hold.uploads if binding.round == 1 and payload]
    assert {WireStage.of(binding) for binding, _ in earlier} >= {
        WIRE["STAGE_ADVERTISE_KEYS"],
        WIRE["STAGE_MASKED_INPUT"],
    }
    for binding, payload in earlier:
        # As it was: bound to round 1, which is over.
        error = refused(
            lambda bound=binding, data=payload: stub.Submit(payload_parts(bound, data), timeout=TIMEOUT),
            grpc.StatusCode.FAILED_PRECONDITION,
        )
        assert error.details() == NOT_EXPECTED
    # Re-bound to the open stage: the transport admits it, the secure-aggregation session refuses it.
    advertisement = next(
        payload for binding, payload in earlier if WireStage.of(binding) == WIRE["STAGE_ADVERTISE_KEYS"]
    )
    refused(
        lambda: stub.Submit(payload_parts(ADVERTISE, advertisement), timeout=TIMEOUT), grpc.StatusCode.INVALID_ARGUMENT
    )


def test_malformed_and_oversized_chunks_are_refused(
    held: tuple[Workspace, ThreadFederation, Hold], caplog: pytest.LogCaptureFixture
) -> None:
    """Refused before anything is buffered, with one generic message: no limit or size goes back."""
    workspace, _, _ = held
    stub = as_site_a(workspace)

    def submit(*parts: pb.Part) -> None:
        stub.Submit(iter(parts), timeout=TIMEOUT)

    def part(index: int, count: int, total: int, size: int) -> pb.Part:
        return pb.Part(binding=ADVERTISE, chunk=pb.Chunk(index=index, count=count, total_size=total, data=bytes(size)))

    oversized = DEFAULT_CHUNK_BYTES + 100  # over our chunk limit, under gRPC's message limit
    with caplog.at_level("INFO"):
        for parts in (
            [part(0, 1, oversized, oversized)],
            [part(0, 64, 64 << 20, 1024)],  # the declared size is refused before anything is buffered
            [part(0, 2, 2048, 1024), part(1, 2, 2047, 1024)],
            [part(1, 2, 2048, 1024)],
        ):
            error = refused(lambda chunks=parts: submit(*chunks), grpc.StatusCode.INVALID_ARGUMENT)
            assert error.details() == MALFORMED_MESSAGE
    # What was wrong stays in the aggregator's log, one line per refusal.
    refusals = [record.getMessage() for record in caplog.records if record.getMessage().startswith("refused Submit")]
    assert len(refusals) == 4 and all("from 'site-a'" in line and "WireError" in line for line in refusals)
    assert "over the limit" in refusals[0] and "out of order" in refusals[3]
    assert not [record for record in caplog.records if record.exc_info]
    refused(lambda: submit(part(0, 1, 4 << 20, 4 << 20)), grpc.StatusCode.RESOURCE_EXHAUSTED)  # over gRPC's limit
    error = refused(
        lambda: stub.Submit(payload_parts(ADVERTISE, b"\x00garbage" * 50), timeout=TIMEOUT),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert error.details() == INVALID_UPLOAD


def test_after_the_attacks_the_round_completes_with_every_genuine_contribution(
    held: tuple[Workspace, ThreadFederation, Hold],
) -> None:
    workspace, federation, hold = held
    hold.release()
    federation.join()
    assert not federation.errors, federation.errors
    log = read_round_log(workspace.output)
    assert [record["status"] for record in log] == ["applied"] * 3
    assert all(record["contributors"] == NAMES for record in log)


# ---------------------------------------------------------------- non-finite updates


class NaNInRound:
    """A trainer (plugged in through the collaborator's privacy hook) whose round-2 update is NaN.

    With `release`, that round's training first waits for the event (at most a minute) and
    records in `released` whether it came.
    """

    def __init__(self, trainer, round_number: int, release: threading.Event | None = None) -> None:  # type: ignore[no-untyped-def]
        self.trainer, self.round_number, self.rounds = trainer, round_number, 0
        self.release, self.released = release, False

    def train_round(self, theta: torch.Tensor, c: float, control: torch.Tensor | None = None) -> Update:
        self.rounds += 1
        update = self.trainer.train_round(theta, c)
        if self.rounds == self.round_number:
            if self.release is not None:
                self.released = self.release.wait(60)
            return Update(delta=update.delta * float("nan"), delta_c=update.delta_c, weight=update.weight)
        return update


NAN_KNOWN = {
    # Training ended before the first key stage: the collaborator withdraws there, as nothing was set up.
    "before-the-key-stages": "STAGE_ADVERTISE_KEYS",
    # Still training when the key stages ran (they do not wait for it): it withdraws at masking, a dropout.
    "after-the-key-stages": "STAGE_MASKED_INPUT",
}


@pytest.mark.parametrize("withdrawn_at", NAN_KNOWN.values(), ids=NAN_KNOWN.keys())
def test_a_collaborator_refuses_to_send_a_nan_update(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, withdrawn_at: str
) -> None:
    """A NaN update is never sent: the collaborator withdraws at the first stage after its training
    ended, and the round is summed over the others (its mask key rebuilt if it had masked with them)."""
    workspace = new_workspace(tmp_path, NAMES, training={"rounds": 3}, quorum={"min_collaborators": 2})
    checked = threading.Event()
    trainers: list[NaNInRound] = []

    def break_site_c(name: str, collaborator: Collaborator) -> None:
        if name != "site-c":
            return
        late = withdrawn_at == "STAGE_MASKED_INPUT"

        def factory(*args: Any) -> NaNInRound:
            trainers.append(NaNInRound(round_trainer(*args), 2, checked if late else None))
            return trainers[-1]

        collaborator.trainer_factory = factory
        start, step = collaborator.start_round, collaborator.step

        def start_and_finish(stub: Any, binding: pb.Binding, stages: Any) -> None:
            start(stub, binding, stages)
            if not late:
                assert collaborator._work is not None and collaborator._work.pending is not None
                collaborator._work.pending.exception()  # training over before the task stream goes on

        def step_then_release(stub: Any, task: pb.Task) -> None:
            step(stub, task)
            if WireStage.of(task.binding) == WIRE["STAGE_CHECK_SHARES"] and task.binding.round == 2:
                checked.set()

        collaborator.start_round = start_and_finish  # type: ignore[method-assign]
        collaborator.step = step_then_release  # type: ignore[method-assign]

    with caplog.at_level("INFO"), thread_federation(workspace, collaborator=break_site_c) as federation:
        federation.join()
    # Having verified no sum of round 2, site-c checks round 3's model by catching up on round 2's sum first
    # (issue 98), where it used to sit round 3 out (issue 79) or train on its model unchecked.
    assert not federation.errors, federation.errors
    assert "site-c: round 2: caught up" in caplog.text
    assert "site-c: round 2: the local update has NaN or Inf; refusing to contribute it" in caplog.text
    if withdrawn_at == "STAGE_MASKED_INPUT":
        assert trainers[0].released  # its share check ran while it was still training
    log = read_round_log(workspace.output)
    assert log[1]["status"] == "applied" and log[1]["contributors"] == ["site-a", "site-b"]
    assert log[1]["dropped"] == {withdrawn_at: ["site-c"]}  # it withdrew before masking anything
    assert log[2]["status"] == "applied" and log[2]["contributors"] == NAMES  # back, having caught up
    assert federation.collaborators["site-c"].contributed_rounds == [1, 3]  # not round 2; round 3 after catching up


def test_the_aggregator_refuses_a_non_finite_plain_update(tmp_path: Path) -> None:
    """With secure aggregation off, the aggregator decodes each upload and refuses NaN or Inf in it."""
    workspace = new_workspace(
        tmp_path, NAMES, training={"rounds": 2}, secure_aggregation={"enabled": False}, quorum={"min_collaborators": 3}
    )
    masked = make_binding(FEDERATION, 2, WIRE["STAGE_MASKED_INPUT"])
    hold = Hold(WIRE["STAGE_MASKED_INPUT"])
    with thread_federation(workspace, collaborator=hold.install) as federation:
        hold.wait_until_held()
        stub = as_site_a(workspace)
        dimension = RoundParameters.from_bytes(
            read_payload(
                stub.Fetch(pb.FetchRequest(binding=masked), timeout=TIMEOUT), max_total_bytes=1 << 20, binding=masked
            )[1]
        ).dimension
        for bad in (np.nan, np.inf, 1e30):  # finite in float32, the training upload's wire type, far past the clip
            values = np.zeros(dimension)
            values[3] = bad
            upload = plain_upload(values, 10.0, TRAINING.plain_values)
            error = refused(
                lambda data=upload: stub.Submit(payload_parts(masked, data), timeout=TIMEOUT),
                grpc.StatusCode.INVALID_ARGUMENT,
            )
            assert error.details() == INVALID_UPLOAD
        hold.release()
        federation.join()
    assert not federation.errors, federation.errors
    log = read_round_log(workspace.output)
    assert not log[1]["secure_aggregation"] and log[1]["contributors"] == NAMES  # site-a's genuine upload went in


def test_a_refused_upload_does_not_hold_the_stage_to_its_deadline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """site-c's round-2 update is refused (its weight is out of range) and, like any collaborator whose
    upload is refused, it sits the round out: the stage closes once site-a and site-b have answered,
    not at its 60 s deadline. The aggregator logs the refusal on one line, without a traceback."""
    workspace = new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": 3},
        secure_aggregation={"enabled": False},
        quorum={"min_collaborators": 3, "round_timeout_seconds": 60.0},
    )

    def break_site_c(name: str, collaborator: Collaborator) -> None:
        submit = collaborator.submit

        def negative_weight(stub: pb_grpc.FederationStub, binding: pb.Binding, payload: bytes | Pieces) -> None:
            if name == "site-c" and (binding.round, WireStage.of(binding)) == (2, WIRE["STAGE_MASKED_INPUT"]):
                # A plain upload is its values' pieces, then the weight's 8 bytes (chunks.plain_upload).
                joined = payload if isinstance(payload, bytes) else b"".join(payload)
                payload = joined[:-8] + np.array([-1.0], dtype="<f8").tobytes()
            submit(stub, binding, payload)

        collaborator.submit = negative_weight  # type: ignore[method-assign]

    with caplog.at_level("INFO"), thread_federation(workspace, collaborator=break_site_c) as federation:
        federation.join()
    assert not federation.errors, federation.errors
    log = read_round_log(workspace.output)
    assert log[1]["status"] == "applied" and log[1]["contributors"] == ["site-a", "site-b"]
    # A stage held to its deadline makes the round last at least its 60 s; any shorter round closed without it,
    # however slowly a loaded machine ran the rest (it took about a second here).
    assert log[1]["seconds"] < 60.0, log[1]["seconds"]
    assert log[2]["contributors"] == NAMES
    # This small model's update fits one part: it went up in a Send.
    [line] = [record.getMessage() for record in caplog.records if record.getMessage().startswith("refused Send")]
    assert line.startswith(
        "refused Send from 'site-c' (round 2 STAGE_MASKED_INPUT): INVALID_ARGUMENT: RefusedError(INVALID_UPLOAD)"
    )
    assert not [record for record in caplog.records if record.exc_info]


def test_the_decode_checks() -> None:
    encoding = EncodingConfig(clip=10.0, max_weight=100.0, fractional_bits=16)
    evaluation = EVALUATION.plain_values  # float64 values, then the float64 weight
    with pytest.raises(RefusedError, match="NaN or Inf"):
        decode_plain(np.array([np.inf, 1.0]).tobytes(), 1, encoding, evaluation)
    with pytest.raises(RefusedError, match="weight"):
        decode_plain(np.array([0.5, 0.0]).tobytes(), 1, encoding, evaluation)
    with pytest.raises(RefusedError, match="1 float64 values and a float64 weight"):
        decode_plain(np.zeros(3).tobytes(), 1, encoding, evaluation)
    with pytest.raises(RefusedError, match="clipping range"):
        decode_plain(np.array([21.0, 2.0]).tobytes(), 1, encoding, evaluation)  # |w * delta| over clip * w
    values, weight = decode_plain(np.array([0.5, 2.0]).tobytes(), 1, encoding, evaluation)
    assert values.tolist() == [0.5] and weight == 2.0

    def outcome(total: np.ndarray, weight: float) -> SumOutcome:
        return SumOutcome(total, weight, 1e-6, ("a", "b"))

    check_decoded_update(outcome(np.array([19.0, -20.0]), 2.0), clip=10.0, count=2)
    for bad, message in (
        (outcome(np.array([1.0, 0.0]), 0.0), "not positive"),
        (outcome(np.array([np.nan, 0.0]), 2.0), "NaN or Inf"),
        (outcome(np.array([21.0, 0.0]), 2.0), "outside the clipping range"),
        (outcome(np.array([0.0, -21.0]), 2.0), "outside the clipping range"),
    ):
        with pytest.raises(RoundAbortedError, match=message):
            check_decoded_update(bad, clip=10.0, count=2)


# ---------------------------------------------------------------- the wire


def test_the_bytes_a_collaborator_sends_do_not_grow_with_its_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10x the samples, the same bytes per round (within 1%): only fixed-size secure-aggregation messages leave.

    And only the evaluation's claimed sum is fetched: every other stage input (key directory, share bundle, masking
    and survivor sets, unmask request, the training claim and tags, the final bundle of this small model) rides with
    its task, one round trip less per stage and collaborator. Every upload fits one part, so each goes in a unary Send, never in a
    Submit stream."""
    calls: Counter[str] = Counter()

    def counted(rpc: str) -> Callable[..., Any]:
        serve = getattr(Servicer, rpc)

        def call(self: Servicer, request: Any, context: grpc.ServicerContext) -> Any:
            calls[rpc] += 1
            return serve(self, request, context)

        return call

    for rpc in ("Fetch", "Send", "Submit"):
        monkeypatch.setattr(Servicer, rpc, counted(rpc))
    data = {
        "site-a": {"dataset": "adult", "partition": "iid", "parts": 3, "index": 0},  # ~10,850 rows
        "site-b": {"dataset": "adult", "partition": "iid", "parts": 30, "index": 1},  # ~1,085 rows
        "site-c": {"dataset": "adult", "partition": "iid", "parts": 30, "index": 2},
    }
    workspace = make_workspace(
        tmp_path,
        NAMES,
        plan=plan_sections(training={"rounds": 3}, evaluation={"every": 1}, quorum={"min_collaborators": 3}),
        data=data,
    )
    with thread_federation(workspace) as federation:
        federation.join()
    assert not federation.errors, federation.errors
    assert federation.exits == dict.fromkeys(NAMES, 0), federation.exits  # every round holds every site
    big, small = federation.collaborators["site-a"], federation.collaborators["site-b"]
    assert big.data.train.size >= 9.9 * small.data.train.size and big.data.test.size >= 9.9 * small.data.test.size
    for round_number in (1, 2, 3):  # each round: training and an evaluation
        sent_big, sent_small = big.uploaded_bytes[round_number], small.uploaded_bytes[round_number]
        assert abs(sent_big - sent_small) <= 0.01 * sent_small, (round_number, sent_big, sent_small)
    # Per round and collaborator: six training stages and six evaluation stages upload, each aggregation then
    # two more of verified aggregation (the tags, the verdict). The evaluation's claim alone is fetched: it carries
    # what each site re-sums (every survivor's masked input of the evaluation's words), past what rides with a task.
    claim_words = (len(NAMES) + 1) * (sums.vector_length() + 1)
    assert claim_words * 8 > INLINE_INPUT_BYTES
    assert calls == Counter({"Send": 3 * 3 * 16, "Fetch": 3 * 3}), calls


def test_too_few_survivors_abort_the_round_and_leave_the_model_unchanged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two of three collaborators withdraw in round 2: one survivor is below t = 2, so nothing is unmasked."""
    workspace = new_workspace(tmp_path, NAMES, training={"rounds": 3}, quorum={"min_collaborators": 3})

    def break_two(name: str, collaborator: Collaborator) -> None:
        if name != "site-a":
            collaborator.trainer_factory = lambda *args: NaNInRound(round_trainer(*args), 2)

    with caplog.at_level("WARNING"), thread_federation(workspace, collaborator=break_two) as federation:
        federation.join()
    assert not federation.errors, federation.errors
    log = read_round_log(workspace.output)
    assert [record["status"] for record in log] == ["applied", "aborted", "applied"]
    assert "below the threshold 2" in log[1]["reason"]
    assert "round 2 aborted, model unchanged" in caplog.text
    assert log[2]["model_sha256"] == log[1]["model_sha256"]  # round 3 starts from round 1's model
    assert log[2]["contributors"] == NAMES
    # Each site's update is in 2 of the 3 planned rounds: no collaborator ends as a plain success.
    assert federation.exits == dict.fromkeys(NAMES, EXIT_INCOMPLETE), federation.exits
    assert "its model holds this institution's update in 2 of 3 rounds" in caplog.text
