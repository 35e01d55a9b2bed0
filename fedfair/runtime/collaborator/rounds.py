"""The round job: what one start stage (TRAIN or EVALUATE) computes, beside the task stream.

A :class:`RoundJob` is built once this institution's trainer exists (from the fetched plan,
:mod:`fedfair.runtime.collaborator.preparation`) and kept for the whole process. For TRAIN
it downloads (theta_t, c_t) (with drift correction, the server's control variate sigma in
the same download) and returns the job that trains, bounds and encodes the update; for
EVALUATE, the job that keeps and encodes this institution's answers to the evaluation and, at
the final round of a plan with ``[evaluation] composition``, its counts by category (what they are:
:mod:`fedfair.runtime.collaborator.answers`).

Why: docs/design.md, "Inside the collaborator".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from fedfair.core.errors import (
    BudgetReason,
    ConfigError,
    FedfairError,
    PrivacyBudgetError,
    Refusal,
    RefusedError,
    WireError,
)
from fedfair.core.local import LocalLearner, RoundTrainer
from fedfair.core.update import WeightedVector, bounded, weighted
from fedfair.fairness import sums
from fedfair.runtime.collaborator.answers import composition_counts
from fedfair.core.errors import UncheckedModelError
from fedfair.runtime.collaborator.catch_up import catch_up
from fedfair.runtime.collaborator.charges import Charges
from fedfair.runtime.collaborator.input_record import InputRecord, SignedView
from fedfair.runtime.collaborator.stored_answer import StoredAnswer
from fedfair.runtime.collaborator import kinds as kinds  # registers the built-in kinds' steps and encodings
from fedfair.runtime.collaborator.config import CollaboratorConfig
from fedfair.runtime.collaborator.outcome import OutcomeRecord
from fedfair.runtime.collaborator.preparation import Prepared
from fedfair.runtime.collaborator.steps import KIND_ENCODINGS, Participant, StartJob, Work
from fedfair.runtime.collaborator.updates import TrainedUpdate, clip_plain_update, control_pieces_beyond_clip
from fedfair.runtime.peer.uplink import StatusReports, Uplink
from fedfair.runtime.composition_counts import CompositionColumn
from fedfair.core.update import update_dimension
from fedfair.runtime.contract import (
    EVALUATION,
    Stages,
    model_digest,
    split_training_download,
    training_download_size,
    training_stages,
)
from fedfair.runtime.plan.aggregator_plan import SharedSettings
from fedfair.runtime.transport import pb, pb_grpc
from fedfair.runtime.observe.logs import per_round
from fedfair.secagg import Encoder

logger = logging.getLogger("fedfair.collaborator")


def check_scheduled(shared: SharedSettings, round_number: int, kind: str) -> None:
    """Refuse a round the pinned plan does not schedule, before anything of it is downloaded, computed or charged.

    Training (`kind` "train"): rounds 1 to the plan's last. Evaluation ("evaluate"): only the rounds its
    ``[evaluation] every`` names (:meth:`~fedfair.runtime.plan.evaluation.EvaluationSettings.due`), so an
    aggregator cannot collect an answer per round of a plan that promised one. The input record
    (:meth:`~fedfair.runtime.collaborator.input_record.InputRecord.view`) then lets each be answered for one
    model only, across restarts.

    Raises:
        RefusedError: reason :attr:`Refusal.INPUT_BOUND`, naming the round and the plan's schedule.
    """
    rounds = shared.training.rounds
    if not 1 <= round_number <= rounds:
        where = f"past the plan's last round, {rounds}" if round_number > rounds else "before the plan's first, 1"
        raise RefusedError(
            Refusal.INPUT_BOUND,
            f"round {round_number} ({kind}) is {where}; "
            "this institution trains and evaluates only the rounds its pinned plan names",
        )
    evaluation = shared.evaluation
    if kind == "evaluate" and not evaluation.due(round_number, rounds):
        schedule = f"every {evaluation.every} rounds and after" if evaluation.every else "only after"
        raise RefusedError(
            Refusal.INPUT_BOUND,
            f"round {round_number} is not one the pinned plan evaluates ([evaluation] every = {evaluation.every}: "
            f"{schedule} the last round, {rounds}); this institution answers only the plan's evaluations",
        )


TrainOn = Callable[[pb_grpc.FederationStub, pb.Binding, str, torch.Tensor, float, torch.Tensor | None], TrainedUpdate]
""":meth:`RoundJob.train_on`, or what stands in for it (the seam `Collaborator.train_on`)."""


class RoundJob:
    """Train (or evaluate), bound and encode this institution's contribution to a round."""

    def __init__(
        self,
        config: CollaboratorConfig,
        shared: SharedSettings,
        prepared: Prepared,
        participant: Participant,
        record: InputRecord,
        uplink: Uplink,
        reports: StatusReports,
        outcome: OutcomeRecord,
    ) -> None:
        self.config = config
        self.shared = shared
        self.prepared = prepared
        self.participant = participant
        """This collaborator as the aggregations know it, its model's parameters counted."""
        self.record = record
        self.charges = Charges(config, shared, record)
        self.uplink = uplink
        self.reports = reports
        self.outcome = outcome
        """Where the models sent for training and the final round's evaluation are followed (the bundle's check)."""
        self._holds_control = False
        """Whether the learner's sigma_k is this process's own (set by a round it trained); until then the
        first round it trains adopts the server's sigma (see the module's notes on drift correction)."""

    @property
    def trainer(self) -> RoundTrainer:
        """The prepared round trainer, kept for the whole process."""
        return self.prepared.trainer

    @property
    def learner(self) -> LocalLearner | None:
        """The local learner of fedfair, or None for a trainer that brings its own."""
        return self.prepared.learner

    @property
    def parameters(self) -> int:
        """How many model parameters the trainer trains (the update's length before encoding)."""
        return self.prepared.parameters

    def view_of(self, round_number: int, kind: str, model: str) -> SignedView:
        """The survivor set an input of this kind and model is bound to, in every session and round.

        It holds across restarts (:mod:`fedfair.runtime.collaborator.input_record`), with the kept bits if
        the input was answered. A training input noised inside the secure sum (``[privacy] mode =
        "distributed"``) is one round's: a later round on the same model trains afresh once it was signed for
        survivors. Raises RefusedError, reason :attr:`Refusal.INPUT_BOUND`, for an input the record refuses.
        """
        one_round = kind == "train" and self.shared.privacy.distributed
        return self.record.view(round_number, kind, model, one_round=one_round)

    def checked(
        self, check: Callable[[], None], round_number: int, kind: str, model: str, caught_up: Callable[[], bool]
    ) -> None:
        """Run the model chain's `check` of round `round_number`'s model (digest `model`, an input of `kind`).

        A model the chain cannot check is checked again once `caught_up` applied the verified sums of the rounds
        this site missed (:mod:`~fedfair.runtime.collaborator.catch_up`; it says whether it applied any). A model
        the chain still cannot check is sat out (UncheckedModelError, a withdrawal) and the outcome record says so;
        a round older than this record answered is the record's to refuse first (FEDERATION_PAST).
        """
        try:
            try:
                check()
            except UncheckedModelError:
                if not caught_up():
                    raise
                check()
        except UncheckedModelError as unchecked:
            self.view_of(round_number, kind, model)
            self.outcome.unchecked(round_number, unchecked.why)
            raise

    def download(
        self, stub: pb_grpc.FederationStub, binding: pb.Binding, max_values: int | None = None
    ) -> tuple[np.ndarray, float]:
        """(values, c) of the stage's model; values is theta, at most `max_values` long (default: the model's)."""
        return self.uplink.download(stub, binding, self.parameters if max_values is None else max_values)

    def train(self, stub: pb_grpc.FederationStub, binding: pb.Binding, train_on: TrainOn) -> StartJob:
        """Download this round's model.

        Return the job that makes its contribution: trained on that model (by `train_on`), or re-sent if this
        round already trained on exactly this model (the aggregator crashed and re-runs the round).
        """
        check_scheduled(self.shared, binding.round, "train")
        corrects_drift = self.shared.training.local.corrects_drift
        values, c = self.download(stub, binding, training_download_size(self.parameters, corrects_drift))
        try:
            theta, control = split_training_download(values, self.parameters, corrects_drift)
        except ConfigError as error:
            raise WireError(str(error)) from None
        model = model_digest(values, c)
        # Checked before anything trains on it or keeps it: the server step applied to the sums this site verified.
        chain = self.participant.chain
        caught_up = partial(catch_up, self.participant, self.uplink, stub, binding.round - 1)
        self.checked(lambda: chain.sent(binding.round, theta, c, control), binding.round, "train", model, caught_up)
        view = self.view_of(binding.round, "train", model)
        self.outcome.training_model(binding.round, theta, c)
        # Trained on, then let go: the update, its encoding and the record need none of it.
        download = [(torch.from_numpy(theta), c, None if control is None else torch.from_numpy(control))]

        def job() -> Work:
            if (answer := view.stored) is not None:  # read back from its file, once
                logger.info(
                    "%s: round %d is run again on the model already trained on; re-sending the kept update",
                    self.config.name,
                    binding.round,
                )
                return resent(binding.round, training_stages(self.shared.secure_aggregation), view, answer)
            trained = train_on(stub, binding, model, *download.pop())
            self.record.note_threshold(binding.round, c)
            return stored(self.contribution(trained), view)

        return StartJob(job, model)

    def train_on(
        self,
        stub: pb_grpc.FederationStub,
        binding: pb.Binding,
        model: str,
        theta: torch.Tensor,
        c: float,
        control: torch.Tensor | None = None,
    ) -> TrainedUpdate:
        """Run this round's local training on (theta, c) and, with drift correction, the server's control variate sigma.

        The only place the trainer advances.

        A spent privacy budget is reported to the aggregator (BUDGET_SPENT); with
        share_epsilon, so is the cumulative epsilon after each private round. The
        private learner logs its own privacy line, so none is logged here.
        """
        round_number = binding.round
        nothing = TrainedUpdate(round_number, model, None, 0.0)
        started = time.perf_counter()
        learner = self.learner  # None for a trainer that brings no learner of fedfair's (benchmarks/round_bench.py)
        if control is not None and not self._holds_control and learner is not None and learner.control is not None:
            # A fresh process has no sigma_k of its own: it starts from the server's (module notes).
            learner.control = control.to(learner.control.device, torch.float64).clone()
        self._holds_control = True
        try:
            update = self.trainer.train_round(theta, c, control)
        except FedfairError as error:
            logger.warning("%s: round %d: not contributing: %s", self.config.name, round_number, error)
            # A collaborator stops contributing for good only when its private learner's budget is spent.
            if isinstance(error, PrivacyBudgetError) and error.reason is BudgetReason.LEARNER_SPENT:
                self.reports.send(stub, binding, pb.COLLABORATOR_STATUS_BUDGET_SPENT)
            return nothing
        influence = self.shared.influence
        batch = int(update.weight)
        update = bounded(
            update, influence.weight_of(self.config.name, self.shared.batch_fraction), influence.update_norm
        )
        # A float32 model's update goes in float32 (sent so, or widened exactly as encoded); a control is float64.
        # Not formed here: the encoding reads it a piece at a time, and only a plain upload forms it whole.
        compact = update.delta.dtype == torch.float32 and update.control is None
        vector = WeightedVector(update, torch.float32 if compact else torch.float64)
        if self.config.share_epsilon and self.config.privacy.enabled:
            from fedfair.privacy.learner import PrivateLearner  # Opacus is loaded only where DP is on

            spent = self.trainer.last_report if isinstance(self.trainer, PrivateLearner) else None
            if spent is not None:
                self.reports.send(stub, binding, pb.COLLABORATOR_STATUS_PRIVACY_SPENT_REPORT, spent.epsilon)
        if not update.weighted_finite(vector.dtype):
            logger.error(
                "%s: round %d: the local update has NaN or Inf; refusing to contribute it (check the "
                "learning rate); withdrawing from this round",
                self.config.name,
                round_number,
            )
            return nothing
        expected = update_dimension(self.parameters, self.shared.training.local.corrects_drift)
        if vector.size != expected:
            logger.error(
                "%s: round %d: the trainer's update holds %d values, but the plan's [training] drift_correction = "
                "\"%s\" makes a round's vector %d long; this collaborator's trainer does not follow the plan (a "
                "custom trainer, or an older fedfair): withdrawing from this round; run a trainer built from the "
                "plan's settings (fedfair.runtime.collaborator.trainer.build_learner)",
                self.config.name,
                round_number,
                vector.size,
                self.shared.training.local.drift_correction,
                expected,
            )
            return nothing
        if update.control is not None:
            pieces = (piece.numpy() for piece in weighted(update.control, update.weight, vector.dtype))
            problem = control_pieces_beyond_clip(pieces, update.weight, self.shared.secure_aggregation.clip)
            if problem:
                logger.error("%s: round %d: %s; withdrawing from this round", self.config.name, round_number, problem)
                return nothing
        logger.info(
            "%s: round %d: trained %d local steps on batches of %d in %.3f s",
            self.config.name,
            round_number,
            self.shared.training.local.local_steps,
            batch,
            time.perf_counter() - started,
            extra=per_round(round_number, self.shared.training.rounds),
        )
        return TrainedUpdate(round_number, model, vector, float(update.weight))

    def contribution(self, trained: TrainedUpdate) -> Work:
        """The round's work for a training outcome, bounded as the plan's encoding bounds it."""
        round_number, weight = trained.round, trained.weight
        training = training_stages(self.shared.secure_aggregation)
        if trained.vector is None:
            return Work(round_number, training, None, 0.0)
        settings = self.shared.secure_aggregation
        if settings.enabled:
            # A vector never formed stays so: its words alone are kept and sent (a whole one is kept beside them).
            whole = trained.vector if isinstance(trained.vector, np.ndarray) else None
            work = Work(round_number, training, whole, weight)
            # Encoded now, off the MASKED_INPUT stage's critical path (the round's encoder checks the parameters then).
            shared = self.shared
            try:
                encode = KIND_ENCODINGS.get(training.protocol.name)
                if encode is not None:  # its kind's own (the bounded sum's: within its bound, unnoised)
                    work.encoded = encode(trained.vector, self.config.name, shared)
                    if shared.privacy.distributed:  # charged as a masked round's noise, before the input leaves
                        self.charges.training(round_number, trained.model, trained.vector.size)
                    return work
                encoding = shared.training_encoding(
                    shared.federation_id, shared.collaborator_count, round_number, trained.vector.size
                )
                # A fresh array each round, let go with the masked upload (steps.py): kept for the next round, it
                # would sit beside that round's download and training, and its page faults cost a few ms a round.
                work.encoded = Encoder(encoding, shared.collaborator_count).encode(trained.vector, weight)
                if encoding.noise is not None:
                    self.charges.training(round_number, trained.model, trained.vector.size)
            except ConfigError as error:
                logger.warning("%s: round %d: not contributing: %s", self.config.name, round_number, error)
                return Work(round_number, training, None, 0.0)
            return work
        if not 0.0 < weight <= settings.max_weight:
            logger.warning(
                "%s: round %d: not contributing: the weight %g is outside (0, max_weight = %g]; ask the "
                "operator to raise [secure_aggregation] max_weight in the plan",
                self.config.name,
                round_number,
                weight,
                settings.max_weight,
            )
            return Work(round_number, training, None, 0.0)
        vector = np.asarray(trained.vector)  # a plain upload sends it whole
        clipped = clip_plain_update(vector, weight, settings.clip)
        changed = int(np.count_nonzero(clipped != vector))
        if changed:
            logger.info(
                "%s: round %d: %d coordinates clipped to +-%g per unit of weight (the plan's clip)",
                self.config.name,
                round_number,
                changed,
                settings.clip,
            )
        return Work(round_number, training, clipped, weight)

    def evaluate(
        self,
        stub: pb_grpc.FederationStub,
        binding: pb.Binding,
        answers: Callable[[torch.Tensor, float], np.ndarray],
    ) -> StartJob:
        """Download the model to evaluate.

        Return the job that makes this institution's answers (by `answers`), followed at the final round, when
        the plan names composition columns, by its composition counts.
        """
        # The exact threshold sums' grid depends on the plan, not on c. The noised tail sums are taken at the
        # model's c, which the aggregator chooses, harmlessly: each answer is charged whatever it asks.
        check_scheduled(self.shared, binding.round, "evaluate")
        theta, c = self.download(stub, binding)
        model = model_digest(theta, c)
        chain = self.participant.chain
        caught_up = partial(catch_up, self.participant, self.uplink, stub, binding.round)
        self.checked(lambda: chain.evaluated(binding.round, theta, c), binding.round, "evaluate", model, caught_up)
        self.participant.figures.asked(binding.round, model, c)  # the figures of its sum, once verified
        view = self.view_of(binding.round, "evaluate", model)
        if binding.round == self.shared.training.rounds:
            self.outcome.output_model(binding.round, theta, c)
        columns, length = self.shared.counted_columns(binding.round), self.shared.evaluation_length(binding.round)

        def job() -> Work:
            answer = (
                view.stored
            )  # read once; a shorter one is an earlier evaluation's, without the final round's counts
            short = answer is not None and answer.vector is not None and answer.vector.size < length
            if answer is not None and not short:
                return resent(binding.round, EVALUATION, view, answer)
            try:
                if answer is not None:
                    return self.counts_beside(view, answer, binding.round, (theta, c), model, columns)
                answered = answers(torch.from_numpy(theta), c)
                if columns:
                    answered = np.concatenate(
                        [answered, composition_counts(self.prepared, self.shared, torch.from_numpy(theta), c, columns)]
                    )
                work = Work(binding.round, EVALUATION, answered, 1.0)
                if self.shared.secure_aggregation.enabled:
                    work.encoded = Encoder(sums.ENCODING, self.shared.collaborator_count).encode(answered, 1.0)
                    self.charges.evaluation(work.encoded, binding.round, model, columns)
            except ConfigError as error:
                logger.warning("%s: round %d evaluation: not contributing: %s", self.config.name, binding.round, error)
                return Work(binding.round, EVALUATION, None, 0.0)
            return stored(work, view)

        return StartJob(job, model)

    def counts_beside(
        self,
        view: SignedView,
        answer: StoredAnswer,
        round_number: int,
        evaluated: tuple[np.ndarray, float],
        model: str,
        columns: tuple[CompositionColumn, ...],
    ) -> Work:
        """The final evaluation of `evaluated` (theta, c), answered at an earlier one (`answer`): its words, fresh counts.

        One answer per model (a second noise draw could be averaged with the first); the counts are their own release.
        """
        assert answer.vector is not None  # a withdrawal is never kept
        theta, c = evaluated
        counts = composition_counts(self.prepared, self.shared, torch.from_numpy(theta), c, columns)
        work = Work(round_number, EVALUATION, np.concatenate([answer.vector, counts]), 1.0)
        if answer.encoded is not None:
            words = Encoder(sums.ENCODING, self.shared.collaborator_count).encode(counts, 1.0)
            self.charges.evaluation(words, round_number, model, columns, counts_alone=True)
            # The weight's word (1 per answer) stays last; the counts' own weight word is dropped.
            work.encoded = np.concatenate([answer.encoded[:-1], words[:-1], answer.encoded[-1:]])
        return stored(work, view)


def stored(work: Work, view: SignedView) -> Work:
    """`work`, its bits kept on disk (:meth:`SignedView.keep`) before anything of it is sent.

    Withdrawing (neither vector nor words) is not kept: no sum holds this institution's input then, so a
    later round on the same model (the aborted round's, unchanged) may answer afresh without any two
    sums differing by it; kept, one failed training would bar the federation from that model.
    """
    work.view = view
    if work.vector is None and work.encoded is None:
        return work
    view.keep(StoredAnswer(work.vector, work.weight, work.encoded))  # written before it is masked in place, not held
    if work.encoded is not None:  # the words are what a secure sum sends: the vector is the record's to keep
        work.vector, work.released = None, True
    return work


def resent(round_number: int, stages: Stages, view: SignedView, answer: StoredAnswer) -> Work:
    """The work that sends again `answer`, the bits `view` kept (the encoding a copy: masking works in place)."""
    contributed = answer.vector is not None or answer.encoded is not None
    work = Work(round_number, stages, answer.vector, answer.weight if contributed else 0.0)
    work.encoded = None if answer.encoded is None else answer.encoded.copy()
    work.released = answer.vector is None and answer.encoded is not None  # words kept alone: the round has them
    work.view = view
    return work
