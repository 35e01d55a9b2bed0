"""The methods FedSRCVaR is compared with, built on the same learning core.

Every baseline trains with `LocalLearner` on the plain mean loss and moves the server
with `FedSRCVaR.server_apply` (no threshold), so differences in results come from the method,
not from the plumbing. They differ in what the server must learn each round:

Why: docs/design.md, "Inside the research harness".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np
import torch

from fedfair.core import server
from fedfair.core.config import TrainingConfig
from fedfair.core.data import ClientData, client_batch_sizes, client_seed
from fedfair.core.errors import AggregateError, ConfigError
from fedfair.core.evaluation import evaluate
from fedfair.core.local import LocalLearner
from fedfair.core.update import Update
from fedfair.core.models import flat_parameters
from fedfair.research.task import Task
from fedfair.simulation.federation import Federation, history_sample
from fedfair.simulation.rounds import SimulationResult, make_learners, round_record, run_rounds

# Turns one round's updates and (when the method needs them) the collaborators'
# mean losses at theta_t into the sums server.apply consumes.
Combine = Callable[[list[Update], np.ndarray], server.Aggregate]


def project_onto_simplex(vector: np.ndarray) -> np.ndarray:
    """Euclidean projection onto {x : x >= 0, sum(x) = 1}.

    The projection is max(v - tau, 0) for the one tau that makes it sum to 1. With
    v sorted in decreasing order u, the coordinates kept positive are the first r,
    where r is the largest index with u_r > (sum_{i<=r} u_i - 1) / r.
    """
    values = np.asarray(vector, dtype=np.float64)
    if values.ndim != 1 or values.size == 0 or not np.isfinite(values).all():
        raise ConfigError(f"can only project a non-empty finite 1-D vector onto the simplex, got shape {values.shape}")
    # The projection of v - a is the projection of v; shifting the largest to 0 keeps
    # u_1 - (u_1 - 1) = 1 > 0 exact, where 1e17 - (1e17 - 1) would round to 0 and keep nothing.
    values = values - float(values.max())
    ordered = np.sort(values)[::-1]
    shifted_sums = np.cumsum(ordered) - 1.0
    ranks = np.arange(1, values.size + 1)
    kept = int(np.nonzero(ordered - shifted_sums / ranks > 0.0)[0][-1]) + 1
    tau = float(shifted_sums[kept - 1]) / kept
    return np.maximum(values - tau, 0.0)


def reweighted(updates: Sequence[Update], weights: np.ndarray) -> server.Aggregate:
    """The sums of the updates with the method's weights in place of b_k."""
    return server.Aggregate.of(
        replace(update, weight=float(weight)) for update, weight in zip(updates, weights, strict=True)
    )


class LossRows:
    """Which of a collaborator's training rows a round's loss evaluation reads.

    AFL, q-FedAvg and FedMinMax need losses at theta_t every round: exactly, one forward
    pass over all n_k rows (`rows` = 0, as the methods are published), which on a large
    federation costs more than the training steps themselves. With `rows` = m > 0 each
    round reads a fresh seeded draw of min(m, n_k) rows without replacement instead: an
    unbiased estimate of the mean loss (and, reweighted by n_k / m, of loss sums), the
    stochastic form these methods' analyses allow.
    """

    @staticmethod
    def check(rows: int) -> None:
        """Refuse a row count that is neither 0 (every row) nor positive."""
        if rows < 0:
            raise ConfigError(
                f"--loss-rows must be 0 (every row) or a positive row count, got {rows}; e.g. --loss-rows 8192"
            )

    def __init__(self, sizes: Sequence[int], rows: int, seed: int) -> None:
        self.check(rows)
        self.sizes = list(sizes)
        self.rows = rows
        self._generator = np.random.default_rng([seed, 0x4C4F5353])  # its own stream: batches stay as they were

    def draw(self) -> list[np.ndarray | None]:
        """This round's row indices per collaborator (None: all its rows)."""
        return [
            None
            if self.rows == 0 or self.rows >= size
            else np.sort(self._generator.choice(size, self.rows, replace=False))
            for size in self.sizes
        ]


@dataclass(frozen=True)
class ReadsLosses:
    """Settings of a method whose server reads the collaborators' losses at theta_t every round."""

    loss_rows: int = 0
    """Rows per collaborator each round's losses are read from (0: all)."""

    def __post_init__(self) -> None:
        LossRows.check(self.loss_rows)


def rows_of(client: ClientData, index: np.ndarray | None) -> ClientData:
    """`client` restricted to the rows at `index`, in that order; `client` itself when `index` is None."""
    if index is None:
        return client
    chosen = torch.from_numpy(index)
    return ClientData(client.name, client.features[chosen], client.labels[chosen])


def client_losses(
    learners: Sequence[LocalLearner],
    federation: Federation,
    theta: torch.Tensor,
    rows: Sequence[np.ndarray | None],
    reduce: Callable[[np.ndarray], float] = np.mean,
) -> np.ndarray:
    """Each collaborator's training losses at theta_t reduced to one number (`reduce`: their mean by default).

    Computed on its own data (`rows` of it); TERM reduces them to its tilted log-normaliser instead.
    """
    losses = np.array(
        [
            reduce(evaluate(learner.model, theta, rows_of(client, index)).losses)
            for learner, client, index in zip(learners, federation.train, rows, strict=True)
        ]
    )
    if not np.isfinite(losses).all():
        raise AggregateError("a collaborator's loss at theta_t is NaN or Inf; the model diverged, lower --lr")
    return losses


Learner = TypeVar("Learner", bound=LocalLearner)


def rebuilt(learners: Sequence[LocalLearner], training: TrainingConfig, kind: type[Learner]) -> list[Learner]:
    """A method's own learners of `kind` on the plain learners' models, data, batch sizes and steps.

    Each is given the sampler seed of the plain learner it replaces, so it draws the plain learner's batches;
    `kind` takes LocalLearner's arguments (its own settings are set on the instances after).
    """
    return [
        kind(
            learner.model,
            learner.features,
            learner.labels,
            learner.batch_size,
            learner.config,
            seed=client_seed(training.seed, index),
        )
        for index, learner in enumerate(learners)
    ]


def run_combined(
    task: Task,
    combine: Combine,
    *,
    steps: Sequence[int] | None = None,
    needs_losses: bool = False,
    loss_rows: int = 0,
    describe: Callable[[], dict[str, float]] | None = None,
    rebuild: Callable[[list[LocalLearner]], list[LocalLearner]] | None = None,
    before_round: Callable[[torch.Tensor], None] | None = None,
) -> SimulationResult:
    """`simulation.run_rounds` on `task` with the method's own server combination and per-client step counts.

    `steps[k]` local steps for collaborator k (default: tau for all); `describe`
    adds the method's server-side state to each history record. `rebuild` turns
    the plain learners into the method's own (a different local objective on the
    same data, seeds and batch sizes, so the batches drawn are the plain ones);
    `before_round(theta_t)` runs at the start of every round, before any local step.
    The server steps with `training`'s server momentum (or FedAdam), as `run_rounds` does; 0, every
    published baseline's plain averaging, unless a method offers it.
    With `needs_losses`, `combine` gets each collaborator's mean loss at theta_t, read
    from `loss_rows` rows of it (`LossRows`; 0: all).
    """
    federation, training, options, on_round = task.federation, task.training, task.options, task.on_round
    template, learners = make_learners(federation, training, None, options=options)
    if rebuild is not None:
        learners = rebuild(learners)
    sampled = LossRows([client.size for client in federation.train], loss_rows, training.seed)
    counts = list(steps) if steps is not None else [training.local.local_steps] * len(learners)
    # The server step run_rounds takes: the method's plain averaging unless the training asks for momentum.
    algorithm = replace(learners[0].algorithm, momentum=training.server_momentum, adam=training.server_adam)
    state = algorithm.server_init(flat_parameters(template))
    pooled = history_sample(federation) if options.record_every else None
    history: list[dict[str, float]] = []
    for _ in range(training.rounds):
        if before_round is not None:
            before_round(state.theta)
        losses = client_losses(learners, federation, state.theta, sampled.draw()) if needs_losses else np.empty(0)
        updates = []
        for learner, count in zip(learners, counts, strict=True):
            learner.begin(state.theta, 0.0)
            for _ in range(count):
                learner.step()
            updates.append(learner.finish())
        state = algorithm.server_apply(state, combine(updates, losses), average_from=training.average_from_round)
        if on_round is not None:
            on_round(state)
        if pooled is not None and (state.round % options.record_every == 0 or state.round == training.rounds):
            record = round_record(template, state, pooled, None)
            history.append((record | describe()) if describe is not None else record)
    return SimulationResult(state=state, model=template, history=history)


@dataclass(frozen=True)
class FedAvgSettings:
    """FedAvg's settings: local passes instead of local steps."""

    local_epochs: int | None = None
    """E passes over each collaborator's data per round instead of --local-steps (None: the steps)."""


def run_fedavg(task: Task, settings: FedAvgSettings) -> SimulationResult:
    """FedAvg (McMahan et al. 2017): local SGD on the mean loss, updates averaged with weights b_k.

    Reveals to the server: nothing beyond the weighted sum of model updates.

    By default every collaborator takes tau = `training.local.local_steps` steps,
    which is exactly Algorithm 1's loop with epsilon = 1. With `local_epochs` = E,
    collaborator k takes E * ceil(n_k / b_k) steps instead (E passes over its data,
    the paper's FedAvg setting), so step counts differ between collaborators. It trains
    with DP-SGD when `task.privacy` is enabled (with local steps only).
    """
    federation, training, options, on_round = task.federation, task.training, task.options, task.on_round
    local_epochs = settings.local_epochs
    if local_epochs is None:
        return run_rounds(federation, training, None, options=options, on_round=on_round, privacy=task.privacy)
    if task.privacy.enabled:
        raise ConfigError("DP-SGD with local epochs is not supported; use --local-steps with the --dp-* flags")
    if local_epochs < 1:
        raise ConfigError(f"local epochs must be at least 1, got {local_epochs}; e.g. --local-epochs 3")
    if training.local.local_steps != 1 or training.local.reuse_batch:
        raise ConfigError("local epochs set the number of local steps; drop --local-steps / --reuse-batch")
    sizes = [client.size for client in federation.train]
    batch_sizes = client_batch_sizes(sizes, training.batch_size)
    steps = [local_epochs * math.ceil(size / batch) for size, batch in zip(sizes, batch_sizes, strict=True)]
    return run_combined(task, lambda updates, _: server.Aggregate.of(updates), steps=steps)


@dataclass
class AFLResult(SimulationResult):
    """A SimulationResult plus AFL's final mixture weights lambda (in `federation.train` order)."""

    mixture: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass(frozen=True)
class AFLSettings(ReadsLosses):
    """AFL's settings: the ascent on the collaborators' mixture weights."""

    mixture_lr: float = 0.01
    """Step size of the ascent on the collaborators' mixture weights."""


def run_afl(task: Task, settings: AFLSettings) -> AFLResult:
    """Agnostic Federated Learning (Mohri et al. 2019): min over theta, max over client mixtures lambda.

    Reveals to the server: every collaborator's mean training loss F_k in
    plaintext each round (the ascent direction for lambda), besides the updates.

    The objective is sum_k lambda_k F_k(theta) with lambda in the simplex. Each
    round, from (theta_t, lambda_t): collaborators take tau SGD steps on their mean
    loss and report F_k(theta_t); the server moves theta by sum_k lambda_k delta_k
    (a descent step on the lambda-weighted loss) and lambda by projected gradient
    ascent, lambda <- proj_simplex(lambda + mixture_lr * F). lambda starts uniform;
    the output is the average iterate, as for the other methods. Computing F_k
    costs each collaborator one forward pass over its training data per round
    (over `loss_rows` of them when positive: `LossRows`).
    History records carry lambda as `lambda_0`, `lambda_1`, ...
    """
    federation, mixture_lr = task.federation, settings.mixture_lr
    if not mixture_lr > 0.0 or not math.isfinite(mixture_lr):
        raise ConfigError(f"mixture_lr must be a positive number, got {mixture_lr}; e.g. --mixture-lr 0.01")
    mixture = np.full(len(federation.train), 1.0 / len(federation.train))

    def combine(updates: list[Update], losses: np.ndarray) -> server.Aggregate:
        nonlocal mixture
        aggregate = reweighted(updates, mixture)
        mixture = project_onto_simplex(mixture + mixture_lr * losses)
        return aggregate

    def describe() -> dict[str, float]:
        return {f"lambda_{index}": float(weight) for index, weight in enumerate(mixture)}

    result = run_combined(task, combine, needs_losses=True, loss_rows=settings.loss_rows, describe=describe)
    return AFLResult(state=result.state, model=result.model, history=result.history, mixture=mixture)


@dataclass(frozen=True)
class QFedAvgSettings(ReadsLosses):
    """q-FedAvg's settings: its fairness exponent q."""

    q: float = 1.0
    """The fairness exponent (0 is FedAvg with equal weights)."""


def run_qfedavg(task: Task, settings: QFedAvgSettings) -> SimulationResult:
    """q-FedAvg (Li et al. 2020), the solver of q-FFL: min over theta of sum_k F_k^(q+1) / (q+1).

    Reveals to the server: every collaborator's mean training loss F_k in
    plaintext each round (it sets both the weights and the step size), besides
    the updates.

    With L = 1 / lr, collaborator k's tau local steps give Delta_k = L (theta_t - theta_k)
    and h_k = q F_k^(q-1) ||Delta_k||^2 + L F_k^q, with F_k = F_k(theta_t); the server
    sets theta_{t+1} = theta_t - sum_k F_k^q Delta_k / sum_k h_k. Larger q weighs
    high-loss collaborators more. q = 0 gives h_k = L, so theta_{t+1} is the
    unweighted mean of the collaborators' models: FedAvg with equal weights.
    F_k is read from `loss_rows` of k's rows when positive (`LossRows`).
    """
    q = settings.q
    if not q >= 0.0 or not math.isfinite(q):
        raise ConfigError(f"q must be a number >= 0, got {q}; 0 is FedAvg with equal client weights, e.g. --q 1")
    lipschitz = 1.0 / task.training.local.lr

    def combine(updates: list[Update], losses: np.ndarray) -> server.Aggregate:
        powered = losses**q
        squared_norms = np.array([float(update.delta.double().square().sum()) for update in updates]) * lipschitz**2
        curvature = np.zeros_like(losses)
        # A collaborator with zero loss has zero gradient too, and the term
        # q F^(q-1) ||Delta||^2 tends to 0 with it; evaluated literally it is 0 * inf.
        positive = losses > 0.0
        curvature[positive] = q * losses[positive] ** (q - 1.0) * squared_norms[positive]
        # server.apply adds sum(w * (theta_k - theta_t)) / total_weight, and
        # -F^q Delta_k = L F^q (theta_k - theta_t): weights L F^q over the total sum(h).
        aggregate = reweighted(updates, lipschitz * powered)
        return replace(aggregate, total_weight=float((curvature + lipschitz * powered).sum()))

    return run_combined(task, combine, needs_losses=True, loss_rows=settings.loss_rows)


def pooled_federation(federation: Federation) -> Federation:
    """A one-collaborator federation holding all the training data (held-out data unchanged).

    Always a plain Federation: a GroupedFederation's per-client group columns would
    no longer line up with the single pooled collaborator.
    """
    return Federation(
        train=(federation.pooled("train"),),
        test=federation.test,
        num_features=federation.num_features,
        num_classes=federation.num_classes,
        image_shape=federation.image_shape,
    )


def run_central_erm(task: Task) -> SimulationResult:
    """Centralized SGD on the mean loss over the pooled training data (ERM).

    Reveals: all training data to one place; a yardstick for what federation costs.
    It is FedAvg with a single collaborator, so batches and steps follow `training`.
    """
    pooled = pooled_federation(task.federation)
    return run_rounds(pooled, task.training, None, options=task.options, on_round=task.on_round)


def run_central_cvar(task: Task) -> SimulationResult:
    """Centralized SGD on CVaR_rho (the dual of DRO) over the pooled training data.

    Reveals: all training data to one place; a yardstick. CVaR is RCVaR at
    epsilon = 0, so `objective.epsilon` is ignored and rho, the smoothing and the
    bound B are taken from `objective`.
    """
    cvar_objective = replace(task.objective, epsilon=0.0)
    pooled = pooled_federation(task.federation)
    return run_rounds(pooled, task.training, cvar_objective, options=task.options, on_round=task.on_round)


# The learners of the reweighting methods (BPF, FedMinMax) and of chi-square DRO


def check_step(value: float, flag: str) -> None:
    """Refuse a step size that is not a finite positive number.

    Raises:
        ConfigError: naming the setting and an example of `flag`.
    """
    if not value > 0.0 or not math.isfinite(value):
        name = flag.removeprefix("--").replace("-", "_")
        raise ConfigError(f"{name} must be a positive number, got {value}; e.g. {flag} 0.1")


# BPF
