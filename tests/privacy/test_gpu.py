"""The private learner on the GPU: same results as the plain CPU path, the right noise, no host
synchronisation per step, and the threshold's per-sample gradient on the device.

Skipped cleanly on machines without CUDA.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from opacus.grad_sample import GradSampleHooks
from torch import nn
from torch.func import functional_call, grad, vmap

from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.local import LocalLearner
from fedfair.core.models import ResNetGN, build_model, flat_parameters, per_sample_loss
from fedfair.core.objective import RCVaRThreshold
from fedfair.privacy.clipping import ClippingMode, LayerClipping
from fedfair.privacy.learner import PrivateLearner
from tests.core.gpu_helpers import (
    CUDA,
    GPU_ONLY,
    assert_steps_never_wait,
    image_learner,
    no_host_sync,
    seeded_learner,
)
from tests.privacy.helpers import private_config

pytestmark = GPU_ONLY


def test_private_learner_on_gpu_without_noise_matches_plain_cpu() -> None:
    cpu = seeded_learner(torch.device("cpu"))
    gpu = PrivateLearner(
        seeded_learner(CUDA), private_config(noise_multiplier=0.0, max_grad_norm=1e6, poisson_sampling=False)
    )
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


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_private_step_loop_never_waits_for_the_device(model: str) -> None:
    learner = image_learner(model)
    assert_steps_never_wait(PrivateLearner(learner, private_config(noise_multiplier=1.0)), learner.model)


def test_private_noise_on_gpu_is_sigma_c_over_b() -> None:
    dimension, n, batch, sigma, clip = 4000, 64, 32, 2.0, 0.5
    model = nn.Linear(dimension, 1, bias=False).to(CUDA)
    head = RCVaRThreshold(ObjectiveConfig(epsilon=1.0)).to(CUDA)
    learner = LocalLearner(
        model,
        torch.zeros(n, dimension),
        torch.randint(0, 2, (n,)),
        batch,
        LocalConfig(local_steps=1, lr=1.0, threshold_lr=1.0),
        threshold=head,
    )
    update = PrivateLearner(learner, private_config(noise_multiplier=sigma, max_grad_norm=clip)).train_round(
        torch.zeros(dimension, device=CUDA), 5.0
    )
    assert float(update.delta.std()) == pytest.approx(sigma * clip / batch, rel=0.15)


@pytest.mark.parametrize("mode", ["norm", "per_sample"])
def test_a_resnet_as_written_clips_alike_on_gpu_and_cpu_without_waiting(mode: ClippingMode) -> None:
    """ResNet-18-GN (width 8, in-place residuals) in float64: the same clipped sum on both, no host sync on the GPU."""
    sums: dict[str, torch.Tensor] = {}
    for device in (torch.device("cpu"), CUDA):
        torch.manual_seed(1)
        model = ResNetGN((3, 16, 16), 10, width=8, groups=4).double().to(device)
        head = RCVaRThreshold(ObjectiveConfig(), c=2.0, dtype=torch.float64).to(device)
        generator = torch.Generator().manual_seed(5)
        features = torch.randn(6, 768, generator=generator, dtype=torch.float64).to(device)
        labels = torch.randint(0, 10, (6,), generator=generator).to(device)
        heads = nn.ModuleList([model, head])
        clipping = LayerClipping(heads, mode, 1.0)
        with no_host_sync() if device.type == "cuda" else nullcontext():
            with clipping.capturing():
                per_sample = head(per_sample_loss(model(features), labels))
            clipping.backward(per_sample)
        sums[device.type] = torch.cat([p.grad.flatten() for p in heads.parameters() if p.grad is not None]).cpu()
    assert sums["cpu"].numel() == sum(p.numel() for p in heads.parameters())
    # float64 sums of the same terms in other orders: differences of a few ulps of the largest terms.
    torch.testing.assert_close(sums["cuda"], sums["cpu"], rtol=1e-9, atol=1e-12)
