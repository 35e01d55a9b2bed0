"""What the core's and the private learner's GPU tests share: seeded learners on a device, and a step
loop that must never make the host wait for the device."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import pytest
import torch

from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.local import LocalLearner
from fedfair.core.update import Update
from fedfair.core.models import build_model, flat_parameters
from fedfair.core.objective import RCVaRThreshold

CUDA = torch.device("cuda")

# The module mark of every GPU test: selectable with `-m gpu`, skipped cleanly without CUDA.
GPU_ONLY = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


class SteppedTrainer(Protocol):
    """A round taken step by step, as both the plain and the private learner offer it."""

    def begin(self, theta: torch.Tensor, c: float) -> None: ...

    def step(self) -> None: ...

    def finish(self) -> Update: ...


def seeded_learner(
    device: torch.device, dtype: torch.dtype = torch.float64, model: str = "mlp", local_steps: int = 3
) -> LocalLearner:
    """The same seeded learner on any device: data and model built on the host, then moved."""
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(400, 12, generator=generator, dtype=dtype)
    labels = (torch.rand(400, generator=generator) < 0.3).long()
    network = build_model(model, 12, 2, dtype=dtype).to(device)
    head = RCVaRThreshold(ObjectiveConfig(epsilon=0.2, rho=0.3, bound=3.0), dtype=dtype).to(device)
    config = LocalConfig(local_steps=local_steps, lr=0.2, threshold_lr=0.3)
    return LocalLearner(network, features, labels, 40, config, threshold=head, seed=3)


def image_learner(model: str) -> LocalLearner:
    """A 10-class learner on 28x28 random images on the GPU, five local steps of 64 samples."""
    generator = torch.Generator().manual_seed(2)
    features = torch.randn(512, 784, generator=generator)
    labels = torch.randint(0, 10, (512,), generator=generator)
    network = build_model(model, 784, 10, image_shape=(1, 28, 28) if model == "cnn" else None).to(CUDA)
    head = RCVaRThreshold(ObjectiveConfig()).to(CUDA)
    return LocalLearner(network, features, labels, 64, LocalConfig(local_steps=5), threshold=head)


@contextmanager
def no_host_sync() -> Iterator[None]:
    """Fail on any operation that makes the host wait for the device."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def assert_steps_never_wait(trainer: SteppedTrainer, model: torch.nn.Module) -> None:
    """Five steps of `trainer` (which trains `model`) without one host synchronisation; a finite update on the GPU."""
    trainer.begin(flat_parameters(model), 1.0)
    with no_host_sync():
        for _ in range(5):
            trainer.step()
    update = trainer.finish()
    assert update.delta.is_cuda and bool(torch.isfinite(update.delta).all())
