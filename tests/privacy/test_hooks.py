"""Opacus hooks: per-sample gradients and gradient norms (of c, Conv, GroupNorm, LayerNorm, Linear), and the models DP-SGD refuses."""

from __future__ import annotations

import pytest
import torch
from opacus.grad_sample import GradSampleHooks, GradSampleHooksFastGradientClipping
from torch import nn
from torch.func import functional_call, grad, vmap

from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.errors import ConfigError
from fedfair.core.local import LocalLearner
from fedfair.core.models import build_model, per_sample_loss
from fedfair.core.objective import RCVaRThreshold
from fedfair.privacy.learner import PrivateLearner
from tests.privacy.helpers import private_config, random_samples


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_threshold_per_sample_gradients_equal_torch_func() -> None:
    """The registered grad sampler of c (and Opacus' for theta) equal torch.func's per-sample gradients."""
    features, labels = random_samples(40, 6, seed=1)
    model = build_model("mlp", 6, 2, dtype=torch.float64)
    with torch.no_grad():
        losses = per_sample_loss(model(features), labels)
    # c at the median loss and a wide smoothing put samples all along the soft kink of s.
    head = RCVaRThreshold(
        ObjectiveConfig(epsilon=0.2, rho=0.25, gamma=0.3), c=float(losses.median()), dtype=torch.float64
    )

    def one_sample(params: dict, c: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = per_sample_loss(functional_call(model, params, (x.unsqueeze(0),)), y.unsqueeze(0))
        return functional_call(head, {"c": c}, (loss,)).sum()

    params = {name: parameter.detach() for name, parameter in model.named_parameters()}
    theta_grads, c_grads = vmap(grad(one_sample, argnums=(0, 1)), in_dims=(None, None, 0, 0))(
        params, head.c.detach(), features, labels
    )

    GradSampleHooks(nn.ModuleList([model, head]), loss_reduction="sum")
    head(per_sample_loss(model(features), labels)).sum().backward()
    assert head.c.grad_sample.shape == (40,)
    assert float(c_grads.abs().min()) < 0.5 * float(c_grads.abs().max())  # not one constant value
    assert float((head.c.grad_sample - c_grads).abs().max()) <= 1e-10
    for name, parameter in model.named_parameters():
        assert float((parameter.grad_sample - theta_grads[name]).abs().max()) <= 1e-10


def test_batchnorm_is_refused_naming_the_layer() -> None:
    features, labels = random_samples(100, 8)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1)).double()
    learner = LocalLearner(model, features, labels, 10, LocalConfig())
    with pytest.raises(ConfigError, match=r"layer '1' \(BatchNorm1d\).*GroupNorm"):
        PrivateLearner(learner, private_config(noise_multiplier=1.0))


class ConvNet(nn.Module):
    """A convolution, GroupNorm, LayerNorm and a dense layer on 1 x 6 x 6 images given as flat rows of 36."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, kernel_size=3)
        self.groups = nn.GroupNorm(2, 4)
        self.norm = nn.LayerNorm(64)
        self.out = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.groups(self.conv(x.view(-1, 1, 6, 6))))
        logits: torch.Tensor = self.out(self.norm(hidden.flatten(1)))
        return logits


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_norm_samplers_equal_the_norms_of_torch_func_per_sample_gradients() -> None:
    """The registered norms of Conv, GroupNorm, LayerNorm, Linear and the threshold c: each layer's ||g_i||."""
    features, labels = random_samples(30, 36, seed=2)
    model = ConvNet().double()
    with torch.no_grad():
        losses = per_sample_loss(model(features), labels)
    head = RCVaRThreshold(
        ObjectiveConfig(epsilon=0.2, rho=0.25, gamma=0.3), c=float(losses.median()), dtype=torch.float64
    )

    def one_sample(params: dict, c: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = per_sample_loss(functional_call(model, params, (x.unsqueeze(0),)), y.unsqueeze(0))
        return functional_call(head, {"c": c}, (loss,)).sum()

    params = {name: parameter.detach() for name, parameter in model.named_parameters()}
    theta_grads, c_grads = vmap(grad(one_sample, argnums=(0, 1)), in_dims=(None, None, 0, 0))(
        params, head.c.detach(), features, labels
    )

    GradSampleHooksFastGradientClipping(nn.ModuleList([model, head]), loss_reduction="sum")
    head(per_sample_loss(model(features), labels)).sum().backward()
    assert float((head.c._norm_sample - c_grads.abs()).abs().max()) <= 1e-12
    for name, parameter in model.named_parameters():
        expected = theta_grads[name].flatten(1).norm(dim=1)
        assert float((parameter._norm_sample - expected).abs().max()) <= 1e-10 * float(expected.max()), name
