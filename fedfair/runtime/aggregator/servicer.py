"""The aggregator's gRPC service: it only moves bytes between collaborators and the board.

The :class:`Servicer` takes the caller's name from its certificate
(:class:`~fedfair.runtime.transport.PeerAuthenticator`), admits uploads through the
:class:`~fedfair.runtime.transport.StageGate` (one per peer per stage, only the open
stage, before its deadline), hands them to the :class:`~fedfair.runtime.aggregator.board.Board`,
and refuses everything else with the transport's generic messages, never naming anyone. Under an input
bound it also admits the plan's auditor, at its own stages only (:mod:`~fedfair.runtime.aggregator.admission`).

Why: docs/design.md, "Inside the aggregator".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any, TypeVar

import grpc

from fedfair.core.errors import Refusal, RefusedError, WireError
from fedfair.runtime.aggregator.admission import Admission
from fedfair.runtime.aggregator.board import Board
from fedfair.runtime.aggregator.requests import Caller, Undecodable, decoded, decoded_parts, tolerant
from fedfair.runtime.aggregator.stages import error_summary
from fedfair.runtime.observe.events import EventLog
from fedfair.runtime.aggregator.identities import LiveStreams
from fedfair.runtime.rate_limits import RateLimit
from fedfair.runtime.aggregator.past_rounds import KEPT_ROUNDS
from fedfair.runtime.aggregator.limits import Hold, PeerLimits, Presence, Quotas, RefusalLog, worker_threads
from fedfair.runtime.contract import STREAM_ACCEPTED, TRAINING, Stages
from fedfair.runtime.transport import (
    DEFAULT_CHUNK_BYTES,
    JOIN,
    MALFORMED_MESSAGE,
    NOT_EXPECTED,
    WIRE_VERSION,
    PeerAuthenticator,
    Pieces,
    StageGate,
    WireStage,
    payload_parts,
    pb,
    pb_grpc,
    receive_upload,
    refusal_details,
)
from fedfair.runtime.transport.stage_gate import STATUS_CODES
from fedfair.runtime.transport.chunks import digest

logger = logging.getLogger("fedfair.aggregator")

SERVICE = "fedfair.v1.Federation"

INVALID_UPLOAD = "message refused: not a valid message for this stage"
"""What a peer hears when its upload breaks the protocol (never why in detail)."""

INTERNAL_ERROR = "the aggregator could not handle this request"
"""What a peer hears when handling its request failed on the aggregator's side (the log says why)."""

TOO_MANY_REPORTS = "refused: too many status reports from this caller; report again later"
"""What a peer hears when it reports its status faster than its :class:`RateLimit` allows."""

TOO_MANY_PAST_FETCHES = (
    "refused: too many fetches of past rounds' inputs from this caller; a site catching up fetches each once, "
    "so fetch again later"
)
"""What a peer hears when it fetches kept inputs of past rounds faster than :attr:`Servicer.past_round_reads` allows."""

STATUS_NAMES: dict[int, str] = {
    pb.COLLABORATOR_STATUS_BUDGET_SPENT: "budget_spent",
    pb.COLLABORATOR_STATUS_PRIVACY_SPENT_REPORT: "privacy_spent_report",
}
"""The statuses a collaborator may report, as the events stream spells them."""

Request = TypeVar("Request")
Reply = TypeVar("Reply")


def _status(error: Exception) -> tuple[grpc.StatusCode, str, int]:
    """The generic status a caller hears for `error`, and the level of its log line."""
    if isinstance(error, RefusedError) and error.reason is Refusal.LATE:
        # Usual at a threshold below the roster: a stage closes once it has enough answers.
        return STATUS_CODES[error.reason], str(error), logging.DEBUG
    if isinstance(error, RefusedError) and error.reason is Refusal.INVALID_UPLOAD:
        return STATUS_CODES[error.reason], INVALID_UPLOAD, logging.WARNING
    if isinstance(error, RefusedError):
        return STATUS_CODES[error.reason], str(error), logging.WARNING
    if isinstance(error, WireError):
        return grpc.StatusCode.INVALID_ARGUMENT, MALFORMED_MESSAGE, logging.WARNING
    return grpc.StatusCode.INTERNAL, INTERNAL_ERROR, logging.ERROR


def _reason(error: Exception) -> str:
    """The log's short reason; for a refused upload, the handler's own error."""
    if isinstance(error, RefusedError) and error.reason is Refusal.LATE:
        return f"late: {error.stage} had already closed (it had enough answers or reached its deadline)"
    cause = error.__cause__
    if isinstance(error, RefusedError) and error.reason is Refusal.INVALID_UPLOAD and cause is not None:
        return error_summary(cause)
    return error_summary(error)


class Servicer(pb_grpc.FederationServicer):
    """The Federation service over a Board and a StageGate.

    Every RPC turns what it refuses into a generic gRPC status and one log line (`_refusals`).
    """

    def __init__(
        self,
        board: Board,
        gate: StageGate,
        authenticator: PeerAuthenticator,
        settings: bytes,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        limits: PeerLimits = PeerLimits(),
        events: EventLog | None = None,
        report_rate: RateLimit | None = None,
        refusal_log: RefusalLog | None = None,
        auditor: PeerAuthenticator | None = None,
        training: Stages = TRAINING,
    ) -> None:
        """Serve the plan's collaborators (`authenticator`) and its auditor (None: none) at `training`'s stages.

        `training` is the plan's training round, whose kind says at which stages the auditor is admitted
        (:class:`~fedfair.runtime.aggregator.admission.Admission`).
        """
        self.board = board
        self.gate = gate
        self.authenticator = authenticator
        self.admission = Admission(authenticator, auditor, training)
        self.settings = settings
        self.chunk_bytes = chunk_bytes
        self.quotas = Quotas(limits)
        self.events = events
        self.report_rate = report_rate or RateLimit()
        self.past_round_reads = RateLimit(per_second=1.0, burst=KEPT_ROUNDS * len(training.specs))
        """Each caller's reads of past rounds' kept inputs (files): at once, every stage of every kept round (what
        a site that missed them all fetches to catch up), then one a second."""
        self.refusal_log = refusal_log or RefusalLog()
        self.presence = Presence(events)
        self.streams = LiveStreams()

    # ------------------------------------------------------------ the one refusal path

    @contextmanager
    def _refusals(self, rpc: str, context: grpc.ServicerContext) -> Iterator[Caller]:
        """Run one request; turn anything it raises into a generic status and one log line.

        What the request holds is released by its own context managers and finally
        clauses before the exception gets here. An RpcError comes from gRPC itself (the
        caller cancelled, or its deadline passed, while we read its request): there is
        no one left to answer, and gRPC knows, so it passes through.
        """
        caller = Caller(context, self.gate.name)
        try:
            yield caller
        except grpc.RpcError:
            logger.debug("%s from %s ended by the caller", rpc, caller.describe())
            raise
        except Exception as error:  # noqa: BLE001 -- every other exception: no traceback, no text to the caller
            code, details, level = _status(error)
            unlogged = self.refusal_log.admit(caller.peer)
            if unlogged is not None:
                reason = _reason(error)
                note = ""
                if unlogged:
                    note = f" ({unlogged} more refusals of this caller since its last line were not logged)"
                logger.log(level, "refused %s from %s: %s: %s%s", rpc, caller.describe(), code.name, reason, note)
                if self.events is not None:
                    self.events.emit(
                        "refusal", rpc=rpc, name=caller.peer, code=code.name, reason=reason, unlogged=unlogged
                    )
            context.abort(code, details)

    def _unary(
        self,
        rpc: str,
        body: Callable[[str, Request, Caller], Reply],
        request: Request | Undecodable,
        context: grpc.ServicerContext,
    ) -> Reply:
        with self._refusals(rpc, context) as caller:
            caller.peer = self.admission.identify(context)
            self.board.heard(caller.peer)
            return body(caller.peer, decoded(request), caller)
        raise AssertionError("unreachable: _refusals aborts the RPC (mypy cannot see that it never swallows)")

    def _streaming(
        self,
        rpc: str,
        body: Callable[[str, Request, Caller], Iterator[Reply]],
        request: Request | Undecodable,
        context: grpc.ServicerContext,
    ) -> Iterator[Reply]:
        with self._refusals(rpc, context) as caller:
            caller.peer = self.admission.identify(context)
            self.board.heard(caller.peer)
            yield from body(caller.peer, decoded(request), caller)

    # ------------------------------------------------------------ the RPCs

    def GetPlan(self, request: pb.PlanRequest | Undecodable, context: grpc.ServicerContext) -> pb.PlanReply:
        """The plan's settings and digest; a joining caller may leave the federation id empty."""
        return self._unary("GetPlan", self._plan, request, context)

    def WaitForTasks(self, request: pb.TaskRequest | Undecodable, context: grpc.ServicerContext) -> Iterator[pb.Task]:
        """The caller's tasks as rounds publish them, until it disconnects or the server stops."""
        return self._streaming("WaitForTasks", self._tasks, request, context)

    def DownloadModel(
        self, request: pb.FetchRequest | Undecodable, context: grpc.ServicerContext
    ) -> Iterator[pb.ModelPart]:
        """The model parts offered at the request's binding; refused (NOT_EXPECTED) when none."""
        return self._streaming("DownloadModel", self.serve_model, request, context)

    def Fetch(self, request: pb.FetchRequest | Undecodable, context: grpc.ServicerContext) -> Iterator[pb.Part]:
        """The caller's input for the open stage or the final bundle, in chunks of `chunk_bytes`."""
        return self._streaming("Fetch", self.serve_input, request, context)

    def Submit(self, request_iterator: Iterator[pb.Part | Undecodable], context: grpc.ServicerContext) -> pb.Receipt:
        """Take one chunked upload for the open stage; the receipt carries its size and SHA-256."""
        return self._unary("Submit", self._submit, request_iterator, context)

    def Send(self, request: pb.Part | Undecodable, context: grpc.ServicerContext) -> pb.Receipt:
        """Take a one-part upload: the same gate, limits and delivery as a Submit of that part."""
        return self._unary("Send", self._send, request, context)

    def Report(self, request: pb.StatusReport | Undecodable, context: grpc.ServicerContext) -> pb.Receipt:
        """Log and record a collaborator's status (privacy spent), rate-limited per caller."""
        return self._unary("Report", self._report, request, context)

    # ------------------------------------------------------------ what the operator sees

    def _arrived(self, peer: str) -> None:
        """Log `peer`'s first task stream with this process, or its return after it left.

        Not its GetPlan: a collaborator that fetched the plan may yet refuse it or be refused, and the line's
        count of collaborators with a task stream would leave it out ("connected (0 of 3 ...)").
        """
        if self.admission.is_auditor(peer):
            logger.info("the auditor %s has a task stream: it verifies the bounded sums' inputs", peer)
            return
        self.presence.arrived(peer, lambda: len(self.board.connected()), len(self.authenticator.allowed_names))

    def _admitted(self, context: grpc.ServicerContext) -> bool:
        """Whether the caller's certificate is still admitted (the manifest in force pins it)."""
        try:
            self.admission.identify(context)
        except RefusedError:
            return False
        return True

    def _departed(self, peer: str) -> None:
        """A task stream of `peer` ended (the RPC's termination callback); log it if it was the last."""
        if self.board.disconnect(peer) and not self.admission.is_auditor(peer):
            self.presence.departed(peer)

    # ------------------------------------------------------------ what each does

    def _plan(self, peer: str, request: pb.PlanRequest, caller: Caller) -> pb.PlanReply:
        # Checked first: a peer of another release may mean other stages by the same numbers, or bind otherwise.
        # The refusal path logs it once, naming the peer; the details name both versions and the fix.
        if request.wire_version != WIRE_VERSION:
            raise RefusedError(Refusal.NOT_EXPECTED, refusal_details(WIRE_VERSION, request.wire_version))
        # A collaborator may join without knowing the id yet (it learns it here) or name the one it expects.
        if request.binding.federation_id or WireStage.of(request.binding) != JOIN:
            self.gate.check_federation(request.binding)
        # A collaborator with no task stream that fetches the plan is starting: a quorum wait covers it.
        self.board.starts.fetched_plan(peer, peer in self.board.connected())
        return pb.PlanReply(
            binding=request.binding,
            settings=self.settings,
            plan_digest=self.board.plan_digest,
            wire_version=WIRE_VERSION,
        )

    def _tasks(self, peer: str, request: pb.TaskRequest, caller: Caller) -> Iterator[pb.Task]:
        context = caller.context
        self.gate.check_federation(request.after)
        with self.quotas.hold(peer, Hold.TASK_STREAM), self.streams.hold(peer, context):
            start = self.board.connect(peer, request.after)
            self._arrived(peer)
            # Runs when the RPC ends for any reason (a cancelled call, a killed peer's closed
            # connection): the board notices the departure and the waiting stream wakes at once.
            if not context.add_callback(lambda: self._departed(peer)):
                self._departed(peer)
                return
            # Said now, not with the first task (which may be minutes away): the stream is taken.
            context.send_initial_metadata((STREAM_ACCEPTED,))
            # A stream ends once a roster update revokes the certificate it was opened with.
            yield from self.board.stream_tasks(peer, start, lambda: context.is_active() and self._admitted(context))
        # Ended by that update, the stream says why (PERMISSION_DENIED naming the revocation) instead of ending
        # cleanly: the holder learns it was revoked even if the federation finishes before it would call again.
        if context.is_active():
            self.admission.identify(context)

    def serve_model(self, peer: str, request: pb.FetchRequest, caller: Caller) -> Iterator[pb.ModelPart]:
        """DownloadModel's body for an identified `peer`: the model parts offered at the request's binding.

        A public seam: an override (an aggregator that sends one site another model, or serves downloads of its
        own) yields the parts `peer` receives; refusals raise, as here, and become the RPC's status.
        """
        self.admission.check_collaborator(peer, "downloads no model")
        self.gate.check_read(request.binding)
        parts = self.board.offers.model(request.binding)
        if parts is None:
            raise RefusedError(Refusal.NOT_EXPECTED, NOT_EXPECTED)
        with self.quotas.hold(peer, Hold.DOWNLOAD):
            yield from parts

    def serve_input(self, peer: str, request: pb.FetchRequest, caller: Caller) -> Iterator[pb.Part]:
        """Fetch's body for an identified `peer`: its input for the open stage, or the final bundle, in chunks.

        A public seam, with :meth:`serve_model`'s contract: an override yields the parts `peer` receives.
        """
        self.admission.check_stage(peer, WireStage.of(request.binding))
        # The caller's limits first: a flood of fetches is refused before the aggregator reads anything for it.
        with self.quotas.hold(peer, Hold.DOWNLOAD):
            binding = request.binding
            # The final bundle is bound to the FINISHED task itself, which the gate knows nothing of.
            payload: bytes | Pieces | None = self.board.final_input(binding)
            if payload is None and self.board.past_rounds.keeps(binding):
                # An applied round's input, kept for a site that missed that round (.past_rounds): a file, read at
                # the caller's rate. Its stages are closed, so only the federation is checked.
                self.gate.check_federation(binding)
                if not self.past_round_reads.allow(peer):
                    raise RefusedError(Refusal.OVER_LIMIT, TOO_MANY_PAST_FETCHES)
                payload = self.board.past_rounds.input(binding)
            if payload is None:
                self.gate.check_read(binding)
                payload = self.board.fetch(peer, binding)
            if payload is None:
                raise RefusedError(Refusal.NOT_EXPECTED, NOT_EXPECTED)
            yield from payload_parts(binding, payload, self.chunk_bytes)

    def _submit(self, peer: str, parts: Iterator[pb.Part | Undecodable], caller: Caller) -> pb.Receipt:
        with self.quotas.hold(peer, Hold.UPLOAD), self.board.uploading(peer):
            # receive_upload frees the gate slot itself if reading fails.
            binding, payload = receive_upload(
                self._own_stages(peer, decoded_parts(parts)),
                self.gate,
                peer,
                max_total_bytes=self.board.max_upload_bytes(),
                max_chunk_bytes=self.chunk_bytes,
            )
            caller.binding = binding
            try:
                self.board.deliver(peer, binding, payload)
            except BaseException:
                # A refused message frees the slot, so a corrected retry still can.
                self.gate.release(binding, peer)
                raise
        return pb.Receipt(binding=binding, received_size=len(payload), sha256=digest(payload))

    def _own_stages(self, peer: str, parts: Iterator[pb.Part]) -> Iterator[pb.Part]:
        """`parts`, each refused unless its stage is `peer`'s own (:meth:`Admission.check_stage`)."""
        for part in parts:
            self.admission.check_stage(peer, WireStage.of(part.binding))
            yield part

    def _send(self, peer: str, part: pb.Part, caller: Caller) -> pb.Receipt:
        # One part is a whole upload: the same gate, limits and delivery as a Submit stream of it.
        return self._submit(peer, iter([part]), caller)

    def _report(self, peer: str, request: pb.StatusReport, caller: Caller) -> pb.Receipt:
        """Log and record a collaborator's status; it never touches a stage, a gate slot or a task.

        The binding must be this federation's and name a round that has started (the round
        the status is about; 0 before the first); its stage is not looked at.
        """
        self.admission.check_collaborator(peer, "reports no status")
        if not self.report_rate.allow(peer):
            raise RefusedError(Refusal.OVER_LIMIT, TOO_MANY_REPORTS)
        binding = request.binding
        self.gate.check_federation(binding)
        round_number = self.board.round
        if binding.round > round_number:
            raise RefusedError(Refusal.NOT_EXPECTED, NOT_EXPECTED)
        caller.binding = binding
        status = STATUS_NAMES.get(request.status)
        if status is None:
            raise WireError(f"status {request.status} is not a known collaborator status")
        epsilon = request.epsilon if request.HasField("epsilon") else None
        if epsilon is not None and not (math.isfinite(epsilon) and epsilon >= 0.0):
            raise WireError(f"a reported epsilon must be a finite number >= 0, got {epsilon!r}")
        spent = "" if epsilon is None else f" (epsilon spent {epsilon:.4g})"
        if request.status == pb.COLLABORATOR_STATUS_BUDGET_SPENT:
            logger.warning("round %d: %s declines to train: its privacy budget is spent%s", binding.round, peer, spent)
        else:
            logger.info("round %d: %s reports its privacy spending%s", binding.round, peer, spent or " (no epsilon)")
        if epsilon is not None:
            self.board.record_epsilon(peer, epsilon)
        if self.events is not None:
            self.events.emit("status", round=binding.round, name=peer, status=status, epsilon=epsilon)
        return pb.Receipt(binding=binding)


def add_to_server(servicer: Servicer, server: grpc.Server) -> None:
    """Register the Federation service on `server`, like protoc's ``add_FederationServicer_to_server``.

    Its request parsers never raise: a malformed message reaches the servicer's refusal path
    as :class:`Undecodable`, not gRPC's traceback.
    """
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "GetPlan": grpc.unary_unary_rpc_method_handler(
            servicer.GetPlan, tolerant(pb.PlanRequest.FromString), pb.PlanReply.SerializeToString
        ),
        "WaitForTasks": grpc.unary_stream_rpc_method_handler(
            servicer.WaitForTasks, tolerant(pb.TaskRequest.FromString), pb.Task.SerializeToString
        ),
        "DownloadModel": grpc.unary_stream_rpc_method_handler(
            servicer.DownloadModel, tolerant(pb.FetchRequest.FromString), pb.ModelPart.SerializeToString
        ),
        "Fetch": grpc.unary_stream_rpc_method_handler(
            servicer.Fetch, tolerant(pb.FetchRequest.FromString), pb.Part.SerializeToString
        ),
        "Submit": grpc.stream_unary_rpc_method_handler(
            servicer.Submit, tolerant(pb.Part.FromString), pb.Receipt.SerializeToString
        ),
        "Send": grpc.unary_unary_rpc_method_handler(
            servicer.Send, tolerant(pb.Part.FromString), pb.Receipt.SerializeToString
        ),
        "Report": grpc.unary_unary_rpc_method_handler(
            servicer.Report, tolerant(pb.StatusReport.FromString), pb.Receipt.SerializeToString
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


def federation_server(
    servicer: Servicer, collaborators: int, options: list[tuple[str, Any]] | None = None
) -> grpc.Server:
    """A gRPC server (not yet bound or started) serving `servicer`, its pool sized by :func:`worker_threads`."""
    pool = futures.ThreadPoolExecutor(
        max_workers=worker_threads(collaborators, servicer.quotas.limits), thread_name_prefix="fedfair-rpc"
    )
    server = grpc.server(pool, options=options)
    add_to_server(servicer, server)
    return server
