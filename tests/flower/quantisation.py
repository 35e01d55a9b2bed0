"""The first round's pair as Flower's SecAgg+ should give it, recomputed exactly, and how far quantisation may move it.

Each site's update is computed here from the same start, settings and sampler (the client app's own functions).
Flower's mod weights a site's (dtheta, dc) by q_k / T, q_k = round(b_k / M * T) (M = max_weight, T =
quantization_range), rounds each weighted entry stochastically to a step s = 2 C / T (C = clipping_range), so each
site is off by less than one step an entry, and the server divides the unmasked sum by sum q_k / T. The pair may
therefore differ from the exact mean with those weights by less than K s / (sum q_k / T) an entry, K sites (the
projection of c onto [0, B] moves no two points further apart), beside float64 rounding.
"""

from __future__ import annotations

import numpy as np
import torch

from fedfair.flower import FlowerSettings
from fedfair.flower.client import replay_sampler, site_learner
from fedfair.simulation.federation import Batches, ModelFactory, client_tensors

CLIPPING_RANGE = 8.0
QUANTIZATION_RANGE = 2**22
"""SecAggPlusWorkflow's defaults, which the tests and the example keep."""


def first_round_under_secaggplus(
    model_factory: ModelFactory,
    sites: list[Batches],
    settings: FlowerSettings,
    shares: list[int],
    max_weight: float,
    start: tuple[torch.Tensor, float],
) -> tuple[np.ndarray, float, float]:
    """[theta, c] after round 1 by the sites' exact updates and SecAgg+'s weights; the bound; the largest move."""
    theta, c = start
    updates = []
    for partition, (rows, share) in enumerate(zip(sites, shares, strict=True)):
        learner = site_learner(
            model_factory, client_tensors(f"site-{partition}", rows), settings, share, partition, None, "cpu"
        )
        replay_sampler(learner, 1)
        update = learner.train_round(theta, c)
        updates.append(np.concatenate([update.delta.double().numpy(), [update.delta_c]]))
    weights = np.array([round(share / max_weight * QUANTIZATION_RANGE) / QUANTIZATION_RANGE for share in shares])
    mean = (weights[:, None] * np.stack(updates)).sum(axis=0) / weights.sum()
    bound = len(sites) * (2 * CLIPPING_RANGE / QUANTIZATION_RANGE) / weights.sum() + 1e-12
    moved_c = min(max(c + float(mean[-1]), 0.0), settings.objective.bound)
    return np.concatenate([theta.numpy() + mean[:-1], [moved_c]]), bound, float(np.abs(mean).max())
