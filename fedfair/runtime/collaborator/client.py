"""The collaborator process: connect to the aggregator and follow its task stream.

One per institution (started by ``fedfair collaborator start``, see
:mod:`fedfair.cli.collaborator`). Before it dials anyone it checks what
is local: its TLS files (and that its configured name is the one its certificate
carries), its manifest pin, and its data, so a wrong path fails at once with the
aggregator up or down. Then it dials the aggregator over mutual TLS, fetches the plan's shared settings and builds its
learner exactly as the in-process simulation builds client i (same model seed, same
sampler seed), so a federation over real processes follows the simulation step for
step. Then it follows the aggregator's task stream:

Why: docs/design.md, "Inside the collaborator".
"""

from __future__ import annotations

import functools
import logging
import threading
from pathlib import Path

import numpy as np
import torch

from fedfair.core.device import device_for
from fedfair.core.errors import ConfigError, FailureError, PermanentFailureError, WireError
from fedfair.core.local import LocalLearner, RoundTrainer
from fedfair.datasets.encoder import Encoder as TableEncoder
from fedfair.runtime.collaborator import answers
from fedfair.runtime.collaborator.charges import Charges, open_ledger, open_record
from fedfair.runtime.collaborator.config import CollaboratorConfig
from fedfair.runtime.peer.connection import Connection, plan_change
from fedfair.runtime.collaborator.identity import check_identity
from fedfair.runtime.collaborator.kinds.bounded_settlement import settlement_file
from fedfair.runtime.collaborator.preparation import (
    Joined,
    Prepared,
    as_participant,
    encode_table,
    join,
    prepare,
    say_joined,
)
from fedfair.runtime.collaborator.receipt import (
    BUNDLE_SUFFIX,
    Expectation,
    Received,
    finished_status,
    federation_file,
    receive_bundle,
)
from fedfair.runtime.peer.retries import Backoff, RetryPolicy, Target
from fedfair.runtime.collaborator.rounds import RoundJob, stored, resent
from fedfair.runtime.collaborator.updates import TrainedUpdate, clip_plain_update, control_beyond_clip
from fedfair.runtime.collaborator.kernels import load_kernels
from fedfair.runtime.collaborator.steps import Participant, StageInput, StartJob, Work
from fedfair.runtime.collaborator.stream import TaskStream
from fedfair.runtime.collaborator.trainer import (
    check_pinned_table,
    LocalData,
    LocalTable,
    TrainerFactory,
    load_local_data,
    read_local_data,
    round_trainer,
)
from fedfair.runtime.peer.uplink import CLAIMS, RPC_SECONDS, TAG_SETS, StatusReports, Uplink, input_limit
from fedfair.runtime.contract import EVALUATION, model_digest
from fedfair.runtime.failures import BUNDLE_REFUSED, LOCAL_PRIVACY, MODEL_UNCHECKED
from fedfair.runtime.manifest_update import LiveManifest
from fedfair.runtime.memory import release_freed, share_arenas
from fedfair.runtime.plan.aggregator_plan import SharedSettings
from fedfair.runtime.plan.model import ModelSettings
from fedfair.runtime.preprocessing import STATISTICS_KIND, STATISTICS_ROUND, statistics_encoding
from fedfair.runtime.state_files import large
from fedfair.secagg import Encoder
from fedfair.runtime.transport import EVALUATE, TRAIN, Pieces, WireStage, pb, pb_grpc

__all__ = [
    "BUNDLE_SUFFIX",
    "RPC_SECONDS",
    "Collaborator",
    "TrainedUpdate",
    "clip_plain_update",
    "control_beyond_clip",
    "model_digest",
]

logger = logging.getLogger("fedfair.collaborator")


class Collaborator(TaskStream):
    """One institution's process: connect, follow tasks, train, mask, submit.

    Its parts come in as the federation is learnt: the checked plan (:class:`Joined`) once
    :meth:`setup` fetched it, the round job (:class:`RoundJob`) once :meth:`prepare` built
    the trainer (under a [schema], once the federation's encoder arrived). Its public seams, which tests and
    attacks override or wrap (each docstring says what an override may do): :meth:`prepare`, :meth:`train`,
    :meth:`train_on`, :meth:`evaluate`, :meth:`evaluation_answers`, and the stream's :meth:`start_round`,
    :meth:`step` and :meth:`submit` (:class:`TaskStream`). Its private methods are no contract.
    """

    def __init__(
        self,
        config: CollaboratorConfig,
        *,
        trainer_factory: TrainerFactory = round_trainer,
        retry: RetryPolicy | None = None,
        reset_state: bool = False,
        started: float | None = None,
    ) -> None:
        """Check everything local (TLS files, manifest pin, data, the data's privacy ledger) before any connection.

        `retry` defaults to the config's [retry]; `reset_state` is the operator's word that a lost record of
        this federation (and its privacy budget) may start again; `started` (time.monotonic()) is when the
        operator's wait began, the clock of [retry] start_wait_seconds (default: the first dial). Raises
        PermanentFailureError with the fix.
        """
        self.trainer_factory = trainer_factory
        self.reset_state = reset_state
        self.identity = check_identity(config)
        self.device = device_for(config.device)
        self._table: LocalTable | None = read_local_data(config)
        """The data as read before connecting; :meth:`setup` lets it go once it has cut this
        institution's part, so a process keeps only its own rows, not the whole dataset too."""
        check_pinned_table(config, self._table)
        # The table against the privacy ledger it charged (the check `fedfair collaborator ledger` makes), and, when
        # the config names its federation, against the table its record there bound: a changed table is refused
        # here with its one fix, before any dial, not after joining.
        ledger = open_ledger(config)
        if config.federation is not None:
            open_record(config, config.federation, ledger, reset=reset_state)
        stop = threading.Event()
        target = Target(config.aggregator, config.certificates, config.aggregator_name)
        backoff = Backoff(
            retry or config.retry, config.name, stop, target, self.identity.certified, role="collaborator"
        )
        backoff.started = started
        super().__init__(Connection(config, backoff, stop, self))  # the connection follows the stream for this
        self._uplink = Uplink()
        self._reports = StatusReports(config.name, self._uplink)
        self._joined: Joined | None = None
        """The fetched and checked plan; :meth:`setup` sets it before any task."""
        self._round: RoundJob | None = None
        """The round job; :meth:`prepare` builds it (under a [schema], at the first start stage)."""
        self._model: ModelSettings | None = None
        """The plan's model as :meth:`prepare` built it (under a [schema], sized by the federation's encoder)."""
        self._encoder: TableEncoder | None = None
        """Under a [schema], the federation's encoder as this collaborator received it."""

    # ------------------------------------------------------------ what it has learnt

    @property
    def joined(self) -> Joined:
        """The fetched and checked plan; only asked once :meth:`setup` ran."""
        assert self._joined is not None, "the plan is fetched (setup) before this is asked"
        return self._joined

    @property
    def shared(self) -> SharedSettings:
        """The federation's shared settings, from the joined plan."""
        return self.joined.shared

    @property
    def plan_digest(self) -> str:
        """The digest of the plan this collaborator joined under (hex SHA-256)."""
        return self.joined.plan_digest

    @property
    def participant(self) -> Participant:
        """This collaborator's secure-aggregation identity: the round job's once built, else the join's."""
        return self._round.participant if self._round is not None else self.joined.participant

    @property
    def trainer(self) -> RoundTrainer | None:
        """The round trainer, or None before the data is prepared."""
        return None if self._round is None else self._round.trainer

    @property
    def learner(self) -> LocalLearner | None:
        """The local learner of fedfair, or None before the data is prepared."""
        return None if self._round is None else self._round.learner

    @property
    def parameters(self) -> int:
        """How many model parameters this institution trains; 0 before the data is prepared."""
        return 0 if self._round is None else self._round.parameters

    @property
    def data(self) -> LocalData:
        """This institution's data as it trains and evaluates (once :meth:`prepare` ran)."""
        data = self._rounds().prepared.data
        assert data is not None  # a trainer that brings no learner of fedfair's has none
        return data

    @property
    def uploaded_bytes(self) -> dict[int, int]:
        """Bytes of every request sent, per round (what leaves the institution)."""
        return self._uplink.uploaded_bytes

    def _rounds(self) -> RoundJob:
        assert self._round is not None  # handle builds it before the first start stage
        return self._round

    def setup(self, stub: pb_grpc.FederationStub) -> None:
        """Fetch and check the plan (:func:`join`); without a [schema], prepare the data and trainer now."""
        table = self._table if self._table is not None else read_local_data(self.config)  # a second run reads again
        self._table = None
        self._joined = join(stub, self.config, self.backoff, self.identity, table, self.reset_state)
        load_kernels(self.shared, self.config.name)
        if self.shared.schema is None:
            self.prepare(load_local_data(self.config, self.shared, table), self.shared)

    def run(self) -> int:
        """Follow the federation to its end (:meth:`TaskStream.run`); however it ends, no kept settlement outlives it."""
        share_arenas()  # before the channel's threads start (fedfair.runtime.memory)
        try:
            return super().run()
        finally:
            # Also when it never joined (the aggregator gone): the federation is then the one its config names.
            federation = self.config.federation if self._joined is None else self.shared.federation_id
            if federation is not None:
                settlement_file(self.config.source.parent, self.config.name, federation).unlink(missing_ok=True)

    def say_joined(self) -> None:
        """Log that this institution joined (the aggregator took its task stream): :func:`say_joined`."""
        say_joined(self.config, self.joined, None if self._round is None else self._round.prepared, self.device)

    def plan_change(self, reply: pb.PlanReply) -> FailureError | None:
        """Why this joined collaborator does not take the plan in `reply`, or None (:func:`plan_change`)."""
        return plan_change("collaborator", self.config.manifest, self.plan_digest, reply)

    def _encode_with(self, stub: pb_grpc.FederationStub, task: pb.Task) -> None:
        """Encode this institution's table with the federation's encoder and build the learner it implies.

        The encoder is the TRAIN stage's input under a [schema].

        Raises:
            WireError: the task carries no input.
        """
        if task.input_size <= 0:
            raise WireError("the TRAIN stage carries no encoder although the plan has a [schema]")
        data, shared, self._encoder = encode_table(self.config, self.joined, bytes(self._input(stub, task)))
        self.prepare(data, shared)

    def prepare(self, data: LocalData, shared: SharedSettings) -> None:
        """Build the round trainer and the evaluation model for this institution's encoded data.

        A public seam, called once per process (at setup, or under a [schema] at the first start stage): an override
        may change the data before ``super().prepare`` (a site that lies about its labels, or holds fewer rows).
        """
        self._model = shared.model
        self._use(prepare(self.config, data, shared, self.device, self.trainer_factory))

    def _use(self, prepared: Prepared) -> None:
        """Build the round job around a prepared trainer, kept for the whole process.

        Raises:
            PermanentFailureError: ``local-privacy`` (or the record's own failure) when the trainer's privacy
                accountant does not go with this institution's record.
        """
        joined = self.joined
        if self.config.privacy.enabled:
            from fedfair.privacy.learner import PrivateLearner  # Opacus is loaded only where DP is on

            # Only local DP-SGD's accountant persists: under the plan's distributed noise (which a site's own
            # mode = "distributed" accepts) the spend is the ledger's, and each process starts its accountant afresh.
            if isinstance(prepared.trainer, PrivateLearner) and prepared.trainer.privacy.mode == "local":
                accountant = prepared.trainer.accountant
                try:
                    joined.record.check_accountant(accountant.rounds, getattr(accountant, "path", None))
                except PermanentFailureError:
                    raise
                except ConfigError as error:
                    raise PermanentFailureError(LOCAL_PRIVACY, reason=error, config=self.config.source) from None
        self._round = RoundJob(
            self.config,
            joined.shared,
            prepared,
            as_participant(self.config, self.identity, joined.shared, prepared.parameters, self._model, joined.outcome),
            joined.record,
            self._uplink,
            self._reports,
            joined.outcome,
        )

    # ------------------------------------------------------------ the round job's seams

    def handle(self, stub: pb_grpc.FederationStub, task: pb.Task) -> bool:
        """Carry out one task (:meth:`TaskStream.handle`) unless it runs under a roster this site does not hold."""
        # A roster update takes effect at the round whose tasks name it, for every party of that round at once.
        verify = self.identity.verify
        if isinstance(verify, LiveManifest) and not verify.settle(task.manifest_digest):
            starts = WireStage.of(task.binding) in (TRAIN, EVALUATE)
            if task.action == pb.ACTION_RUN and starts:
                # Checking peers under another roster than the round's would admit a revoked key or refuse a
                # re-keyed one; sitting out lets the round complete without this site (its steps find no work).
                self.connection.warn(
                    "rounds sat out",
                    "%s: sitting out round %d: it runs under manifest %s, which %s does not hold",
                    self.config.name,
                    task.binding.round,
                    task.manifest_digest,
                    verify.current.source,
                )
                return True
        return super().handle(stub, task)

    def _statistics_round(self, binding: pb.Binding) -> bool:
        """Whether `binding` is the statistics aggregation before round 1 (plans with a [schema])."""
        return self.shared.schema is not None and binding.round == STATISTICS_ROUND

    def _ensure_encoded(self, stub: pb_grpc.FederationStub, task: pb.Task) -> None:
        """Under a [schema], encode this institution's table with the federation's encoder; a no-op once encoded.

        The first start stage (TRAIN or EVALUATE) this process sees carries the encoder.
        """
        if self._round is None:
            self._encode_with(stub, task)

    def train(self, stub: pb_grpc.FederationStub, binding: pb.Binding) -> StartJob:
        """Download this round's model.

        Return the job that makes its contribution (:meth:`RoundJob.train`, training through :meth:`train_on`).
        """
        return self._rounds().train(stub, binding, self.train_on)

    def train_on(
        self,
        stub: pb_grpc.FederationStub,
        binding: pb.Binding,
        model: str,
        theta: torch.Tensor,
        c: float,
        control: torch.Tensor | None = None,
    ) -> TrainedUpdate:
        """This round's local training (:meth:`RoundJob.train_on`): the only place the trainer advances.

        A public seam, run in the round's job: an override may record, scale or replace the update it returns (a
        liar); an honest one returns ``super().train_on``'s. The update then goes through the same clipping and
        encoding as any.
        """
        return self._rounds().train_on(stub, binding, model, theta, c, control)

    def evaluate(self, stub: pb_grpc.FederationStub, binding: pb.Binding) -> StartJob:
        """Download the model to evaluate (none for the statistics aggregation).

        Return the job that makes this institution's answers.
        """
        if self._statistics_round(binding):
            # The statistics of this institution's table (counts and sums only), summed with every
            # other site's before training; no model is involved.
            view = self.joined.record.view(binding.round, "statistics", STATISTICS_KIND)
            if (answer := view.stored) is not None:  # read back from its file, once
                return StartJob(lambda: resent(binding.round, EVALUATION, view, answer), "")
            vector = self.joined.statistics
            statistics = Work(binding.round, EVALUATION, vector, 1.0)
            if self.shared.secure_aggregation.enabled and vector is not None:
                encoder = Encoder(statistics_encoding(self.shared.privacy.noised), self.shared.collaborator_count)
                statistics.encoded = encoder.encode(vector, 1.0)
                # Charged and noised (under the plan's [privacy]) before the bits are kept and sent.
                Charges(self.config, self.shared, self.joined.record).statistics(
                    statistics.encoded, binding.round, STATISTICS_KIND
                )
            return StartJob(lambda: stored(statistics, view), "")
        return self._rounds().evaluate(stub, binding, self.evaluation_answers)

    def evaluation_answers(self, theta: torch.Tensor, c: float) -> np.ndarray:
        """This institution's answers to the evaluation's queries on (theta, c) (:func:`answers.evaluation_answers`).

        A public seam, run in the evaluation's job: an override may record or replace the answers (one vector of the
        plan's evaluation length), which are then encoded, charged and sent as any.
        """
        rounds = self._rounds()
        return answers.evaluation_answers(rounds.prepared, rounds.shared, theta, c)

    # ------------------------------------------------------------ what it fetches and sends

    def bundle_path(self) -> Path:
        """Where this collaborator keeps the federation's final model bundle.

        Beside its config, one per federation, as it keeps its privacy accountant.
        """
        return federation_file(self.config, self.shared.federation_id, BUNDLE_SUFFIX)

    def finish(self, stub: pb_grpc.FederationStub, task: pb.Task) -> int:
        """At FINISHED: keep the final model bundle if it checks out (:func:`receive_bundle`); the exit status.

        The closing count and the status come from this institution's own record (:func:`finished_status`).

        Raises:
            PermanentFailureError: ``bundle-refused`` (after the closing line) when the bundle is not this
                federation's output model; ``model-unchecked`` when this site sat rounds out, unable to check
                their models, and checked no output model after them. Nothing is kept then.
        """
        joined, path = self.joined, self.bundle_path()
        expected = (
            None
            if self._model is None
            else Expectation(
                joined.shared.federation_id,
                joined.settings,
                self._model,
                joined.shared.training.seed,
                self.config.factories,
                None if self._encoder is None else self._encoder.to_mapping(),
            )
        )
        # An output model that is not the average of the training rounds' models refuses any bundle that holds it.
        refusal, unchecked = joined.outcome.output_mismatch(), joined.outcome.unchecked_output()
        if refusal is not None:
            received = Received(refusal=refusal)
        elif unchecked is not None:
            received = Received(not_kept=f"this site could not check the models sent from round {unchecked[0]} on")
        elif task.input_size > 0:
            limit = input_limit(task, self.aggregations, self.shared.collaborator_count, self.parameters, 0)
            fetch = functools.partial(self._uplink.input_into, stub, task, limit)
            output = None if expected is None else joined.outcome.output  # read a slice at a time as it is checked
            figures = self.participant.figures if self.shared.secure_aggregation.enabled else None
            # The rounds are over: what they freed goes back to the system before the bundle (a model's worth) is
            # fetched and loaded, in every site at once. Once a federation, so the faults it costs do not recur.
            release_freed()
            received = receive_bundle(self.config.name, path, fetch, expected, output, figures)
        else:
            received = Received(not_kept="the aggregator sent none")
        shared = joined.shared
        allowed = shared.quorum.aborted_rounds_allowed
        status = finished_status(
            self.config.name, shared.training.rounds, joined.outcome.contributed, received, allowed
        )
        if received.refusal is not None:
            raise PermanentFailureError(BUNDLE_REFUSED, reason=received.refusal, path=path)
        if unchecked is not None:
            rounds, record = len(joined.outcome.sat_out), joined.outcome.path
            raise PermanentFailureError(
                MODEL_UNCHECKED, round=unchecked[0], why=unchecked[1], rounds=rounds, path=record
            )
        return status

    def _note_round(self, round_number: int, *, held: bool) -> None:
        """Count training round `round_number` in the outcome record: its sum holds this update, or it aborted."""
        if held:
            self.joined.outcome.held(round_number)
        else:
            self.joined.outcome.aborted(round_number)

    def _note_refusal(self, round_number: int, reason: str, detail: str) -> Path:
        """Keep the refused training round and its reason in the outcome record (no bundle is kept after it)."""
        self.joined.outcome.refused(round_number, reason, detail)
        return self.joined.outcome.path

    def _input(self, stub: pb_grpc.FederationStub, task: pb.Task) -> StageInput:
        """The input of `task`'s stage: a claimed sum or a tag set as a read-only view of its buffer, any other as bytes.

        The one the task carries, or else fetched, within the pinned plan's bound
        (:func:`~fedfair.runtime.peer.uplink.input_limit`); a tag set of 64 MiB or more (every survivor's
        masked input, above RESUMMED_WORDS) in an unlinked file beside the site's config, mapped.
        """
        stage = WireStage.of(task.binding)
        evaluation_words = 0
        if stage in EVALUATION.specs:  # its sums' length caps a claim or a tag set of them
            evaluation_words = self.participant.aggregation(EVALUATION, task.binding.round)[1]
        limit = input_limit(task, self.aggregations, self.shared.collaborator_count, self.parameters, evaluation_words)
        stages = self.aggregations.of(stage)
        read = (stages.protocol.name if stages is not None else "", stage)
        if read in TAG_SETS and large(task.input_size):
            return self._uplink.input_in_file(stub, task, limit, self.participant.folder)
        if read in CLAIMS | TAG_SETS:
            return self._uplink.input_view(stub, task, limit)
        return self._uplink.input(stub, task, limit)

    def submit(self, stub: pb_grpc.FederationStub, binding: pb.Binding, payload: bytes | Pieces) -> None:
        """Upload this stage's payload (see :class:`Uploader`), counting the bytes sent (:meth:`TaskStream.submit`)."""
        self._uplink.submit(stub, binding, payload)
