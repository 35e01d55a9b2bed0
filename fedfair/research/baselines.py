"""The methods FedSRCVaR is compared with, built on the same learning core.

Every baseline trains with `local.LocalLearner` on the plain mean loss and moves
the server with `server.apply`, so differences in results come from the method,
not from the plumbing. They differ in what the server must learn each round:

- FedAvg: nothing beyond the weighted sum of model updates, like FedSRCVaR, so
  secure aggregation can hide every collaborator's update.
- AFL and q-FedAvg: in addition, every collaborator's mean training loss in
  plaintext, because the server's weights depend on each loss separately.
- FedMinMax: in addition, per-group loss sums, and it needs every sample's
  sensitive group (a column FedSRCVaR never sees); it is the known-groups yardstick.
- Centralized ERM / CVaR / BPF / chi-square DRO: all the data, pooled. They are
  yardsticks, not federated methods.

All return `simulation.SimulationResult` (AFL, FedMinMax and BPF subclasses that
add their adversary's final weights), so callers treat them alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch.nn import functional as F

from fedfair.core import server
from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.data import ClientData, client_batch_sizes, client_seed
from fedfair.core.errors import ConfigError
from fedfair.core.evaluation import evaluate
from fedfair.core.local import BatchSampler, LocalLearner
from fedfair.core.update import Update
from fedfair.core.models import flat_parameters
from fedfair.privacy.config import PrivacyConfig
from fedfair.simulation.federation import history_sample
from fedfair.simulation.rounds import make_learners, round_record, run_rounds
from fedfair.simulation.federation import Federation
from fedfair.simulation.rounds import RoundCallback, SimulationResult, TrainingConfig

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
    ordered = np.sort(values)[::-1]
    shifted_sums = np.cumsum(ordered) - 1.0
    ranks = np.arange(1, values.size + 1)
    kept = int(np.nonzero(ordered - shifted_sums / ranks > 0.0)[0][-1]) + 1
    tau = float(shifted_sums[kept - 1]) / kept
    return np.maximum(values - tau, 0.0)


def _reweighted(updates: Sequence[Update], weights: np.ndarray) -> server.Aggregate:
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
            raise ConfigError(f"--loss-rows must be 0 (every row) or a positive row count, got {rows}; e.g. --loss-rows 8192")

    def __init__(self, sizes: Sequence[int], rows: int, seed: int) -> None:
        self.check(rows)
        self.sizes = list(sizes)
        self.rows = rows
        self._generator = np.random.default_rng([seed, 0x4C4F5353])  # its own stream: batches stay as they were

    def draw(self) -> list[np.ndarray | None]:
        """This round's row indices per collaborator (None: all its rows)."""
        return [
            None if self.rows == 0 or self.rows >= size else np.sort(self._generator.choice(size, self.rows, replace=False))
            for size in self.sizes
        ]


def _rows_of(client: ClientData, index: np.ndarray | None) -> ClientData:
    if index is None:
        return client
    chosen = torch.from_numpy(index)
    return ClientData(client.name, client.features[chosen], client.labels[chosen])


def _client_losses(
    learners: Sequence[LocalLearner], federation: Federation, theta: torch.Tensor, rows: Sequence[np.ndarray | None]
) -> np.ndarray:
    """Each collaborator's mean training loss at theta_t, computed on its own data (`rows` of it)."""
    losses = np.array(
        [
            evaluate(learner.model, theta, _rows_of(client, index)).losses.mean()
            for learner, client, index in zip(learners, federation.train, rows, strict=True)
        ]
    )
    if not np.isfinite(losses).all():
        raise server.AggregateError("a collaborator's mean loss is NaN or Inf; the model diverged, lower --lr")
    return losses


def _run_combined(
    federation: Federation,
    training: TrainingConfig,
    combine: Combine,
    *,
    steps: Sequence[int] | None = None,
    needs_losses: bool = False,
    loss_rows: int = 0,
    describe: Callable[[], dict[str, float]] | None = None,
    on_round: RoundCallback | None = None,
    rebuild: Callable[[list[LocalLearner]], list[LocalLearner]] | None = None,
    before_round: Callable[[torch.Tensor], None] | None = None,
) -> SimulationResult:
    """`simulation.run_rounds` with the method's own server combination and per-client step counts.

    `steps[k]` local steps for collaborator k (default: tau for all); `describe`
    adds the method's server-side state to each history record. `rebuild` turns
    the plain learners into the method's own (a different local objective on the
    same data, seeds and batch sizes, so the batches drawn are the plain ones);
    `before_round(theta_t)` runs at the start of every round, before any local step.
    With `needs_losses`, `combine` gets each collaborator's mean loss at theta_t, read
    from `loss_rows` rows of it (`LossRows`; 0: all).
    """
    template, learners = make_learners(federation, training, None)
    if rebuild is not None:
        learners = rebuild(learners)
    sampled = LossRows([client.size for client in federation.train], loss_rows, training.seed)
    counts = list(steps) if steps is not None else [training.local.local_steps] * len(learners)
    algorithm = learners[0].algorithm
    state = algorithm.server_init(flat_parameters(template))
    pooled = history_sample(federation) if training.record_every else None
    history: list[dict[str, float]] = []
    for _ in range(training.rounds):
        if before_round is not None:
            before_round(state.theta)
        losses = _client_losses(learners, federation, state.theta, sampled.draw()) if needs_losses else np.empty(0)
        updates = []
        for learner, count in zip(learners, counts, strict=True):
            learner.begin(state.theta, 0.0)
            for _ in range(count):
                learner.step()
            updates.append(learner.finish())
        state = algorithm.server_apply(state, combine(updates, losses), average_from=training.average_from_round)
        if on_round is not None:
            on_round(state)
        if pooled is not None and (state.round % training.record_every == 0 or state.round == training.rounds):
            record = round_record(template, state, pooled, None)
            history.append((record | describe()) if describe is not None else record)
    return SimulationResult(state=state, model=template, history=history)


def run_fedavg(
    federation: Federation,
    training: TrainingConfig,
    *,
    local_epochs: int | None = None,
    on_round: RoundCallback | None = None,
    privacy: PrivacyConfig | None = None,
) -> SimulationResult:
    """FedAvg (McMahan et al. 2017): local SGD on the mean loss, updates averaged with weights b_k.

    Reveals to the server: nothing beyond the weighted sum of model updates.

    By default every collaborator takes tau = `training.local.local_steps` steps,
    which is exactly Algorithm 1's loop with epsilon = 1. With `local_epochs` = E,
    collaborator k takes E * ceil(n_k / b_k) steps instead (E passes over its data,
    the paper's FedAvg setting), so step counts differ between collaborators.
    """
    if local_epochs is None:
        return run_rounds(federation, training, None, on_round=on_round, privacy=privacy)
    if privacy is not None and privacy.enabled:
        raise ConfigError("DP-SGD with local epochs is not supported; use --local-steps with the --dp-* flags")
    if local_epochs < 1:
        raise ConfigError(f"local epochs must be at least 1, got {local_epochs}; e.g. --local-epochs 3")
    if training.local.local_steps != 1 or training.local.reuse_batch:
        raise ConfigError("local epochs set the number of local steps; drop --local-steps / --reuse-batch")
    sizes = [client.size for client in federation.train]
    batch_sizes = client_batch_sizes(sizes, training.batch_size)
    steps = [local_epochs * math.ceil(size / batch) for size, batch in zip(sizes, batch_sizes, strict=True)]
    return _run_combined(
        federation, training, lambda updates, _: server.Aggregate.of(updates), steps=steps, on_round=on_round
    )


@dataclass
class AFLResult(SimulationResult):
    """A SimulationResult plus AFL's final mixture weights lambda (in `federation.train` order)."""

    mixture: np.ndarray = field(default_factory=lambda: np.zeros(0))


def run_afl(
    federation: Federation,
    training: TrainingConfig,
    *,
    mixture_lr: float,
    loss_rows: int = 0,
    on_round: RoundCallback | None = None,
) -> AFLResult:
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
    if not mixture_lr > 0.0 or not math.isfinite(mixture_lr):
        raise ConfigError(f"mixture_lr must be a positive number, got {mixture_lr}; e.g. --mixture-lr 0.01")
    mixture = np.full(len(federation.train), 1.0 / len(federation.train))

    def combine(updates: list[Update], losses: np.ndarray) -> server.Aggregate:
        nonlocal mixture
        aggregate = _reweighted(updates, mixture)
        mixture = project_onto_simplex(mixture + mixture_lr * losses)
        return aggregate

    def describe() -> dict[str, float]:
        return {f"lambda_{index}": float(weight) for index, weight in enumerate(mixture)}

    result = _run_combined(
        federation, training, combine, needs_losses=True, loss_rows=loss_rows, describe=describe, on_round=on_round
    )
    return AFLResult(state=result.state, model=result.model, history=result.history, mixture=mixture)


def run_qfedavg(
    federation: Federation,
    training: TrainingConfig,
    *,
    q: float,
    loss_rows: int = 0,
    on_round: RoundCallback | None = None,
) -> SimulationResult:
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
    if not q >= 0.0 or not math.isfinite(q):
        raise ConfigError(f"q must be a number >= 0, got {q}; 0 is FedAvg with equal client weights, e.g. --q 1")
    lipschitz = 1.0 / training.local.lr

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
        aggregate = _reweighted(updates, lipschitz * powered)
        return replace(aggregate, total_weight=float((curvature + lipschitz * powered).sum()))

    return _run_combined(federation, training, combine, needs_losses=True, loss_rows=loss_rows, on_round=on_round)


def _pooled(federation: Federation) -> Federation:
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


def run_central_erm(
    federation: Federation, training: TrainingConfig, *, on_round: RoundCallback | None = None
) -> SimulationResult:
    """Centralized SGD on the mean loss over the pooled training data (ERM).

    Reveals: all training data to one place; a yardstick for what federation costs.
    It is FedAvg with a single collaborator, so batches and steps follow `training`.
    """
    return run_rounds(_pooled(federation), training, None, on_round=on_round)


def run_central_cvar(
    federation: Federation,
    objective: ObjectiveConfig,
    training: TrainingConfig,
    *,
    on_round: RoundCallback | None = None,
) -> SimulationResult:
    """Centralized SGD on CVaR_rho (the dual of DRO) over the pooled training data.

    Reveals: all training data to one place; a yardstick. CVaR is RCVaR at
    epsilon = 0, so `objective.epsilon` is ignored and rho, the smoothing and the
    bound B are taken from `objective`.
    """
    cvar_objective = replace(objective, epsilon=0.0)
    return run_rounds(_pooled(federation), training, cvar_objective, on_round=on_round)


# The learners of the reweighting methods (BPF, FedMinMax) and of chi-square DRO


class _RecordingSampler(BatchSampler):
    """A BatchSampler that remembers its last batch's indices (None: the whole local set).

    Built with the plain learner's size, batch size and seed, it draws exactly the
    plain learner's batches; the weighted objective needs to know which samples they are.
    """

    def __init__(self, num_samples: int, batch_size: int, seed: int) -> None:
        super().__init__(num_samples, batch_size, seed)
        self.last: torch.Tensor | None = None

    def next_batch(self) -> torch.Tensor | None:
        self.last = super().next_batch()
        return self.last


class WeightedLearner(LocalLearner):
    """A LocalLearner whose local objective is mean_i w_i l_i over its batches.

    `sample_weights` (one per local sample) is what the method's adversary sets
    between rounds: BPF's per-sample ratios, FedMinMax's group weights. When
    `recent_losses` is set, every step writes its batch's losses into it, the
    per-sample loss memory BPF's adversary ascends on.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        features: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        config: LocalConfig,
        *,
        seed: int,
    ) -> None:
        super().__init__(model, features, labels, batch_size, config, seed=seed)
        self.recorder = _RecordingSampler(self.num_samples, batch_size, seed)
        self.sampler = self.recorder
        self.sample_weights = torch.ones(self.num_samples, device=self.features.device, dtype=self.features.dtype)
        self.recent_losses: torch.Tensor | None = None

    def set_weights(self, weights: np.ndarray) -> None:
        """Use these per-sample weights from the next step on."""
        self.sample_weights.copy_(torch.from_numpy(np.asarray(weights, dtype=np.float64)))

    def objective(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        losses = super().objective(features, labels)
        index = self.recorder.last
        if index is None:
            weights = self.sample_weights
            if self.recent_losses is not None:
                self.recent_losses.copy_(losses.detach())
        else:
            index = index.to(self.sample_weights.device)
            weights = self.sample_weights.index_select(0, index)
            if self.recent_losses is not None:
                self.recent_losses[index] = losses.detach().to(self.recent_losses.dtype)
        return losses * weights


def _weighted(learners: Sequence[LocalLearner], training: TrainingConfig) -> list[WeightedLearner]:
    """WeightedLearners on the plain learners' models, data, batch sizes and sampler seeds."""
    return [
        WeightedLearner(
            learner.model,
            learner.features,
            learner.labels,
            learner.batch_size,
            learner.config,
            seed=client_seed(training.seed, index),
        )
        for index, learner in enumerate(learners)
    ]


def _check_step(value: float, flag: str) -> None:
    if not value > 0.0 or not math.isfinite(value):
        name = flag.removeprefix("--").replace("-", "_")
        raise ConfigError(f"{name} must be a positive number, got {value}; e.g. {flag} 0.1")


# BPF


def project_onto_capped_simplex(vector: np.ndarray, lower: float, upper: float, total: float = 1.0) -> np.ndarray:
    """Euclidean projection onto {x : lower <= x_i <= upper, sum(x) = total}.

    By the KKT conditions of min ||x - v||^2 on that set the projection is
    clip(v - tau, lower, upper) for the one tau at which it sums to `total`. That
    sum is non-increasing and piecewise linear in tau, with kinks at v_i - lower and
    v_i - upper: we evaluate it at every kink (sorted values and prefix sums),
    take the segment that brackets `total` and solve its linear piece exactly.
    """
    values = np.asarray(vector, dtype=np.float64)
    if values.ndim != 1 or values.size == 0 or not np.isfinite(values).all():
        raise ConfigError(f"can only project a non-empty finite 1-D vector, got shape {values.shape}")
    count = values.size
    if not (math.isfinite(lower) and math.isfinite(upper) and lower <= upper):
        raise ConfigError(f"the box [{lower}, {upper}] is empty or unbounded; need finite lower <= upper")
    slack = 1e-12 * max(abs(total), 1.0)
    if not count * lower - slack <= total <= count * upper + slack:
        raise ConfigError(
            f"no {count} values in [{lower}, {upper}] sum to {total}; the adversary's set is empty "
            "(for BPF: epsilon must not exceed rho)"
        )
    if upper - lower <= slack / count:
        return np.full(count, total / count)
    # At either end of the range only one point is feasible; rounding at the kinks could miss it.
    if total >= count * upper - slack:
        return np.full(count, upper)
    if total <= count * lower + slack:
        return np.full(count, lower)
    ordered = np.sort(values)
    prefix = np.concatenate([[0.0], np.cumsum(ordered)])

    def clipped_sums(taus: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """sum_i clip(v_i - tau, lower, upper) at each tau, and how many v_i - tau lie strictly inside."""
        at_lower = np.searchsorted(ordered, taus + lower, side="right")
        first_upper = np.searchsorted(ordered, taus + upper, side="left")
        inside = first_upper - at_lower
        inside_sum = prefix[first_upper] - prefix[at_lower]
        return at_lower * lower + (count - first_upper) * upper + inside_sum - inside * taus, inside

    kinks = np.sort(np.concatenate([values - lower, values - upper]))
    sums, _ = clipped_sums(kinks)
    # sums[0] = count * upper > total > count * lower = sums[-1], and sums never increases.
    reached = np.nonzero(sums >= total)[0]
    segment = int(reached[-1]) if reached.size else 0
    if sums[segment] == total or segment == kinks.size - 1:
        tau = float(kinks[segment])
    else:
        _, inside = clipped_sums(np.array([0.5 * (kinks[segment] + kinks[segment + 1])]))
        tau = float(kinks[segment]) + (float(sums[segment]) - total) / max(int(inside[0]), 1)
    return np.clip(values - tau, lower, upper)


def bpf_ratio_bounds(rho: float, epsilon: float = 0.0) -> tuple[float, float]:
    """The box [epsilon / rho, 1 / rho] of BPF's density ratios lambda_i = n * w_i.

    The adversary's weights w lie in {w : epsilon / (rho n) <= w_i <= 1 / (rho n),
    sum(w) = 1}: a group of mass rho, every sample in it with probability at most 1
    and at least epsilon (Martinez et al. 2021). With epsilon = 0 the best weights
    put 1 / (rho n) on the worst rho-fraction, so the adversary's value is CVaR_rho.
    """
    if not 0.0 < rho <= 1.0:
        raise ConfigError(f"rho must be in (0, 1], got {rho}; e.g. --rho 0.3")
    if not 0.0 <= epsilon <= rho:
        raise ConfigError(
            f"BPF needs 0 <= epsilon <= rho (every sample's weight is at least epsilon / rho of the cap), got "
            f"epsilon {epsilon} and rho {rho}; e.g. --epsilon 0.01"
        )
    if epsilon == rho < 1.0:
        raise ConfigError(
            f"BPF with epsilon = rho = {rho} pins every ratio at 1: that is plain ERM, the adversary cannot move; "
            "pass --epsilon 0 (the bounded-size adversary) or an epsilon below rho"
        )
    return epsilon / rho, 1.0 / rho


def bpf_adversary_step(
    ratios: np.ndarray, losses: np.ndarray, step: float, rho: float, epsilon: float = 0.0
) -> np.ndarray:
    """One projected gradient ascent step of the adversary on mean_i(lambda_i l_i).

    The gradient in lambda is l / n; the step is taken on l (the n folded into
    `step`, so it does not depend on the data size) and projected back onto
    {lambda in [epsilon / rho, 1 / rho]^n : mean(lambda) = 1}.
    """
    lower, upper = bpf_ratio_bounds(rho, epsilon)
    moved = np.asarray(ratios, dtype=np.float64) + step * np.asarray(losses, dtype=np.float64)
    return project_onto_capped_simplex(moved, lower, upper, total=float(moved.size))


@dataclass
class BPFResult(SimulationResult):
    """A SimulationResult plus BPF's final density ratios lambda over the pooled training samples."""

    ratios: np.ndarray = field(default_factory=lambda: np.zeros(0))


def run_bpf(
    federation: Federation,
    objective: ObjectiveConfig,
    training: TrainingConfig,
    *,
    adversary_lr: float,
    on_round: RoundCallback | None = None,
) -> BPFResult:
    """Blind Pareto Fairness (Martinez et al. 2021), centralized: min over theta, max over sample weights.

    Reveals: all training data to one place, like the other centralized yardsticks;
    no group labels. The objective is mean_i lambda_i l_i(theta) with the density
    ratios lambda in {lambda_i in [epsilon / rho, 1 / rho], mean(lambda) = 1}
    (`bpf_ratio_bounds`; rho and epsilon from `objective`, epsilon = 0 the plain
    bounded-size adversary). Each round the learner takes tau SGD steps on the
    lambda-weighted loss over mini-batches of the pooled data, remembering each
    sample's most recent loss (every sample starts at its loss under theta_0);
    then the adversary takes one projected ascent step on that memory
    (`bpf_adversary_step` with `adversary_lr`). lambda starts uniform (ERM); the
    output is the average iterate. History records carry the largest ratio and
    the adversary's weighted loss.
    """
    bpf_ratio_bounds(objective.rho, objective.epsilon)
    _check_step(adversary_lr, "--adversary-lr")
    pooled = _pooled(federation)
    learner_box: list[WeightedLearner] = []
    ratios = np.ones(pooled.train[0].size)

    def rebuild(learners: list[LocalLearner]) -> list[LocalLearner]:
        (learner,) = _weighted(learners, training)
        start = evaluate(learner.model, flat_parameters(learner.model), pooled.train[0]).losses
        learner.recent_losses = torch.from_numpy(start).to(learner.features.device)
        learner_box.append(learner)
        return [learner]

    def combine(updates: list[Update], _: np.ndarray) -> server.Aggregate:
        nonlocal ratios
        (learner,) = learner_box
        assert learner.recent_losses is not None
        memory = learner.recent_losses.cpu().numpy()
        ratios = bpf_adversary_step(ratios, memory, adversary_lr, objective.rho, objective.epsilon)
        learner.set_weights(ratios)
        return server.Aggregate.of(updates)

    def describe() -> dict[str, float]:
        (learner,) = learner_box
        assert learner.recent_losses is not None
        memory = learner.recent_losses.cpu().numpy()
        return {"adversary_max_ratio": float(ratios.max()), "adversary_weighted_loss": float(np.mean(ratios * memory))}

    result = _run_combined(pooled, training, combine, rebuild=rebuild, describe=describe, on_round=on_round)
    return BPFResult(state=result.state, model=result.model, history=result.history, ratios=ratios)


# FedMinMax


@dataclass(frozen=True, eq=False)
class GroupedFederation(Federation):
    """A Federation plus every training sample's sensitive group, which only FedMinMax uses.

    `train_groups[k][i]` is the index into `group_names` of collaborator k's i-th
    training sample. FedSRCVaR and the other baselines never look at it.
    """

    train_groups: tuple[np.ndarray, ...] = ()
    group_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.train_groups) != len(self.train):
            raise ConfigError(
                f"{len(self.train)} collaborators need as many group columns, got {len(self.train_groups)}"
            )
        for client, groups in zip(self.train, self.train_groups, strict=True):
            in_range = groups.size == 0 or 0 <= groups.min() <= groups.max() < len(self.group_names)
            if groups.shape != (client.size,) or not in_range:
                raise ConfigError(
                    f"collaborator '{client.name}' needs one group index in [0, {len(self.group_names)}) per training "
                    f"sample ({client.size}), got shape {groups.shape}"
                )


def with_groups(
    federation: Federation, train_groups: Sequence[np.ndarray], group_names: Sequence[str]
) -> GroupedFederation:
    """`federation` with each collaborator's training-sample groups attached (indices into `group_names`)."""
    return GroupedFederation(
        train=federation.train,
        test=federation.test,
        num_features=federation.num_features,
        num_classes=federation.num_classes,
        image_shape=federation.image_shape,
        train_groups=tuple(np.asarray(groups, dtype=np.int64) for groups in train_groups),
        group_names=tuple(group_names),
    )


@dataclass
class FedMinMaxResult(SimulationResult):
    """A SimulationResult plus FedMinMax's final group weights mu (in `group_names` order)."""

    group_weights: np.ndarray = field(default_factory=lambda: np.zeros(0))


def run_fedminmax(
    federation: GroupedFederation,
    training: TrainingConfig,
    *,
    adversary_lr: float,
    loss_rows: int = 0,
    on_round: RoundCallback | None = None,
) -> FedMinMaxResult:
    """FedMinMax (Papadaki et al. 2022): min over theta, max over group weights mu of sum_a mu_a R_a(theta).

    Reveals to the server: each collaborator's per-group sample counts (once) and
    per-group loss sums at theta_t (every round) in plaintext, besides the
    updates; and it needs every sample's sensitive group, which FedSRCVaR never uses.

    R_a is group a's mean training loss over the whole federation and mu lies in
    the simplex. With p_a = n_a / n the groups' shares, collaborator k trains on
    mean_i w_{a(i)} l_i, w_a = mu_a / p_a: averaged with weights b_k ~ n_k these
    local objectives are sum_a mu_a R_a. Each round, from (theta_t, mu_t): the
    server forms R(theta_t) from the loss sums; collaborators take tau SGD steps
    on their weighted loss; the server averages the updates as FedAvg does and
    moves mu by projected ascent, mu <- proj_simplex(mu + adversary_lr * R).
    mu starts at p, where every weight is 1: the first round is FedAvg's, and with
    a single group every round is. History records carry mu as `mu_0`, `mu_1`, ...
    With `loss_rows` > 0 each collaborator sums losses over a fresh draw of that many
    rows, scaled by n_k / rows: unbiased estimates of the group loss sums (`LossRows`).
    """
    _check_step(adversary_lr, "--adversary-lr")
    groups = len(federation.group_names)
    counts = np.zeros(groups)
    for column in federation.train_groups:
        counts += np.bincount(column, minlength=groups)
    shares = counts / counts.sum()
    mixture = shares.copy()
    risks = np.zeros(groups)
    learner_box: list[WeightedLearner] = []
    sampled = LossRows([client.size for client in federation.train], loss_rows, training.seed)

    def rebuild(learners: list[LocalLearner]) -> list[LocalLearner]:
        learner_box.extend(_weighted(learners, training))
        return list(learner_box)

    def group_risks(theta: torch.Tensor) -> None:
        nonlocal risks
        sums = np.zeros(groups)
        for learner, client, column, index in zip(
            learner_box, federation.train, federation.train_groups, sampled.draw(), strict=True
        ):
            losses = evaluate(learner.model, theta, _rows_of(client, index)).losses
            if index is None:
                sums += np.bincount(column, weights=losses, minlength=groups)
            else:
                sums += np.bincount(column[index], weights=losses, minlength=groups) * (client.size / index.size)
        if not np.isfinite(sums).all():
            raise server.AggregateError("a group's loss is NaN or Inf; the model diverged, lower --lr")
        risks = sums / np.maximum(counts, 1)

    def combine(updates: list[Update], _: np.ndarray) -> server.Aggregate:
        nonlocal mixture
        mixture = project_onto_simplex(mixture + adversary_lr * risks)
        for learner, column in zip(learner_box, federation.train_groups, strict=True):
            learner.set_weights((mixture / shares)[column])
        return server.Aggregate.of(updates)

    def describe() -> dict[str, float]:
        return {f"mu_{index}": float(weight) for index, weight in enumerate(mixture)}

    result = _run_combined(
        federation, training, combine, rebuild=rebuild, before_round=group_risks, describe=describe, on_round=on_round
    )
    return FedMinMaxResult(state=result.state, model=result.model, history=result.history, group_weights=mixture)


# Chi-square DRO (Hashimoto et al. 2018)


def chi_square_constant(rho: float) -> float:
    """C = sqrt(2 r + 1) for the chi-square radius r = (1 / rho - 1)^2 / 2 that protects every group of mass >= rho.

    Hashimoto et al. (2018) set r from the smallest group share alpha_min = rho.
    """
    if not 0.0 < rho < 1.0:
        raise ConfigError(f"chi-square DRO needs rho in (0, 1), got {rho}; rho = 1 is ERM (--method central-erm)")
    return math.sqrt(1.0 + (1.0 / rho - 1.0) ** 2)


def _as_losses(losses: np.ndarray | torch.Tensor) -> np.ndarray:
    values = losses.detach().to("cpu", torch.float64).numpy() if isinstance(losses, torch.Tensor) else losses
    values = np.asarray(values, dtype=np.float64).ravel()
    if values.size == 0 or not np.isfinite(values).all():
        raise ConfigError("the chi-square DRO risk needs a non-empty vector of finite losses")
    return values


def chi_square_dual(losses: np.ndarray | torch.Tensor, eta: float, rho: float) -> float:
    """C * sqrt(mean((l - eta)_+^2)) + eta: Hashimoto et al.'s dual of the chi-square robust risk, at one eta.

    For every eta it bounds the robust risk from above; its minimum over eta equals it.
    """
    values = _as_losses(losses)
    return chi_square_constant(rho) * float(np.sqrt(np.mean(np.maximum(values - eta, 0.0) ** 2))) + eta


def chi_square_eta(losses: np.ndarray | torch.Tensor, rho: float) -> float:
    """The eta minimising `chi_square_dual`, by binary search on its derivative.

    The dual is convex in eta with derivative 1 - C mean(x) / sqrt(mean(x^2)),
    x = (l - eta)_+, which is non-decreasing. It is 1 at eta >= max(l); while every
    x is positive it is <= 0 exactly for eta <= mean(l) - std(l) / sqrt(C^2 - 1). So
    [min(that, min(l)), max(l)] brackets the minimiser, and halving it until the two
    ends meet in floating point finds it.
    """
    values = _as_losses(losses)
    constant = chi_square_constant(rho)
    low = min(float(values.min()), float(values.mean() - values.std() / math.sqrt(constant**2 - 1.0)))
    high = float(values.max())

    def slope(eta: float) -> float:
        excess = np.maximum(values - eta, 0.0)
        scale = math.sqrt(float(np.mean(excess**2)))
        return 1.0 - constant * float(np.mean(excess)) / scale if scale > 0.0 else 1.0

    while True:
        middle = 0.5 * (low + high)
        if not low < middle < high:
            return high
        if slope(middle) < 0.0:
            low = middle
        else:
            high = middle


class ChiSquareDROLearner(LocalLearner):
    """A LocalLearner on the chi-square DRO risk of each mini-batch, eta searched per batch.

    Per batch, eta* minimises the dual (`chi_square_eta`); by the envelope theorem
    the gradient of min_eta dual is the dual's gradient at eta*. The per-sample terms
    eta* + C (x_i^2 / s + s) / 2, with x = (l - eta*)_+ and s = sqrt(mean(x^2)) held
    fixed, average to the dual's value and have exactly its gradient, so the core's
    `step` (which averages per-sample terms) descends on the DRO risk.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        features: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        config: LocalConfig,
        *,
        rho: float,
        seed: int,
    ) -> None:
        super().__init__(model, features, labels, batch_size, config, seed=seed)
        self.rho = rho
        self.constant = chi_square_constant(rho)
        self.last_eta = math.nan

    def objective(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        losses = super().objective(features, labels)
        self.last_eta = chi_square_eta(losses, self.rho)
        excess = F.relu(losses - self.last_eta)
        scale = excess.detach().square().mean().sqrt()
        if float(scale) == 0.0:
            # Every loss is at eta*: the robust risk is that common loss, and so is its gradient.
            return losses
        return self.last_eta + 0.5 * self.constant * (excess.square() / scale + scale)


def run_dro(
    federation: Federation,
    objective: ObjectiveConfig,
    training: TrainingConfig,
    *,
    on_round: RoundCallback | None = None,
) -> SimulationResult:
    """Chi-square DRO (Hashimoto et al. 2018), centralized, as the paper runs it: eta found by search.

    Reveals: all training data to one place; a yardstick. SGD on the pooled data
    minimises the dual min over eta of C sqrt(E[(l - eta)_+^2]) + eta, with
    C = `chi_square_constant(objective.rho)` and eta found by binary search on every
    mini-batch (`ChiSquareDROLearner`); epsilon is ignored. Today's `run_central_cvar`
    is the other DRO: CVaR is DRO over the ratio-bounded ball, its threshold c
    learned by SGD instead. History records carry the last batch's eta.
    """
    chi_square_constant(objective.rho)
    learner_box: list[ChiSquareDROLearner] = []

    def rebuild(learners: list[LocalLearner]) -> list[LocalLearner]:
        learner_box.extend(
            ChiSquareDROLearner(
                learner.model,
                learner.features,
                learner.labels,
                learner.batch_size,
                learner.config,
                rho=objective.rho,
                seed=client_seed(training.seed, index),
            )
            for index, learner in enumerate(learners)
        )
        return list(learner_box)

    def describe() -> dict[str, float]:
        return {"eta": learner_box[0].last_eta}

    return _run_combined(
        _pooled(federation),
        training,
        lambda updates, _: server.Aggregate.of(updates),
        rebuild=rebuild,
        describe=describe,
        on_round=on_round,
    )
