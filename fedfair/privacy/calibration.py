"""The distributed noise of DP-SGD rounds, from public plan values only.

Every collaborator and the secure sum derive the same noise from the step sizes, the clip bounds,
the Poisson rate, the planned steps and the update's length, so nothing about it travels. Free of
torch and Opacus, so an aggregator or a plan reader computes it without loading either.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.privacy.config import PrivacyConfig
from fedfair.privacy.distributed import Release, TrainingNoise, padded_dimension, training_noise
from fedfair.privacy.ring import Ring


def threshold_clip(privacy: PrivacyConfig, epsilon: float, rho: float) -> float:
    """C's clip bound under distributed DP.

    ``privacy.threshold_max_grad_norm``, else the bound of c's per-record gradient (1 - eps)(1 - s'(l - c) /
    rho) with s' in [0, 1], (1 - eps) max(1, 1/rho - 1).
    """
    if privacy.threshold_max_grad_norm is not None:
        return privacy.threshold_max_grad_norm
    return (1.0 - epsilon) * max(1.0, 1.0 / rho - 1.0)


def record_sensitivity(
    lr: float,
    threshold_lr: float,
    max_grad_norm: float,
    threshold_norm: float | None,
    weight_per_record: float = 1.0,
) -> float:
    """How far one record moves a collaborator's weighted vector [w delta, w delta_c] in L2 under distributed DP.

    One step with clipped, un-noised gradients divided by the expected batch b is delta = -lr S / b for theta
    (-threshold_lr S_c / b for c), S the clipped sum, in which one record moves S by at most C (S_c by C_c).
    Weighted by w, one record moves [w delta, w delta_c] by (w / b) sqrt((lr C)^2 + (threshold_lr C_c)^2).
    The noise of the sum protects every site's records, so `weight_per_record` is the largest w_k / b_k over
    the sites: 1 when each weight is the site's batch (Algorithm 1, ``weights = "declared"``), 1 / min b_k
    under equal weights w_k = 1 (:meth:`fedfair.runtime.plan.influence.InfluenceSettings.weight_per_record`).
    """
    threshold = 0.0 if threshold_norm is None else threshold_lr * threshold_norm
    return weight_per_record * float(np.hypot(lr * max_grad_norm, threshold))


def distributed_training_noise(
    privacy: PrivacyConfig,
    lr: float,
    threshold_lr: float,
    threshold_norm: float | None,
    sample_rate: float,
    planned_steps: int,
    dimension: int,
    weight_per_record: float = 1.0,
    ring: Ring | None = None,
    beside: tuple[Release, ...] = (),
) -> TrainingNoise:
    """The secure sum's noise for DP-SGD rounds under ``privacy`` (mode "distributed"), from public values only.

    The step sizes, clip bounds and the sites' largest weight per expected batch record
    (:func:`record_sensitivity`), the Poisson rate, the planned steps and the update's ``dimension``
    (rotated, so padded to a power of two); with ``ring``, fractional bits that keep the sum within its words;
    ``beside``, the releases each site makes once a step besides its update, composed into the target.
    """
    if privacy.target_epsilon is None:
        raise ConfigError("distributed privacy needs target_epsilon to calibrate the noise")
    if not (math.isfinite(weight_per_record) and weight_per_record > 0):
        raise ConfigError(f"weight_per_record={weight_per_record!r} must be a positive w_k / b_k")
    sensitivity = record_sensitivity(lr, threshold_lr, privacy.max_grad_norm, threshold_norm, weight_per_record)
    noise = training_noise(
        privacy.target_epsilon,
        privacy.delta,
        sensitivity,
        sample_rate,
        planned_steps,
        padded_dimension(dimension),
        ring,
        beside,
    )
    return dataclasses.replace(noise, weight_per_record=weight_per_record)
