"""TERM under the same distributed DP as FedSRCVaR, its tilted normaliser one more coordinate of the noised sum.

Each record's loss is clipped to [0, L] for its weight w_i = exp(t (min(l_i, L) - L)) in (0, 1]; a site sends
[-lr S_k, lr C W_k] over its expected batch, S_k the sum of w_i grad l_i each clipped at C and W_k = sum_i w_i
over its Poisson sample, in c's place of FedSRCVaR's vector (clip bound 1, step lr C), so one record moves it by
at most sqrt(2) lr C / b and FedSRCVaR's calibration, secure sum and accountant cover it. The server divides the
one noised sum by the other (post-processing): -lr times TERM's tilted gradient of the sampled records.

Why: docs/paper.md, "TERM under the same DP".
"""

from __future__ import annotations

import dataclasses
import math

import torch

from fedfair.core import server
from fedfair.core.config import ObjectiveConfig, TrainingConfig
from fedfair.core.data import client_seed
from fedfair.core.errors import ConfigError
from fedfair.core.local import LocalLearner, RoundTrainer, contributing_updates
from fedfair.core.models import flat_parameters
from fedfair.privacy.learner import PrivateLearner
from fedfair.research.private_rounds import PrivateRounds
from fedfair.research.task import Task
from fedfair.simulation.rounds import SimulationResult, make_learners
from fedfair.simulation.secure import DistributedDP, SecureSum, federation_dp

LOSS_CLIP = 1.0
"""L: each record's loss is clipped to [0, L] for its tilted weight exp(t (min(l, L) - L)) in (0, 1]. A record
whose true class has probability below 1/e (cross-entropy above 1) weighs 1, the most; below L the weights keep
TERM's ratios exp(t (l_i - l_j)). A smaller L would raise every weight, and so the normaliser above its noise,
but flatten the tilt over more records; a public constant, chosen before any run."""

NORMALISER_SCALE_PER_CLIP = 1.0
"""The normaliser's step over lr C: each record moves its coordinate by lr C w_i / b, at most as far as it can
move theta's (lr C / b), so the normaliser carries the same noise per unit of its sensitivity as theta's update
and a record's bound is sqrt(2) lr C / b. With a step of lr (sensitivity 1, as c's coordinate) its noise would
be C times its sensitivity and drown the normaliser."""

NORMALISER = ObjectiveConfig(rho=1.0, epsilon=0.0, smooth="zang", gamma=0.5)
"""The head whose coordinate carries the normaliser: c's, read with epsilon 0, rho 1 and Zang's smoothing at an
input one below c, where the smoothed plus is 0 with slope 0, so the head outputs c with slope 1 in c for
every record. Every round starts its c at 0 (`NORMALISER_START`) and never projects it, so only the move counts."""

NORMALISER_START = 0.0
"""c at each round's start: the normaliser is c's move, so its value only has to keep that move exact."""


def tilted_weights(losses: torch.Tensor, tilt: float, loss_clip: float = LOSS_CLIP) -> torch.Tensor:
    """Each record's weight exp(t (min(l_i, L) - L)) in (0, 1]: TERM's exp(t l_i) over exp(t L)."""
    return torch.exp(tilt * (losses.clamp(max=loss_clip) - loss_clip))


class DPTERMLearner(LocalLearner):
    """A LocalLearner whose per-record objective is w_i (l_i - c): theta's gradient w_i grad l_i, c's -w_i.

    Under one-pass clipping with c's own bound 1 (w_i <= 1 is never clipped) one step moves c up by its step times
    sum_i w_i / b: the round's update carries the normaliser in c's coordinate (`NORMALISER`). The weights are
    read at the losses before the step and held constant through backward, as `TERMLearner`'s.
    """

    tilt: float = 1.0

    def objective(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The batch's per-record w_i (l_i - c), c's head fed an input where it outputs c with slope 1."""
        if self.threshold is None:
            raise ConfigError("DP TERM carries its normaliser in c's coordinate; build its learners with NORMALISER")
        losses = self.loss(self.model(features), labels)
        below = torch.full_like(losses, -1.0) + self.threshold.c.detach()
        carried: torch.Tensor = self.threshold(below)  # c, with d carried / dc = 1 for every record
        return tilted_weights(losses.detach(), self.tilt) * (losses - carried)


def tilted_step(aggregate: server.Aggregate, normaliser_lr: float, noise_floor: float) -> server.Aggregate:
    """The server's TERM step from the summed [b_k delta_k, b_k delta_c_k]: theta's sum over the normaliser.

    b_k delta_c_k sums to normaliser_lr sum_i w_i (plus noise): divided by normaliser_lr it is the released
    normaliser, floored at `noise_floor` (its noise's standard deviation, public) so that a normaliser below its
    own noise cannot blow the step up. The result averages to -lr sum_i w_i grad l_i / normaliser; c stays put.
    """
    normaliser = max(aggregate.weighted_delta_c / normaliser_lr, noise_floor)
    if normaliser <= 0.0:  # no noise and no record sampled: theta's sum is zero too
        return dataclasses.replace(
            aggregate, weighted_delta=torch.zeros_like(aggregate.weighted_delta), weighted_delta_c=0.0
        )
    scale = aggregate.total_weight / normaliser
    return dataclasses.replace(aggregate, weighted_delta=aggregate.weighted_delta * scale, weighted_delta_c=0.0)


def dp_training(training: TrainingConfig, max_grad_norm: float) -> TrainingConfig:
    """The training with the normaliser's step lr C (`NORMALISER_SCALE_PER_CLIP`) and c never projected locally."""
    local = dataclasses.replace(
        training.local,
        threshold_lr=training.local.lr * max_grad_norm * NORMALISER_SCALE_PER_CLIP,
        project_locally=False,
    )
    return dataclasses.replace(training, local=local)


def term_plan(task: Task) -> DistributedDP:
    """The distributed DP of TERM's run on `task`: FedSRCVaR's plan (`federation_dp`) with the normaliser's step.

    The step is `dp_training`'s, the normaliser's clip bound 1; the sites and the secure sum derive the same noise.
    """
    training = dp_training(task.training, task.privacy.max_grad_norm)
    privacy = dataclasses.replace(task.privacy, threshold_max_grad_norm=1.0)
    return federation_dp(task.federation, training, NORMALISER, privacy, task.colluders)


def run_term_dp(task: Task, tilt: float, plan: DistributedDP, summed: SecureSum | None) -> SimulationResult:
    """TERM under distributed DP (module docstring): each site a `PrivateLearner` over a `DPTERMLearner`.

    Reveals to the server: the noised secure sum of the updates and the normaliser, nothing else.

    `plan` is `term_plan(task)`; `summed` the secure sum with its noise inside (`methods.secure_sum` of `plan`),
    or None to sum in the clear without noise (a test of the mechanism; the accountants still charge the plan's).
    """
    if not (math.isfinite(tilt) and tilt > 0.0):
        raise ConfigError(f"TERM's tilt t must be a positive number, got {tilt}; e.g. --tilt 1")
    federation = task.federation
    training = dataclasses.replace(task.training, local=plan.local)
    template, plain = make_learners(federation, training, NORMALISER, options=task.options)
    learners = []
    for index, learner in enumerate(plain):
        own = DPTERMLearner(
            learner.model,
            learner.features,
            learner.labels,
            learner.batch_size,
            learner.config,
            threshold=learner.threshold,
            seed=client_seed(training.seed, index),
        )
        own.tilt = tilt
        learners.append(own)
    trainers = [
        PrivateLearner(learner, plan.privacy, planned_rounds=training.rounds, name=client.name)
        for learner, client in zip(learners, federation.train, strict=True)
    ]
    algorithm = dataclasses.replace(plain[0].algorithm, momentum=training.server_momentum, adam=training.server_adam)
    state = algorithm.server_init(flat_parameters(template))
    rounds = PrivateRounds(task, template)
    normaliser_lr = training.local.threshold_lr
    active: list[RoundTrainer] = list(trainers)
    for _ in range(training.rounds):
        updates, active = contributing_updates(active, state.theta, NORMALISER_START)
        aggregate = server.Aggregate.of(updates) if summed is None else summed(updates)
        floor = summed.noise_stds[-1] / normaliser_lr if summed is not None and summed.noise_stds else 0.0
        state = algorithm.server_apply(
            state, tilted_step(aggregate, normaliser_lr, floor), average_from=training.average_from_round
        )
        rounds.applied(state)
    return rounds.result(state, trainers, summed)
