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
from fedfair.privacy.hooks import conv2d_norm_sample, uses_ghost_norm
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


@pytest.mark.parametrize(
    ("layer", "size", "ghost"),
    [
        (nn.Conv2d(16, 32, 3, stride=2, padding=1), 4, True),  # T = 4: 4 * (144 + 32) < 144 * 32
        (nn.Conv2d(16, 16, 3, padding=(1, 2), dilation=(1, 2), bias=False), 3, True),  # T = 9: 9 * 160 < 2304
        (nn.Conv2d(2, 4, 3, padding=1), 6, False),  # T = 36: 36 * 22 > 18 * 4
        (nn.Conv2d(16, 32, 3, padding=1, groups=2), 2, False),  # groups: the materialised gradient
    ],
)
def test_conv2d_norms_by_gram_matrices_or_gradients_equal_torch_funcs(layer: nn.Conv2d, size: int, ghost: bool) -> None:
    """Both forms of ||g_i|| for a 2-D convolution (ghost norm where it costs less) against torch.func's."""
    layer = layer.double()
    generator = torch.Generator().manual_seed(8)
    inputs = torch.randn(5, layer.in_channels, size, size, generator=generator, dtype=torch.float64)
    outputs = layer(inputs)
    backprops = torch.randn(outputs.shape, generator=generator, dtype=torch.float64)
    assert uses_ghost_norm(layer, outputs.shape[2] * outputs.shape[3]) == ghost

    def one_sample(params: dict[str, torch.Tensor], x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return (functional_call(layer, params, (x.unsqueeze(0),)) * g.unsqueeze(0)).sum()

    params = {name: parameter.detach() for name, parameter in layer.named_parameters()}
    expected = vmap(grad(one_sample), in_dims=(None, 0, 0))(params, inputs, backprops)
    norms = conv2d_norm_sample(layer, [inputs], backprops)
    assert len(norms) == len(params)
    for name, parameter in layer.named_parameters():
        reference = expected[name].flatten(1).norm(dim=1)
        # float64 sums of at most k * T products on either side.
        assert float((norms[parameter] - reference).abs().max()) <= 1e-12 * float(reference.max()), name
