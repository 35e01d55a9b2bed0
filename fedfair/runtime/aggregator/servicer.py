"""The aggregator's gRPC service: it only moves bytes between collaborators and the board.

The :class:`Servicer` takes the caller's name from its certificate
(:class:`~fedfair.runtime.transport.PeerAuthenticator`), admits uploads through the
:class:`~fedfair.runtime.transport.StageGate` (one per peer per stage, only the open
stage, before its deadline), hands them to the :class:`~fedfair.runtime.aggregator.board.Board`,
and refuses everything else with the transport's generic messages, never naming anyone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc

from fedfair.core.errors import FedfairError
from fedfair.runtime.aggregator.board import Board
from fedfair.runtime.transport import (
    DEFAULT_CHUNK_BYTES,
    NOT_EXPECTED,
    PeerAuthenticator,
    Rejected,
    StageGate,
    WireError,
    payload_parts,
    pb,
    pb_grpc,
    receive_upload,
)
from fedfair.runtime.transport.chunks import digest

INVALID_UPLOAD = "message refused: not a valid message for this stage"
"""What a peer hears when its upload parses badly or breaks the protocol (never why in detail)."""


class Servicer(pb_grpc.FederationServicer):
    """The Federation service over a Board and a StageGate."""

    def __init__(
        self,
        board: Board,
        gate: StageGate,
        authenticator: PeerAuthenticator,
        settings: bytes,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        self.board = board
        self.gate = gate
        self.authenticator = authenticator
        self.settings = settings
        self.chunk_bytes = chunk_bytes

    def _identify(self, context: grpc.ServicerContext) -> str:
        """The caller's name from its certificate, or the RPC ends with a generic refusal."""
        try:
            return self.authenticator.identify(context)
        except Rejected as rejected:
            rejected.abort(context)

    @staticmethod
    def _check(context: grpc.ServicerContext, check: Callable[[pb.Binding], None], binding: pb.Binding) -> None:
        """Pass the request through one of the gate's checks, or end the RPC with its generic refusal."""
        try:
            check(binding)
        except Rejected as rejected:
            rejected.abort(context)

    def GetPlan(self, request: pb.PlanRequest, context: grpc.ServicerContext) -> pb.PlanReply:
        self._identify(context)
        # A collaborator may join without knowing the id yet (it learns it here) or name the one it expects.
        if request.binding.federation_id or request.binding.stage != pb.STAGE_JOIN:
            self._check(context, self.gate.check_federation, request.binding)
        return pb.PlanReply(binding=request.binding, settings=self.settings, plan_digest=self.board.plan_digest)

    def WaitForTasks(self, request: pb.TaskRequest, context: grpc.ServicerContext) -> Iterator[pb.Task]:
        peer = self._identify(context)
        self._check(context, self.gate.check_federation, request.after)
        self.board.connect(peer)
        # Runs when the RPC ends for any reason, a killed peer's closed connection included.
        if not context.add_callback(lambda: self.board.disconnect(peer)):
            self.board.disconnect(peer)
            return
        yield from self.board.stream_tasks(peer, request.after, context.is_active)

    def DownloadModel(self, request: pb.FetchRequest, context: grpc.ServicerContext) -> Iterator[pb.ModelPart]:
        self._identify(context)
        self._check(context, self.gate.check_read, request.binding)
        parts = self.board.model(request.binding)
        if parts is None:
            Rejected(grpc.StatusCode.FAILED_PRECONDITION, NOT_EXPECTED).abort(context)
        yield from parts

    def Fetch(self, request: pb.FetchRequest, context: grpc.ServicerContext) -> Iterator[pb.Part]:
        peer = self._identify(context)
        self._check(context, self.gate.check_read, request.binding)
        payload = self.board.fetch(peer, request.binding)
        if payload is None:
            Rejected(grpc.StatusCode.FAILED_PRECONDITION, NOT_EXPECTED).abort(context)
        yield from payload_parts(request.binding, payload, self.chunk_bytes)

    def Submit(self, request_iterator: Iterator[pb.Part], context: grpc.ServicerContext) -> pb.Receipt:
        peer = self._identify(context)
        try:
            binding, payload = receive_upload(
                request_iterator,
                self.gate,
                peer,
                max_total_bytes=self.board.max_upload_bytes(),
                max_chunk_bytes=self.chunk_bytes,
            )
        except Rejected as rejected:
            rejected.abort(context)
        except WireError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        try:
            self.board.deliver(peer, binding, payload)
        except Rejected as rejected:
            self.gate.release(binding, peer)
            rejected.abort(context)
        except FedfairError:
            # A refused message frees the slot, so the genuine sender (or a fixed retry) still can.
            self.gate.release(binding, peer)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, INVALID_UPLOAD)
        return pb.Receipt(binding=binding, received_size=len(payload), sha256=digest(payload))
