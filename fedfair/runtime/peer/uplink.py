"""What a party (a collaborator, the auditor) sends and fetches over a connection, and the bytes it sends per round.

Every request that leaves the institution is counted in :attr:`Uplink.uploaded_bytes`, per
round: the task stream and the start stage's job both send, so the count is locked.
How much it reads is this institution's to bound, not the aggregator's: each stage's input is
capped by :func:`input_limit`, from the pinned plan alone, and a larger announcement is refused
before a byte is buffered (the model download is bounded by the model's size the same way).
Status reports (:class:`StatusReports`) go through here too: a report that fails never
stops training.
"""

from __future__ import annotations

import logging
import mmap
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np

from fedfair.core.errors import WireError
from fedfair.runtime.contract import EVALUATION, TRAINING, Aggregations
from fedfair.runtime.transport import (
    EVALUATE,
    TRAIN,
    Forwarder,
    Pieces,
    Reassembler,
    Uploader,
    WireStage,
    assemble,
    inline_input,
    pb,
    pb_grpc,
    read_model,
)
from fedfair.secagg.round import roster_input

# Only StatusReports logs here, and only a collaborator reports its status: the auditor's Uplink logs nothing.
logger = logging.getLogger("fedfair.collaborator")

RPC_SECONDS = 60.0
"""Upper bound on one request besides a stage's own deadline (a stalled peer cannot hang us)."""

ENCODER_BYTES = 16 << 20
"""The federation's encoder that a start stage carries under a [schema] (category lists, statistics)."""

BUNDLE_BYTES = 64 << 20
"""The final model bundle beside its tensors (schema, encoder, report data)."""

BUNDLE_BYTES_PER_PARAMETER = 32
"""The bundle's tensors: the averaged and the last model, float64 each, twice over for slack."""


CLAIMS = frozenset(
    (stages.protocol.name, stages.claim) for stages in (TRAINING, EVALUATION) if stages.claim is not None
)
"""The (round kind, stage) pairs whose input is a claimed sum (d + 1 words): read as a view, since bytes would copy it
once more."""

TAG_SETS = frozenset(
    (stages.protocol.name, stages.wire(spec))
    for stages in (TRAINING, EVALUATION)
    for spec in stages.protocol.verify_stages
    if spec.upload is None
)
"""The (round kind, stage) pairs whose input is the tag set, which above RESUMMED_WORDS may carry every survivor's
masked input: read as a view too."""


def input_limit(
    task: pb.Task, aggregations: Aggregations, collaborators: int, parameters: int, evaluation_words: int
) -> int:
    """The most bytes this institution reads for `task`'s input, from its pinned plan.

    The final bundle (a fixed cap plus the model's size), a start stage's encoder (a fixed cap), or a secure stage's
    input as its round's declaration caps it (:attr:`~fedfair.secagg.round.StageSpec.input_bytes`) for the plan's
    roster and the most words one of the aggregation's sums may hold: a training round's 2 (d + 1) values with drift
    correction, padded to a power of two under noise (below 4 (d + 2)), an evaluation's `evaluation_words` (the
    length its plan gives that round's evaluation or statistics sums) and its weight. A stage no declaration names
    takes a fixed part and one per party of the roster. `aggregations` are the federation's, which name its stages.
    """
    if task.action == pb.ACTION_FINISHED:
        return BUNDLE_BYTES + BUNDLE_BYTES_PER_PARAMETER * parameters
    stage = WireStage.of(task.binding)
    if stage in (TRAIN, EVALUATE):
        return ENCODER_BYTES
    stages, spec = aggregations.of(stage), aggregations.spec(stage)
    if stages is None or spec is None:
        return roster_input(collaborators, 0)
    words = evaluation_words + 2 if stages.start == EVALUATE else 4 * (parameters + 2)
    return spec.input_bytes(collaborators, words)


def federation_stub(channel: grpc.Channel) -> pb_grpc.FederationStub:
    """The Federation service's stub over `channel`."""
    return pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]  # protoc's code is untyped


class Uplink:
    """Fetches, downloads and uploads of one collaborator, each request's bytes counted per round."""

    def __init__(self) -> None:
        self.uploaded_bytes: dict[int, int] = {}
        """Bytes of every request sent, per round (what leaves the institution)."""
        self._count_lock = threading.Lock()
        self._uploader: Uploader | None = None
        """Uploads over the current connection (it remembers whether that aggregator has Send)."""

    def count(self, round_number: int, size: int) -> None:
        """Add `size` bytes sent to `round_number`'s count."""
        with self._count_lock:  # the task stream and the start stage's job both send
            self.uploaded_bytes[round_number] = self.uploaded_bytes.get(round_number, 0) + size

    def input(self, stub: pb_grpc.FederationStub, task: pb.Task, limit: int) -> bytes:
        """The input of `task`'s stage.

        The one the task carries, or else fetched, at most `limit` bytes (:func:`input_limit`); a WireError,
        before anything is fetched, for an announcement past it.
        """
        return bytes(self.input_view(stub, task, limit))

    def input_view(self, stub: pb_grpc.FederationStub, task: pb.Task, limit: int) -> memoryview:
        """The input of `task`'s stage as :meth:`input` reads it, left in the buffer it arrived in: a read-only view.

        For the claimed sum of verified aggregation (d + 1 words), which bytes would copy once more as it arrives.
        """
        carried = inline_input(task)
        if carried is not None:
            return memoryview(carried)
        # Anything longer than announced is refused before it is buffered.
        assembler = Reassembler(task.input_size)
        assemble(self._fetch(stub, task, limit), assembler, task.binding)
        return memoryview(assembler.take()).toreadonly()

    def input_in_file(self, stub: pb_grpc.FederationStub, task: pb.Task, limit: int, folder: Path | None) -> memoryview:
        """The input of `task`'s stage as :meth:`input_view` reads it, kept in an unlinked file and mapped read-only.

        The file is in `folder` (None: the system's temporary folder). For a tag set that carries every survivor's masked input (above RESUMMED_WORDS, a round with a missing tag):
        the page cache holds its words while memory allows, not the process.
        """
        carried = inline_input(task)
        if carried is not None:
            return memoryview(carried)
        with tempfile.TemporaryFile(prefix="fedfair-", suffix=".input", dir=folder) as file:
            self.input_into(stub, task, limit, file.write)
            file.flush()
            if not file.tell():
                return memoryview(b"")
            # The mapping outlives the file object: it holds its own reference to the file.
            return memoryview(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ))

    def input_into(
        self, stub: pb_grpc.FederationStub, task: pb.Task, limit: int, sink: Callable[[bytes], object]
    ) -> None:
        """The input of `task`'s stage, as :meth:`input` reads it, handed to `sink` a piece at a time as it arrives.

        For the final model bundle, which goes straight to a file: it is never held whole.
        """
        carried = inline_input(task)
        if carried is not None:
            sink(carried)
            return
        forwarder = Forwarder(task.input_size, sink)
        assemble(self._fetch(stub, task, limit), forwarder, task.binding)

    def _fetch(self, stub: pb_grpc.FederationStub, task: pb.Task, limit: int) -> Iterator[pb.Part]:
        """The Fetch stream of `task`'s input; a WireError, before anything is fetched, past `limit` bytes."""
        if task.input_size > limit:
            raise WireError(
                f"the aggregator announces {task.input_size} bytes for the {WireStage.of(task.binding)} "
                f"input, above the {limit} this institution's pinned plan allows; nothing of it was read"
            )
        request = pb.FetchRequest(binding=task.binding)
        self.count(task.binding.round, request.ByteSize())
        parts: Iterator[pb.Part] = stub.Fetch(request, timeout=RPC_SECONDS)
        return parts

    def submit(self, stub: pb_grpc.FederationStub, binding: pb.Binding, payload: bytes | Pieces) -> None:
        """Upload this stage's payload, whole or in pieces (see :class:`Uploader`), counting the bytes sent."""

        def count(part: pb.Part) -> None:
            self.count(binding.round, part.ByteSize())

        if self._uploader is None or self._uploader.stub is not stub:
            self._uploader = Uploader(stub)  # a new connection: its aggregator may have Send
        self._uploader.upload(binding, payload, timeout=RPC_SECONDS, on_part=count)

    def download(self, stub: pb_grpc.FederationStub, binding: pb.Binding, max_values: int) -> tuple[np.ndarray, float]:
        """(values, c) of the stage's model; values is theta, at most `max_values` long."""
        parts = stub.DownloadModel(pb.FetchRequest(binding=binding), timeout=RPC_SECONDS)
        self.count(binding.round, pb.FetchRequest(binding=binding).ByteSize())
        return read_model(parts, binding, max_values=max_values)


class StatusReports:
    """Reports of this collaborator's status to the aggregator (the Report RPC, never free text)."""

    def __init__(self, name: str, uplink: Uplink) -> None:
        self.name = name
        self.uplink = uplink

    def send(
        self,
        stub: pb_grpc.FederationStub,
        binding: pb.Binding,
        status: pb.CollaboratorStatus,
        epsilon: float | None = None,
    ) -> None:
        """Tell the aggregator a status of this collaborator; a report that fails never stops training."""
        report = pb.StatusReport(binding=binding, status=status, epsilon=epsilon)
        try:
            stub.Report(report, timeout=RPC_SECONDS)
            self.uplink.count(binding.round, report.ByteSize())
        except grpc.RpcError as error:
            logger.warning(
                "%s: round %d: could not report %s to the aggregator (%s)",
                self.name,
                binding.round,
                pb.CollaboratorStatus.Name(status),
                error.code().name,
            )
