"""The collaborator process: ``fedfair collaborator start --config collaborator/site-a.toml``.

One per institution. It loads its own data, checks its TLS files (and that its
configured name is the one its certificate carries), dials the aggregator over
mutual TLS, fetches the plan's shared settings and builds its learner exactly as
the in-process simulation builds client i (same model seed, same sampler seed), so
a federation over real processes follows the simulation step for step. Then it
follows the aggregator's task stream:

- TRAIN: download (theta_t, c_t) in bounded chunks and run `local.py`'s tau steps;
- ADVERTISE / SHARE / MASKED_INPUT / UNMASK: the secure-aggregation client's steps,
  with its mTLS private key as its identity key (with secure aggregation off, only
  MASKED_INPUT, carrying the plain float64 vector);
- EVALUATE and EVAL_*: the same steps over its answers to the evaluation's threshold
  queries on its held-out losses (`fedfair.fairness.sums`);
- ABORTED: forget the round; FINISHED: exit.

It never sends a per-sample value: only secure-aggregation messages whose size is
fixed by the model (or the evaluation vector) and the number of collaborators. An
update with NaN or Inf is refused before masking (the collaborator withdraws from
the round). Lost connections are retried with jittered exponential back-off, a
bounded number of times; nothing waits on a fixed sleep. A restarted collaborator
rejoins at the next round.

Privacy hook: the `trainer_factory` argument of :class:`Collaborator` (default
`fedfair.runtime.collaborator.trainer.round_trainer`) turns the plain `LocalLearner` into what trains each round;
with `[privacy] enabled = true` it wraps it in `fedfair.privacy.learner.PrivateLearner`.
"""

from __future__ import annotations

import argparse
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np
import torch
from cryptography.hazmat.primitives import serialization

from fedfair import pki
from fedfair.core.device import device_for
from fedfair.core.errors import ConfigError, FedfairError
from fedfair.core.evaluation import evaluate
from fedfair.core.models import build_model, flat_parameters
from fedfair.fairness import sums as evaluation
from fedfair.privacy.learner import PrivateLearner
from fedfair.runtime.collaborator.trainer import (
    TrainerFactory,
    build_learner,
    load_local_data,
    round_trainer,
)
from fedfair.runtime.contract import EVALUATION, TRAINING, RoundParameters, Stages
from fedfair.runtime.faults import maybe_die
from fedfair.runtime.logs import configure_logging
from fedfair.runtime.plan import (
    CollaboratorConfig,
    load_collaborator_config,
    load_shared_settings,
)
from fedfair.runtime.transport import (
    DEFAULT_CHUNK_BYTES,
    TlsFiles,
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
from fedfair.secagg import Client, Encoder, EncodingConfig
from fedfair.secagg.errors import ProtocolError
from fedfair.secagg.messages import KeyDirectory, ShareBundle, UnmaskRequest

logger = logging.getLogger("fedfair.collaborator")

RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)
RPC_SECONDS = 60.0
"""Upper bound on one request besides a stage's own deadline (a stalled peer cannot hang us)."""

_STEPS = {
    stage: (stages, step)
    for stages in (TRAINING, EVALUATION)
    for step, stage in (
        ("advertise", stages.advertise),
        ("share", stages.share),
        ("masked", stages.masked),
        ("unmask", stages.unmask),
    )
}


class AggregatorUnreachable(FedfairError):
    """The aggregator could not be reached within the retry bound."""


# ---------------------------------------------------------------- retries


@dataclass(frozen=True)
class RetryPolicy:
    """Jittered exponential back-off: attempt k waits uniform(0.5, 1) * min(cap, base * 2^k)."""

    attempts: int = 8
    base_seconds: float = 0.5
    cap_seconds: float = 15.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.5, 1.0) * min(self.cap_seconds, self.base_seconds * 2.0**attempt)


_T = TypeVar("_T")


# ---------------------------------------------------------------- one round's work


@dataclass
class Work:
    """What the collaborator contributes to one aggregation, and its secure-aggregation state."""

    round: int
    stages: Stages
    vector: np.ndarray | None
    weight: float
    client: Client | None = None
    withdrawn: bool = False
    encoded: np.ndarray | None = None
    """The fixed-point encoding of (vector, weight), made while the key stages run."""


class RoundRefused(FedfairError):
    """This collaborator does not take part in the rest of the round (it withdraws)."""


class Collaborator:
    """One institution's process: connect, follow tasks, train, mask, submit."""

    def __init__(
        self,
        config: CollaboratorConfig,
        *,
        trainer_factory: TrainerFactory = round_trainer,
        retry: RetryPolicy = RetryPolicy(),
    ) -> None:
        self.config = config
        self.trainer_factory = trainer_factory
        self.retry = retry
        self.files = TlsFiles(config.certificates.ca, config.certificates.cert, config.certificates.key)
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
        self._random = random.Random()
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
            stub = pb_grpc.FederationStub(channel)
            self._setup(stub)
            return self._follow(stub)

    def _setup(self, stub: pb_grpc.FederationStub) -> None:
        join = make_binding(self.config.federation or "", 0, pb.STAGE_JOIN)
        reply = self._retrying(
            "fetching the plan", lambda: stub.GetPlan(pb.PlanRequest(binding=join), timeout=RPC_SECONDS)
        )
        self.shared = load_shared_settings(reply.settings)
        if self.config.federation is not None and self.shared.federation_id != self.config.federation:
            raise ConfigError(
                f"{self.config.source}: the aggregator runs federation {self.shared.federation_id!r}, not "
                f"{self.config.federation!r}; check [collaborator] aggregator and federation"
            )
        self.plan_digest = reply.plan_digest
        self.federation_id = self.shared.federation_id
        self._prepare()

    def _prepare(self) -> None:
        """Load this institution's data and build the round trainer and the evaluation model."""
        data = load_local_data(self.config, self.shared)
        self.data = data
        learner = build_learner(data, self.shared, self.device)
        self.trainer = self.trainer_factory(learner, self.config, self.shared)
        self.parameters = int(flat_parameters(learner.model).numel())
        self.evaluation_model = build_model(
            self.shared.model.name,
            self.shared.model.features,
            self.shared.model.classes,
            image_shape=self.shared.model.image_shape,
        ).to(self.device)
        logger.info(
            "%s: joined federation %s (secure aggregation %s); %d training rows, batch %d, %d held-out rows, device %s",
            self.config.name,
            self.federation_id,
            "on" if self.shared.secure_aggregation.enabled else "OFF",
            data.train.size,
            learner.batch_size,
            data.test.size,
            self.device,
        )

    def _follow(self, stub: pb_grpc.FederationStub) -> int:
        after = make_binding(self.federation_id, 0, pb.STAGE_JOIN)
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
                    raise _refusal(error, "following the task stream") from None
            failures += 1
            if failures > self.retry.attempts:
                raise AggregatorUnreachable(
                    f"lost the aggregator at {self.config.aggregator} and {self.retry.attempts} reconnections "
                    "failed; check that it is running, then start this collaborator again"
                )
            self._wait(failures - 1, "the task stream ended")
        return 0

    def _wait(self, attempt: int, why: str) -> None:
        delay = self.retry.delay(attempt, self._random)
        logger.info("%s: %s; retrying in %.1f s", self.config.name, why, delay)
        self._stop.wait(delay)

    def _retrying(self, what: str, call: Callable[[], _T]) -> _T:
        """`call()`, retried with back-off while the aggregator is unavailable."""
        for attempt in range(self.retry.attempts + 1):
            try:
                return call()
            except grpc.RpcError as error:
                if error.code() not in RETRYABLE or attempt == self.retry.attempts or self._stop.is_set():
                    raise _refusal(error, what) from None
                self._wait(attempt, f"the aggregator is unavailable while {what}")
        raise AssertionError("unreachable: the loop returns or raises")

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
            elif binding.stage in _STEPS:
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
                raise _refusal(error, "taking part") from None

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
            _, encoding = self._expected(work)
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
        return evaluation.local_answers(result.losses, 1.0 - result.correct, evaluation.threshold_grid(c))

    def _step(self, stub: pb_grpc.FederationStub, task: pb.Task) -> None:
        binding = task.binding
        stages, step = _STEPS[binding.stage]
        work = self._work
        if work is None or work.round != binding.round or work.stages is not stages:
            # A task for a round this process did not start (it restarted mid-round): sit it out.
            self._submit(stub, binding, b"")
            return
        if work.withdrawn:
            return
        try:
            if work.vector is None:
                raise RoundRefused("nothing to contribute this round")
            inputs = self._fetch(stub, binding, task.input_size)
            payload = getattr(self, f"_{step}")(work, binding, inputs)
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
        if step == "masked" and stages is TRAINING:
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

    # ------------------------------------------------------------ the four secure-aggregation steps

    def _expected(self, work: Work) -> tuple[int, EncodingConfig]:
        if work.stages is EVALUATION:
            return evaluation.vector_length(), evaluation.ENCODING
        secure = self.shared.secure_aggregation
        encoding = EncodingConfig(
            clip=secure.clip,
            max_weight=secure.max_weight,
            fractional_bits=secure.fractional_bits,
            modulus_bits=secure.modulus_bits,
        )
        return self.parameters + 1, encoding

    def _check_parameters(self, work: Work, inputs: bytes) -> RoundParameters:
        """The round's parameters, refused unless they are what this collaborator's plan implies."""
        parameters = RoundParameters.from_bytes(inputs)
        dimension, encoding = self._expected(work)
        secure = self.shared.secure_aggregation
        problems = [
            what
            for what, wrong in (
                ("kind", parameters.kind != ("evaluate" if work.stages is EVALUATION else "train")),
                ("round", parameters.round != work.round),
                ("secure aggregation", parameters.secure != secure.enabled),
                ("roster", self.config.name not in parameters.parties),
                ("quorum", len(parameters.parties) < self.shared.quorum.min_collaborators),
                ("dimension", parameters.dimension != dimension),
                ("encoding", parameters.encoding != encoding),
                ("threshold", parameters.threshold != secure.threshold),
                ("neighbours", parameters.neighbours != (secure.neighbours or None)),
            )
            if wrong
        ]
        if problems:
            raise RoundRefused(f"the round's parameters differ from the plan ({', '.join(problems)})")
        return parameters

    def _advertise(self, work: Work, binding: pb.Binding, inputs: bytes) -> bytes:
        parameters = self._check_parameters(work, inputs)
        config = parameters.secagg_config(self.federation_id, work.stages)
        work.client = Client(config, self.config.name, self._identity_key, self._credential, self._verify)
        return work.client.advertise().to_bytes()

    def _share(self, work: Work, binding: pb.Binding, inputs: bytes) -> bytes:
        if work.client is None:
            raise RoundRefused("no keys were advertised this round")
        return work.client.share_keys(KeyDirectory.from_bytes(inputs)).to_bytes()

    def _masked(self, work: Work, binding: pb.Binding, inputs: bytes) -> bytes:
        assert work.vector is not None  # checked by _step
        if not self.shared.secure_aggregation.enabled:
            self._check_parameters(work, inputs)
            return np.append(work.vector, work.weight).astype("<f8").tobytes()
        if work.client is None:
            raise RoundRefused("no keys were shared this round")
        encoded = (
            work.encoded if work.encoded is not None else work.client.config.encoder.encode(work.vector, work.weight)
        )
        work.encoded = None  # masked in place: never reuse it
        return work.client.masked_input(ShareBundle.from_bytes(inputs), encoded).to_bytes()

    def _unmask(self, work: Work, binding: pb.Binding, inputs: bytes) -> bytes:
        if work.client is None:
            raise RoundRefused("no masked input was sent this round")
        return work.client.unmask(UnmaskRequest.from_bytes(inputs)).to_bytes()


def _refusal(error: grpc.RpcError, what: str) -> FedfairError:
    """A gRPC failure as one actionable line."""
    code = error.code()
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return ConfigError(
            f"the aggregator refused this collaborator while {what}: its certificate is not on the plan's "
            "allow-list or not from the federation's CA; ask the operator"
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        return AggregatorUnreachable(
            f"the aggregator is unreachable while {what} ({error.details()}); check the address, that it "
            "runs, and that its certificate name matches aggregator_name"
        )
    return FedfairError(f"the aggregator answered {code.name} while {what}: {error.details()}")


# ---------------------------------------------------------------- command line


def _start_command(args: argparse.Namespace) -> int:
    configure_logging()
    config = load_collaborator_config(args.config)
    collaborator = Collaborator(config)
    try:
        return collaborator.run()
    except KeyboardInterrupt:
        collaborator.stop()
        return 130


def register_commands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    group = subparsers.add_parser("collaborator", help="take part in a federation as one institution")
    commands = group.add_subparsers(dest="collaborator_command", required=True, metavar="COMMAND")
    start = commands.add_parser("start", help="connect to the aggregator and train on local data")
    start.add_argument("--config", type=Path, required=True, help="this institution's collaborator.toml")
    start.set_defaults(handler=_start_command)
