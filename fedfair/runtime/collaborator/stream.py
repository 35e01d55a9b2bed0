"""The connection and the task stream: dial the aggregator, follow its tasks, retry after an outage.

:class:`TaskStream` is the part of :class:`~fedfair.runtime.collaborator.client.Collaborator`
that talks to the aggregator's task stream: a new mutual-TLS channel per connection,
the back-off of :mod:`fedfair.runtime.collaborator.retries` between connections, each
task carried out (start stages as a job beside the stream, the secure-aggregation steps
of :mod:`fedfair.runtime.collaborator.steps` in the stream's own thread), and what a
failed task costs. What a task computes (the plan, the round job, the bytes sent) is the
collaborator's, reached through the methods below that it implements.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from fedfair.core.errors import (
    ConfigError,
    FailureError,
    PermanentFailureError,
    ProtocolError,
    Refusal,
    RefusedError,
    VerificationError,
    WireError,
)
from fedfair.runtime.collaborator.config import CollaboratorConfig
from fedfair.runtime.collaborator.retries import RETRYABLE, Backoff
from fedfair.runtime.collaborator.steps import STEPS, Participant, StageInput, StartJob, Work
from fedfair.runtime.collaborator.watchdog import Watchdog
from fedfair.runtime.collaborator.uplink import RPC_SECONDS, federation_stub
from fedfair.runtime.contract import EVALUATION, STREAM_ACCEPTED, TRAINING, Stages
from fedfair.runtime.failures import AGGREGATE_REFUSED, CONNECTION_LOST
from fedfair.runtime.faults import maybe_die
from fedfair.runtime.plan.aggregator_plan import SharedSettings
from fedfair.runtime.rate_limits import LineBudget, RateLimit
from fedfair.runtime.transport import Pieces, make_binding, pb, pb_grpc, secure_channel

logger = logging.getLogger("fedfair.collaborator")

LINE_BURST = 10
"""Lines of one kind (refusals, malformed messages, failed stages, withdrawals) written at once."""

LINE_SECONDS = 60.0
"""Then one line of that kind per this many seconds; the rest are counted on the next line, or on one line when
the task stream ends: 20,000 tasks refused within a minute add 11 lines, not 20,000."""


class TaskStream:
    """Follow the aggregator's task stream to FINISHED; a subclass supplies what each task computes."""

    def __init__(self, config: CollaboratorConfig, backoff: Backoff, stop: threading.Event) -> None:
        self.config = config
        self.files = config.certificates
        self.backoff = backoff
        self._stop = stop
        self._stream: Any = None
        self._jobs: ThreadPoolExecutor | None = None
        """Runs each round's start-stage job (see :meth:`_start`) beside the current connection's task stream."""
        self.contributed_rounds: list[int] = []
        self._work: Work | None = None
        self._channel: grpc.Channel | None = None
        self._watchdog = Watchdog(config.name, config.aggregator, config.idle_timeout_seconds, self._silenced)
        self._lines = LineBudget(RateLimit(per_second=1.0 / LINE_SECONDS, burst=LINE_BURST))
        """The budget of the lines an aggregator's tasks make this process write (:meth:`_warn`)."""
        self._announced = False
        """Whether :meth:`_say_joined` ran: once, when the aggregator first took this process's task stream."""

    # ------------------------------------------------------------ what the collaborator supplies

    @property
    def shared(self) -> SharedSettings:
        """The federation's shared settings (the subclass supplies them once joined)."""
        raise NotImplementedError

    @property
    def plan_digest(self) -> str:
        """The digest of the plan this collaborator joined under (the subclass supplies it)."""
        raise NotImplementedError

    @property
    def participant(self) -> Participant:
        """This collaborator's secure-aggregation identity (the subclass supplies it)."""
        raise NotImplementedError

    def _setup(self, stub: pb_grpc.FederationStub) -> None:
        raise NotImplementedError

    def _plan_change(self, reply: pb.PlanReply) -> FailureError | None:
        raise NotImplementedError

    def _say_joined(self) -> None:
        raise NotImplementedError

    def _statistics_round(self, binding: pb.Binding) -> bool:
        raise NotImplementedError

    def _ensure_encoded(self, stub: pb_grpc.FederationStub, task: pb.Task) -> None:
        raise NotImplementedError

    def _train(self, stub: pb_grpc.FederationStub, binding: pb.Binding) -> StartJob:
        raise NotImplementedError

    def _evaluate(self, stub: pb_grpc.FederationStub, binding: pb.Binding) -> StartJob:
        raise NotImplementedError

    def _input(self, stub: pb_grpc.FederationStub, task: pb.Task) -> StageInput:
        raise NotImplementedError

    def _submit(self, stub: pb_grpc.FederationStub, binding: pb.Binding, payload: bytes | Pieces) -> None:
        raise NotImplementedError

    def _finish(self, stub: pb_grpc.FederationStub, task: pb.Task) -> int:
        raise NotImplementedError

    def _note_round(self, round_number: int, *, held: bool) -> None:
        raise NotImplementedError

    def _note_refusal(self, round_number: int, reason: str, detail: str) -> Path:
        """Keep the refused training round and its reason in the outcome record; return the record's path."""
        raise NotImplementedError

    def _refuse_sum(self, round_number: int, error: VerificationError) -> PermanentFailureError:
        """The failure that stops this process once it refused training round `round_number`'s sum.

        The refusal is kept in the outcome record first (the error's own round is the secure-aggregation session's).
        """
        detail = str(error).split("; ", 1)[-1]
        path = self._note_refusal(round_number, error.reason.name, detail)
        logger.error("%s: round %d: %s", self.config.name, round_number, error.reason.value)
        return PermanentFailureError(
            AGGREGATE_REFUSED, round=round_number, reason=error.reason.name, detail=detail, path=path
        )

    # ------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask `run` to return (from another thread)."""
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()

    def run(self) -> int:
        """Connect and follow the task stream until FINISHED; the process's exit status.

        0 when, by this institution's own record, the final model holds its update in every planned round,
        :data:`~fedfair.runtime.failures.EXIT_INCOMPLETE` otherwise (:mod:`~fedfair.runtime.collaborator.receipt`).
        """
        self._say_connecting()
        with self._dial() as channel:
            self._setup(federation_stub(channel))
        return self._follow()

    def _say_connecting(self) -> None:
        """The run's first console line: the address it dials, how long it waits for an answer, how to stop.

        Said before the first dial: a dial to a host that drops packets, or a port nobody serves, may take
        minutes to reach its one-line error ([retry] start_wait_seconds), and meanwhile the operator sees
        what the process waits for and that Ctrl-C ends the wait.
        """
        logger.info(
            "%s: connecting to the aggregator at %s; waiting up to %.0f s for it to answer (Ctrl-C stops)",
            self.config.name,
            self.config.aggregator,
            self.backoff.policy.start_wait_seconds,
        )

    def _await_plan(self) -> None:
        """Once joined, wait until the aggregator serves again the plan this collaborator joined under.

        It checks with :meth:`_plan_change`: one line per attempt, with back-off, for up to [retry] max_wait_seconds
        (the operator may go back to the old plan), then stop with ``plan-changed``. No task stream is
        held meanwhile, so the aggregator does not count this collaborator in a round it would refuse.
        (Before joining, a plan unlike the pinned one is refused at once as ``plan-mismatch``.)
        """
        self.backoff.call("fetching the plan", self._fetch_plan, self._plan_change)

    def _fetch_plan(self) -> pb.PlanReply:
        """The aggregator's plan, over a new channel (a channel to a restarting aggregator reconnects slowly)."""
        with self._dial() as channel:
            binding = make_binding("", 0, pb.STAGE_JOIN)
            reply: pb.PlanReply = federation_stub(channel).GetPlan(pb.PlanRequest(binding=binding), timeout=RPC_SECONDS)
            return reply

    def _dial(self) -> grpc.Channel:
        """A new mutual-TLS channel to the aggregator."""
        return secure_channel(self.config.aggregator, self.files, aggregator_name=self.config.aggregator_name)

    def _silenced(self) -> None:
        """The watchdog's expiry: end every RPC of the current connection now (``_follow`` then stops)."""
        channel = self._channel
        if channel is not None:
            channel.close()

    def _follow(self) -> int:
        """Follow the task stream to FINISHED under the idle watchdog (:mod:`.watchdog`); return the exit status.

        It reconnects after a lost aggregator on this collaborator's back-off policy until an outage outlasts its bound.
        """
        try:
            with self._watchdog.watching():
                return self._follow_watched()
        finally:
            for kind, count in sorted(self._lines.drain().items()):
                logger.warning("%s: %d more %s since the last such line were not logged", self.config.name, count, kind)

    def _follow_watched(self) -> int:
        """:meth:`_follow`'s loop.

        The back-off starts again from its first delay only after a connection that received a task and held for
        at least the delay before it: an aggregator that drops every stream at once (or after one task) is
        dialled ever more slowly, never in a tight loop.
        """
        after = make_binding(self.shared.federation_id, 0, pb.STAGE_JOIN)
        what = "following the task stream"
        attempt, since = 0, time.monotonic()
        while not self._stop.is_set():
            changed, progressed, opened = False, False, time.monotonic()
            # A new channel for every connection: a channel whose server went away reconnects on
            # gRPC's own back-off, which grows past a minute, so it, not this policy, would decide
            # when a restarted aggregator is found, and could outlast the policy's bound.
            # The round jobs of a connection use its channel, so they end (a job that lost the aggregator
            # fails its RPCs, training runs to its end) before the channel closes, and in the order started.
            with self._dial() as channel, ThreadPoolExecutor(1, f"{self.config.name}-round") as self._jobs:
                self._channel = channel
                stub = federation_stub(channel)
                try:
                    self._stream = stub.WaitForTasks(pb.TaskRequest(after=after))
                    self._accepted(self._stream)
                    for task in self._stream:
                        progressed = True
                        stage = pb.Stage.Name(task.binding.stage)
                        self._watchdog.waiting_for(f"round {task.binding.round} {stage}'s input")
                        if task.plan_digest != self.plan_digest:
                            changed = True  # left below, once this connection's round jobs have ended
                            break
                        if task.action == pb.ACTION_FINISHED:
                            return self._finish(stub, task)
                        if self._handle(stub, task):
                            after = task.binding
                            self._watchdog.progress()
                    failure = FailureError(
                        CONNECTION_LOST, address=self.config.aggregator, reason="the task stream ended"
                    )
                except grpc.RpcError as error:
                    if self._stop.is_set():
                        break
                    if self._watchdog.expired is not None:
                        raise self._watchdog.expired from None
                    failure = self.backoff.classify(error, what)
                finally:
                    self._channel = None
            if changed:
                # The operator changed the plan: wait, without a task stream, for it to come back (or stop
                # with plan-changed), then follow the stream again from where this collaborator was.
                self._await_plan()
                attempt, since = 0, time.monotonic()
                continue
            if self._watchdog.expired is not None:
                raise self._watchdog.expired
            held = time.monotonic() - opened >= self.backoff.policy.delay_bound(attempt)
            if progressed or held:
                since = time.monotonic()  # a new outage begins now
            if progressed and held:
                attempt = 0
            self.backoff.retry(attempt, since, failure, what)
            attempt += 1
        return 0

    def _accepted(self, stream: Any) -> None:
        """Say that this process joined, once, when the aggregator first takes its task stream.

        The aggregator sends :data:`STREAM_ACCEPTED` once the stream is this name's only live one; a
        refused stream (a second process of a connected name) ends without it, and iterating it then
        raises the refusal. Taking the stream is progress: the wait for the first task starts there.
        """
        if self._announced or STREAM_ACCEPTED not in (stream.initial_metadata() or ()):
            return
        self._announced = True
        self._say_joined()
        self._watchdog.progress("the first task")

    # ------------------------------------------------------------ tasks

    def _warn(self, kind: str, message: str, *args: object) -> None:
        """Log a WARNING caused by the aggregator's tasks, within the budget of its `kind`.

        LINE_BURST lines of a kind at once, then one per LINE_SECONDS (:class:`LineBudget`): a hostile or broken
        aggregator sends tasks at the speed of its network, and a line each would bury the operator's log. The
        lines skipped are counted on the next one of the kind (and on one line when the task stream ends).
        """
        unlogged = self._lines.admit(kind)
        if unlogged is None:
            return
        note = f" ({unlogged} more {kind} since the last such line were not logged)" if unlogged else ""
        logger.warning(message + "%s", *args, note)

    def _handle(self, stub: pb_grpc.FederationStub, task: pb.Task) -> bool:
        """Carry out one task; False if an RPC of it failed, so it does not count as done."""
        binding = task.binding
        if task.action == pb.ACTION_ABORTED:
            if self._work is not None and self._work.round == binding.round:
                logger.info("%s: round %d was aborted by the aggregator", self.config.name, binding.round)
                self._work = None
            if binding.stage == TRAINING.last(self.shared.secure_aggregation.enabled):
                self._note_round(binding.round, held=False)
            return True
        try:
            if binding.stage == pb.STAGE_TRAIN:
                self._ensure_encoded(stub, task)
                self._start(stub, binding, TRAINING)
            elif binding.stage == pb.STAGE_EVALUATE:
                if not self._statistics_round(binding):
                    self._ensure_encoded(stub, task)
                self._start(stub, binding, EVALUATION)
            elif binding.stage in STEPS:
                self._step(stub, task)
        except grpc.RpcError as error:
            if self._watchdog.expired is not None:  # the watchdog closed the channel under this task
                raise self._watchdog.expired from None
            code = error.code()
            if code == grpc.StatusCode.PERMISSION_DENIED:
                raise self.backoff.classify(error, "taking part") from None
            stage = pb.Stage.Name(binding.stage)
            if code in RETRYABLE:
                # The aggregator is gone (killed, restarting) or unreachable: its resumed process
                # re-runs this round, or this one continues it, so the round's work is kept.
                self._warn(
                    "losses of the aggregator",
                    "%s: round %d %s: lost the aggregator (%s); keeping this round's work",
                    self.config.name,
                    binding.round,
                    stage,
                    code.name,
                )
            else:
                # A closed stage is usual, not a failure: it ends once the protocol has enough answers.
                if code == grpc.StatusCode.FAILED_PRECONDITION and self._verifies_after(binding):
                    # UNMASK closed on enough shares without this site's, but its input is in the sum: it still
                    # tags and checks that sum, and no other survivor can verify it without this site's tag.
                    return False
                if code == grpc.StatusCode.FAILED_PRECONDITION:
                    logger.debug(
                        "%s: round %d %s: the stage had already closed; skipping the rest of the round",
                        self.config.name,
                        binding.round,
                        stage,
                    )
                else:
                    self._warn(
                        "failed stages",
                        "%s: round %d %s: the aggregator refused or failed (%s); skipping the rest of the round",
                        self.config.name,
                        binding.round,
                        stage,
                        code.name,
                    )
                self._work = None
            return False
        except VerificationError as error:  # a model not made from the sums this site verified (the model chain)
            raise self._refuse_sum(binding.round, error) from None
        except RefusedError as error:  # INPUT_BOUND: the input record refuses it (a WITHDRAWN is _step's own)
            self._warn(
                "refusals",
                "%s: round %d %s: not contributing: %s",
                self.config.name,
                binding.round,
                pb.Stage.Name(binding.stage),
                error,
            )
            self._work = None
            return True
        except WireError as error:
            # A malformed model from the aggregator: sit the round out rather than crash.
            self._warn(
                "malformed messages",
                "%s: round %d %s: the aggregator sent a malformed message (%s); skipping the rest of the round",
                self.config.name,
                binding.round,
                pb.Stage.Name(binding.stage),
                error,
            )
            self._work = None
            return False
        return True

    def _verifies_after(self, binding: pb.Binding) -> bool:
        """Whether `binding` is the UNMASK stage of an aggregation this site goes on to verify (verified aggregation)."""
        work = self._work
        return (
            work is not None
            and work.round == binding.round
            and work.stages.claim is not None
            and binding.stage == work.stages.unmask
        )

    def _start(self, stub: pb_grpc.FederationStub, binding: pb.Binding, stages: Stages) -> None:
        """Download the round's model now, then compute the contribution as a job beside the task stream.

        The job trains or evaluates, then encodes; the key stages, which need none of it, run
        while it does: with real training their round trips, agreements and signatures hide behind it.
        The download stays on the task's own path: a failure there is the task's, and it does not
        compete with the key stages for the network and the aggregator.

        Jobs run one at a time, in the order started: a round the aggregator re-runs while this
        process still trains it waits for that training, and then re-sends its outcome. Without
        secure aggregation there are no key stages to run beside the job, so it runs here: handing
        it to another thread would only add two waits for the interpreter lock.
        """
        assert self._jobs is not None  # _follow handles tasks inside a connection's executor
        self._work = None  # the last aggregation's contribution goes before this one's model comes
        compute = self._train(stub, binding) if stages is TRAINING else self._evaluate(stub, binding)

        def job() -> Work:
            with self._watchdog.working():  # the aggregator waits for this collaborator meanwhile
                return compute.run()

        if not self.shared.secure_aggregation.enabled:
            self._work = job()
            self._work.model = compute.model
            return
        self._work = Work(binding.round, stages, None, 0.0, model=compute.model)
        self._work.pending = self._jobs.submit(job)

    # ------------------------------------------------------------ secure-aggregation stages

    def _step(self, stub: pb_grpc.FederationStub, task: pb.Task) -> None:
        """One secure-aggregation stage: fetch its input, run this stage's step, upload the result."""
        binding = task.binding
        work = self._work
        if work is None or work.round != binding.round or binding.stage not in work.stages.uploads:
            # A task for a round this process did not start (it restarted mid-round): sit it out.
            self._submit(stub, binding, b"")
            return
        if work.withdrawn:
            return
        try:
            # Only masking needs the contribution; a job already over is taken at any stage, so a
            # round with nothing to contribute is left as soon as that is known.
            work.settle(wait=binding.stage == work.stages.masked)
            if work.vector is None and not work.released and work.pending is None:
                raise RefusedError(Refusal.WITHDRAWN, "nothing to contribute this round")
            inputs = self._input(stub, task)
            payload = STEPS[binding.stage](self.participant, work, inputs)
        except VerificationError as error:
            # Not a withdrawal: the aggregator showed a sum that is not the survivors' (or would not let it be
            # checked). No model made from it is applied, and no bundle kept after it: the site stops here.
            raise self._refuse_sum(binding.round, error) from None
        except (RefusedError, ProtocolError, ConfigError, WireError) as error:
            if isinstance(error, RefusedError) and error.reason is not Refusal.WITHDRAWN:
                raise
            self._warn(
                "withdrawals",
                "%s: round %d %s: withdrawing from the round: %s",
                self.config.name,
                binding.round,
                pb.Stage.Name(binding.stage),
                error,
            )
            work.withdrawn = True
            self._submit(stub, binding, b"")
            return
        maybe_die("before-upload", binding.round, pb.Stage.Name(binding.stage))
        self._submit(stub, binding, payload)
        maybe_die("after-upload", binding.round, pb.Stage.Name(binding.stage))
        # A round re-run after an aggregator crash is sent again, but it is one round contributed to.
        if binding.stage == TRAINING.masked and binding.round not in self.contributed_rounds[-1:]:
            self.contributed_rounds.append(binding.round)
        # The sum holds this update once it is uploaded (plain) or once this site signed a survivor set, which
        # names it (secure aggregation: a masked input the aggregator drops leaves the site out of that stage).
        if binding.stage == (TRAINING.consistency if self.shared.secure_aggregation.enabled else TRAINING.masked):
            self._note_round(binding.round, held=True)
