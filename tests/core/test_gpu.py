"""The core on the GPU: same results as the CPU, data on the device once, no host synchronisation per step.

Skipped cleanly on machines without CUDA. The private learner's GPU tests are in tests/privacy/test_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

from fedfair.core.device import device_for
from fedfair.core.models import flat_parameters
from tests.core.gpu_helpers import (
    CUDA,
    GPU_ONLY,
    assert_steps_never_wait,
    image_learner,
    seeded_learner,
)

pytestmark = GPU_ONLY


def test_auto_device_is_cuda_when_present() -> None:
    assert device_for("auto").type == "cuda"


def test_plain_learner_on_gpu_matches_cpu_with_data_moved_once() -> None:
    cpu, gpu = seeded_learner(torch.device("cpu")), seeded_learner(CUDA)
    assert gpu.features.is_cuda and gpu.labels.is_cuda
    theta, c = flat_parameters(cpu.model), 1.0
    for _ in range(3):
        expected, actual = cpu.train_round(theta, c), gpu.train_round(theta.to(CUDA), c)
        torch.testing.assert_close(actual.delta.cpu(), expected.delta, rtol=0, atol=1e-12)
        assert actual.delta_c == pytest.approx(expected.delta_c, abs=1e-12)
        theta, c = theta + expected.delta, c + expected.delta_c


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_step_loop_never_waits_for_the_device(model: str) -> None:
    learner = image_learner(model)
    assert_steps_never_wait(learner, learner.model)
