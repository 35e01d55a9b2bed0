"""Algorithm 1 over an in-process federation: the executors of `fedfair.core.algorithm`, rounds, history.

Runs exactly the rules the real processes run (`fedfair.core.algorithm.FedSRCVaR`),
summing updates in the clear or, when the caller asks, through secure aggregation
(`fedfair.simulation.secure.SecureSum`). Fast enough for research sweeps over
(epsilon, rho) grids.

Besides the built-in models, a caller may bring its own: any function returning an
`nn.Module` (built under the training seed, so every collaborator starts from the
same theta_0) and any per-sample loss.

Why: docs/design.md, "Inside the simulation".
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from fedfair.core import server
from fedfair.core.config import ObjectiveConfig, TrainingConfig
from fedfair.core.data import ClientData, client_batch_sizes, client_seed, local_batch_size
from fedfair.core.device import device_for
from fedfair.core.errors import ConfigError
from fedfair.core.evaluation import evaluate
from fedfair.core.local import (
    LocalLearner,
    PerSampleLoss,
    RoundTrainer,
    checked_losses,
    contributing_updates,
)
from fedfair.core.models import build_model, flat_parameters, load_flat_parameters, seeded, trainable_module
from fedfair.core.objective import RCVaRThreshold, make_smooth_plus, rcvar, smoothed_rcvar_per_sample
from fedfair.core.update import Update
from fedfair.privacy.config import PrivacyConfig
from fedfair.privacy.learner import PrivateLearner
from fedfair.simulation.federation import DTYPES, Federation, ModelFactory, history_sample
from fedfair.simulation.vectorised import VectorisedClients

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimulationOptions:
    """What only an in-process simulation chooses beside the training schedule (`TrainingConfig`).

    The built-in model, where and in which precision it trains, and how often the history records
    the training objective (every `record_every` rounds; 0: never).
    """

    model: str = "logreg"
    device: str = "cpu"
    dtype: str = "float32"
    record_every: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"unknown dtype '{self.dtype}'; choose float32 or float64")

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype the model and data take."""
        return DTYPES[self.dtype]


def make_learners(
    federation: Federation,
    training: TrainingConfig,
    objective: ObjectiveConfig | None,
    *,
    options: SimulationOptions = SimulationOptions(),
    model_factory: ModelFactory | None = None,
    loss: PerSampleLoss | None = None,
) -> tuple[nn.Module, list[LocalLearner]]:
    """A template model and one LocalLearner per collaborator, each with its own seeded sampler.

    The model is `options.model` (built in) unless `model_factory` is given; the loss is
    cross-entropy unless `loss` is.
    """
    device = device_for(options.device)

    def fresh_model() -> nn.Module:
        if model_factory is not None:
            model = trainable_module(seeded(model_factory, training.seed), "the model factory")
            return model.to(device, options.torch_dtype)
        return build_model(
            options.model,
            federation.num_features,
            federation.num_classes,
            image_shape=federation.image_shape,
            seed=training.seed,
            dtype=options.torch_dtype,
        ).to(device)

    sizes = [client.size for client in federation.train]
    if training.batch_fraction is not None:
        batch_sizes = [local_batch_size(size, training.batch_fraction) for size in sizes]
    else:
        batch_sizes = client_batch_sizes(sizes, training.batch_size)
    learners = []
    for index, (client, batch_size) in enumerate(zip(federation.train, batch_sizes)):
        threshold = None
        if objective is not None:
            threshold = RCVaRThreshold(objective, dtype=options.torch_dtype).to(device)
        seed = client_seed(training.seed, index)
        model = fresh_model()
        learner = LocalLearner(
            model,
            client.features,
            client.labels,
            batch_size,
            training.local,
            threshold=threshold,
            seed=seed,
            loss=loss,
        )
        learners.append(learner)
    return fresh_model(), learners


def training_objectives(losses: np.ndarray, c: float, objective: ObjectiveConfig) -> tuple[float, float]:
    """(exact RCVaR minimised over c, smoothed objective at the given c) of training losses."""
    smooth_plus = make_smooth_plus(objective.smooth, objective.gamma)
    smooth = smoothed_rcvar_per_sample(
        torch.from_numpy(losses), c, objective.epsilon, objective.rho, smooth_plus
    ).mean()
    return rcvar(losses, objective.epsilon, objective.rho), float(smooth)


@dataclass
class SimulationResult:
    """The final server state, the model to evaluate it with, and recorded history."""

    state: server.ServerState
    model: nn.Module
    history: list[dict[str, float]]
    privacy: dict[str, dict[str, float | int | str | None]] = field(default_factory=dict)
    noise: dict[str, float | int] = field(default_factory=dict)
    """The secure sum's distributed DP noise (`SecureSum.noise_report`); empty when the sums carry none."""
    vectorised: bool = False
    """Whether the collaborators' local steps ran as one batched computation."""
    loop_reason: str = ""
    """Why they ran as a loop over learners instead ("" when vectorised)."""


RoundCallback = Callable[[server.ServerState], None]


def batched_clients(
    learners: Sequence[LocalLearner], *, private: bool, vectorise: bool
) -> tuple[VectorisedClients | None, str]:
    """The learners as one batched computation, or None and the reason the simulation keeps the loop."""
    if not vectorise:
        return None, "the loop was asked for (vectorise=False)"
    if private:
        # Each private learner draws its own Poisson batch and clips per sample through Opacus.
        return None, "DP-SGD trains each collaborator on its own Poisson-sampled batches"
    clients = VectorisedClients(learners)
    reason = clients.blocker()
    return (None, reason) if reason is not None else (clients, "")


def run_rounds(
    federation: Federation,
    training: TrainingConfig,
    objective: ObjectiveConfig | None,
    *,
    options: SimulationOptions = SimulationOptions(),
    aggregate: Callable[[list[Update]], server.Aggregate] | None = None,
    on_round: RoundCallback | None = None,
    privacy: PrivacyConfig | None = None,
    model_factory: ModelFactory | None = None,
    loss: PerSampleLoss | None = None,
    vectorise: bool = True,
) -> SimulationResult:
    """Algorithm 1 over the federation; objective None runs the same loop on the mean loss (FedAvg).

    `aggregate` turns the round's updates into sums; the default (None) adds them in the
    clear (`server.Aggregate.of`), secure aggregation substitutes its masked sum. With
    `privacy` enabled every collaborator trains with DP-SGD and stops contributing once
    its budget is spent. `options` picks the built-in model, device, dtype and how often
    the history records; `model_factory` and `loss` replace the built-in model and
    cross-entropy (make_learners). The local steps are vectorised whenever they can be
    (`vectorise=False` forces the loop over learners); `SimulationResult.vectorised` and
    `loop_reason` say which ran.
    """
    template, learners = make_learners(
        federation, training, objective, options=options, model_factory=model_factory, loss=loss
    )
    trainers: list[RoundTrainer] = list(learners)
    private = privacy is not None and privacy.enabled
    if privacy is not None and privacy.enabled:
        trainers = [
            PrivateLearner(learner, privacy, planned_rounds=training.rounds, name=client.name)
            for learner, client in zip(learners, federation.train, strict=True)
        ]
    clients, loop_reason = batched_clients(learners, private=private, vectorise=vectorise)
    if clients is None:
        logger.info("local steps: a loop over %d collaborators (%s)", len(learners), loop_reason)
    else:
        logger.info("local steps: %d collaborators vectorised into one batched step", len(learners))
    algorithm = dataclasses.replace(learners[0].algorithm, momentum=training.server_momentum, adam=training.server_adam)
    state = algorithm.server_init(flat_parameters(template))
    history: list[dict[str, float]] = []
    pooled = history_sample(federation) if options.record_every else None
    for _ in range(training.rounds):
        if clients is not None:
            stacked = clients.train_round(state.theta, state.c, state.control)
            summed = stacked.plain_sum() if aggregate is None else aggregate(stacked.updates())
        else:
            updates, trainers = contributing_updates(trainers, state.theta, state.c, control=state.control)
            summed = (aggregate or server.Aggregate.of)(updates)
        state = algorithm.server_apply(state, summed, average_from=training.average_from_round)
        if on_round is not None:
            on_round(state)
        if pooled is not None and (state.round % options.record_every == 0 or state.round == training.rounds):
            history.append(round_record(template, state, pooled, objective, loss))
    reports = {trainer.name: trainer.report().to_dict() for trainer in trainers if isinstance(trainer, PrivateLearner)}
    return SimulationResult(
        state=state,
        model=template,
        history=history,
        privacy=reports,
        vectorised=clients is not None,
        loop_reason=loop_reason,
    )


def round_record(
    model: nn.Module,
    state: server.ServerState,
    pooled: ClientData,
    objective: ObjectiveConfig | None,
    loss: PerSampleLoss | None = None,
) -> dict[str, float]:
    """Training objective of the last and averaged iterates at this round (under `loss` when given)."""
    record: dict[str, float] = {"round": state.round, "c": state.c, "c_average": state.c_average}
    for label, theta, c in (("last", state.theta, state.c), ("average", state.theta_average, state.c_average)):
        losses = evaluate(model, theta, pooled).losses if loss is None else sample_losses(model, theta, pooled, loss)
        record[f"mean_loss_{label}"] = float(losses.mean())
        if objective is not None:
            exact, smooth = training_objectives(losses, c, objective)
            record[f"train_objective_{label}"] = exact
            record[f"train_objective_smooth_{label}"] = smooth
    return record


@torch.no_grad()
def sample_losses(
    model: nn.Module, theta: torch.Tensor, data: ClientData, loss: PerSampleLoss, chunk: int = 65536
) -> np.ndarray:
    """Each sample's loss under the caller's loss function at parameters theta (float64)."""
    parameter = next(model.parameters())
    load_flat_parameters(model, theta.to(parameter.device, parameter.dtype))
    parts = []
    for start in range(0, data.size, chunk):
        features = data.features[start : start + chunk].to(parameter.device, parameter.dtype)
        labels = data.labels[start : start + chunk].to(parameter.device)
        parts.append(checked_losses(loss(model(features), labels), features.shape[0]).double().cpu())
    return torch.cat(parts).numpy()


def run_fedsrcvar(
    federation: Federation,
    objective: ObjectiveConfig,
    training: TrainingConfig,
    *,
    options: SimulationOptions = SimulationOptions(),
    aggregate: Callable[[list[Update]], server.Aggregate] | None = None,
    on_round: RoundCallback | None = None,
    privacy: PrivacyConfig | None = None,
    model_factory: ModelFactory | None = None,
    loss: PerSampleLoss | None = None,
    vectorise: bool = True,
) -> SimulationResult:
    """FedSRCVaR (Algorithm 1): local steps on smoothed RCVaR, weighted averaging, c projected."""
    return run_rounds(
        federation,
        training,
        objective,
        options=options,
        aggregate=aggregate,
        on_round=on_round,
        privacy=privacy,
        model_factory=model_factory,
        loss=loss,
        vectorise=vectorise,
    )
