"""One collaborator's DP-SGD settings: what `[privacy]` in its config and the `--dp-*` flags build.

Free of torch and Opacus, so reading a plan or a collaborator's config stays light.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedfair.core.errors import ConfigError

ACCOUNTANTS = ("prv", "rdp")
"""Privacy accountants: PRV (tight, the default) and RDP (fast, a cross-check)."""

MODES = ("local", "distributed")
"""Where the noise is added: by each collaborator to its own update ("local", DP-SGD), or inside the
secure sum, calibrated to the pooled data ("distributed"; see `fedfair.privacy.distributed`)."""


@dataclass(frozen=True)
class PrivacyConfig:
    """One collaborator's DP-SGD settings: the `[privacy]` table and the `--dp-*` flags.

    Give either `noise_multiplier` (sigma, noise std over the clip bound) or
    `target_epsilon` (sigma is then calibrated so that the planned rounds spend
    exactly that). `budget_epsilon` is the most this collaborator will ever spend;
    with a target and no budget the target is the budget. `poisson_sampling` off
    reuses the plain shuffled mini-batches: only for checking the private path
    against the plain one, as the accountant's epsilon assumes Poisson sampling.

    `mode` "distributed" adds no noise locally: each record's gradient is clipped (theta's
    to `max_grad_norm`, c's separately to `threshold_max_grad_norm`, by default c's own
    bound (1 - eps) max(1, 1/rho - 1), where clipping changes nothing) and the secure sum
    adds Skellam noise calibrated to `target_epsilon` over the pooled records. It needs
    `target_epsilon`, Poisson sampling and one local step per round. `sample_rate` is the Poisson
    rate every collaborator then samples at (the plan's batch fraction, so that one record's
    chance of taking part is the same everywhere); None samples at b_k / n_k, as local DP does.
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
    mode: str = "local"
    threshold_max_grad_norm: float | None = None
    sample_rate: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"unknown privacy mode '{self.mode}'; choose local or distributed")
        if self.sample_rate is not None and self.mode != "distributed":
            raise ConfigError("sample_rate applies to distributed privacy only; local DP samples at b_k / n_k")
        if self.sample_rate is not None and not 0.0 < self.sample_rate <= 1.0:
            raise ConfigError(
                f"sample_rate must be in (0, 1], got {self.sample_rate}; e.g. the plan's batch fraction 0.01"
            )
        bound = self.threshold_max_grad_norm
        if bound is not None and (not bound > 0.0 or not math.isfinite(bound)):
            raise ConfigError(f"threshold_max_grad_norm must be a positive number, got {bound}; or leave it unset")
        if self.accountant not in ACCOUNTANTS:
            raise ConfigError(f"unknown privacy accountant '{self.accountant}'; choose prv or rdp (--dp-accountant)")
        if not self.max_grad_norm > 0.0 or not math.isfinite(self.max_grad_norm):
            raise ConfigError(
                f"max_grad_norm must be a positive number, got {self.max_grad_norm}; "
                "e.g. max_grad_norm = 20 (--dp-max-grad-norm)"
            )
        if not 0.0 < self.delta < 1.0:
            raise ConfigError(
                f"delta must be in (0, 1), got {self.delta}; use well below 1/n, e.g. delta = 1e-5 (--dp-delta)"
            )
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
        if self.mode == "distributed" and (self.target_epsilon is None or not self.poisson_sampling):
            raise ConfigError(
                "distributed privacy calibrates the secure sum's noise to a target: set target_epsilon (not "
                "noise_multiplier) and keep Poisson sampling on"
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
