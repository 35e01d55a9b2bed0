"""The collaborator process: connect to the aggregator and follow its task stream.

One per institution (started by ``fedfair collaborator start``, see
:mod:`fedfair.runtime.collaborator.commands`). It loads its own data, checks its TLS
files (and that its configured name is the one its certificate carries), dials the
aggregator over mutual TLS, fetches the plan's shared settings and builds its
learner exactly as the in-process simulation builds client i (same model seed, same
sampler seed), so a federation over real processes follows the simulation step for
step. Then it follows the aggregator's task stream:

- TRAIN: download (theta_t, c_t) in bounded chunks and run the local learner's tau steps;
- ADVERTISE / SHARE / MASKED_INPUT / UNMASK: the secure-aggregation steps of
  :mod:`fedfair.runtime.collaborator.steps` (with secure aggregation off, only
  MASKED_INPUT, carrying the plain float64 vector);
- EVALUATE and EVAL_*: the same steps over its answers to the evaluation's threshold
  queries on its held-out losses (`fedfair.fairness.sums`);
- ABORTED: forget the round; FINISHED: exit.

It never sends a per-sample value: only secure-aggregation messages whose size is
fixed by the model (or the evaluation vector) and the number of collaborators. An
update with NaN or Inf is refused before masking (the collaborator withdraws from
the round); with secure aggregation off, the plain update is clipped exactly as the
encoding would clip it (each coordinate of the unweighted update to [-clip, clip]),
so the aggregator's bounds never refuse an honest one. Lost connections are retried
with jittered exponential back-off, a bounded number of times
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

Privacy hook: the `trainer_factory` argument of :class:`Collaborator` (default
`fedfair.runtime.collaborator.trainer.round_trainer`) turns the plain `LocalLearner` into what trains each round;
with `[privacy] enabled = true` it wraps it in `fedfair.privacy.learner.PrivateLearner`.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import torch
from cryptography.hazmat.primitives import serialization

from fedfair import pki
from fedfair.core.device import device_for
from fedfair.core.errors import ConfigError, FedfairError
from fedfair.core.evaluation import evaluate
from fedfair.core.models import flat_parameters
from fedfair.fairness import sums
from fedfair.privacy.learner import PrivateLearner
from fedfair.runtime.collaborator.config import CollaboratorConfig
from fedfair.runtime.collaborator.retries import (
    DEFAULT_RETRY_POLICY,
    RETRYABLE,
    AggregatorUnreachable,
    Backoff,
    RetryPolicy,
    refusal,
)
from fedfair.runtime.collaborator.steps import (
    STEPS,
    Participant,
    RoundRefused,
    SignedView,
    Work,
)
from fedfair.runtime.collaborator.trainer import (
    TrainerFactory,
    build_learner,
    load_local_data,
    round_trainer,
)
from fedfair.runtime.contract import EVALUATION, TRAINING, Stages
from fedfair.runtime.faults import maybe_die
from fedfair.runtime.manifest import (
    check_certificate,
    check_shared_settings,
    pinned_verifier,
)
from fedfair.runtime.plan import load_shared_settings
from fedfair.runtime.transport import (
    DEFAULT_CHUNK_BYTES,
    WireError,
    check_tls_files,
    make_binding,
    payload_parts,
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
    on. `vector` is [w * delta, w * delta_c], read-only (None: nothing to contribute this
    round, the trainer refused or the update was not finite); `weight` is w.
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


def _stub(channel: grpc.Channel) -> pb_grpc.FederationStub:
    return pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]  # protoc's code is untyped


class Collaborator:
    """One institution's process: connect, follow tasks, train, mask, submit."""

    def __init__(
        self,
        config: CollaboratorConfig,
        *,
        trainer_factory: TrainerFactory = round_trainer,
        retry: RetryPolicy = DEFAULT_RETRY_POLICY,
    ) -> None:
        self.config = config
        self.trainer_factory = trainer_factory
        self.files = config.certificates
        certified = check_tls_files(self.files, "collaborator")
        if certified != config.name:
            raise ConfigError(
                f"{config.source}: name = {config.name!r} but {self.files.cert} certifies {certified!r}; "
                "the aggregator knows this institution by its certificate, so make them the same"
            )
        self.device = device_for(config.device)
        self._identity_key = pki.load_private_key(self.files.key)
        self._credential = pki.load_certificate(self.files.cert).public_bytes(serialization.Encoding.DER)
        ca_certificate = pki.load_certificate(self.files.ca)
        if config.manifest is not None:
            # Peers are checked against the pinned fingerprints, not only the CA: a twin minted
            # by whoever holds the CA key is refused like a stranger.
            check_certificate(config.manifest, config.name, self._credential)
            self._verify = pinned_verifier(config.manifest, ca_certificate)
        else:
            self._verify = pki.credential_verifier(ca_certificate, "collaborator")
        self._stop = threading.Event()
        self.backoff = Backoff(retry, config.name, self._stop)
        self._stream: Any = None
        self.uploaded_bytes: dict[int, int] = {}
        """Bytes of every request sent, per round (what leaves the institution)."""
        self.contributed_rounds: list[int] = []
        self._work: Work | None = None
        self._trained: TrainedUpdate | None = None
        self._views: dict[tuple[int, int, str], SignedView] = {}
        """Per (round, kind, model): the survivors this collaborator signed for that input, in any session."""

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
        join = make_binding(self.config.federation or "", 0, pb.STAGE_JOIN)
        reply = self.backoff.call(
            "fetching the plan", lambda: stub.GetPlan(pb.PlanRequest(binding=join), timeout=RPC_SECONDS)
        )
        self.shared = load_shared_settings(reply.settings)
        if self.config.manifest is not None:
            check_shared_settings(self.config.manifest, self.shared)
        if self.config.federation is not None and self.shared.federation_id != self.config.federation:
            raise ConfigError(
                f"{self.config.source}: the aggregator runs federation {self.shared.federation_id!r}, not "
                f"{self.config.federation!r}; check [collaborator] aggregator and federation"
            )
        self.plan_digest = reply.plan_digest
        self._prepare()
        self.participant = Participant(
            self.config.name,
            self.shared,
            self.parameters,
            self._identity_key,
            self._credential,
            self._verify,
            self.config.manifest,
        )

    def _prepare(self) -> None:
        """Load this institution's data and build the round trainer and the evaluation model."""
        data = load_local_data(self.config, self.shared)
        self.data = data
        learner = build_learner(data, self.shared, self.device)
        self.trainer = self.trainer_factory(learner, self.config, self.shared)
        self.parameters = int(flat_parameters(learner.model).numel())
        self.evaluation_model = self.shared.model.build().to(self.device)
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
        collaborator's back-off policy, a bounded number of times in a row."""
        after = make_binding(self.shared.federation_id, 0, pb.STAGE_JOIN)
        failures = 0
        while not self._stop.is_set():
            # A new channel for every connection: a channel whose server went away reconnects on
            # gRPC's own back-off, which grows past a minute, so it, not this policy, would decide
            # when a restarted aggregator is found, and could outlast the policy's attempts.
            with self._dial() as channel:
                stub = _stub(channel)
                try:
                    self._stream = stub.WaitForTasks(pb.TaskRequest(after=after))
                    for task in self._stream:
                        failures = 0
                        if task.plan_digest != self.plan_digest:
                            raise ConfigError(
                                "the aggregator's plan changed during the federation; restart this "
                                "collaborator to fetch the new plan"
                            )
                        if task.action == pb.ACTION_FINISHED:
                            logger.info("%s: the federation has finished", self.config.name)
                            return 0
                        if self._handle(stub, task):
                            after = task.binding
                except grpc.RpcError as error:
                    if self._stop.is_set():
                        break
                    if error.code() not in RETRYABLE:
                        raise refusal(error, "following the task stream") from None
            failures += 1
            attempts = self.backoff.policy.attempts
            if failures > attempts:
                raise AggregatorUnreachable(
                    f"lost the aggregator at {self.config.aggregator} and {attempts} reconnections "
                    "failed; check that it is running, then start this collaborator again"
                )
            self.backoff.wait(failures - 1, "the task stream ended")
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
                self._work = self._train(stub, binding)
            elif binding.stage == pb.STAGE_EVALUATE:
                self._work = self._evaluate(stub, binding)
            elif binding.stage in STEPS:
                self._step(stub, task)
        except grpc.RpcError as error:
            code = error.code()
            if code == grpc.StatusCode.PERMISSION_DENIED:
                raise refusal(error, "taking part") from None
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

    def _download(self, stub: pb_grpc.FederationStub, binding: pb.Binding) -> tuple[np.ndarray, float]:
        parts = stub.DownloadModel(pb.FetchRequest(binding=binding), timeout=RPC_SECONDS)
        self._count(binding.round, pb.FetchRequest(binding=binding).ByteSize())
        return read_model(parts, binding, max_values=self.parameters)

    def _train(self, stub: pb_grpc.FederationStub, binding: pb.Binding) -> Work:
        """This round's contribution: trained on the downloaded model, or re-sent if this round
        already trained on exactly this model (the aggregator crashed and re-runs the round)."""
        theta, c = self._download(stub, binding)
        model = model_digest(theta, c)
        trained = self._trained
        if trained is not None and (trained.round, trained.model) == (binding.round, model):
            logger.info(
                "%s: round %d is run again on the model already trained on; re-sending that update",
                self.config.name,
                binding.round,
            )
        else:
            trained = self._train_on(binding.round, model, torch.from_numpy(theta), c)
            self._trained = trained
        work = self._contribution(trained)
        work.view = self._view_of(binding.round, TRAINING, model)
        return work

    def _view_of(self, round_number: int, stages: Stages, model: str) -> SignedView:
        """The survivor set an input of this round and model is bound to, shared by every session that carries it.

        A re-run round re-sends the same input; were it summed with two different sets of
        survivors, the aggregator could subtract the two sums and isolate whoever differs.
        """
        return self._views.setdefault((round_number, stages.session_offset, model), SignedView())

    def _train_on(self, round_number: int, model: str, theta: torch.Tensor, c: float) -> TrainedUpdate:
        """Run this round's local training on (theta, c): the only place the trainer advances."""
        nothing = TrainedUpdate(round_number, model, None, 0.0)
        started = time.perf_counter()
        try:
            update = self.trainer.train_round(theta, c)
        except FedfairError as error:  # e.g. a spent privacy budget
            logger.warning("%s: round %d: not contributing: %s", self.config.name, round_number, error)
            return nothing
        vector = update.weighted_vector().numpy()
        if isinstance(self.trainer, PrivateLearner):
            logger.info("%s: privacy spent so far: %s", self.config.name, self.trainer.report().describe())
        if not np.isfinite(vector).all() or not np.isfinite(update.weight):
            logger.error(
                "%s: round %d: the local update has NaN or Inf; refusing to contribute it (check the "
                "learning rate); withdrawing from this round",
                self.config.name,
                round_number,
            )
            return nothing
        logger.info(
            "%s: round %d: trained %d local steps on batches of %d in %.3f s",
            self.config.name,
            round_number,
            self.shared.training.local_steps,
            int(update.weight),
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
            try:
                work.encoded = Encoder(settings.encoding(), self.shared.collaborator_count).encode(
                    trained.vector, weight
                )
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

    def _evaluate(self, stub: pb_grpc.FederationStub, binding: pb.Binding) -> Work:
        theta, c = self._download(stub, binding)  # the evaluation's thresholds depend on the plan, not on c
        try:
            answers = self._evaluation_answers(torch.from_numpy(theta))
        except ConfigError as error:
            logger.warning("%s: round %d evaluation: not contributing: %s", self.config.name, binding.round, error)
            return Work(binding.round, EVALUATION, None, 0.0)
        work = Work(binding.round, EVALUATION, answers, 1.0)
        work.view = self._view_of(binding.round, EVALUATION, model_digest(theta, c))
        return work

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
            if work.vector is None:
                raise RoundRefused("nothing to contribute this round")
            inputs = self._fetch(stub, binding, task.input_size)
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

    def _fetch(self, stub: pb_grpc.FederationStub, binding: pb.Binding, size: int) -> bytes:
        request = pb.FetchRequest(binding=binding)
        self._count(binding.round, request.ByteSize())
        # The task announced the size; anything longer is refused before it is buffered.
        _, payload = read_payload(stub.Fetch(request, timeout=RPC_SECONDS), max_total_bytes=size, binding=binding)
        return payload

    def _submit(self, stub: pb_grpc.FederationStub, binding: pb.Binding, payload: bytes) -> None:
        def counted() -> Iterator[pb.Part]:
            for part in payload_parts(binding, payload, DEFAULT_CHUNK_BYTES):
                self._count(binding.round, part.ByteSize())
                yield part

        stub.Submit(counted(), timeout=RPC_SECONDS)

    def _count(self, round_number: int, size: int) -> None:
        self.uploaded_bytes[round_number] = self.uploaded_bytes.get(round_number, 0) + size
