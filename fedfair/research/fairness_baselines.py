"""Federated fairness baselines beside AFL and q-FedAvg: PropFair, TERM and Delta-FL.

Each is written from its paper against the same learning core as FedSRCVaR (`LocalLearner`'s
steps, `FedSRCVaR.server_apply`'s server step, the rounds of `baselines.run_combined`), so a
difference in results is the method's. They take the server momentum of `TrainingConfig`
like FedSRCVaR (0: the plain averaging step their papers describe), so that they can be tuned
over the same grid. FedAvgM (Hsu et al. 2019) needs nothing here: it is FedAvg's run with
server momentum (`fedfair.research.methods`).

Why: docs/paper.md, "Against the federated fairness baselines".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.special import logsumexp

from fedfair.core import server
from fedfair.core.errors import ConfigError
from fedfair.core.local import LocalLearner
from fedfair.core.update import Update
from fedfair.research.baselines import LossRows, ReadsLosses, client_losses, rebuilt, reweighted, run_combined
from fedfair.research.task import Task
from fedfair.simulation.rounds import SimulationResult

# ---------------------------------------------------------------- PropFair

PROPFAIR_MARGIN = 0.2
"""Below M - f = this margin PropFair's -log(M - f) is continued by its tangent (a linear piece), so a batch
whose loss nears or passes M gets a gradient at most 1 / margin times its mean loss's instead of an unbounded
one (Zhang et al. guard the logarithm the same way; the margin is our choice)."""


def propfair_surrogate(mean_loss: torch.Tensor, ceiling: float) -> torch.Tensor:
    """PropFair's objective at a client's mean loss f: -log(M - f), linear where M - f < `PROPFAIR_MARGIN`.

    Continuous with its first derivative at M - f = margin, so it is the tangent there.
    """
    gap = ceiling - mean_loss
    logarithm = -torch.log(torch.clamp(gap, min=PROPFAIR_MARGIN))
    tangent = -math.log(PROPFAIR_MARGIN) + (PROPFAIR_MARGIN - gap) / PROPFAIR_MARGIN
    return torch.where(gap >= PROPFAIR_MARGIN, logarithm, tangent)


def check_ceiling(ceiling: float) -> None:
    """Refuse a ceiling M that is not a finite number above the margin (then -log(M - f) has no room at f = 0)."""
    if not (math.isfinite(ceiling) and ceiling > PROPFAIR_MARGIN):
        raise ConfigError(
            f"PropFair's ceiling M must be a number above {PROPFAIR_MARGIN}, got {ceiling}; it should exceed the "
            "losses it meets, e.g. --ceiling 5"
        )


class PropFairLearner(LocalLearner):
    """A LocalLearner whose step descends `propfair_surrogate` of its batch's mean loss.

    The surrogate's gradient is the mean loss's times dS/df = 1 / (M - f) (1 / margin on the linear piece), so
    each step weighs the batch's per-sample losses by that one factor, computed at the batch's loss and held
    constant through the backward pass: the gradient of -log(M - f) exactly, by autograd on the plain losses.
    """

    ceiling: float = 5.0

    def objective(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The batch's per-sample losses times dS/df at their mean: their mean's gradient is the surrogate's."""
        losses = super().objective(features, labels)
        gap = self.ceiling - losses.detach().mean()
        return losses / torch.clamp(gap, min=PROPFAIR_MARGIN)


@dataclass(frozen=True)
class PropFairSettings:
    """PropFair's settings: the ceiling M of its utilities M - F_k."""

    ceiling: float = 5.0
    """M in -log(M - F_k); it should exceed the losses met (ln K at the uniform start)."""

    def __post_init__(self) -> None:
        check_ceiling(self.ceiling)


def run_propfair(task: Task, settings: PropFairSettings) -> SimulationResult:
    """PropFair (Zhang et al. 2022): min over theta of sum_k p_k (-log(M - F_k(theta))), proportional fairness.

    Reveals to the server: nothing beyond FedAvg's weighted sum of updates.

    Maximising sum_k p_k log(M - F_k) is Nash's bargaining over the clients' utilities M - F_k: a client whose
    loss nears M weighs 1 / (M - F_k) times its share. Each client takes tau SGD steps on the surrogate of its
    batches' mean loss (`PropFairLearner`), and the server averages the updates with FedAvg's weights b_k.
    """

    def rebuild(learners: list[LocalLearner]) -> list[LocalLearner]:
        own = rebuilt(learners, task.training, PropFairLearner)
        for learner in own:
            learner.ceiling = settings.ceiling
        return list(own)

    return run_combined(task, lambda updates, _: server.Aggregate.of(updates), rebuild=rebuild)


# ---------------------------------------------------------------- TERM


def log_mean_exp(values: np.ndarray) -> float:
    """log(mean(exp(values))), without overflow: the tilted risk's log-normaliser times t."""
    return float(logsumexp(values) - math.log(values.size))


def check_tilt(tilt: float) -> None:
    """Refuse a tilt t that is not a finite positive number (t -> 0 is FedAvg; t < 0 would favour the easy rows)."""
    if not (math.isfinite(tilt) and tilt > 0.0):
        raise ConfigError(f"TERM's tilt t must be a positive number, got {tilt}; t -> 0 is FedAvg, e.g. --tilt 1")


class TERMLearner(LocalLearner):
    """A LocalLearner whose step descends its batch's tilted risk (1/t) log mean_B exp(t l_i).

    Its gradient weighs each sample by exp(t l_i) over the batch's mean of them: at most |B|, so one outlier
    cannot take a step |B| times larger than its own gradient's. (Normalising by the client's m_k from the
    round's start instead, unbiased, let single samples with weights near n_k take the MLP on Adult to
    losses of 1e3 and beyond at every step of the grid, t = 1 included.) With the whole local set as the
    batch and one step it is the client's exact tilted gradient.
    """

    tilt: float = 1.0

    def objective(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The batch's per-sample losses times their tilted weights (mean 1), held constant through backward."""
        losses = super().objective(features, labels)
        weights = torch.softmax(self.tilt * losses.detach(), dim=0) * losses.numel()
        return losses * weights


def term_weights(updates: Sequence[Update], log_normalisers: np.ndarray) -> np.ndarray:
    """The server's weights b_k m_k / max m: client k's share of the federation's normaliser sum_i exp(t l_i).

    sum_i exp(t l_i) = sum_k n_k m_k, and b_k is proportional to n_k, so these weights over their sum are
    n_k m_k / sum_j n_j m_j; scaled by the largest m so that none overflows.
    """
    weights = np.array([update.weight for update in updates], dtype=np.float64)
    scaled: np.ndarray = weights * np.exp(log_normalisers - log_normalisers.max())
    return scaled


@dataclass(frozen=True)
class TERMSettings(ReadsLosses):
    """TERM's settings: its tilt t."""

    tilt: float = 1.0
    """t > 0 in (1/t) log mean exp(t l_i); larger t nears the worst sample's loss, t -> 0 is FedAvg."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_tilt(self.tilt)


def run_term(task: Task, settings: TERMSettings) -> SimulationResult:
    """Sample-level TERM (Li et al. 2021), federated: min over theta of (1/t) log((1/n) sum_i exp(t l_i(theta))).

    Reveals to the server: every collaborator's log m_k = log mean_i exp(t l_i(theta_t)) in plaintext each
    round (one number, as AFL's losses), besides the updates.

    The tilted risk's gradient is sum_i exp(t l_i) grad l_i / Z with Z = sum_i exp(t l_i) over every sample of
    every client: a normaliser no client holds. It splits as sum_k (n_k m_k / Z) g_k, g_k client k's own tilted
    gradient (normalised by n_k m_k). So each round, at theta_t, every client reports log m_k (from `loss_rows`
    of its rows when positive: `LossRows`); each takes tau steps on its batches' own tilted risk
    (`TERMLearner`, TERM's mini-batch form), and the server weighs client k's update by n_k m_k
    (`term_weights`), whose sum is Z. With full batches and one local step the server's move is exactly -lr
    times the tilted risk's gradient; as t -> 0 every weight tends to 1 and the method to FedAvg.
    """
    federation, tilt = task.federation, settings.tilt
    sampled = LossRows([client.size for client in federation.train], settings.loss_rows, task.training.seed)
    learner_box: list[TERMLearner] = []
    log_normalisers = np.zeros(len(federation.train))

    def rebuild(learners: list[LocalLearner]) -> list[LocalLearner]:
        for learner in rebuilt(learners, task.training, TERMLearner):
            learner.tilt = tilt
            learner_box.append(learner)
        return list(learner_box)

    def normalise(theta: torch.Tensor) -> None:
        nonlocal log_normalisers
        rows = sampled.draw()
        log_normalisers = client_losses(
            learner_box, federation, theta, rows, reduce=lambda losses: log_mean_exp(tilt * losses)
        )

    def combine(updates: list[Update], _: np.ndarray) -> server.Aggregate:
        return reweighted(updates, term_weights(updates, log_normalisers))

    return run_combined(task, combine, rebuild=rebuild, before_round=normalise)


# ---------------------------------------------------------------- Delta-FL


def check_level(level: float) -> None:
    """Refuse a superquantile level outside (0, 1] (1: every client, FedAvg)."""
    if not 0.0 < level <= 1.0:
        raise ConfigError(
            f"Delta-FL's level is the share of client weight in the tail, in (0, 1], got {level}; 1 is FedAvg, "
            "e.g. --client-level 0.5"
        )


def superquantile_weights(losses: np.ndarray, shares: np.ndarray, level: float) -> np.ndarray:
    """The pi maximising sum_k pi_k F_k over {0 <= pi_k <= p_k / level, sum(pi) = 1}.

    Its value is the superquantile (CVaR) at `level` of the client losses F_k drawn with probabilities p_k:
    the highest losses take their whole cap p_k / level until the mass 1 is spent, the last one partly.
    Level 1 gives pi = p.
    """
    check_level(level)
    losses = np.asarray(losses, dtype=np.float64)
    caps = np.asarray(shares, dtype=np.float64) / float(np.sum(shares)) / level
    order = np.argsort(-losses, kind="stable")
    before = np.concatenate([[0.0], np.cumsum(caps[order])[:-1]])
    weights = np.zeros_like(caps)
    weights[order] = np.clip(1.0 - before, 0.0, caps[order])
    return weights


@dataclass(frozen=True)
class DeltaFLSettings(ReadsLosses):
    """Delta-FL's settings: the superquantile level over clients."""

    client_level: float = 0.5
    """The share of client weight in the tail whose mean loss it minimises (1: every client, FedAvg)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_level(self.client_level)


def run_deltafl(task: Task, settings: DeltaFLSettings) -> SimulationResult:
    """Delta-FL (Pillutla et al. 2023): min over theta of the superquantile of the client losses at `level`.

    Reveals to the server: every collaborator's mean training loss F_k(theta_t) in plaintext each round (to
    find the tail), besides the updates.

    The objective is the mean of the worst `level` share of client weight: sup over pi in
    {0 <= pi_k <= p_k / level, sum(pi) = 1} of sum_k pi_k F_k, p_k the clients' FedAvg weights b_k / sum(b).
    Each round every client reports F_k(theta_t) (from `loss_rows` of its rows when positive: `LossRows`) and
    takes tau SGD steps on its mean loss; the server averages the updates with the maximising pi
    (`superquantile_weights`), a descent step on the superquantile. Level 1 is FedAvg with its weights b_k.
    """

    def combine(updates: list[Update], losses: np.ndarray) -> server.Aggregate:
        shares = np.array([update.weight for update in updates], dtype=np.float64)
        return reweighted(updates, superquantile_weights(losses, shares, settings.client_level))

    return run_combined(task, combine, needs_losses=True, loss_rows=settings.loss_rows)
