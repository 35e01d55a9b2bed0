"""Group risk at rho from per-sample values held in one place: worst group, best group, mean, disparity.

The worst group at rho is the rho-fraction of held-out samples with the highest
values (the paper's high-risk group); its risk is CVaR_rho. The best group is the
rho-fraction with the lowest values. Both use a fractional weight on the boundary
sample, so they are defined for every rho in (0, 1] and any number of samples.

This is the form for whoever holds every per-sample loss: the in-process simulation,
one institution looking at its own data, and tests, where it is the exact reference.
A federated test set, where no per-sample loss may leave its institution, takes the
secure-sum form in `fedfair.fairness.sums`, which reports the same fields within a
certified gap.
"""

from __future__ import annotations

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.core.objective import cvar
from fedfair.fairness.report import GroupRiskReport


def _values(name: str, values: np.ndarray) -> np.ndarray:
    """Per-sample values as a flat float64 array; refuse empty and non-finite input."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ConfigError(f"{name} must be a non-empty 1-D array of per-sample values, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ConfigError(f"{name} contains NaN or Inf; evaluate a finite model (check the learning rate)")
    return array


def _check_rho(rho: float) -> None:
    if not 0.0 < rho <= 1.0:
        raise ConfigError(f"rho must be in (0, 1], got {rho}; it is the protected group fraction, e.g. --rho 0.3")


def worst_group_risk(values: np.ndarray, rho: float) -> float:
    """Mean of the highest rho-fraction of values (CVaR_rho), boundary sample weighted fractionally."""
    _check_rho(rho)
    return cvar(_values("values", values), rho)


def best_group_risk(values: np.ndarray, rho: float) -> float:
    """Mean of the lowest rho-fraction of values: the worst group of the negated values, negated."""
    _check_rho(rho)
    # 0.0 - x rather than -x: a zero risk reads 0.0, not -0.0, in reports.
    return 0.0 - cvar(-_values("values", values), rho)


def group_risk_report(losses: np.ndarray, correct: np.ndarray, rho: float) -> GroupRiskReport:
    """Group risks at rho from per-sample losses and per-sample correctness (bool or 0/1); exact, so uncertified."""
    _check_rho(rho)
    losses = _values("losses", losses)
    hits = _values("correct", correct)
    if hits.shape != losses.shape:
        raise ConfigError(f"losses and correct must have one entry per sample, got {losses.shape} and {hits.shape}")
    if not np.isin(hits, (0.0, 1.0)).all():
        raise ConfigError("correct must hold only 0/1 (or False/True) per sample")
    errors = 1.0 - hits
    return GroupRiskReport.from_risks(
        rho=rho,
        mean_risk=float(losses.mean()),
        worst_risk=worst_group_risk(losses, rho),
        best_risk=best_group_risk(losses, rho),
        mean_error=float(errors.mean()),
        worst_error=worst_group_risk(errors, rho),
        best_error=best_group_risk(errors, rho),
    )
