"""The RCVaR objective: smooth plus functions, the per-sample objective, exact CVaR.

RCVaR blends the mean loss with the mean loss of the worst rho-fraction of samples:

    RCVaR = (1 - eps) * CVaR_rho(l) + eps * mean(l),
    CVaR_rho(l) = min_c  c + mean((l - c)+) / rho.

With c a parameter it is an average of per-sample terms (docs/design.md section 1), which
is what lets a federation minimise it by averaging (theta, c) updates. We train the smoothed
form, where the plus function is replaced by a convex, (2/gamma)-smooth s with
0 <= s(x) - max(x, 0) <= gamma.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fedfair.core.config import SMOOTH_FUNCTIONS, ObjectiveConfig, check_smooth_plus
from fedfair.core.errors import ConfigError


class SmoothPlus(Protocol):
    """A convex, (2/gamma)-smooth upper approximation of max(x, 0) within gamma."""

    # Read-only, so that the frozen dataclasses below satisfy the protocol.
    @property
    def gamma(self) -> float:
        """The smoothing width: larger is smoother (curvature ~ 1/gamma) and further above max(x, 0)."""
        ...

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """s(x) elementwise, in `x`'s shape and dtype: convex, >= max(x, 0), at most `max_gap` above it."""
        ...

    def derivative(self, x: torch.Tensor) -> torch.Tensor:
        """s'(x) elementwise, in [0, 1]: what the closed-form gradient with respect to c uses."""
        ...

    @property
    def max_gap(self) -> float:
        """The largest value of s(x) - max(x, 0) over all x."""
        ...


@dataclass(frozen=True)
class SoftReLU:
    """gamma * softplus(x / gamma): the paper's default; gap at most gamma * ln 2, curvature 1/(4 gamma)."""

    gamma: float = 0.05

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The value gamma * softplus(x / gamma), elementwise."""
        # torch's softplus turns linear above `threshold`; at 40 the switch is below float64 resolution
        # (e^-40), so the value and `derivative` agree exactly with autograd.
        return self.gamma * F.softplus(x / self.gamma, threshold=40.0)

    def derivative(self, x: torch.Tensor) -> torch.Tensor:
        """The slope sigmoid(x / gamma), elementwise."""
        return torch.sigmoid(x / self.gamma)

    @property
    def max_gap(self) -> float:
        """The gap gamma * ln 2, reached at x = 0."""
        return self.gamma * math.log(2.0)


@dataclass(frozen=True)
class ShiftedQuadratic:
    """Nesterov's smoothing of max(x, 0) shifted up by gamma/2 so that it lies above it.

    0 for x <= 0, x^2 / (2 gamma) on [0, gamma], x - gamma/2 beyond, plus gamma/2:
    curvature 1/gamma, gap between 0 (for x >= gamma) and gamma/2 (for x <= 0).
    """

    gamma: float = 0.05

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The shifted Nesterov smoothing elementwise: gamma/2 for x <= 0, x for x >= gamma."""
        # max_{0<=u<=1} (u x - gamma u^2 / 2) is attained at u = clamp(x / gamma, 0, 1).
        u = self.derivative(x)
        return u * x - 0.5 * self.gamma * u * u + 0.5 * self.gamma

    def derivative(self, x: torch.Tensor) -> torch.Tensor:
        """The slope clamp(x / gamma, 0, 1), elementwise."""
        return (x / self.gamma).clamp(0.0, 1.0)

    @property
    def max_gap(self) -> float:
        """The gap gamma / 2, reached for every x <= 0."""
        return 0.5 * self.gamma


@dataclass(frozen=True)
class Zang:
    """Zang's (1980) smoothing: 0 below -gamma/2, (x + gamma/2)^2 / (2 gamma) across the kink, x above.

    Curvature 1/gamma; gap largest at x = 0, where it is gamma / 8.
    """

    gamma: float = 0.05

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Zang's smoothing elementwise: 0 below -gamma/2, x above gamma/2."""
        half = 0.5 * self.gamma
        shifted = (x + half).clamp(0.0, self.gamma)
        # On the quadratic piece shifted = x + gamma/2; above it the linear piece continues smoothly.
        return shifted * shifted / (2.0 * self.gamma) + (x - half).clamp(min=0.0)

    def derivative(self, x: torch.Tensor) -> torch.Tensor:
        """The slope clamp((x + gamma/2) / gamma, 0, 1), elementwise."""
        return ((x + 0.5 * self.gamma) / self.gamma).clamp(0.0, 1.0)

    @property
    def max_gap(self) -> float:
        """The gap gamma / 8, reached at x = 0."""
        return self.gamma / 8.0


SMOOTH_PLUS_FUNCTIONS: dict[str, type[SoftReLU | ShiftedQuadratic | Zang]] = dict(
    zip(SMOOTH_FUNCTIONS, (SoftReLU, ShiftedQuadratic, Zang), strict=True)
)


def make_smooth_plus(name: str = "softrelu", gamma: float = 0.05) -> SmoothPlus:
    """The smooth plus function `name` (one of `SMOOTH_FUNCTIONS`: "softrelu", "quadratic", "zang") of width `gamma`.

    Raises:
        ConfigError: for an unknown name or gamma <= 0.
    """
    check_smooth_plus(name, gamma)
    return SMOOTH_PLUS_FUNCTIONS[name](gamma=gamma)


def rcvar_per_sample(losses: torch.Tensor, c: torch.Tensor | float, epsilon: float, rho: float) -> torch.Tensor:
    """Exact per-sample f(theta, c; z) given the losses l(theta; z)."""
    return (1.0 - epsilon) * (c + F.relu(losses - c) / rho) + epsilon * losses


def smoothed_rcvar_per_sample(
    losses: torch.Tensor, c: torch.Tensor | float, epsilon: float, rho: float, smooth: SmoothPlus
) -> torch.Tensor:
    """Per-sample f_smooth(theta, c; z): what FedSRCVaR trains."""
    return (1.0 - epsilon) * (c + smooth(losses - c) / rho) + epsilon * losses


class RCVaRThreshold(nn.Module):
    """The threshold c as a module: maps per-sample losses to per-sample smoothed RCVaR.

    Keeping c inside a module (rather than a bare tensor beside the model) gives it
    a per-sample gradient hook, which DP-SGD needs so that c is clipped and noised
    together with theta.
    """

    def __init__(self, config: ObjectiveConfig, c: float | None = None, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.epsilon = config.epsilon
        self.rho = config.rho
        self.bound = config.bound
        self.smooth = make_smooth_plus(config.smooth, config.gamma)
        self.c = nn.Parameter(torch.tensor(config.bound if c is None else c, dtype=dtype))

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        """Per-sample smoothed RCVaR terms for per-sample `losses` [N] at this module's c: shape [N]."""
        return smoothed_rcvar_per_sample(losses, self.c, self.epsilon, self.rho, self.smooth)

    def grad_c_per_sample(self, losses: torch.Tensor) -> torch.Tensor:
        """D f_smooth / d c for each sample: (1 - eps) * (1 - s'(l - c) / rho)."""
        return (1.0 - self.epsilon) * (1.0 - self.smooth.derivative(losses - self.c) / self.rho)

    @torch.no_grad()
    def project(self) -> None:
        """Project c onto [0, B].

        Algorithm 1 does it at the server after averaging (`fedfair.core.server.apply`); a local step does it
        only with LocalConfig.project_locally.
        """
        self.c.clamp_(0.0, self.bound)


def _as_sorted_desc(losses: np.ndarray | torch.Tensor) -> np.ndarray:
    values = np.asarray(losses.detach().cpu() if isinstance(losses, torch.Tensor) else losses, dtype=np.float64).ravel()
    if values.size == 0:
        raise ConfigError("CVaR of an empty loss vector is undefined; pass at least one sample")
    return -np.sort(-values)


def cvar(losses: np.ndarray | torch.Tensor, rho: float) -> float:
    """Mean of the worst rho-fraction of losses, with a fractional weight on the boundary sample.

    Equals min_c c + mean((l - c)+) / rho exactly.
    """
    if not 0.0 < rho <= 1.0:
        raise ConfigError(f"rho must be in (0, 1], got {rho}")
    ordered = _as_sorted_desc(losses)
    mass = rho * ordered.size
    whole = math.floor(mass)
    total = ordered[:whole].sum()
    if whole < ordered.size:
        total += (mass - whole) * ordered[whole]
    return float(total / mass)


def cvar_threshold(losses: np.ndarray | torch.Tensor, rho: float) -> float:
    """A minimiser c of c + mean((l - c)+) / rho: the boundary sample, the (1 - rho)-quantile."""
    ordered = _as_sorted_desc(losses)
    boundary = max(math.ceil(rho * ordered.size - 1e-12), 1) - 1
    return float(ordered[boundary])


def cvar_terms(losses: np.ndarray | torch.Tensor, rho: float) -> np.ndarray:
    """Per-sample terms c + (l - c)+ / rho at the boundary c (`cvar_threshold`), in the losses' order.

    Their mean is `cvar` exactly (c minimises the mean); they are CVaR's influence function plus CVaR, so
    their standard deviation over sqrt(n) is the standard error of the n-sample CVaR estimate, and the
    spread of two models' terms' difference, sample by sample, is that of their paired CVaR gap.
    """
    values = np.asarray(losses.detach().cpu() if isinstance(losses, torch.Tensor) else losses, dtype=np.float64)
    threshold = cvar_threshold(values, rho)
    return threshold + np.maximum(values.ravel() - threshold, 0.0) / rho


def rcvar(losses: np.ndarray | torch.Tensor, epsilon: float, rho: float) -> float:
    """Exact RCVaR of a loss vector: (1 - eps) * CVaR_rho + eps * mean."""
    mean = float(np.mean(_as_sorted_desc(losses)))
    return (1.0 - epsilon) * cvar(losses, rho) + epsilon * mean


class RCVaRLoss(nn.Module):
    """Smoothed RCVaR as a loss for any PyTorch training loop: per-sample losses in, one scalar out.

    The threshold c is this module's parameter (held by an :class:`RCVaRThreshold`, the
    head FedSRCVaR trains), so an optimizer over ``[*model.parameters(), *loss.parameters()]``
    minimises the objective jointly in (theta, c), exactly as Algorithm 1 does::

        criterion = RCVaRLoss(rho=0.2, epsilon=0.1)
        optimizer = torch.optim.SGD([*model.parameters(), *criterion.parameters()], lr=0.1)
        loss = criterion(F.cross_entropy(model(x), y, reduction="none"))
        loss.backward(); optimizer.step(); criterion.project()

    The defaults are those of :class:`~fedfair.core.config.ObjectiveConfig`, which checks them.
    """

    def __init__(
        self,
        rho: float = ObjectiveConfig.rho,
        epsilon: float = ObjectiveConfig.epsilon,
        *,
        gamma: float = ObjectiveConfig.gamma,
        smooth: str = ObjectiveConfig.smooth,
        bound: float = ObjectiveConfig.bound,
        c: float | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.config = ObjectiveConfig(epsilon=epsilon, rho=rho, gamma=gamma, smooth=smooth, bound=bound)
        self.head = RCVaRThreshold(self.config, c=c, dtype=dtype)

    @property
    def threshold(self) -> float:
        """The current threshold c: at the optimum, the loss level above which the worst rho-fraction lies."""
        return float(self.head.c.detach())

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        """The mean of f_smooth(theta, c; z) over the batch, given each sample's loss l(theta; z)."""
        if losses.dim() != 1:
            raise ConfigError(
                f"RCVaRLoss needs one loss per sample (a 1-D tensor), got shape {tuple(losses.shape)}; "
                "compute the loss with reduction='none', e.g. F.cross_entropy(logits, labels, reduction='none')"
            )
        per_sample: torch.Tensor = self.head(losses)
        return per_sample.mean()

    def project(self) -> None:
        """Project c onto [0, B]; call it after each optimizer step, as Algorithm 1 does."""
        self.head.project()
