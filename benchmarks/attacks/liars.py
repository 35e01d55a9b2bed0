"""How one institution lies to the aggregator about its weight or its update, and the poisoner beside it.

A :class:`Liar` replaces one collaborator's ``train_on`` (it skips ``core.local.bounded`` and sends a vector and
weight of its own, steering toward a target model); :func:`poisoner` is the yardstick, an honest protocol
participant whose training labels are flipped. Used by the influence rows (:mod:`attacks.influence`) and
``benchmarks/influence_bench.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedfair.core.data import ClientData
from fedfair.runtime.collaborator.client import Collaborator, TrainedUpdate

CLAIMED_WEIGHT = 1e6


Steer = Callable[[torch.Tensor, float], tuple[np.ndarray, float]]
"""(theta, c) of the round -> (the weighted vector [w * delta, w * delta_c], w) the liar sends."""


@dataclass
class Liar:
    """How one site lies: `steer` makes each round's vector and weight; `sent` keeps what it sent."""

    name: str
    steer: Steer
    sent: list[dict[str, float]] = field(default_factory=list)

    def install(self, collaborator: Collaborator) -> None:
        def lying_train_on(
            stub: Any, binding: Any, model: str, theta: torch.Tensor, c: float, control: Any = None
        ) -> TrainedUpdate:
            vector, weight = self.steer(theta.to(torch.float64), c)
            kept = np.array(vector, dtype=np.float64)
            kept.setflags(write=False)
            self.sent.append(
                {"round": binding.round, "weight": weight, "update_norm": float(np.linalg.norm(kept)) / weight}
            )
            return TrainedUpdate(binding.round, model, kept, float(weight))

        collaborator.train_on = lying_train_on  # type: ignore[method-assign]


def toward(target: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """The unit vector from theta to the target (delta_c left 0)."""
    direction = target.to(torch.float64) - theta
    return direction / max(float(direction.norm()), 1e-12)


def claimed_weight_liar(name: str, target: torch.Tensor, clip: float) -> Liar:
    """Weight 1e6 and delta = target - theta clipped to [-clip, clip] per coordinate (the old checks)."""

    def steer(theta: torch.Tensor, c: float) -> tuple[np.ndarray, float]:
        delta = (target.to(torch.float64) - theta).clamp(-clip, clip)
        return np.append(delta.numpy(), 0.0) * CLAIMED_WEIGHT, CLAIMED_WEIGHT

    return Liar(name, steer)


def bound_liar(name: str, target: torch.Tensor, weight: float, norm: float) -> Liar:
    """The agreed weight and an update of L2 norm exactly C toward the target, every round."""

    def steer(theta: torch.Tensor, c: float) -> tuple[np.ndarray, float]:
        delta = toward(target, theta) * norm
        return np.append(delta.numpy(), 0.0) * weight, weight

    return Liar(name, steer)


def mean_bound_liar(
    name: str, target: torch.Tensor, weight: float, total: float, norm: float, clip: float, fraction: float = 0.9
) -> Liar:
    """Secure rounds check only the mean: the agreed weight and a weighted vector of norm `fraction` W C toward
    the target (W the agreed total), its update kept inside the encoding's per-coordinate clip."""

    def steer(theta: torch.Tensor, c: float) -> tuple[np.ndarray, float]:
        delta = (toward(target, theta) * (fraction * total * norm / weight)).clamp(-clip, clip)
        return np.append(delta.numpy(), 0.0) * weight, weight

    return Liar(name, steer)


def poisoner(name: str) -> Callable[[str, Collaborator], None]:
    """An `adjust` for :func:`run_federation`: `name` is an honest protocol participant (fedfair's own
    ``train_on``, ``core.local.bounded`` and its agreed weight) whose training labels are flipped (y -> 1 - y,
    binary Adult) before its learner is built; its held-out rows keep their true labels. No protocol can tell
    it from an honest site: the yardstick for what a liar gains beyond its declared share."""

    def adjust(site: str, collaborator: Collaborator) -> None:
        if site != name:
            return
        prepare = collaborator.prepare

        def flipped(local: Any, shared: Any) -> None:
            train = local.train
            labels = train.labels
            if not bool(((labels == 0) | (labels == 1)).all()):
                raise ValueError(f"{site}: label flipping needs binary labels, got {sorted(set(labels.tolist()))}")
            poisoned = ClientData(train.name, train.features, 1 - labels)
            prepare(dataclasses.replace(local, train=poisoned), shared)

        collaborator.prepare = flipped  # type: ignore[method-assign,assignment]

    return adjust
