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
the round). Lost connections are retried with jittered exponential back-off, a
bounded number of times (:mod:`fedfair.runtime.collaborator.retries`). A restarted
collaborator rejoins at the next round.

Privacy hook: the `trainer_factory` argument of :class:`Collaborator` (default
`fedfair.runtime.collaborator.trainer.round_trainer`) turns the plain `LocalLearner` into what trains each round;
with `[privacy] enabled = true` it wraps it in `fedfair.privacy.learner.PrivateLearner`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
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
from fedfair.runtime.collaborator.steps import STEPS, Participant, RoundRefused, Work
from fedfair.runtime.collaborator.trainer import (
    TrainerFactory,
    build_learner,
    load_local_data,
    round_trainer,
)
from fedfair.runtime.contract import EVALUATION, TRAINING
from fedfair.runtime.faults import maybe_die
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
        self._verify = pki.credential_verifier(pki.load_certificate(self.files.ca), "collaborator")
        self._stop = threading.Event()
        self.backoff = Backoff(retry, config.name, self._stop)
        self._stream: Any = None
        self.uploaded_bytes: dict[int, int] = {}
        """Bytes of every request sent, per round (what leaves the institution)."""
        self.contributed_rounds: list[int] = []
        self._work: Work | None = None

    # ------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask `run` to return (from another thread)."""
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()

    def run(self) -> int:
        """Connect and follow the task stream until FINISHED; 0 on a finished federation."""
        with secure_channel(self.config.aggregator, self.files, aggregator_name=self.config.aggregator_name) as channel:
            stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]  # protoc's code is untyped
            self._setup(stub)
            return self._follow(stub)

    def _setup(self, stub: pb_grpc.FederationStub) -> None:
        join = make_binding(self.config.federation or "", 0, pb.STAGE_JOIN)
        reply = self.backoff.call(
            "fetching the plan", lambda: stub.GetPlan(pb.PlanRequest(binding=join), timeout=RPC_SECONDS)
        )
        self.shared = load_shared_settings(reply.settings)
        if self.config.federation is not None and self.shared.federation_id != self.config.federation:
            raise ConfigError(
                f"{self.config.source}: the aggregator runs federation {self.shared.federation_id!r}, not "
                f"{self.config.federation!r}; check [collaborator] aggregator and federation"
            )
        self.plan_digest = reply.plan_digest
        self._prepare()
        self.participant = Participant(
            self.config.name, self.shared, self.parameters, self._identity_key, self._credential, self._verify
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

    def _follow(self, stub: pb_grpc.FederationStub) -> int:
        after = make_binding(self.shared.federation_id, 0, pb.STAGE_JOIN)
        failures = 0
        while not self._stop.is_set():
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
                    self._handle(stub, task)
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

    def _handle(self, stub: pb_grpc.FederationStub, task: pb.Task) -> None:
        binding = task.binding
        if task.action == pb.ACTION_ABORTED:
            if self._work is not None and self._work.round == binding.round:
                logger.info("%s: round %d was aborted by the aggregator", self.config.name, binding.round)
                self._work = None
            return
        try:
            if binding.stage == pb.STAGE_TRAIN:
                self._work = self._train(stub, binding)
            elif binding.stage == pb.STAGE_EVALUATE:
                self._work = self._evaluate(stub, binding)
            elif binding.stage in STEPS:
                self._step(stub, task)
        except grpc.RpcError as error:
            code = error.code()
            logger.warning(
                "%s: round %d %s: the aggregator refused or failed (%s); skipping the rest of the round",
                self.config.name,
                binding.round,
                pb.Stage.Name(binding.stage),
                code.name,
            )
            self._work = None
            if code == grpc.StatusCode.PERMISSION_DENIED:
                raise refusal(error, "taking part") from None

    def _download(self, stub: pb_grpc.FederationStub, binding: pb.Binding) -> tuple[torch.Tensor, float]:
        parts = stub.DownloadModel(pb.FetchRequest(binding=binding), timeout=RPC_SECONDS)
        self._count(binding.round, pb.FetchRequest(binding=binding).ByteSize())
        theta, c = read_model(parts, binding, max_values=self.parameters)
        return torch.from_numpy(theta), c

    def _train(self, stub: pb_grpc.FederationStub, binding: pb.Binding) -> Work:
        theta, c = self._download(stub, binding)
        started = time.perf_counter()
        try:
            update = self.trainer.train_round(theta, c)
        except FedfairError as error:  # e.g. a spent privacy budget
            logger.warning("%s: round %d: not contributing: %s", self.config.name, binding.round, error)
            return Work(binding.round, TRAINING, None, 0.0)
        vector = update.weighted_vector().numpy()
        if isinstance(self.trainer, PrivateLearner):
            logger.info("%s: privacy spent so far: %s", self.config.name, self.trainer.report().describe())
        if not np.isfinite(vector).all() or not np.isfinite(update.weight):
            logger.error(
                "%s: round %d: the local update has NaN or Inf; refusing to contribute it (check the "
                "learning rate); withdrawing from this round",
                self.config.name,
                binding.round,
            )
            return Work(binding.round, TRAINING, None, 0.0)
        logger.info(
            "%s: round %d: trained %d local steps on batches of %d in %.3f s",
            self.config.name,
            binding.round,
            self.shared.training.local_steps,
            int(update.weight),
            time.perf_counter() - started,
        )
        work = Work(binding.round, TRAINING, vector, float(update.weight))
        if self.shared.secure_aggregation.enabled:
            # Encoding needs only the update, so it is done now rather than on the MASKED_INPUT
            # stage's critical path; the round's own encoder checks the parameters again then.
            encoding = self.shared.secure_aggregation.encoding()
            try:
                work.encoded = Encoder(encoding, self.shared.collaborator_count).encode(vector, work.weight)
            except ConfigError as error:
                logger.warning("%s: round %d: not contributing: %s", self.config.name, binding.round, error)
                return Work(binding.round, TRAINING, None, 0.0)
        return work

    def _evaluate(self, stub: pb_grpc.FederationStub, binding: pb.Binding) -> Work:
        theta, c = self._download(stub, binding)
        try:
            answers = self._evaluation_answers(theta, c)
        except ConfigError as error:
            logger.warning("%s: round %d evaluation: not contributing: %s", self.config.name, binding.round, error)
            return Work(binding.round, EVALUATION, None, 0.0)
        return Work(binding.round, EVALUATION, answers, 1.0)

    def _evaluation_answers(self, theta: torch.Tensor, c: float) -> np.ndarray:
        """This institution's answers to the evaluation's threshold queries on its held-out losses."""
        result = evaluate(self.evaluation_model, theta, self.data.test)
        return sums.local_answers(result.losses, 1.0 - result.correct, sums.threshold_grid(c))

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
        if binding.stage == TRAINING.masked:
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
