"""The looped executor: one collaborator's local steps, by autograd on its own model.

`LocalLearner` runs a collaborator's share of a round with FedJAX's client split,
`begin` (load the global pair), `step` (one mini-batch), `finish` (the update); what a
step does with the gradient is `fedfair.core.algorithm`'s. The in-process simulation
(where its batched twin does not apply), the real collaborator process, the baselines
and the private learner all drive it. It does no I/O. `BatchSampler` draws its
mini-batches, and `contributing_updates` runs a round over the collaborators still in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import nn

from fedfair.core.algorithm import ClientRound, FedSRCVaR
from fedfair.core.config import LocalConfig
from fedfair.core.errors import BudgetReason, ConfigError, PrivacyBudgetError, QuorumError, QuorumReason
from fedfair.core.models import flat_parameters, load_flat_parameters, per_sample_loss
from fedfair.core.objective import RCVaRThreshold
from fedfair.core.update import Update

logger = logging.getLogger(__name__)


class BatchSampler:
    """Fixed-size mini-batches drawn without replacement from shuffled passes over n samples.

    Seeded and device-independent: the same seed gives the same indices on any machine.
    """

    def __init__(self, num_samples: int, batch_size: int, seed: int) -> None:
        if num_samples < 1:
            raise ConfigError("a collaborator has no training samples; check the partition (each client needs data)")
        if not 1 <= batch_size <= num_samples:
            raise ConfigError(
                f"batch size {batch_size} is outside [1, {num_samples}] for a client with {num_samples} samples; "
                "lower --batch-size or use 0 for full batches"
            )
        self.num_samples = num_samples
        self.batch_size = batch_size
        self._generator = torch.Generator().manual_seed(seed)
        self._order = torch.empty(0, dtype=torch.long)
        self._cursor = 0

    def next_batch(self) -> torch.Tensor | None:
        """Indices of the next mini-batch, or None when the batch is the whole local set."""
        if self.batch_size == self.num_samples:
            return None
        if self._cursor + self.batch_size > self._order.numel():
            rest = self._order[self._cursor :]
            fresh = torch.randperm(self.num_samples, generator=self._generator)
            self._order = torch.cat([rest, fresh])
            self._cursor = 0
        batch = self._order[self._cursor : self._cursor + self.batch_size]
        self._cursor += self.batch_size
        return batch


PerSampleLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(model outputs, labels) -> one loss per sample, e.g. lambda o, y: F.cross_entropy(o, y, reduction="none")."""


class LocalLearner:
    """The looped executor of `FedSRCVaR`: one collaborator's model, objective head and data.

    It computes each step's gradient by autograd on its own model and hands it to the
    algorithm's rules (`fedfair.core.algorithm`), which take the step, correct drift and
    project; `threshold` is the RCVaR head holding c, and without one the objective is the
    plain mean loss (FedAvg), so the baselines share this code path exactly. `loss` is the
    per-sample loss (cross-entropy unless the caller brings its own, which must give one loss
    per sample).
    """

    def __init__(
        self,
        model: nn.Module,
        features: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        config: LocalConfig,
        *,
        threshold: RCVaRThreshold | None = None,
        seed: int = 0,
        loss: PerSampleLoss | None = None,
    ) -> None:
        parameter = next(model.parameters())
        self.model = model
        self.loss: PerSampleLoss = per_sample_loss if loss is None else checked_loss(loss)
        self.threshold = threshold
        self.config = config
        self.algorithm = FedSRCVaR(config, bound=None if threshold is None else threshold.bound)
        # Data moves to the model's device and dtype once, not per step.
        self.features = features.to(parameter.device, parameter.dtype)
        self.labels = labels.to(parameter.device)
        self.sampler = BatchSampler(self.features.shape[0], batch_size, seed)
        self.batch_size = batch_size
        self.state_tensors: list[torch.Tensor] = list(model.parameters())
        """What a step moves, in the algorithm's order: theta's tensors, then c when there is a threshold."""
        if threshold is not None:
            self.state_tensors.append(threshold.c)
        self._round: ClientRound | None = None
        self._batch: tuple[torch.Tensor, torch.Tensor] | None = None
        # sigma_k: [theta's coordinates, c] in step units, float64 on the model's device, zero before the first round.
        self.control: torch.Tensor | None = None
        if config.corrects_drift:
            size = sum(part.numel() for part in model.parameters()) + 1
            self.control = torch.zeros(size, dtype=torch.float64, device=parameter.device)

    @property
    def num_samples(self) -> int:
        """n_k, the collaborator's local training samples."""
        return int(self.features.shape[0])

    def begin(self, theta: torch.Tensor, c: float, control: torch.Tensor | None = None) -> None:
        """Start a round from the global pair (theta_t, c_t).

        Args:
            theta: the global model's flat parameters, moved to the model's device and dtype here.
            c: the global threshold; ignored without an RCVaR head.
            control: with drift correction, the server's control variate sigma ([theta's coordinates, c]
                in step units); None counts as zeros.
        """
        parameter = next(self.model.parameters())
        start_theta = theta.detach().to(parameter.device, parameter.dtype)
        load_flat_parameters(self.model, start_theta)
        if self.threshold is not None:
            with torch.no_grad():
                self.threshold.c.fill_(float(c))
        self._round = self.algorithm.client_init(
            start_theta, c, self.state_tensors, own_control=self.control, server_control=control
        )
        self._batch = self._draw_batch() if self.config.reuse_batch else None

    def _draw_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        index = self.sampler.next_batch()
        if index is None:
            return self.features, self.labels
        # Non-blocking: a blocking host-to-device copy would make every step wait for the GPU's queue.
        index = index.to(self.features.device, non_blocking=True)
        return self.features.index_select(0, index), self.labels.index_select(0, index)

    def objective(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-sample training objective: smoothed RCVaR terms, or plain losses without a threshold."""
        losses = self.loss(self.model(features), labels)
        return losses if self.threshold is None else self.threshold(losses)

    def zero_grad(self) -> None:
        """Clear the gradients of every state tensor (theta's tensors and c), so a backward pass starts afresh."""
        for tensor in self.state_tensors:
            tensor.grad = None

    def step(self) -> None:
        """One local step: the mean objective's gradient on a mini-batch, then the algorithm's step."""
        features, labels = self._batch if self._batch is not None else self._draw_batch()
        self.zero_grad()
        torch.autograd.backward(self.objective(features, labels).mean())
        self.take_step([tensor.grad for tensor in self.state_tensors])

    def take_step(self, gradients: list[torch.Tensor | None]) -> None:
        """The algorithm's step on this model from `gradients` (one per state tensor, None: none).

        The private learner computes its own (clipped, noised) gradients and takes its steps
        through here, so both follow the same rules and `finish` knows tau.
        """
        self.algorithm.client_step(self._current_round(), self.state_tensors, gradients)

    def _current_round(self) -> ClientRound:
        if self._round is None:
            raise RuntimeError("no round in progress; a round starts from the global model with begin()")
        return self._round

    def finish(self) -> Update:
        """The round's update (theta_k - theta_t, c_k - c_t) with weight b_k.

        With drift correction it also moves sigma_k to sigma_k+ (the algorithm's `client_final`) and sends it.
        """
        round_ = self._current_round()
        with torch.no_grad():
            c = self.threshold.c.detach() if self.threshold is not None else None
            delta, delta_c, control = self.algorithm.client_final(round_, flat_parameters(self.model), c, self.control)
        self._round = None
        if control is not None:
            self.control = control
        return Update(delta=delta, delta_c=float(delta_c), weight=float(self.batch_size), control=control)

    def train_round(self, theta: torch.Tensor, c: float, control: torch.Tensor | None = None) -> Update:
        """begin, tau steps, finish: a collaborator's whole part of one round."""
        self.begin(theta, c, control)
        for _ in range(self.config.local_steps):
            self.step()
        return self.finish()


def checked_loss(loss: PerSampleLoss) -> PerSampleLoss:
    """The caller's loss, refused (`checked_losses`) unless it gives one loss per sample."""

    def checked(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return checked_losses(loss(outputs, labels), outputs.shape[0])

    return checked


def checked_losses(losses: torch.Tensor, samples: int) -> torch.Tensor:
    """The loss function's output, once it is one loss per sample (RCVaR needs each sample's loss)."""
    if losses.shape != (samples,):
        raise ConfigError(
            f"the loss returned shape {tuple(losses.shape)} for a batch of {samples}; it must return one loss "
            "per sample, e.g. F.cross_entropy(outputs, labels, reduction='none')"
        )
    return losses


class RoundTrainer(Protocol):
    """What a round needs of a collaborator: a plain LocalLearner or a private one."""

    def train_round(self, theta: torch.Tensor, c: float, control: torch.Tensor | None = None) -> Update:
        """The collaborator's update for one round from the global (theta, c) and the server's control variate.

        Raises:
            PrivacyBudgetError: with reason LEARNER_SPENT, the collaborator leaves for good before this round.
        """
        ...


def contributing_updates(
    learners: Sequence[RoundTrainer],
    theta: torch.Tensor,
    c: float,
    *,
    control: torch.Tensor | None = None,
    quorum: int = 1,
) -> tuple[list[Update], list[RoundTrainer]]:
    """One round over the collaborators still contributing: (their updates, those that remain).

    `control` is the server's drift-correction control variate (`ServerState.control`), None without.

    A learner that stops contributing (a `PrivacyBudgetError`: its budget is spent)
    is left out from this round on, with a warning; if fewer than `quorum` remain,
    a QuorumError (LOST) ends the federation.
    """
    updates: list[Update] = []
    remaining: list[RoundTrainer] = []
    for learner in learners:
        try:
            updates.append(learner.train_round(theta, c, control))
        except PrivacyBudgetError as stopped:
            if stopped.reason is not BudgetReason.LEARNER_SPENT:
                raise
            logger.warning("%s", stopped)
            continue
        remaining.append(learner)
    if len(updates) < quorum:
        raise QuorumError(
            QuorumReason.LOST,
            f"only {len(updates)} of {len(learners)} collaborators are within their privacy budgets, below the quorum "
            f"of {quorum}; the federation stops here (larger budgets would let it go on)",
        )
    return updates, remaining
