"""The collaborator process: connect to the aggregator and follow its task stream.

One per institution (started by ``fedfair collaborator start``, see
:mod:`fedfair.runtime.collaborator.commands`). Before it dials anyone it checks what
is local: its TLS files (and that its configured name is the one its certificate
carries), its manifest pin, and its data, so a wrong path fails at once with the
aggregator up or down. Then it dials the aggregator over mutual TLS, fetches the plan's shared settings and builds its
learner exactly as the in-process simulation builds client i (same model seed, same
sampler seed), so a federation over real processes follows the simulation step for
step. Then it follows the aggregator's task stream:

- TRAIN: download (theta_t, c_t) in bounded chunks (with drift correction, the server's control
  variate sigma follows theta in the same download), then run the local learner's tau steps
  and encode the update as a job beside the task stream (one at a time, in order; without
  secure aggregation, where no key stages could run beside it, in the task's own handler);
- ADVERTISE / SHARE / CHECK_SHARES / MASKED_INPUT / CONSISTENCY / UNMASK: the
  secure-aggregation steps of :mod:`fedfair.runtime.collaborator.steps` (with secure
  aggregation off, only MASKED_INPUT, carrying the plain float64 vector). The key stages
  before MASKED_INPUT need nothing of the update, so they run while the job trains;
  MASKED_INPUT waits for it. A round whose job ends with nothing to send (a NaN update,
  a spent privacy budget) is left at the next stage: before any keys when the job ended
  first, else at masking, where the aggregator treats it as a dropout;
- EVALUATE and EVAL_*: the same steps over its answers to the evaluation's threshold
  queries on its held-out losses (`fedfair.fairness.sums`);
- ABORTED: forget the round; FINISHED: exit.

It never sends a per-sample value: only secure-aggregation messages whose size is
fixed by the model (or the evaluation vector) and the number of collaborators. An
update with NaN or Inf is refused before masking (the collaborator withdraws from
the round), and so is one whose control variate (drift correction) lies beyond the
plan's clip, which the encoding would otherwise clip silently; with secure aggregation
off, the plain update is clipped exactly as the encoding would clip it (each coordinate
of the unweighted update to [-clip, clip]), so the aggregator's bounds never refuse an
honest one.

Failures are classified (:mod:`fedfair.runtime.failures`): a transient one (the
aggregator down, restarting or busy) is retried with jittered back-off for up to
``[retry] max_wait_seconds`` of outage; a permanent one (a certificate the other side
cannot trust, a name the plan does not allow, a plan or data that do not fit) stops
the collaborator at once with the cause and the fix
(:mod:`fedfair.runtime.collaborator.retries`). A restarted collaborator rejoins at
the next round.

Crash consistency: an aggregator killed mid-round and resumed re-runs that round
from its checkpoint, so this process may be sent the same round's TRAIN again. It
keeps its last training outcome, keyed by the round and the SHA-256 of the
downloaded (theta, c); on the same key it re-sends that outcome rather than training
again (the same bits, no second privacy cost, the sampler is not advanced twice),
and a different model means a fresh round of training. A task whose RPC failed is
not counted as done, and losing the aggregator does not drop the round's work.
Evaluation answers are a function of the model alone and are simply recomputed.

Drift correction (``[training] drift_correction = "scaffold"``): the learner, kept for
the whole process, holds this institution's control variate sigma_k (`LocalLearner.control`)
across rounds; each round passes it the server's sigma and submits the 2 (d + 1) vector
[w delta, w delta_c, w sigma_k+]. A process that starts (or restarts) mid-federation has
no sigma_k of its own: before the first round it trains it takes the server's sigma as
its sigma_k, so that round's correction term sigma - sigma_k is zero (plain local steps,
as SCAFFOLD's first round) and its sigma_k+ is a fresh estimate from there on. The server
keeps no running sum of the sigma_k, so this leaves no error behind (`fedfair.core.server`).

Privacy hook: the `trainer_factory` argument of :class:`Collaborator` (default
`fedfair.runtime.collaborator.trainer.round_trainer`) turns the plain `LocalLearner` into what trains each round;
with `[privacy] enabled = true` it wraps it in `fedfair.privacy.learner.PrivateLearner`.
A collaborator that declines a round because its privacy budget is spent tells the
aggregator with the Report RPC (status BUDGET_SPENT, never free text); with
``[privacy] share_epsilon = true`` it also reports its cumulative epsilon each round.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch
from cryptography.hazmat.primitives import serialization

from fedfair import pki
from fedfair.bundle import load_bundle
from fedfair.core.device import device_for
from fedfair.core.errors import ConfigError, FedfairError
from fedfair.core.evaluation import evaluate
from fedfair.core.files import atomic_write
from fedfair.core.local import LocalLearner, RoundTrainer, bounded
from fedfair.core.models import flat_parameters
from fedfair.datasets.schema import statistics_vector
from fedfair.fairness import sums
from fedfair.privacy.learner import PrivacyBudgetExhausted, PrivateLearner
from fedfair.runtime.collaborator.config import CollaboratorConfig
from fedfair.runtime.collaborator.retries import (
    RETRYABLE,
    Backoff,
    RetryPolicy,
    Target,
)
from fedfair.runtime.collaborator.bindings import BindingRefused, Bindings, SignedView
from fedfair.runtime.collaborator.steps import (
    STEPS,
    Participant,
    RoundRefused,
    Work,
)
from fedfair.runtime.collaborator.trainer import (
    LocalData,
    TrainerFactory,
    build_learner,
    check_schema_table,
    encoded_data,
    load_local_data,
    read_local_data,
    round_trainer,
)
from fedfair.runtime.contract import (
    EVALUATION,
    TRAINING,
    Stages,
    split_training_download,
    training_download_size,
    update_dimension,
)
from fedfair.runtime.failures import (
    CONNECTION_LOST,
    FEDERATION_MISMATCH,
    LOCAL_BINDINGS,
    LOCAL_CERTIFICATES,
    LOCAL_MANIFEST,
    LOCAL_PRIVACY,
    PLAN_MISMATCH,
    Failure,
    PermanentFailure,
)
from fedfair.runtime.faults import maybe_die
from fedfair.runtime.manifest import (
    check_certificate,
    check_shared_settings,
    pinned_verifier,
)
from fedfair.runtime.plan import SharedSettings, json_object, load_shared_settings
from fedfair.runtime.preprocessing import (
    STATISTICS_KIND,
    STATISTICS_ROUND,
    model_for,
    read_encoder_payload,
)
from fedfair.runtime.transport import (
    Uploader,
    WireError,
    check_tls_files,
    inline_input,
    make_binding,
    pb,
    pb_grpc,
    read_model,
    read_payload,
    secure_channel,
)
from fedfair.secagg import Encoder
from fedfair.secagg.errors import ProtocolError

logger = logging.getLogger("fedfair.collaborator")

RPC_SECONDS = 60.0
"""Upper bound on one request besides a stage's own deadline (a stalled peer cannot hang us)."""

BUNDLE_SUFFIX = "model_bundle.pt"
"""The federation's final model bundle is kept as NAME.FEDERATION.model_bundle.pt beside the config."""


def model_digest(theta: np.ndarray, c: float) -> str:
    """SHA-256 of a downloaded model (theta, c), its dtype included: which model a round trained on."""
    values = np.ascontiguousarray(theta)
    digest = hashlib.sha256(values.dtype.str.encode())
    digest.update(values.tobytes())
    digest.update(struct.pack("<d", c))
    return digest.hexdigest()


@dataclass(frozen=True)
class TrainedUpdate:
    """The outcome of training in one round, kept so that a re-run of the round re-sends it.

    The key is (round, model): the round and the :func:`model_digest` of the model trained
    on (with drift correction, of theta and the server's sigma together). `vector` is
    [w * delta, w * delta_c] (followed by w * sigma_k+ with drift correction), read-only
    (None: nothing to contribute this round, the trainer refused or the update was not
    finite); `weight` is w.
    """

    round: int
    model: str
    vector: np.ndarray | None
    weight: float


def clip_plain_update(vector: np.ndarray, weight: float, clip: float) -> np.ndarray:
    """[w * delta] clipped coordinate-wise to [-clip * w, clip * w]: what the secure encoding does to it
    (`fedfair.secagg.encode.Encoder.encode`, the same float operations), and what the aggregator's
    plain decode check (`decode_plain`) accepts."""
    bound = clip * weight
    clipped: np.ndarray = np.clip(vector, -bound, bound)
    return clipped


def control_beyond_clip(vector: np.ndarray, weight: float, clip: float) -> str | None:
    """Why a drift-corrected vector [w delta, w delta_c, w sigma_k+] must not be sent, or None.

    The encoding (and the plain path's clip) bounds every weighted coordinate by clip * w. An
    update's coordinates are clipped like a gradient, but a clipped control variate would be a
    wrong one, and the server's sigma, the mean of them, would steer every collaborator's next
    steps off course, silently: so a control coordinate past the bound is refused instead.
    """
    control = vector[vector.size // 2 :]
    bound = clip * weight
    beyond = int(np.count_nonzero(np.abs(control) > bound))
    if not beyond:
        return None
    largest = float(np.abs(control).max()) / weight
    return (
        f"{beyond} coordinates of the drift correction's control variate exceed the encoding's clip "
        f"(largest {largest:.4g} per unit of weight, clip {clip:g}), and clipping would corrupt it; raise "
        "[secure_aggregation] clip in the plan above that (or lower [training] lr / threshold_lr)"
    )


def _stub(channel: grpc.Channel) -> pb_grpc.FederationStub:
    return pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]  # protoc's code is untyped


class Collaborator:
    """One institution's process: connect, follow tasks, train, mask, submit."""

    def __init__(
        self,
        config: CollaboratorConfig,
        *,
        trainer_factory: TrainerFactory = round_trainer,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Check everything local (TLS files, manifest pin, data) before any connection;
        `retry` defaults to the config's [retry]. Raises PermanentFailure with the fix."""
        self.config = config
        self.trainer_factory = trainer_factory
        self.files = config.certificates
        try:
            certified = check_tls_files(self.files, "collaborator")
        except ConfigError as error:
            raise PermanentFailure(LOCAL_CERTIFICATES, reason=error, config=config.source) from None
        if certified != config.name:
            raise PermanentFailure(
                LOCAL_CERTIFICATES,
                reason=f"name = {config.name!r} but {self.files.cert} certifies {certified!r}; the aggregator "
                "knows this institution by its certificate, so make them the same",
                config=config.source,
            )
        self.device = device_for(config.device)
        self._identity_key = pki.load_private_key(self.files.key)
        self._credential = pki.load_certificate(self.files.cert).public_bytes(serialization.Encoding.DER)
        ca_certificate = pki.load_certificate(self.files.ca)
        if config.manifest is not None:
            # Peers are checked against the pinned fingerprints, not only the CA: a twin minted
            # by whoever holds the CA key is refused like a stranger.
            try:
                check_certificate(config.manifest, config.name, self._credential)
            except ConfigError as error:
                raise PermanentFailure(LOCAL_MANIFEST, reason=error) from None
            self._verify = pinned_verifier(config.manifest, ca_certificate)
        else:
            self._verify = pki.credential_verifier(ca_certificate, "collaborator")
        self._table = read_local_data(config)
        self._stop = threading.Event()
        target = Target(config.aggregator, self.files, config.aggregator_name)
        self.backoff = Backoff(retry or config.retry, config.name, self._stop, target, certified)
        self._stream: Any = None
        self.uploaded_bytes: dict[int, int] = {}
        """Bytes of every request sent, per round (what leaves the institution)."""
        self._count_lock = threading.Lock()
        self._jobs: ThreadPoolExecutor | None = None
        """Runs each round's start-stage job (see :meth:`_start`) beside the current connection's task stream."""
        self.contributed_rounds: list[int] = []
        self._work: Work | None = None
        self._trained: TrainedUpdate | None = None
        self._holds_control = False
        """Whether the learner's sigma_k is this process's own (set by a round it trained); until then the
        first round it trains adopts the server's sigma (see the module's notes on drift correction)."""
        self._uploader: Uploader | None = None
        """Uploads over the current connection (it remembers whether that aggregator has Send)."""
        self._encoding_buffer: np.ndarray | None = None
        """Where each training round's update is encoded (and then masked in place): one buffer for the
        whole federation, because a fresh array per round can cost more in page faults than the encoding."""

    # ------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask `run` to return (from another thread)."""
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()

    def run(self) -> int:
        """Connect and follow the task stream until FINISHED; 0 on a finished federation."""
        with self._dial() as channel:
            self._setup(_stub(channel))
        return self._follow()

    def _dial(self) -> grpc.Channel:
        """A new mutual-TLS channel to the aggregator."""
        return secure_channel(self.config.aggregator, self.files, aggregator_name=self.config.aggregator_name)

    def _setup(self, stub: pb_grpc.FederationStub) -> None:
        # Joined without naming the federation, so that another federation's aggregator answers with
        # its id (compared below, named in the message) rather than a generic refusal of the binding.
        join = make_binding("", 0, pb.STAGE_JOIN)
        reply = self.backoff.call(
            "fetching the plan", lambda: stub.GetPlan(pb.PlanRequest(binding=join), timeout=RPC_SECONDS)
        )
        try:
            served = json_object(reply.settings, "the aggregator's plan")
            self.shared = load_shared_settings(reply.settings)
        except ConfigError as error:
            raise PermanentFailure(PLAN_MISMATCH, reason=error) from None
        ours, theirs = self.config.federation, self.shared.federation_id
        if ours is not None and theirs != ours:
            raise PermanentFailure(FEDERATION_MISMATCH, address=self.config.aggregator, theirs=theirs, ours=ours)
        if self.config.manifest is not None:
            try:
                check_shared_settings(self.config.manifest, self.shared, served)
            except ConfigError as error:
                raise PermanentFailure(PLAN_MISMATCH, reason=error) from None
        factory = self.shared.model.factory
        if factory is not None and factory not in self.config.factories:
            # Checked before anything is built: a plan is data, and only this institution's own config
            # may let it name code to run here.
            raise PermanentFailure(
                PLAN_MISMATCH,
                reason=f"it names the model factory '{factory}', which this institution does not allow, so it "
                f"was not imported; if you trust that code, list it in {self.config.source} under [model] "
                f"factories",
            )
        self.plan_digest = reply.plan_digest
        try:
            self._bindings = Bindings(self._kept_path("bindings.json"))
        except ConfigError as error:
            raise PermanentFailure(LOCAL_BINDINGS, reason=error, config=self.config.source) from None
        self.trainer: RoundTrainer | None = None
        self.learner: LocalLearner | None = None
        self.parameters = 0
        if self.shared.schema is None:
            self._prepare(load_local_data(self.config, self.shared, self._table), self.shared)
        else:
            # The table is checked now, before any round; it is encoded once the statistics of every
            # site's table arrive with the first TRAIN stage (fedfair.runtime.preprocessing).
            self.schema_table = check_schema_table(self.config, self.shared, self._table)
            self.statistics = statistics_vector(self.shared.schema, self.schema_table.train, self.schema_table.source)
            logger.info(
                "%s: joined federation %s (secure aggregation %s); %d training and %d held-out rows fit the "
                "plan's schema; waiting for the federation's statistics",
                self.config.name,
                self.shared.federation_id,
                "on" if self.shared.secure_aggregation.enabled else "OFF",
                len(self.schema_table.train),
                len(self.schema_table.test),
            )
        self.participant = self._participant()

    def _participant(self) -> Participant:
        return Participant(
            self.config.name,
            self.shared,
            self.parameters,
            self._identity_key,
            self._credential,
            self._verify,
            self.config.manifest,
        )

    def _encode_with(self, stub: pb_grpc.FederationStub, task: pb.Task) -> None:
        """Take the federation's encoder (the TRAIN stage's input under a [schema]), encode this
        institution's table with it and build the learner for the model it implies."""
        schema = self.shared.schema
        assert schema is not None
        if task.input_size <= 0:
            raise WireError("the TRAIN stage carries no encoder although the plan has a [schema]")
        try:
            encoder = read_encoder_payload(self._input(stub, task), schema)
        except ConfigError as error:
            raise WireError(str(error)) from None
        self.encoder = encoder
        self._prepare(
            encoded_data(self.config, self.schema_table, encoder),
            dataclasses.replace(self.shared, model=model_for(self.shared.model, encoder, self.config.factories)),
        )
        self.participant = self._participant()

    def _prepare(self, data: LocalData, shared: SharedSettings) -> None:
        """Build the round trainer and the evaluation model for this institution's encoded data."""
        self.data = data
        learner = build_learner(data, shared, self.device, self.config.factories, name=self.config.name)
        # Kept for the whole process: it holds the drift correction's sigma_k across rounds.
        self.learner = learner
        try:
            self.trainer = self.trainer_factory(learner, self.config, shared)
        except PermanentFailure:
            raise
        except ConfigError as error:  # [privacy] settings, or the accountant's state file
            raise PermanentFailure(LOCAL_PRIVACY, reason=error, config=self.config.source) from None
        self.parameters = int(flat_parameters(learner.model).numel())
        self.evaluation_model = shared.model.build(allowed=self.config.factories).to(self.device)
        logger.info(
            "%s: joined federation %s (secure aggregation %s); %d training rows, batch %d, %d held-out rows, device %s",
            self.config.name,
            self.shared.federation_id,
            "on" if self.shared.secure_aggregation.enabled else "OFF",
            data.train.size,
            learner.batch_size,
            data.test.size,
            self.device,
        )

    def _follow(self) -> int:
        """Follow the task stream to FINISHED, reconnecting after a lost aggregator on this
        collaborator's back-off policy until an outage outlasts its bound."""
        after = make_binding(self.shared.federation_id, 0, pb.STAGE_JOIN)
        what = "following the task stream"
        attempt, since = 0, 0.0
        while not self._stop.is_set():
            # A new channel for every connection: a channel whose server went away reconnects on
            # gRPC's own back-off, which grows past a minute, so it, not this policy, would decide
            # when a restarted aggregator is found, and could outlast the policy's bound.
            # The round jobs of a connection use its channel, so they end (a job that lost the aggregator
            # fails its RPCs, training runs to its end) before the channel closes, and in the order started.
            with self._dial() as channel, ThreadPoolExecutor(1, f"{self.config.name}-round") as self._jobs:
                stub = _stub(channel)
                try:
                    self._stream = stub.WaitForTasks(pb.TaskRequest(after=after))
                    for task in self._stream:
                        attempt = 0
                        if task.plan_digest != self.plan_digest:
                            raise PermanentFailure(
                                PLAN_MISMATCH,
                                reason="it changed during the federation; restart this collaborator to fetch "
                                "the new plan",
                            )
                        if task.action == pb.ACTION_FINISHED:
                            logger.info("%s: the federation has finished", self.config.name)
                            self._receive_bundle(stub, task)
                            return 0
                        if self._handle(stub, task):
                            after = task.binding
                    failure = Failure(CONNECTION_LOST, address=self.config.aggregator, reason="the task stream ended")
                except grpc.RpcError as error:
                    if self._stop.is_set():
                        break
                    failure = self.backoff.classify(error, what)
            if attempt == 0:
                since = time.monotonic()
            self.backoff.retry(attempt, since, failure, what)
            attempt += 1
        return 0

    # ------------------------------------------------------------ tasks

    def _handle(self, stub: pb_grpc.FederationStub, task: pb.Task) -> bool:
        """Carry out one task; False if an RPC of it failed, so it does not count as done."""
        binding = task.binding
        if task.action == pb.ACTION_ABORTED:
            if self._work is not None and self._work.round == binding.round:
                logger.info("%s: round %d was aborted by the aggregator", self.config.name, binding.round)
                self._work = None
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
            code = error.code()
            if code == grpc.StatusCode.PERMISSION_DENIED:
                raise self.backoff.classify(error, "taking part") from None
            stage = pb.Stage.Name(binding.stage)
            if code in RETRYABLE:
                # The aggregator is gone (killed, restarting) or unreachable: its resumed process
                # re-runs this round, or this one continues it, so the round's work is kept.
                logger.warning(
                    "%s: round %d %s: lost the aggregator (%s); keeping this round's work",
                    self.config.name,
                    binding.round,
                    stage,
                    code.name,
                )
            else:
                # A closed stage is usual, not a failure: it ends once the protocol has enough answers.
                closed = code == grpc.StatusCode.FAILED_PRECONDITION
                logger.log(
                    logging.INFO if closed else logging.WARNING,
                    "%s: round %d %s: %s; skipping the rest of the round",
                    self.config.name,
                    binding.round,
                    stage,
                    "the stage had already closed" if closed else f"the aggregator refused or failed ({code.name})",
                )
                self._work = None
            return False
        except BindingRefused as error:
            logger.warning(
                "%s: round %d %s: not contributing: %s", self.config.name, binding.round, pb.Stage.Name(binding.stage), error
            )
            self._work = None
            return True
        except WireError as error:
            # A malformed model from the aggregator: sit the round out rather than crash.
            logger.warning(
                "%s: round %d %s: the aggregator sent a malformed message (%s); skipping the rest of the round",
                self.config.name,
                binding.round,
                pb.Stage.Name(binding.stage),
                error,
            )
            self._work = None
            return False
        return True

    def _start(self, stub: pb_grpc.FederationStub, binding: pb.Binding, stages: Stages) -> None:
        """Download the round's model now, then compute the contribution (train or evaluate, then
        encode) as a job beside the task stream, so that the key stages, which need none of it, run
        while it does: with real training their round trips, agreements and signatures hide behind it.
        The download stays on the task's own path: a failure there is the task's, and it does not
        compete with the key stages for the network and the aggregator.

        Jobs run one at a time, in the order started: a round the aggregator re-runs while this
        process still trains it waits for that training, and then re-sends its outcome. Without
        secure aggregation there are no key stages to run beside the job, so it runs here: handing
        it to another thread would only add two waits for the interpreter lock.
        """
        assert self._jobs is not None  # _follow handles tasks inside a connection's executor
        job = self._train(stub, binding) if stages is TRAINING else self._evaluate(stub, binding)
        if not self.shared.secure_aggregation.enabled:
            self._work = job()
            return
        self._work = Work(binding.round, stages, None, 0.0)
        self._work.pending = self._jobs.submit(job)

    def _download(
        self, stub: pb_grpc.FederationStub, binding: pb.Binding, max_values: int | None = None
    ) -> tuple[np.ndarray, float]:
        """(values, c) of the stage's model; values is theta, at most `max_values` long (default: the model's)."""
        parts = stub.DownloadModel(pb.FetchRequest(binding=binding), timeout=RPC_SECONDS)
        self._count(binding.round, pb.FetchRequest(binding=binding).ByteSize())
        return read_model(parts, binding, max_values=self.parameters if max_values is None else max_values)

    def _train(self, stub: pb_grpc.FederationStub, binding: pb.Binding) -> Callable[[], Work]:
        """Download this round's model; return the job that makes its contribution: trained on that
        model, or re-sent if this round already trained on exactly this model (the aggregator
        crashed and re-runs the round)."""
        corrects_drift = self.shared.training.corrects_drift
        values, c = self._download(stub, binding, training_download_size(self.parameters, corrects_drift))
        try:
            theta, control = split_training_download(values, self.parameters, corrects_drift)
        except ConfigError as error:
            raise WireError(str(error)) from None
        model = model_digest(values, c)
        view = self._view_of(binding.round, "train", model)

        def job() -> Work:
            trained = self._trained
            if trained is not None and (trained.round, trained.model) == (binding.round, model):
                logger.info(
                    "%s: round %d is run again on the model already trained on; re-sending that update",
                    self.config.name,
                    binding.round,
                )
            else:
                server_control = None if control is None else torch.from_numpy(control)
                trained = self._train_on(stub, binding, model, torch.from_numpy(theta), c, server_control)
                self._trained = trained
            work = self._contribution(trained)
            work.view = view
            return work

        return job

    def _view_of(self, round_number: int, kind: str, model: str) -> SignedView:
        """The survivor set an input of this kind and model is bound to, in every session and round, across
        restarts (:mod:`fedfair.runtime.collaborator.bindings`); BindingRefused for a round older than one
        this institution already contributed to."""
        return self._bindings.view(round_number, kind, model)

    def _train_on(
        self,
        stub: pb_grpc.FederationStub,
        binding: pb.Binding,
        model: str,
        theta: torch.Tensor,
        c: float,
        control: torch.Tensor | None = None,
    ) -> TrainedUpdate:
        """Run this round's local training on (theta, c) and, with drift correction, the server's
        control variate sigma: the only place the trainer advances.

        A spent privacy budget is reported to the aggregator (BUDGET_SPENT); with
        share_epsilon, so is the cumulative epsilon after each private round. The
        private learner logs its own privacy line, so none is logged here.
        """
        round_number = binding.round
        nothing = TrainedUpdate(round_number, model, None, 0.0)
        started = time.perf_counter()
        assert self.trainer is not None  # _handle builds it before the first TRAIN
        learner = self.learner  # None for a trainer that brings no learner of fedfair's (benchmarks/round_bench.py)
        if control is not None and not self._holds_control and learner is not None and learner.control is not None:
            # A fresh process has no sigma_k of its own: it starts from the server's (module notes).
            learner.control = control.to(learner.control.device, torch.float64).clone()
        self._holds_control = True
        try:
            update = self.trainer.train_round(theta, c, control)
        except PrivacyBudgetExhausted as error:
            logger.warning("%s: round %d: not contributing: %s", self.config.name, round_number, error)
            self._report(stub, binding, pb.COLLABORATOR_STATUS_BUDGET_SPENT)
            return nothing
        except FedfairError as error:
            logger.warning("%s: round %d: not contributing: %s", self.config.name, round_number, error)
            return nothing
        influence = self.shared.influence
        batch = int(update.weight)
        update = bounded(
            update, influence.weight_of(self.config.name, self.shared.training.batch_fraction), influence.update_norm
        )
        vector = update.weighted_vector().numpy()
        if self.config.share_epsilon and isinstance(self.trainer, PrivateLearner):
            spent = self.trainer.last_report
            if spent is not None:
                self._report(stub, binding, pb.COLLABORATOR_STATUS_PRIVACY_SPENT_REPORT, spent.epsilon)
        if not np.isfinite(vector).all() or not np.isfinite(update.weight):
            logger.error(
                "%s: round %d: the local update has NaN or Inf; refusing to contribute it (check the "
                "learning rate); withdrawing from this round",
                self.config.name,
                round_number,
            )
            return nothing
        expected = update_dimension(self.parameters, self.shared.training.corrects_drift)
        if vector.size != expected:
            logger.error(
                "%s: round %d: the trainer's update holds %d values, but the plan's [training] drift_correction = "
                '"%s" makes a round\'s vector %d long; this collaborator\'s trainer does not follow the plan (a '
                "custom trainer, or an older fedfair): withdrawing from this round; run a trainer built from the "
                "plan's settings (fedfair.runtime.collaborator.trainer.build_learner)",
                self.config.name,
                round_number,
                vector.size,
                self.shared.training.drift_correction,
                expected,
            )
            return nothing
        if update.control is not None:
            problem = control_beyond_clip(vector, update.weight, self.shared.secure_aggregation.clip)
            if problem:
                logger.error("%s: round %d: %s; withdrawing from this round", self.config.name, round_number, problem)
                return nothing
        logger.info(
            "%s: round %d: trained %d local steps on batches of %d in %.3f s",
            self.config.name,
            round_number,
            self.shared.training.local_steps,
            batch,
            time.perf_counter() - started,
        )
        kept = np.array(vector, dtype=np.float64)
        kept.setflags(write=False)  # it may be sent again: nothing downstream may change it in place
        return TrainedUpdate(round_number, model, kept, float(update.weight))

    def _contribution(self, trained: TrainedUpdate) -> Work:
        """The round's work for a training outcome, bounded as the plan's encoding bounds it."""
        round_number, weight = trained.round, trained.weight
        if trained.vector is None:
            return Work(round_number, TRAINING, None, 0.0)
        settings = self.shared.secure_aggregation
        if settings.enabled:
            work = Work(round_number, TRAINING, trained.vector, weight)
            # Encoding needs only the update, so it is done now rather than on the MASKED_INPUT
            # stage's critical path; the round's own encoder checks the parameters again then.
            encoder = Encoder(settings.encoding(), self.shared.collaborator_count)
            buffer = self._encoding_buffer
            if buffer is None or buffer.size != trained.vector.size + 1 or buffer.dtype != encoder.dtype:
                buffer = self._encoding_buffer = np.empty(trained.vector.size + 1, dtype=encoder.dtype)
            # Rounds run one after another, so the last round's masked words, already sent or
            # abandoned with its Work, are free to overwrite.
            try:
                work.encoded = encoder.encode(trained.vector, weight, out=buffer)
            except ConfigError as error:
                logger.warning("%s: round %d: not contributing: %s", self.config.name, round_number, error)
                return Work(round_number, TRAINING, None, 0.0)
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
            return Work(round_number, TRAINING, None, 0.0)
        clipped = clip_plain_update(trained.vector, weight, settings.clip)
        changed = int(np.count_nonzero(clipped != trained.vector))
        if changed:
            logger.info(
                "%s: round %d: %d coordinates clipped to +-%g per unit of weight (the plan's clip)",
                self.config.name,
                round_number,
                changed,
                settings.clip,
            )
        return Work(round_number, TRAINING, clipped, weight)

    def _report(
        self, stub: pb_grpc.FederationStub, binding: pb.Binding, status: pb.CollaboratorStatus, epsilon: float | None = None
    ) -> None:
        """Tell the aggregator a status of this collaborator; a report that fails never stops training."""
        report = pb.StatusReport(binding=binding, status=status, epsilon=epsilon)
        try:
            stub.Report(report, timeout=RPC_SECONDS)
            self._count(binding.round, report.ByteSize())
        except grpc.RpcError as error:
            logger.warning(
                "%s: round %d: could not report %s to the aggregator (%s)",
                self.config.name,
                binding.round,
                pb.CollaboratorStatus.Name(status),
                error.code().name,
            )

    def _statistics_round(self, binding: pb.Binding) -> bool:
        """Whether `binding` is the statistics aggregation before round 1 (plans with a [schema])."""
        return self.shared.schema is not None and binding.round == STATISTICS_ROUND

    def _ensure_encoded(self, stub: pb_grpc.FederationStub, task: pb.Task) -> None:
        """Under a [schema], encode this institution's table with the federation's encoder, which the
        first start stage (TRAIN or EVALUATE) this process sees carries; a no-op once encoded."""
        if self.trainer is None:
            self._encode_with(stub, task)

    def _evaluate(self, stub: pb_grpc.FederationStub, binding: pb.Binding) -> Callable[[], Work]:
        """Download the model to evaluate (none for the statistics aggregation); return the job that
        makes this institution's answers."""
        if self._statistics_round(binding):
            # The statistics of this institution's table (counts and sums only), summed with every
            # other site's before training; no model is involved.
            statistics = Work(binding.round, EVALUATION, self.statistics, 1.0)
            statistics.view = self._view_of(binding.round, "statistics", STATISTICS_KIND)
            return lambda: statistics
        theta, c = self._download(stub, binding)  # the evaluation's thresholds depend on the plan, not on c
        view = self._view_of(binding.round, "evaluate", model_digest(theta, c))

        def job() -> Work:
            try:
                answers = self._evaluation_answers(torch.from_numpy(theta))
            except ConfigError as error:
                logger.warning("%s: round %d evaluation: not contributing: %s", self.config.name, binding.round, error)
                return Work(binding.round, EVALUATION, None, 0.0)
            work = Work(binding.round, EVALUATION, answers, 1.0)
            work.view = view
            return work

        return job

    def _evaluation_answers(self, theta: torch.Tensor) -> np.ndarray:
        """This institution's answers to the evaluation's threshold queries on its held-out losses
        (the thresholds are its own copy of the plan's, so the aggregator cannot choose them)."""
        result = evaluate(self.evaluation_model, theta, self.data.test)
        return sums.local_answers(result.losses, 1.0 - result.correct, self.shared.evaluation.thresholds())

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
            if work.vector is None and work.pending is None:
                raise RoundRefused("nothing to contribute this round")
            inputs = self._input(stub, task)
            payload = STEPS[binding.stage](self.participant, work, inputs)
        except (RoundRefused, ProtocolError, ConfigError, WireError) as error:
            logger.warning(
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

    def _kept_path(self, suffix: str) -> Path:
        """A file this collaborator keeps for one federation: beside its config, NAME.FEDERATION.SUFFIX."""
        return self.config.source.parent / f"{self.config.name}.{self.shared.federation_id}.{suffix}"

    def bundle_path(self) -> Path:
        """Where this collaborator keeps the federation's final model bundle: beside its config,
        one per federation, as it keeps its privacy accountant."""
        return self._kept_path(BUNDLE_SUFFIX)

    def _receive_bundle(self, stub: pb_grpc.FederationStub, task: pb.Task) -> None:
        """Fetch the final model bundle the FINISHED task offers and keep it, checked as `fedfair predict`
        would load it (plain tensors and JSON only); a failure costs the file, never the finished run."""
        if task.input_size <= 0:
            return
        path = self.bundle_path()
        try:
            payload = self._input(stub, task)
            atomic_write(path, lambda stream: stream.write(payload))
            load_bundle(path)
        except (grpc.RpcError, WireError, ConfigError, OSError) as error:
            path.unlink(missing_ok=True)
            reason = error.code().name if isinstance(error, grpc.RpcError) else str(error)
            logger.warning(
                "%s: could not keep the federation's model bundle (%s); ask the aggregator's operator for "
                "model_bundle.pt from its output folder",
                self.config.name,
                reason,
            )
            return
        logger.info(
            "%s: the federation's model bundle is in %s (use it: fedfair predict --model %s --data TABLE "
            "--out PREDICTIONS.csv)",
            self.config.name,
            path,
            path,
        )

    def _input(self, stub: pb_grpc.FederationStub, task: pb.Task) -> bytes:
        """The input of `task`'s stage: the one the task carries, or else fetched."""
        carried = inline_input(task)
        if carried is not None:
            return carried
        request = pb.FetchRequest(binding=task.binding)
        self._count(task.binding.round, request.ByteSize())
        # The task announced the size; anything longer is refused before it is buffered.
        _, payload = read_payload(
            stub.Fetch(request, timeout=RPC_SECONDS), max_total_bytes=task.input_size, binding=task.binding
        )
        return payload

    def _submit(self, stub: pb_grpc.FederationStub, binding: pb.Binding, payload: bytes) -> None:
        """Upload this stage's payload (see :class:`Uploader`), counting the bytes sent."""

        def count(part: pb.Part) -> None:
            self._count(binding.round, part.ByteSize())

        if self._uploader is None or self._uploader.stub is not stub:
            self._uploader = Uploader(stub)  # a new connection: its aggregator may have Send
        self._uploader.upload(binding, payload, timeout=RPC_SECONDS, on_part=count)

    def _count(self, round_number: int, size: int) -> None:
        with self._count_lock:  # the task stream and the start stage's job both send
            self.uploaded_bytes[round_number] = self.uploaded_bytes.get(round_number, 0) + size
