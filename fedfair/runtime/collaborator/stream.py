"""The collaborator's side of the task stream: what each task makes it do.

:class:`TaskStream` is the part of :class:`~fedfair.runtime.collaborator.client.Collaborator` that carries
out the aggregator's tasks as its :class:`~fedfair.runtime.peer.connection.Connection` hands them
over: start stages as a job beside the stream (on the connection's executor), the secure-aggregation steps
of :mod:`fedfair.runtime.collaborator.steps` in the stream's own thread, and what a failed task costs. The
connection (dial, back-off, watchdog, task loop) is composed, not inherited: :meth:`run` and :meth:`stop`
are its. What a task computes (the plan, the round job, the bytes sent) is the collaborator's, reached
through the methods below that it implements. Its public methods (``start_round``, ``train``, ``evaluate``,
``step``, ``submit``) are a participant's seams, which tests and attacks override or wrap.
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc

from fedfair.core.errors import (
    ConfigError,
    PermanentFailureError,
    ProtocolError,
    Refusal,
    RefusedError,
    VerificationError,
    WireError,
)
from fedfair.runtime.collaborator.config import CollaboratorConfig
from fedfair.runtime.collaborator.kinds.bounded_settlement import drop_settlement
from fedfair.runtime.peer.connection import Connection
from fedfair.runtime.peer.retries import RETRYABLE
from fedfair.runtime.collaborator.stage_steps import round_steps
from fedfair.runtime.collaborator.steps import Participant, StageInput, StartJob, Work
from fedfair.runtime.contract import EVALUATION, Aggregations, Stages, training_stages
from fedfair.runtime.failures import AGGREGATE_REFUSED
from fedfair.runtime.faults import maybe_die
from fedfair.runtime.plan.aggregator_plan import SharedSettings
from fedfair.runtime.transport import EVALUATE, TRAIN, Pieces, WireStage, pb, pb_grpc

logger = logging.getLogger("fedfair.collaborator")


class TaskStream:
    """Carry out the tasks `connection` hands over; a subclass supplies what each task computes."""

    def __init__(self, connection: Connection[CollaboratorConfig]) -> None:
        """Take part through `connection`, whose follower this object is."""
        self.connection = connection
        self.config = connection.config
        self.backoff = connection.backoff
        self.contributed_rounds: list[int] = []
        self._work: Work | None = None

    # ------------------------------------------------------------ what the collaborator supplies

    @property
    def shared(self) -> SharedSettings:
        """The federation's shared settings (the subclass supplies them once joined)."""
        raise NotImplementedError

    @property
    def participant(self) -> Participant:
        """This collaborator's secure-aggregation identity (the subclass supplies it)."""
        raise NotImplementedError

    @property
    def training(self) -> Stages:
        """A training round's stages under this federation's plan (the bounded sum's where it bounds every input)."""
        return training_stages(self.shared.secure_aggregation)

    @property
    def aggregations(self) -> Aggregations:
        """This federation's aggregations (its training round's kind, its evaluations'), which name its stages."""
        return Aggregations(self.training, EVALUATION)

    def _statistics_round(self, binding: pb.Binding) -> bool:
        raise NotImplementedError

    def _ensure_encoded(self, stub: pb_grpc.FederationStub, task: pb.Task) -> None:
        raise NotImplementedError

    def train(self, stub: pb_grpc.FederationStub, binding: pb.Binding) -> StartJob:
        """A training round's start: download its model now; return the job that trains and encodes.

        A participant's public seam: an override may wrap the job (time it, delay it) or replace the contribution
        the job makes; it is called on the task stream's thread and the job runs beside it (:meth:`start_round`).
        """
        raise NotImplementedError

    def evaluate(self, stub: pb_grpc.FederationStub, binding: pb.Binding) -> StartJob:
        """An evaluation's start: download the model to evaluate; return the job that makes this site's answers.

        The same contract as :meth:`train`.
        """
        raise NotImplementedError

    def _input(self, stub: pb_grpc.FederationStub, task: pb.Task) -> StageInput:
        raise NotImplementedError

    def submit(self, stub: pb_grpc.FederationStub, binding: pb.Binding, payload: bytes | Pieces) -> None:
        """Upload `payload` for the stage `binding` names: every message this participant sends goes through here.

        A participant's public seam for outgoing messages: an override may delay, alter, replace or drop the
        payload (a late or hostile site) and calls ``super().submit`` to send; an empty payload says the site
        withdraws from the stage. A failed upload raises ``grpc.RpcError``, which :meth:`handle` classifies.
        """
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

    # ------------------------------------------------------------ lifecycle: the connection's

    def stop(self) -> None:
        """Ask `run` to return (from another thread)."""
        self.connection.stop()

    def run(self) -> int:
        """Connect and follow the task stream until FINISHED; the process's exit status.

        0 when, by this institution's own record, the final model holds its update in every planned round,
        :data:`~fedfair.runtime.failures.EXIT_INCOMPLETE` otherwise (:mod:`~fedfair.runtime.collaborator.receipt`).
        """
        return self.connection.run()

    # ------------------------------------------------------------ tasks

    def handle(self, stub: pb_grpc.FederationStub, task: pb.Task) -> bool:
        """Carry out one task; False if an RPC of it failed, so it does not count as done."""
        binding = task.binding
        at = WireStage.of(binding)
        if task.action == pb.ACTION_ABORTED:
            if self._work is None or self._work.round == binding.round:
                if self._work is not None:
                    logger.info("%s: round %d was aborted by the aggregator", self.config.name, binding.round)
                self._end_round()
            if at == self.training.last(self.shared.secure_aggregation.enabled):
                self._note_round(binding.round, held=False)
            return True
        try:
            if at == TRAIN:
                self._ensure_encoded(stub, task)
                self.start_round(stub, binding, self.training)
            elif at == EVALUATE:
                if not self._statistics_round(binding):
                    self._ensure_encoded(stub, task)
                self.start_round(stub, binding, EVALUATION)
            elif self.aggregations.spec(at) is not None:
                self.step(stub, task)
        except grpc.RpcError as error:
            if self.connection.watchdog.expired is not None:  # the watchdog closed the channel under this task
                raise self.connection.watchdog.expired from None
            code = error.code()
            if code == grpc.StatusCode.PERMISSION_DENIED:
                raise self.backoff.classify(error, "taking part") from None
            stage = self.aggregations.name(at)
            if code in RETRYABLE:
                # The aggregator is gone (killed, restarting) or unreachable: its resumed process
                # re-runs this round, or this one continues it, so the round's work is kept.
                self.connection.warn(
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
                    self.connection.warn(
                        "failed stages",
                        "%s: round %d %s: the aggregator refused or failed (%s); skipping the rest of the round",
                        self.config.name,
                        binding.round,
                        stage,
                        code.name,
                    )
                self._end_round()
            return False
        except VerificationError as error:  # a model not made from the sums this site verified (the model chain)
            # Its round is a training round's: this one's, or one this site missed and caught up on (.catch_up).
            raise self._refuse_sum(error.round, error) from None
        except RefusedError as error:  # INPUT_BOUND: the input record refuses it (a WITHDRAWN is step's own)
            self.connection.warn(
                "refusals",
                "%s: round %d %s: not contributing: %s",
                self.config.name,
                binding.round,
                self.aggregations.name(at),
                error,
            )
            self._end_round()
            return True
        except WireError as error:
            # A malformed model from the aggregator: sit the round out rather than crash.
            self.connection.warn(
                "malformed messages",
                "%s: round %d %s: the aggregator sent a malformed message (%s); skipping the rest of the round",
                self.config.name,
                binding.round,
                self.aggregations.name(at),
                error,
            )
            self._end_round()
            return False
        return True

    def _end_round(self) -> None:
        """The current round ended for this site (aborted, left, or another begins): forget its work.

        A bounded round's kept settlement goes with it (:func:`.bounded_settlement.drop_settlement`): it alone is this
        site's update, and only the record of the round it was kept for could use it (docs/security.md, "A framed
        site").
        """
        self._work = None
        drop_settlement(self.participant)

    def _taken_up(self, binding: pb.Binding) -> Work | None:
        """The round of a stage task this process did not start, where it may take it up; None where it sits it out.

        A stage its kind declares rejoinable (:attr:`~fedfair.secagg.round.StageSpec.rejoinable`), which the
        aggregator hands a restarted process that contributed before its restart: the round's work holds nothing of
        it, and the kind's step takes up what it kept on disk (the bounded sum's DECIDE: its settlement), or withdraws.
        """
        at = WireStage.of(binding)
        stages = self.aggregations.of(at)
        spec = None if stages is None else stages.specs.get(at)
        if stages is None or spec is None or not spec.rejoinable:
            return None
        logger.info(
            "%s: round %d %s: this process did not start the round; taking it up from what it kept",
            self.config.name,
            binding.round,
            stages.name(at),
        )
        # Its contribution left before the restart: the round has it (released), and the step finds nothing to wait for.
        self._work = Work(binding.round, stages, None, 0.0, released=True)
        return self._work

    def _leave_stage(self, stub: pb_grpc.FederationStub, binding: pb.Binding) -> None:
        """Withdraw from the stage `binding` (an empty upload) as this process stops there, where the stage is rejoinable.

        The aggregator waits at a rejoinable stage for a site whose task stream ended, as a new process of it may
        take the stage up (:attr:`~fedfair.secagg.round.StageSpec.rejoinable`); a site that stops on purpose says so,
        so that the round waits no longer for it. The refusal stands whatever the upload meets.
        """
        spec = self.aggregations.spec(WireStage.of(binding))
        if spec is None or not spec.rejoinable:
            return
        try:
            self.submit(stub, binding, b"")
        except grpc.RpcError as error:
            logger.debug(
                "%s: round %d %s: the withdrawal was not taken (%s)",
                self.config.name,
                binding.round,
                self.aggregations.name(WireStage.of(binding)),
                error.code(),
            )

    def _verifies_after(self, binding: pb.Binding) -> bool:
        """Whether `binding` is the UNMASK stage of an aggregation this site goes on to verify (verified aggregation)."""
        work = self._work
        return (
            work is not None
            and work.round == binding.round
            and work.stages.claim is not None
            and WireStage.of(binding) == work.stages.sum_end
        )

    def start_round(self, stub: pb_grpc.FederationStub, binding: pb.Binding, stages: Stages) -> None:
        """A start stage (TRAIN or EVALUATE): download the round's model now, then compute the contribution as a job.

        A participant's public seam: an override may skip the round (not calling ``super().start_round``: its later
        stages then find no work and withdraw) or act around it; what the job computes is :meth:`train`'s or
        :meth:`evaluate`'s.

        The job trains or evaluates, then encodes; the key stages, which need none of it, run
        while it does: with real training their round trips, agreements and signatures hide behind it.
        The download stays on the task's own path: a failure there is the task's, and it does not
        compete with the key stages for the network and the aggregator.

        Jobs run one at a time, in the order started: a round the aggregator re-runs while this
        process still trains it waits for that training, and then re-sends its outcome. Without
        secure aggregation there are no key stages to run beside the job, so it runs here: handing
        it to another thread would only add two waits for the interpreter lock.
        """
        jobs = self.connection.jobs
        assert jobs is not None  # the connection hands tasks over inside its executor
        self._end_round()  # the last aggregation's contribution goes before this one's model comes
        compute = self.evaluate(stub, binding) if stages is EVALUATION else self.train(stub, binding)

        def job() -> Work:
            with self.connection.watchdog.working():  # the aggregator waits for this collaborator meanwhile
                return compute.run()

        if not self.shared.secure_aggregation.enabled:
            self._work = job()
            self._work.model = compute.model
            return
        self._work = Work(binding.round, stages, None, 0.0, model=compute.model)
        self._work.pending = jobs.submit(job)

    # ------------------------------------------------------------ secure-aggregation stages

    def step(self, stub: pb_grpc.FederationStub, task: pb.Task) -> None:
        """One upload stage of an aggregation: fetch its input, run the stage's step, upload the result (:meth:`submit`).

        A participant's public seam: an override may hold the stage back, skip it or act around
        ``super().step``; to change what is sent, override :meth:`submit` instead. The stages are the upload
        stages of :func:`~fedfair.runtime.collaborator.stage_steps.round_steps` (the masked input alone without secure
        aggregation).
        """
        binding = task.binding
        at = WireStage.of(binding)
        work = self._work
        if work is None or work.round != binding.round or at not in work.stages.uploads:
            work = self._taken_up(binding)
        if work is None:
            # A task for a round this process did not start (it restarted mid-round): sit it out. A settlement kept
            # before the restart is of no use once the federation is at another round.
            drop_settlement(self.participant, keeping=binding.round)
            self.submit(stub, binding, b"")
            return
        if work.withdrawn:
            return
        try:
            # Only masking needs the contribution; a job already over is taken at any stage, so a
            # round with nothing to contribute is left as soon as that is known.
            work.settle(wait=at == work.stages.masked)
            if work.vector is None and not work.released and work.pending is None:
                raise RefusedError(Refusal.WITHDRAWN, "nothing to contribute this round")
            inputs = self._input(stub, task)
            with self.connection.watchdog.working():  # proving, checking: the aggregator waits for this site
                payload = round_steps(work.stages)[at](self.participant, work, inputs)
        except VerificationError as error:
            # Not a withdrawal: the aggregator showed a sum that is not the survivors' (or would not let it be
            # checked). No model made from it is applied, and no bundle kept after it: the site stops here.
            self._leave_stage(stub, binding)
            raise self._refuse_sum(binding.round, error) from None
        except (RefusedError, ProtocolError, ConfigError, WireError) as error:
            if isinstance(error, RefusedError) and error.reason is not Refusal.WITHDRAWN:
                raise
            self.connection.warn_withdrawal(self.config.name, binding, error)
            work.withdrawn = True
            self.submit(stub, binding, b"")
            return
        maybe_die("before-upload", binding.round, work.stages.name(at))
        self.submit(stub, binding, payload)
        if work.stop is not None:  # an upload that was this site's last word: a framed site's dispute
            raise self._refuse_sum(binding.round, work.stop)
        maybe_die("after-upload", binding.round, work.stages.name(at))
        # A round re-run after an aggregator crash is sent again, but it is one round contributed to.
        training = self.training
        if at == training.masked and binding.round not in self.contributed_rounds[-1:]:
            self.contributed_rounds.append(binding.round)
        # The sum holds this update once it is uploaded (plain) or once the round names it: this site signed a
        # survivor set (a masked input the aggregator drops leaves the site out of that stage), or accepted a verdict
        # record that puts it in the bounded sum.
        if at == (training.committed if self.shared.secure_aggregation.enabled else training.masked):
            self._note_round(binding.round, held=True)
