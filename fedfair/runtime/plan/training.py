"""The plan's ``[objective]`` and ``[training]``, read into the learning core's own config classes.

A plan is a deployment: nobody knows the total batch and every round costs round trips, so what a
plan leaves out takes :data:`PLAN_TRAINING`'s values, not the simulation's.
"""

from __future__ import annotations

from collections.abc import Mapping

from fedfair.core.config import (
    AVERAGE_FROM,
    BATCH_FRACTION,
    BOUND,
    DEFAULT_SERVER_MOMENTUM,
    DRIFT_CORRECTIONS,
    EPSILON,
    GAMMA,
    RHO,
    SERVER_MOMENTUM,
    SMOOTH_FUNCTIONS,
    STEP_SIZE,
    LocalConfig,
    ObjectiveConfig,
    TrainingConfig,
)
from fedfair.core.errors import ConfigError
from fedfair.core.tables import Table, field_names
from fedfair.runtime.plan.limits import MAX_LOCAL_STEPS, MAX_ROUNDS, MAX_SEED, capped, number_in

PLAN_TRAINING = TrainingConfig(rounds=100, batch_fraction=0.01, server_momentum=DEFAULT_SERVER_MOMENTUM)
"""What a plan's [training] takes for a key it leaves out: the core defaults but for three. A batch is a
fraction of a site's own rows (nobody knows the total; w_k = b_k stays proportional to n_k unrevealed),
100 rounds (each costs round trips), and FedSRCVaR's server momentum. Manifests pin them: they stay."""

PLAN_TRAINING_KEYS = (
    "rounds",
    "local_steps",
    "batch_fraction",
    "lr",
    "threshold_lr",
    "seed",
    "average_from",
    "drift_correction",
    "server_momentum",
)
"""The keys of a plan's [training]: fields of TrainingConfig and, in the same flat table, of its LocalConfig
(the simulation's total `batch_size` and FedAdam are not a plan's)."""

_LOCAL_KEYS = frozenset(field_names(LocalConfig))


def batch_fraction(training: TrainingConfig) -> float:
    """A plan's batch_fraction: each collaborator's batch is round(batch_fraction * n_k), at least 1."""
    if training.batch_fraction is None:
        raise ConfigError("a plan's [training] needs a batch_fraction: nobody in a federation knows the total batch")
    return training.batch_fraction


def training_table(training: TrainingConfig) -> dict[str, object]:
    """A plan's [training] table of `training`: the flat keys a plan and the shared settings carry."""
    return {key: getattr(training.local if key in _LOCAL_KEYS else training, key) for key in PLAN_TRAINING_KEYS}


def read_objective(source: str, data: Mapping[str, object]) -> ObjectiveConfig:
    """The plan's ``[objective]``, every value checked; the core's defaults for what it leaves out."""
    t = Table.of(source, data, "objective", field_names(ObjectiveConfig))
    d = ObjectiveConfig()
    return ObjectiveConfig(
        epsilon=number_in(t, "epsilon", EPSILON, d.epsilon),
        rho=number_in(t, "rho", RHO, d.rho),
        gamma=number_in(t, "gamma", capped(GAMMA), d.gamma),
        smooth=t.string("smooth", d.smooth, choices=SMOOTH_FUNCTIONS),
        bound=number_in(t, "bound", capped(BOUND), d.bound),
    )


def read_training(source: str, data: Mapping[str, object]) -> TrainingConfig:
    """The plan's ``[training]``, every value checked; :data:`PLAN_TRAINING`'s values for what it leaves out."""
    t = Table.of(source, data, "training", PLAN_TRAINING_KEYS)
    d = PLAN_TRAINING
    fraction = number_in(t, "batch_fraction", BATCH_FRACTION, batch_fraction(d))
    step_size = capped(STEP_SIZE)
    local = LocalConfig(
        local_steps=t.integer("local_steps", d.local.local_steps, low=1, high=MAX_LOCAL_STEPS),
        lr=number_in(t, "lr", step_size, d.local.lr),
        threshold_lr=number_in(t, "threshold_lr", step_size, d.local.threshold_lr),
        drift_correction=t.string("drift_correction", d.local.drift_correction, choices=DRIFT_CORRECTIONS),
    )
    return TrainingConfig(
        rounds=t.integer("rounds", d.rounds, low=1, high=MAX_ROUNDS),
        local=local,
        batch_fraction=fraction,
        seed=t.integer("seed", d.seed, low=0, high=MAX_SEED),
        average_from=number_in(t, "average_from", AVERAGE_FROM, d.average_from),
        server_momentum=number_in(t, "server_momentum", SERVER_MOMENTUM, d.server_momentum),
    )


def default_update_norm(training: TrainingConfig) -> float:
    """C when the plan sets none: 2 * lr * local_steps, twice the distance tau SGD steps of gradient norm 1 go.

    Honest FedSRCVaR updates on Adult measured 0.9 lr tau (median) at 1 and 5 local steps, so this
    clips few of them, but not none: a small site's update grows once c reaches the losses (Adult by
    race, 200 rounds: 9 of the smallest site's, 1.5% of all), so the model then differs from Algorithm
    1's (docs/flower.md). A tighter C bounds a liar more and slows honest training
    (benchmarks/influence_bench.py).
    """
    return 2.0 * training.local.lr * training.local.local_steps
