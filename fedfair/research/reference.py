"""Centralized yardsticks: the optimum the federation must reach.

For convex models (logistic regression) the smoothed RCVaR objective is convex in
(theta, c), so L-BFGS-B in float64 with exact gradients on the pooled training data
finds its global minimum, with c bounded in [0, B]. Tolerance: the solver stops
when the projected gradient's largest entry is below `gtol` (default 1e-9) or the
relative decrease per iteration is below `ftol` (default 1e-13); on Adult this
puts the objective within about 1e-9 relative of the optimum, far inside the 1%
the federation is held to.

For non-convex models (MLP, CNN) the same solver returns a local minimum; it is
still the centralized counterpart of the federated run, not a certificate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.optimize
import torch

from fedfair.core.config import ObjectiveConfig
from fedfair.core.data import ClientData
from fedfair.core.errors import ReferenceSolverError
from fedfair.core.models import (
    build_model,
    flat_parameters,
    load_flat_parameters,
    per_sample_loss,
)
from fedfair.core.objective import make_smooth_plus, rcvar, smoothed_rcvar_per_sample
from fedfair.simulation.federation import Federation


@dataclass(frozen=True)
class ReferenceSolution:
    """The centralized optimum: parameters, threshold, and both objective values there."""

    theta: torch.Tensor
    c: float
    objective_smooth: float
    objective_exact: float
    iterations: int


def solve_reference(
    federation: Federation,
    objective: ObjectiveConfig,
    *,
    model_name: str = "logreg",
    seed: int = 0,
    gtol: float = 1e-9,
    ftol: float = 1e-13,
    max_iterations: int = 5000,
) -> ReferenceSolution:
    """Minimise the mean smoothed RCVaR over the pooled training data with L-BFGS-B (float64)."""
    data: ClientData = federation.pooled("train")
    model = build_model(
        model_name,
        federation.num_features,
        federation.num_classes,
        image_shape=federation.image_shape,
        seed=seed,
        dtype=torch.float64,
    )
    features = data.features.to(torch.float64)
    labels = data.labels
    smooth = make_smooth_plus(objective.smooth, objective.gamma)
    start = np.concatenate([flat_parameters(model).numpy(), [objective.bound]])

    def value_and_gradient(point: np.ndarray) -> tuple[float, np.ndarray]:
        load_flat_parameters(model, torch.from_numpy(point[:-1]))
        c = torch.tensor(point[-1], dtype=torch.float64, requires_grad=True)
        losses = per_sample_loss(model(features), labels)
        value = smoothed_rcvar_per_sample(losses, c, objective.epsilon, objective.rho, smooth).mean()
        gradients = torch.autograd.grad(value, [*model.parameters(), c])
        gradient = torch.cat([part.reshape(-1) for part in gradients])
        return float(value.detach()), gradient.numpy().copy()

    bounds = [(None, None)] * (start.size - 1) + [(0.0, objective.bound)]
    result = scipy.optimize.minimize(
        value_and_gradient,
        start,
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        options={"maxiter": max_iterations, "gtol": gtol, "ftol": ftol, "maxcor": 30},
    )
    if not result.success and result.nit >= max_iterations:
        raise ReferenceSolverError(f"L-BFGS-B did not converge in {max_iterations} iterations: {result.message}")
    theta = torch.from_numpy(result.x[:-1].copy())
    load_flat_parameters(model, theta)
    with torch.no_grad():
        losses = per_sample_loss(model(features), labels).numpy()
    return ReferenceSolution(
        theta=theta,
        c=float(result.x[-1]),
        objective_smooth=float(result.fun),
        objective_exact=rcvar(losses, objective.epsilon, objective.rho),
        iterations=int(result.nit),
    )
