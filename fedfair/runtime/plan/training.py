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
        epsilon=t.number("epsilon", d.epsilon, check=EPSILON.__contains__, expected=EPSILON.expected),
        rho=t.number("rho", d.rho, check=RHO.__contains__, expected=RHO.expected),
        gamma=t.number("gamma", d.gamma, check=GAMMA.__contains__, expected=GAMMA.expected),
        smooth=t.string("smooth", d.smooth, choices=SMOOTH_FUNCTIONS),
        bound=t.number("bound", d.bound, check=BOUND.__contains__, expected=BOUND.expected),
    )


def read_training(source: str, data: Mapping[str, object]) -> TrainingConfig:
    """The plan's ``[training]``, every value checked; :data:`PLAN_TRAINING`'s values for what it leaves out."""
    t = Table.of(source, data, "training", PLAN_TRAINING_KEYS)
    d = PLAN_TRAINING
    fraction = t.number(
        "batch_fraction", batch_fraction(d), check=BATCH_FRACTION.__contains__, expected=BATCH_FRACTION.expected
    )
    local = LocalConfig(
        local_steps=t.integer("local_steps", d.local.local_steps, low=1),
        lr=t.number("lr", d.local.lr, check=STEP_SIZE.__contains__, expected=STEP_SIZE.expected),
        threshold_lr=t.number(
            "threshold_lr", d.local.threshold_lr, check=STEP_SIZE.__contains__, expected=STEP_SIZE.expected
        ),
        drift_correction=t.string("drift_correction", d.local.drift_correction, choices=DRIFT_CORRECTIONS),
    )
    return TrainingConfig(
        rounds=t.integer("rounds", d.rounds, low=1),
        local=local,
        batch_fraction=fraction,
        seed=t.integer("seed", d.seed, low=0),
        average_from=t.number(
            "average_from", d.average_from, check=AVERAGE_FROM.__contains__, expected=AVERAGE_FROM.expected
        ),
        server_momentum=t.number(
            "server_momentum", d.server_momentum, check=SERVER_MOMENTUM.__contains__, expected=SERVER_MOMENTUM.expected
        ),
    )


def default_update_norm(training: TrainingConfig) -> float:
    """C when the plan sets none: 2 * lr * local_steps, twice the distance tau SGD steps of gradient norm 1 go.

    Honest FedSRCVaR updates on Adult measured 0.9 lr tau (median) at 1 and 5 local steps,
    so this clips almost none of them; a tighter C bounds a liar more and slows honest training
    (benchmarks/influence_bench.py).
    """
    return 2.0 * training.local.lr * training.local.local_steps
