"""A collaborator's share of one round: tau local SGD steps from the global (theta, c).

This is the client half of Algorithm 1 and the only training code in fedfair: the
in-process simulation, the real collaborator process, the baselines and the
private path all call it. It does no I/O. Following FedJAX's client split, a round
is `begin` (load the global pair), `step` (one mini-batch), `finish` (the update).
As in the paper, c is left unconstrained within a round and the server projects
the average onto [0, B]; `LocalConfig.project_locally` also projects every step.

With `LocalConfig.drift_correction` = "scaffold" the learner keeps SCAFFOLD's control
variate (Karimireddy et al. 2020, option II) for theta and c, laid out as one float64
vector [theta's coordinates, c] and kept in step units: sigma_k = lr * s_k (c's
coordinate with threshold_lr), s_k the gradient estimate SCAFFOLD writes, so that the
values that travel are parameter moves, the size the encoding's clip is set for, and the
server needs no step size. Every local step is followed by x -= sigma - sigma_k, sigma
the server's control variate sent with (theta_t, c_t); `finish` sets
sigma_k+ = sigma_k - sigma + (x_t - x_k) / tau (the round's mean corrected step) and
sends it beside the update. The server's next sigma is the weighted mean of the sigma_k+
it received: one more secure sum, and nothing accumulated across rounds, so a
collaborator that drops out, restarts or sits a round out leaves no error behind
(SCAFFOLD's running update s += mean(s_k+ - s_k) is the same value when everyone
contributes).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from fedfair.core.config import LocalConfig
from fedfair.core.errors import ConfigError, FedfairError
from fedfair.core.models import flat_parameters, load_flat_parameters, per_sample_loss
from fedfair.core.objective import RCVaRThreshold

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Update:
    """What a collaborator contributes: its change of (theta, c) and its weight w_k = b_k.

    The server needs only w * delta, w * delta_c and w summed over collaborators,
    which is exactly what secure aggregation reveals. With drift correction,
    `control` is the collaborator's new control variate sigma_k+ ([theta's coordinates,
    c] in step units, float64), whose weighted sum is one more secure sum; it is None
    without.
    """

    delta: torch.Tensor
    delta_c: float
    weight: float
    control: torch.Tensor | None = None

    def weighted_vector(self) -> torch.Tensor:
        """The vector a collaborator submits, in float64: [w * delta, w * delta_c], followed by
        w * control when drift correction is on (then 2 (d + 1) numbers, still only summed)."""
        delta_c = torch.tensor([self.delta_c], dtype=torch.float64)
        parts = [self.delta.detach().to("cpu", torch.float64), delta_c]
        if self.control is not None:
            parts.append(self.control.detach().to("cpu", torch.float64))
        return torch.cat(parts) * self.weight


def bounded(update: Update, weight: float, norm: float) -> Update:
    """`update` as a federation with agreed weights submits it: with the agreed `weight` in place of
    the batch size, and (delta, delta_c) scaled into the L2 ball of radius `norm`, so that this
    collaborator moves the weighted mean by at most weight * norm / total weight.

    An update already inside the ball is returned with its tensors untouched (bit for bit). The
    drift-correction control variate is a separate sum, bounded coordinate by coordinate by the
    encoding's clip, and is left as it is. A non-finite update is returned unscaled: the caller
    refuses it.
    """
    delta = update.delta.detach()
    length = math.sqrt(float(delta.to(torch.float64).square().sum()) + update.delta_c**2)
    if not math.isfinite(length) or length <= norm:
        return dataclasses.replace(update, weight=weight)
    scale = norm / length
    return dataclasses.replace(update, delta=delta * scale, delta_c=update.delta_c * scale, weight=weight)


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


class LocalLearner:
    """A collaborator's model, objective head and data, ready to run rounds.

    `threshold` is the RCVaR head holding c; without one the objective is the plain
    mean loss (FedAvg), so the baselines share this code path exactly.
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
    ) -> None:
        parameter = next(model.parameters())
        self.model = model
        self.threshold = threshold
        self.config = config
        # Data moves to the model's device and dtype once, not per step.
        self.features = features.to(parameter.device, parameter.dtype)
        self.labels = labels.to(parameter.device)
        self.sampler = BatchSampler(self.features.shape[0], batch_size, seed)
        self.batch_size = batch_size
        groups = [{"params": list(model.parameters()), "lr": config.lr}]
        if threshold is not None:
            groups.append({"params": [threshold.c], "lr": config.threshold_lr})
        self.optimizer = torch.optim.SGD(groups, lr=config.lr)
        self._start_theta: torch.Tensor | None = None
        self._start_c = 0.0
        self._batch: tuple[torch.Tensor, torch.Tensor] | None = None
        self._steps_taken = 0
        # sigma_k: [theta's coordinates, c] in step units, float64 on the model's device, zero before the first round.
        self.control: torch.Tensor | None = None
        if config.corrects_drift:
            size = sum(part.numel() for part in model.parameters()) + 1
            self.control = torch.zeros(size, dtype=torch.float64, device=parameter.device)
        self._server_control: torch.Tensor | None = None
        self._corrections: list[tuple[torch.Tensor, torch.Tensor]] = []
        """This round's (tensor, sigma - sigma_k shaped like it) for theta's parameters and c."""

    @property
    def num_samples(self) -> int:
        return int(self.features.shape[0])

    def begin(self, theta: torch.Tensor, c: float, control: torch.Tensor | None = None) -> None:
        """Load the global pair (theta_t, c_t) at the start of a round, and with drift correction
        the server's control variate sigma ([theta's coordinates, c] in step units; None counts as zeros)."""
        parameter = next(self.model.parameters())
        self._start_theta = theta.detach().to(parameter.device, parameter.dtype)
        load_flat_parameters(self.model, self._start_theta)
        self._start_c = float(c)
        if self.threshold is not None:
            with torch.no_grad():
                self.threshold.c.fill_(self._start_c)
        self._steps_taken = 0
        self._prepare_correction(control)
        self._batch = self._draw_batch() if self.config.reuse_batch else None

    def _prepare_correction(self, control: torch.Tensor | None) -> None:
        """Precompute this round's per-step correction sigma - sigma_k, shaped like each parameter."""
        if self.control is None:
            if control is not None:
                raise ConfigError(
                    "the server sent a control variate but this collaborator does not correct drift; "
                    "set drift_correction = 'scaffold' in its LocalConfig, as the server's"
                )
            return
        server_control = torch.zeros_like(self.control) if control is None else control.detach()
        if server_control.shape != self.control.shape:
            raise ConfigError(
                f"the server's control variate has {server_control.numel()} entries, this model needs "
                f"{self.control.numel()} (its parameters and c); both sides must train the same model"
            )
        self._server_control = server_control.to(self.control.device, torch.float64)
        difference = self._server_control - self.control
        corrections: list[tuple[torch.Tensor, torch.Tensor]] = []
        offset = 0
        for parameter in self.model.parameters():
            count = parameter.numel()
            corrections.append((parameter, difference[offset : offset + count].view_as(parameter).to(parameter.dtype)))
            offset += count
        if self.threshold is not None:
            corrections.append((self.threshold.c, difference[offset].to(self.threshold.c.dtype)))
        self._corrections = corrections

    def _draw_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        index = self.sampler.next_batch()
        if index is None:
            return self.features, self.labels
        # Non-blocking: a blocking host-to-device copy would make every step wait for the GPU's queue.
        index = index.to(self.features.device, non_blocking=True)
        return self.features.index_select(0, index), self.labels.index_select(0, index)

    def objective(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-sample training objective: smoothed RCVaR terms, or plain losses without a threshold."""
        losses = per_sample_loss(self.model(features), labels)
        return losses if self.threshold is None else self.threshold(losses)

    def step(self) -> None:
        """One SGD step on (theta, c) over a mini-batch (c projected only if `project_locally`)."""
        features, labels = self._batch if self._batch is not None else self._draw_batch()
        self.optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(self.objective(features, labels).mean())
        self.optimizer.step()
        self.after_step()

    @torch.no_grad()
    def after_step(self) -> None:
        """What follows every optimizer step: the drift correction, the step count, the optional projection.

        With drift correction, x -= sigma - sigma_k on theta and c (lr * (s - s_k) in
        SCAFFOLD's terms), after the optimizer's step, so that it composes with any optimizer taking plain SGD
        steps on the same parameters. Under DP-SGD this costs no privacy: sigma_k is a
        function of this collaborator's earlier private iterates (all of which DP-SGD's
        accounting already treats as released) and sigma of the federation's released sums,
        never of this step's data; and the sigma_k+ `finish` sends is a function of the
        round's (private) update, sigma_k and sigma. All are post-processing.

        Then c is projected onto [0, B] when `config.project_locally` asks for it:
        Algorithm 1 leaves c unconstrained within a round and projects it at the server
        (`server.apply`); the per-step projection is the opt-in variant LocalConfig describes.

        A learner that takes its own steps on this model (the private one) ends each with this
        call, so both follow the same rules and `finish` knows tau.
        """
        for tensor, correction in self._corrections:
            tensor.sub_(correction)
        self._steps_taken += 1
        if self.threshold is not None and self.config.project_locally:
            self.threshold.project()

    def finish(self) -> Update:
        """The round's update (theta_k - theta_t, c_k - c_t) with weight b_k.

        With drift correction it also moves sigma_k to sigma_k+ = sigma_k - sigma + (x_t - x_k) / tau
        (SCAFFOLD's option II in step units: the round's mean uncorrected step) and sends it.
        """
        if self._start_theta is None:
            raise RuntimeError("finish() called before begin(); a round starts from the global model")
        with torch.no_grad():
            delta = flat_parameters(self.model) - self._start_theta
            delta_c = float(self.threshold.c) - self._start_c if self.threshold is not None else 0.0
            control = self._advance_control(delta, delta_c)
        return Update(delta=delta, delta_c=delta_c, weight=float(self.batch_size), control=control)

    def _advance_control(self, delta: torch.Tensor, delta_c: float) -> torch.Tensor | None:
        """sigma_k+ = sigma_k - sigma + (x_t - x_k) / tau, kept and returned (None without drift correction)."""
        if self.control is None or self._server_control is None:
            return None
        if self._steps_taken < 1:
            raise RuntimeError("finish() after no local step; a drift-corrected round needs at least one step")
        drift_c = torch.tensor([delta_c], dtype=torch.float64, device=self.control.device)
        drift = torch.cat([delta.to(torch.float64), drift_c])
        self.control = self.control - self._server_control - drift / self._steps_taken
        self._server_control = None
        self._corrections = []
        return self.control

    def train_round(self, theta: torch.Tensor, c: float, control: torch.Tensor | None = None) -> Update:
        """begin, tau steps, finish: a collaborator's whole part of one round."""
        self.begin(theta, c, control)
        for _ in range(self.config.local_steps):
            self.step()
        return self.finish()


class StopsContributing(FedfairError):
    """A collaborator leaves the federation for good before a round (e.g. its privacy budget is spent)."""


class QuorumLost(FedfairError):
    """Too few collaborators are still contributing to go on."""


class RoundTrainer(Protocol):
    """What a round needs of a collaborator: a plain LocalLearner or a private one."""

    def train_round(self, theta: torch.Tensor, c: float, control: torch.Tensor | None = None) -> Update: ...


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

    A learner that stops contributing (`StopsContributing`, e.g. a spent privacy budget)
    is left out from this round on, with a warning; if fewer than `quorum` remain,
    QuorumLost ends the federation.
    """
    updates: list[Update] = []
    remaining: list[RoundTrainer] = []
    for learner in learners:
        try:
            updates.append(learner.train_round(theta, c, control))
        except StopsContributing as stopped:
            logger.warning("%s", stopped)
            continue
        remaining.append(learner)
    if len(updates) < quorum:
        raise QuorumLost(
            f"only {len(updates)} of {len(learners)} collaborators are within their privacy budgets, below the quorum "
            f"of {quorum}; the federation stops here (larger budgets would let it go on)"
        )
    return updates, remaining
