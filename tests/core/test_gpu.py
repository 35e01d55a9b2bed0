"""The GPU path: same results as the CPU, data on the device once, no host synchronisation per step.

Skipped cleanly on machines without CUDA.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from opacus.grad_sample import GradSampleHooks
from torch import nn
from torch.func import functional_call, grad, vmap

from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.device import device_for
from fedfair.core.local import LocalLearner
from fedfair.core.models import build_model, flat_parameters, per_sample_loss
from fedfair.core.objective import RCVaRThreshold
from fedfair.privacy.config import PrivacyConfig
from fedfair.privacy.learner import PrivateLearner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = torch.device("cuda")


def _learner(device: torch.device, dtype: torch.dtype = torch.float64, model: str = "mlp", local_steps: int = 3) -> LocalLearner:
    """The same seeded learner on any device: data and model built on the host, then moved."""
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(400, 12, generator=generator, dtype=dtype)
    labels = (torch.rand(400, generator=generator) < 0.3).long()
    network = build_model(model, 12, 2, dtype=dtype).to(device)
    head = RCVaRThreshold(ObjectiveConfig(epsilon=0.2, rho=0.3, bound=3.0), dtype=dtype).to(device)
    config = LocalConfig(local_steps=local_steps, lr=0.2, threshold_lr=0.3)
    return LocalLearner(network, features, labels, 40, config, threshold=head, seed=3)


def _private(**kwargs: object) -> PrivacyConfig:
    return PrivacyConfig(**{"enabled": True, "accountant": "rdp", **kwargs})  # type: ignore[arg-type]


@contextmanager
def _no_host_sync() -> Iterator[None]:
    """Fail on any operation that makes the host wait for the device."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_auto_device_is_cuda_when_present() -> None:
    assert device_for("auto").type == "cuda"


def test_plain_learner_on_gpu_matches_cpu_with_data_moved_once() -> None:
    cpu, gpu = _learner(torch.device("cpu")), _learner(CUDA)
    assert gpu.features.is_cuda and gpu.labels.is_cuda
    theta, c = flat_parameters(cpu.model), 1.0
    for _ in range(3):
        expected, actual = cpu.train_round(theta, c), gpu.train_round(theta.to(CUDA), c)
        torch.testing.assert_close(actual.delta.cpu(), expected.delta, rtol=0, atol=1e-12)
        assert actual.delta_c == pytest.approx(expected.delta_c, abs=1e-12)
        theta, c = theta + expected.delta, c + expected.delta_c


def test_private_learner_on_gpu_without_noise_matches_plain_cpu() -> None:
    cpu = _learner(torch.device("cpu"))
    gpu = PrivateLearner(_learner(CUDA), _private(noise_multiplier=0.0, max_grad_norm=1e6, poisson_sampling=False))
    theta = flat_parameters(cpu.model)
    for _ in range(2):
        expected, actual = cpu.train_round(theta, 1.0), gpu.train_round(theta.to(CUDA), 1.0)
        torch.testing.assert_close(actual.delta.cpu(), expected.delta, rtol=0, atol=1e-12)
        assert actual.delta_c == pytest.approx(expected.delta_c, abs=1e-12)
        theta = theta + expected.delta


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_threshold_per_sample_gradients_on_gpu_equal_torch_func() -> None:
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(64, 6, generator=generator, dtype=torch.float64).to(CUDA)
    labels = (torch.rand(64, generator=generator) < 0.4).long().to(CUDA)
    model = build_model("mlp", 6, 2, dtype=torch.float64).to(CUDA)
    head = RCVaRThreshold(ObjectiveConfig(epsilon=0.2, rho=0.25, gamma=0.3), c=0.7, dtype=torch.float64).to(CUDA)

    def one_sample(c: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = per_sample_loss(model(x.unsqueeze(0)), y.unsqueeze(0))
        return functional_call(head, {"c": c}, (loss,)).sum()

    expected = vmap(grad(one_sample), in_dims=(None, 0, 0))(head.c.detach(), features, labels).detach()
    GradSampleHooks(nn.ModuleList([model, head]), loss_reduction="sum")
    head(per_sample_loss(model(features), labels)).sum().backward()
    assert float((head.c.grad_sample - expected).abs().max()) <= 1e-10


@pytest.mark.parametrize("private", [False, True], ids=["plain", "dp-sgd"])
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_step_loop_never_waits_for_the_device(private: bool, model: str) -> None:
    generator = torch.Generator().manual_seed(2)
    features = torch.randn(512, 784, generator=generator)
    labels = torch.randint(0, 10, (512,), generator=generator)
    network = build_model(model, 784, 10, image_shape=(1, 28, 28) if model == "cnn" else None).to(CUDA)
    head = RCVaRThreshold(ObjectiveConfig()).to(CUDA)
    learner = LocalLearner(network, features, labels, 64, LocalConfig(local_steps=5), threshold=head)
    trainer = PrivateLearner(learner, _private(noise_multiplier=1.0)) if private else learner
    trainer.begin(flat_parameters(network), 1.0)
    with _no_host_sync():
        for _ in range(5):
            trainer.step()
    update = trainer.finish()
    assert update.delta.is_cuda and bool(torch.isfinite(update.delta).all())


def test_private_noise_on_gpu_is_sigma_c_over_b() -> None:
    dimension, n, batch, sigma, clip = 4000, 64, 32, 2.0, 0.5
    model = nn.Linear(dimension, 1, bias=False).to(CUDA)
    head = RCVaRThreshold(ObjectiveConfig(epsilon=1.0)).to(CUDA)
    learner = LocalLearner(
        model, torch.zeros(n, dimension), torch.randint(0, 2, (n,)), batch,
        LocalConfig(local_steps=1, lr=1.0, threshold_lr=1.0), threshold=head,
    )
    update = PrivateLearner(learner, _private(noise_multiplier=sigma, max_grad_norm=clip)).train_round(
        torch.zeros(dimension, device=CUDA), 5.0
    )
    assert float(update.delta.std()) == pytest.approx(sigma * clip / batch, rel=0.15)
