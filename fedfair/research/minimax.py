"""The minimax baselines that reweight samples or groups: BPF and FedMinMax.

Both train `WeightedLearner`s (a LocalLearner whose loss weighs each sample) against an
adversary that moves the weights toward the worst-off: BPF over the pooled samples (a
centralized yardstick without group labels), FedMinMax over sensitive groups it must be
told (the known-groups yardstick). Their shared machinery is `fedfair.research.baselines`'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from fedfair.core import server
from fedfair.core.config import LocalConfig
from fedfair.core.errors import AggregateError, ConfigError
from fedfair.core.evaluation import evaluate
from fedfair.core.local import BatchSampler, LocalLearner
from fedfair.core.models import flat_parameters
from fedfair.core.update import Update
from fedfair.research.baselines import (
    LossRows,
    ReadsLosses,
    check_step,
    pooled_federation,
    project_onto_simplex,
    rebuilt,
    rows_of,
    run_combined,
)
from fedfair.research.task import Task
from fedfair.simulation.federation import Federation
from fedfair.simulation.rounds import SimulationResult


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
        """The batch's per-sample objective times each row's weight; the losses are kept in `recent_losses`."""
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


@dataclass(frozen=True)
class BPFSettings:
    """BPF's settings: the ascent on the per-sample weights."""

    adversary_lr: float = 0.1
    """Step size of the ascent on the sample weights."""


def run_bpf(task: Task, settings: BPFSettings) -> BPFResult:
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
    objective, training, adversary_lr = task.objective, task.training, settings.adversary_lr
    bpf_ratio_bounds(objective.rho, objective.epsilon)
    check_step(adversary_lr, "--adversary-lr")
    pooled = pooled_federation(task.federation)
    learner_box: list[WeightedLearner] = []
    ratios = np.ones(pooled.train[0].size)

    def rebuild(learners: list[LocalLearner]) -> list[LocalLearner]:
        (learner,) = rebuilt(learners, training, WeightedLearner)
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

    result = run_combined(replace(task, federation=pooled), combine, rebuild=rebuild, describe=describe)
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


@dataclass(frozen=True)
class FedMinMaxSettings(ReadsLosses):
    """FedMinMax's settings: the ascent on the group weights, and which groups."""

    adversary_lr: float = 0.1
    """Step size of the ascent on the group weights."""
    groups: str | None = None
    """The sensitive column whose groups it protects (None: the partition column); the federation's loader
    reads it (`GroupedFederation`)."""


def run_fedminmax(task: Task, settings: FedMinMaxSettings) -> FedMinMaxResult:
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
    federation, training, adversary_lr = task.federation, task.training, settings.adversary_lr
    if not isinstance(federation, GroupedFederation):
        raise ConfigError(
            "FedMinMax needs every training sample's sensitive group: build the federation with "
            "load_federation(config) for --method fedminmax, or attach them with minimax.with_groups"
        )
    check_step(adversary_lr, "--adversary-lr")
    groups = len(federation.group_names)
    counts = np.zeros(groups)
    for column in federation.train_groups:
        counts += np.bincount(column, minlength=groups)
    shares = counts / counts.sum()
    mixture = shares.copy()
    risks = np.zeros(groups)
    learner_box: list[WeightedLearner] = []
    sampled = LossRows([client.size for client in federation.train], settings.loss_rows, training.seed)

    def rebuild(learners: list[LocalLearner]) -> list[LocalLearner]:
        learner_box.extend(rebuilt(learners, training, WeightedLearner))
        return list(learner_box)

    def group_risks(theta: torch.Tensor) -> None:
        nonlocal risks
        sums = np.zeros(groups)
        for learner, client, column, index in zip(
            learner_box, federation.train, federation.train_groups, sampled.draw(), strict=True
        ):
            losses = evaluate(learner.model, theta, rows_of(client, index)).losses
            if index is None:
                sums += np.bincount(column, weights=losses, minlength=groups)
            else:
                sums += np.bincount(column[index], weights=losses, minlength=groups) * (client.size / index.size)
        if not np.isfinite(sums).all():
            raise AggregateError("a group's loss is NaN or Inf; the model diverged, lower --lr")
        risks = sums / np.maximum(counts, 1)

    def combine(updates: list[Update], _: np.ndarray) -> server.Aggregate:
        nonlocal mixture
        mixture = project_onto_simplex(mixture + adversary_lr * risks)
        for learner, column in zip(learner_box, federation.train_groups, strict=True):
            learner.set_weights((mixture / shares)[column])
        return server.Aggregate.of(updates)

    def describe() -> dict[str, float]:
        return {f"mu_{index}": float(weight) for index, weight in enumerate(mixture)}

    result = run_combined(task, combine, rebuild=rebuild, before_round=group_risks, describe=describe)
    return FedMinMaxResult(state=result.state, model=result.model, history=result.history, group_weights=mixture)


# Chi-square DRO (Hashimoto et al. 2018)
