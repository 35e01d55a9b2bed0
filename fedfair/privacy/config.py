"""One collaborator's DP-SGD settings: what `[privacy]` in its config and the `--dp-*` flags build.

Free of torch and Opacus, so reading a plan or a collaborator's config stays light.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedfair.core.errors import ConfigError

ACCOUNTANTS = ("prv", "rdp")
"""Privacy accountants: PRV (tight, the default) and RDP (fast, a cross-check)."""


@dataclass(frozen=True)
class PrivacyConfig:
    """One collaborator's DP-SGD settings: the `[privacy]` table and the `--dp-*` flags.

    Give either `noise_multiplier` (sigma, noise std over the clip bound) or
    `target_epsilon` (sigma is then calibrated so that the planned rounds spend
    exactly that). `budget_epsilon` is the most this collaborator will ever spend;
    with a target and no budget the target is the budget. `poisson_sampling` off
    reuses the plain shuffled mini-batches: only for checking the private path
    against the plain one, as the accountant's epsilon assumes Poisson sampling.
    """

    enabled: bool = False
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    # c is clipped together with theta, so a small bound starves c of the pull of the high-loss
    # samples and drifts training back to ERM (on Adult, C = 1 drops c from 0.59 to 0.09); 20
    # keeps the threshold honest at a modest noise cost (the privacy-utility table in docs/security.md).
    max_grad_norm: float = 20.0
    delta: float = 1e-5
    budget_epsilon: float | None = None
    accountant: str = "prv"
    poisson_sampling: bool = True

    def __post_init__(self) -> None:
        if self.accountant not in ACCOUNTANTS:
            raise ConfigError(f"unknown privacy accountant '{self.accountant}'; choose prv or rdp (--dp-accountant)")
        if not self.max_grad_norm > 0.0 or not math.isfinite(self.max_grad_norm):
            raise ConfigError(
                f"max_grad_norm must be a positive number, got {self.max_grad_norm}; "
                "e.g. max_grad_norm = 20 (--dp-max-grad-norm)"
            )
        if not 0.0 < self.delta < 1.0:
            raise ConfigError(f"delta must be in (0, 1), got {self.delta}; use well below 1/n, e.g. delta = 1e-5 (--dp-delta)")
        noise = self.noise_multiplier
        if noise is not None and (not noise >= 0.0 or not math.isfinite(noise)):
            raise ConfigError(
                f"noise_multiplier must be a number >= 0, got {noise}; e.g. noise_multiplier = 1.0 (--dp-noise-multiplier)"
            )
        for key, flag, value in (
            ("target_epsilon", "--dp-target-epsilon", self.target_epsilon),
            ("budget_epsilon", "--dp-budget", self.budget_epsilon),
        ):
            if value is not None and (not value > 0.0 or not math.isfinite(value)):
                raise ConfigError(f"{key} must be a positive number, got {value}; e.g. {key} = 3.0 ({flag})")
        if not self.enabled:
            return
        if self.noise_multiplier is not None and self.target_epsilon is not None:
            raise ConfigError(
                "privacy takes noise_multiplier or target_epsilon, not both; drop one "
                "(--dp-noise-multiplier / --dp-target-epsilon)"
            )
        if self.noise_multiplier is None and self.target_epsilon is None:
            raise ConfigError(
                "privacy is enabled without a noise level; set noise_multiplier = 1.0 or target_epsilon = 3.0 "
                "in [privacy] (--dp-noise-multiplier / --dp-target-epsilon)"
            )

    @property
    def budget(self) -> float | None:
        """The epsilon this collaborator will not exceed: the budget, else the target, else none."""
        return self.budget_epsilon if self.budget_epsilon is not None else self.target_epsilon
