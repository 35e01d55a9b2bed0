"""PropFair and Delta-FL under the same distributed DP as FedSRCVaR: a per-site loss release each round, charged.

Each round every site releases F~_k, the mean of min(l_i, L) over all its n_k records at theta_t (n_k public),
Skellam noise from the CSPRNG on its integer encoding, in the clear: one record moves it by at most L / n_k. The
server turns the released losses into a factor per site (Delta-FL: pi_k / p_k; PropFair: 1 / max(M - F~_k,
margin)) and announces r_k = factor_k / max_j factor_j in [0, 1]; each site scales its clipped one-step update
(FedAvg's DP path: FedSRCVaR at epsilon 1) by r_k before the noised secure sum, so a record moves the sum no
more than under FedAvg, and the server rescales the sum by the max: -lr sum_k p_k factor_k g_k. The releases'
noise is a public constant (`LOSS_SHARE`); the sum's is calibrated so both, composed, spend the target.

Why: docs/paper.md, "PropFair and Delta-FL under the same DP".
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections.abc import Callable

import numpy as np

from fedfair.core import server
from fedfair.core.errors import ConfigError
from fedfair.core.evaluation import evaluate
from fedfair.core.local import RoundTrainer, contributing_updates
from fedfair.core.models import flat_parameters
from fedfair.privacy.distributed import Release, calibrate
from fedfair.privacy.learner import PrivateLearner
from fedfair.research.fairness_baselines import PROPFAIR_MARGIN, check_ceiling, superquantile_weights
from fedfair.research.private_rounds import PrivateRounds
from fedfair.research.task import Task
from fedfair.research.term_dp import LOSS_CLIP
from fedfair.secagg.noise import skellam
from fedfair.simulation.rounds import SimulationResult, make_learners
from fedfair.simulation.secure import DistributedDP, SecureSum, federation_dp

LOSS_UNITS = 2**12
"""U: a record's clipped loss min(l, L) is encoded as the integer round(U min(l, L) / L) in [0, U], a function
of the record alone, so one record moves a site's integer sum by at most U (L1 and L2: one coordinate). U 2^12
as the training's encoding (`fedfair.privacy.distributed.SENSITIVITY_UNITS`): the grid's step L / U is far below
the noise, and the Skellam noise's price of integrality is negligible at the mu it is calibrated to."""

LOSS_SHARE = 0.5
"""The loss releases' noise makes them alone spend this share of the target epsilon over the planned rounds (at
the plan's delta). Shares compose as RDP, not linearly: on Adult's plan (epsilon 1, 200 rounds, rate 0.0079)
half the budget for the releases raises the secure sum's noise by 4.5% (a quarter: 0.5%; 0.7: 9%; 0.9: 26%),
while a released loss carries noise of about 108 L / n_k (a quarter: 206 L / n_k), 0.067 at Adult's smallest
site of 1,621 records. Beyond a half the training pays fast for a little less noise on the losses. A public
constant, fixed from these plan figures before any run."""


def encoded_loss_sum(losses: np.ndarray, loss_clip: float = LOSS_CLIP) -> int:
    """sum_i round(U min(l_i, L) / L): a site's clipped losses on the integer grid; one record moves it by <= U."""
    clipped = np.minimum(np.asarray(losses, dtype=np.float64), loss_clip)
    if not np.isfinite(clipped).all() or (clipped < 0.0).any():
        raise ConfigError("a record's loss at theta_t is NaN, Inf or negative; the model diverged, lower --lr")
    return int(np.rint(clipped * (LOSS_UNITS / loss_clip)).astype(np.int64).sum())


def loss_release(target_epsilon: float, delta: float, rounds: int) -> Release:
    """One site's loss releases over `rounds` rounds: Skellam on its encoded sum, every record each round (rate 1).

    Their mu (the site's own: the release is in the clear, no other party's noise covers it) makes them alone
    spend `LOSS_SHARE` of `target_epsilon` at `delta`: public plan values only.
    """
    shape = Release("skellam", 1.0, float(LOSS_UNITS), float(LOSS_UNITS), 1.0, rounds)
    return dataclasses.replace(shape, mu=calibrate(LOSS_SHARE * target_epsilon, delta, [shape], tolerance=1e-4))


def released_loss(losses: np.ndarray, size: int, mu: float, loss_clip: float = LOSS_CLIP) -> float:
    """F~_k: the site's encoded clipped loss sum plus Skellam(mu) noise from a fresh CSPRNG key, over U n_k / L.

    `size` is n_k as the plan states it; mu 0 releases the exact (quantised) mean (a test of the mechanism).
    """
    noise = int(skellam(mu, 1, secrets.token_bytes(32))[0]) if mu > 0.0 else 0
    return (encoded_loss_sum(losses, loss_clip) + noise) * loss_clip / (LOSS_UNITS * size)


def deltafl_factors(level: float) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Delta-FL's site factors pi_k / p_k from the released losses and the FedAvg shares p_k (post-processing).

    pi maximises sum_k pi_k F~_k over {0 <= pi_k <= p_k / level, sum pi = 1} (`superquantile_weights`), so
    sum_k p_k factor_k g_k = sum_k pi_k g_k, Delta-FL's step.
    """

    def factors(losses: np.ndarray, shares: np.ndarray) -> np.ndarray:
        weights: np.ndarray = superquantile_weights(losses, shares, level) / shares
        return weights

    return factors


def propfair_factors(ceiling: float) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """PropFair's site factors 1 / max(M - F~_k, margin): the derivative of its -log(M - F_k), linear below margin.

    sum_k p_k factor_k g_k is then PropFair's full gradient sum_k p_k g_k / (M - F_k) (`propfair_surrogate`).
    """
    check_ceiling(ceiling)

    def factors(losses: np.ndarray, shares: np.ndarray) -> np.ndarray:
        del shares  # PropFair weighs each site by its FedAvg share p_k alone
        gaps: np.ndarray = 1.0 / np.maximum(ceiling - losses, PROPFAIR_MARGIN)
        return gaps

    return factors


def fair_plan(task: Task) -> DistributedDP:
    """The distributed DP of a PropFair or Delta-FL run on `task`.

    FedAvg's plan (FedSRCVaR's at epsilon 1) with every site's loss releases composed into the target
    (`DistributedDP.beside`).
    """
    privacy = task.privacy
    if privacy.target_epsilon is None:
        raise ConfigError("distributed DP needs a target epsilon; pass --dp-target-epsilon")
    objective = dataclasses.replace(task.objective, epsilon=1.0)
    plan = federation_dp(task.federation, task.training, objective, privacy, task.colluders)
    losses = loss_release(privacy.target_epsilon, privacy.delta, task.training.rounds)
    return dataclasses.replace(plan, beside=(losses,))


def run_fair_dp(
    task: Task,
    factors: Callable[[np.ndarray, np.ndarray], np.ndarray],
    plan: DistributedDP,
    summed: SecureSum | None,
) -> SimulationResult:
    """PropFair or Delta-FL (by `factors`) under distributed DP (module docstring), each site a `PrivateLearner`.

    Reveals to the server: every site's noised loss F~_k each round and the noised secure sum of the scaled
    updates, nothing else; each site's accountant charges both (`plan.beside`).

    `plan` is `fair_plan(task)`; `summed` the secure sum with its noise inside (`methods.secure_sum` of `plan`),
    or None to sum in the clear and release the losses without noise (a test of the mechanism; the accountants
    still charge the plan's).
    """
    federation, training = task.federation, dataclasses.replace(task.training, local=plan.local)
    template, learners = make_learners(federation, training, plan.objective, options=task.options)
    trainers = [
        PrivateLearner(learner, plan.privacy, planned_rounds=training.rounds, name=client.name, beside=plan.beside)
        for learner, client in zip(learners, federation.train, strict=True)
    ]
    sizes = [client.size for client in federation.train]
    shares = np.array([learner.batch_size for learner in learners], dtype=np.float64)
    shares /= shares.sum()
    loss_mu = plan.beside[0].mu if summed is not None else 0.0
    algorithm = dataclasses.replace(learners[0].algorithm, momentum=training.server_momentum, adam=training.server_adam)
    state = algorithm.server_init(flat_parameters(template))
    rounds = PrivateRounds(task, template)
    active: list[RoundTrainer] = list(trainers)
    for _ in range(training.rounds):
        # The template holds no clipping hooks; each site evaluates its own records at theta_t.
        released = np.array(
            [
                released_loss(evaluate(template, state.theta, client).losses, size, loss_mu)
                for client, size in zip(federation.train, sizes, strict=True)
            ]
        )
        factor = factors(released, shares)
        largest = float(factor.max())
        if not (math.isfinite(largest) and largest > 0.0):
            raise ConfigError(f"the sites' factors {factor} have no positive finite maximum; check the method's knob")
        ratios = {id(trainer): ratio for trainer, ratio in zip(trainers, factor / largest, strict=True)}
        updates, active = contributing_updates(active, state.theta, 0.0)
        own = [
            dataclasses.replace(update, delta=update.delta * ratios[id(trainer)], delta_c=0.0)
            for update, trainer in zip(updates, active, strict=True)
        ]
        aggregate = server.Aggregate.of(own) if summed is None else summed(own)
        # c carries nothing at epsilon 1: its coordinate is noise alone, and theta's sum is rescaled by the max.
        aggregate = dataclasses.replace(
            aggregate, weighted_delta=aggregate.weighted_delta * largest, weighted_delta_c=0.0
        )
        state = algorithm.server_apply(state, aggregate, average_from=training.average_from_round)
        rounds.applied(state)
    return rounds.result(state, trainers, summed)
