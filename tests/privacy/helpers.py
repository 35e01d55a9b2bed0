"""Small seeded learners and private settings shared by the privacy tests."""

from __future__ import annotations

import torch

from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.local import LocalLearner
from fedfair.core.models import build_model
from fedfair.core.objective import RCVaRThreshold
from fedfair.privacy.config import PrivacyConfig
from fedfair.privacy.probe import ModeProbe

DELTA = 1e-5


def random_samples(n: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """n float64 feature rows of width d and binary labels, about 30% positive."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(n, d, generator=generator, dtype=torch.float64)
    labels = (torch.rand(n, generator=generator) < 0.3).long()
    return features, labels


def threshold_learner(
    n: int = 300,
    batch_size: int = 30,
    local_steps: int = 3,
    model: str = "mlp",
    objective: ObjectiveConfig | None = None,
) -> LocalLearner:
    """A float64 learner with a threshold head on 8 random features, seeded so that two are identical."""
    features, labels = random_samples(n, 8)
    network = build_model(model, 8, 2, dtype=torch.float64)
    head = RCVaRThreshold(objective or ObjectiveConfig(epsilon=0.2, rho=0.3, bound=3.0), dtype=torch.float64)
    config = LocalConfig(local_steps=local_steps, lr=0.2, threshold_lr=0.3)
    return LocalLearner(network, features, labels, batch_size, config, threshold=head, seed=7)


def private_config(**kwargs: object) -> PrivacyConfig:
    """DP-SGD enabled with the RDP accountant (fast), plus the given settings."""
    return PrivacyConfig(**{"enabled": True, "accountant": "rdp", **kwargs})  # type: ignore[arg-type]


def scripted_probe(*durations: float) -> ModeProbe:
    """A mode probe (one timed step per mode) whose clock makes the k-th timed mode take durations[k] seconds.

    The clock runs out after them, so a second timing of the same key would fail the test.
    """
    readings = []
    now = 0.0
    for seconds in durations:
        readings += [now, now + seconds]
        now += seconds
    clock = iter(readings)
    return ModeProbe(timer=lambda: next(clock), repeats=1)
