"""The chi-square DRO baseline: the pooled data's worst-case reweighting within a chi-square ball.

A centralized yardstick without group labels, like CVaR: each step minimises the dual
of the chi-square-constrained worst case (`chi_square_dual`), with the dual variable eta
found by a one-dimensional search (`chi_square_eta`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch
from torch.nn import functional as F

from fedfair.core import server
from fedfair.core.errors import ConfigError
from fedfair.core.local import LocalLearner
from fedfair.research.baselines import pooled_federation, rebuilt, run_combined
from fedfair.research.task import Task
from fedfair.simulation.rounds import SimulationResult


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
    `step` (which averages per-sample terms) descends on the DRO risk. Built by `baselines.rebuilt`,
    then given its `rho`, as the other methods' learners are given their settings.
    """

    rho: float = 0.5
    last_eta: float = math.nan

    def objective(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-sample terms of the batch's chi-square DRO risk at its eta* (kept in `last_eta`).

        Their mean is the dual's value and their gradient its gradient (the class docstring); when every
        loss equals eta*, the plain losses.
        """
        losses = super().objective(features, labels)
        self.last_eta = chi_square_eta(losses, self.rho)
        excess = F.relu(losses - self.last_eta)
        scale = excess.detach().square().mean().sqrt()
        if float(scale) == 0.0:
            # Every loss is at eta*: the robust risk is that common loss, and so is its gradient.
            return losses
        return self.last_eta + 0.5 * chi_square_constant(self.rho) * (excess.square() / scale + scale)


def run_dro(task: Task) -> SimulationResult:
    """Chi-square DRO (Hashimoto et al. 2018), centralized, as the paper runs it: eta found by search.

    Reveals: all training data to one place; a yardstick. SGD on the pooled data
    minimises the dual min over eta of C sqrt(E[(l - eta)_+^2]) + eta, with
    C = `chi_square_constant(objective.rho)` and eta found by binary search on every
    mini-batch (`ChiSquareDROLearner`); epsilon is ignored. Today's `run_central_cvar`
    is the other DRO: CVaR is DRO over the ratio-bounded ball, its threshold c
    learned by SGD instead. History records carry the last batch's eta.
    """
    objective = task.objective
    chi_square_constant(objective.rho)
    learner_box: list[ChiSquareDROLearner] = []

    def rebuild(learners: list[LocalLearner]) -> list[LocalLearner]:
        for learner in rebuilt(learners, task.training, ChiSquareDROLearner):
            learner.rho = objective.rho
            learner_box.append(learner)
        return list(learner_box)

    def describe() -> dict[str, float]:
        return {"eta": learner_box[0].last_eta}

    pooled = replace(task, federation=pooled_federation(task.federation))
    return run_combined(pooled, lambda updates, _: server.Aggregate.of(updates), rebuild=rebuild, describe=describe)
