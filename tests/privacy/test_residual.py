"""Residual networks under DP as written: ResNet-18-GN's in-place operations, clipped against a plain reference."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedfair.core.config import LocalConfig, ObjectiveConfig
from fedfair.core.errors import ConfigError
from fedfair.core.local import LocalLearner
from fedfair.core.models import ResNetGN, flat_parameters
from fedfair.core.objective import RCVaRThreshold
from fedfair.privacy.clipping import LayerClipping, norm_clipping_blockers
from fedfair.privacy.learner import PrivateLearner
from tests.privacy.helpers import private_config, scripted_probe

IMAGE = (3, 16, 16)
FLOAT32_UNIT_ROUNDOFF = torch.finfo(torch.float32).eps / 2
# Rounding errors of a sum of n float32 terms stay within LAMBDA * sqrt(n) * u of the sum of their
# magnitudes with probability at least 1 - 2 exp(-LAMBDA^2 (1 - u)^2 / 2) (Higham and Mary 2019,
# probabilistic error analysis): about 1 - 7e-4 at 4, per coordinate, while the worst case n * u
# (what the float64 tests use) would be 2.5% of the sum here, too loose to catch a wrong factor.
LAMBDA = 4.0


def resnet_learner(batch_size: int = 6, samples: int = 24) -> LocalLearner:
    """A float32 ResNet-18-GN of width 8 on random 3 x 16 x 16 images (10 classes) with the RCVaR head."""
    generator = torch.Generator().manual_seed(5)
    features = torch.randn(samples, math.prod(IMAGE), generator=generator)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    torch.manual_seed(1)
    model = ResNetGN(IMAGE, 10, width=8, groups=4)
    head = RCVaRThreshold(ObjectiveConfig(epsilon=0.2, rho=0.3, bound=3.0), c=2.0)
    config = LocalConfig(local_steps=2, lr=0.5, threshold_lr=0.3)
    return LocalLearner(model, features, labels, batch_size, config, threshold=head, seed=7)


def reference_gradients(learner: LocalLearner, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each sample's gradient of its objective in (theta, c) by plain autograd on that sample alone, one row each."""
    rows = []
    for i in range(features.shape[0]):
        objective = learner.objective(features[i : i + 1], labels[i : i + 1]).sum()
        gradients = torch.autograd.grad(objective, learner.state_tensors)
        rows.append(torch.cat([gradient.flatten() for gradient in gradients]))
    return torch.stack(rows)


def accumulation_length(model: nn.Module) -> int:
    """The longest chain of float32 sums behind one coordinate of g_i: every layer's fan-in plus its positions.

    Backpropagating through a layer adds, per output coordinate, up to (fan-in) products; a weight
    gradient sums over the positions a kernel visits; the chain of them through the network adds up.
    """
    length = 0
    for layer in model.modules():
        if isinstance(layer, nn.Conv2d):
            kernel = layer.kernel_size[0] * layer.kernel_size[1]
            # In and out fan-ins, and at most the 8 x 8 positions a 16 x 16 image leaves after the stem.
            length += (layer.in_channels + layer.out_channels) * kernel + 64
        elif isinstance(layer, nn.GroupNorm):
            length += 64 * layer.num_channels // layer.num_groups  # a group's statistics
        elif isinstance(layer, nn.Linear):
            length += layer.in_features + layer.out_features
    return length


def float32_tolerance(learner: LocalLearner, per_sample: torch.Tensor, scale: float) -> float:
    """How far two float32 computations of a clipped sum of `per_sample`'s rows may differ, at this `scale`.

    Both sides are float32 sums of the same terms in other orders. A coordinate of g_i rounds
    through (accumulation length) sums, its norm through P squares (which moves the clip factor
    alike), and the sum over B samples through B more: n = length + P + B terms in all, each side
    within LAMBDA * sqrt(n) * u of `scale` (the sum of the terms' magnitudes), hence twice that.
    """
    batch, size = per_sample.shape
    terms = accumulation_length(learner.model) + size + batch
    return 2 * LAMBDA * math.sqrt(terms) * FLOAT32_UNIT_ROUNDOFF * scale


def clipped_reference(
    learner: LocalLearner, features: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, float, float]:
    """The reference sum_i min(1, C / (||g_i|| + 1e-6)) g_i at C = the median norm, its clip C and its tolerance."""
    per_sample = reference_gradients(learner, features, labels)
    norms = per_sample.norm(dim=1)
    clip = float(norms.median())
    factors = (clip / (norms + 1e-6)).clamp(max=1.0)
    assert bool((factors < 1.0).any()) and bool((factors == 1.0).any())  # some clipped, some not
    expected = (factors[:, None] * per_sample).sum(0)
    scale = float((factors[:, None] * per_sample.abs()).sum(0).max())
    return expected, clip, float32_tolerance(learner, per_sample, scale)


@pytest.mark.parametrize("mode", ["norm", "per_sample"])
def test_a_resnet_with_in_place_residuals_clips_as_the_per_sample_reference(mode: str) -> None:
    """ResNet-18-GN as torchvision writes it (out += identity, ReLU(inplace=True)): the clipped sum of one step."""
    learner = resnet_learner()
    assert learner.threshold is not None
    heads = nn.ModuleList([learner.model, learner.threshold])
    assert norm_clipping_blockers(heads) == []  # GroupNorm has its norm rule
    features, labels = learner.features[:6], learner.labels[:6]
    expected, clip, tolerance = clipped_reference(learner, features, labels)

    clipping = LayerClipping(heads, mode, clip)  # type: ignore[arg-type]
    with clipping.capturing():
        per_sample = learner.objective(features, labels)
    clipping.backward(per_sample)
    actual = torch.cat([tensor.grad.flatten() for tensor in learner.state_tensors if tensor.grad is not None])

    assert actual.shape == expected.shape
    # A tolerance that a wrong factor or a missing layer would exceed by far: under 1% of the sum's scale.
    assert tolerance < 0.01 * float(expected.abs().max())
    assert float((actual - expected).abs().max()) <= tolerance


@pytest.mark.parametrize("mode", ["norm", "per_sample"])
def test_a_private_learner_trains_a_resnet_as_written_and_its_step_is_the_clipped_reference(mode: str) -> None:
    """Two DP-SGD steps (noise 0) of ResNet-18-GN unedited; the first moves theta by -lr * (clipped sum) / b."""
    learner = resnet_learner()
    private = PrivateLearner(learner, private_config(noise_multiplier=0.0, max_grad_norm=0.5), clipping=mode)
    assert private.clipping == mode
    private._sampling.manual_seed(11)  # in place of OS entropy, so that the batch is known
    start = flat_parameters(learner.model)
    private.begin(start, 2.0)
    index = private._index[private._bounds[0] : private._bounds[1]]
    assert index.numel() > 0
    per_sample = reference_gradients(learner, learner.features[index], learner.labels[index])
    factors = (0.5 / (per_sample.norm(dim=1) + 1e-6)).clamp(max=1.0)
    clipped = (factors[:, None] * per_sample).sum(0) / learner.batch_size
    private.step()
    moved = flat_parameters(learner.model) - start
    expected = -learner.config.lr * clipped[:-1]
    scale = float(per_sample.abs().sum(0).max()) * learner.config.lr / learner.batch_size
    tolerance = float32_tolerance(learner, per_sample, scale)
    assert float((moved - expected).abs().max()) <= tolerance
    assert learner.threshold is not None
    moved_c = float(learner.threshold.c.detach()) - 2.0
    assert moved_c == pytest.approx(-learner.config.threshold_lr * float(clipped[-1]), abs=tolerance)
    private.step()  # a second step on the same graph-free model: nothing left over from the first
    update = private.finish()
    assert bool(torch.isfinite(update.delta).all()) and float(update.delta.abs().max()) > 0


def test_auto_times_norm_and_per_sample_clipping_of_a_resnet_and_keeps_the_faster() -> None:
    """The probe's clock decides; the second learner of the same shape reuses the choice without timing."""
    probe = scripted_probe(3.0, 1.0)  # norm-only 3 s, per-sample 1 s
    first = PrivateLearner(resnet_learner(), private_config(noise_multiplier=1.0), probe=probe)
    assert first.clipping == "per_sample"
    second = PrivateLearner(resnet_learner(), private_config(noise_multiplier=1.0), probe=probe)
    assert second.clipping == "per_sample"  # from the cache: the clock has no readings left
    (timings,) = probe.timings.values()
    assert timings == {"norm": 3.0, "per_sample": 1.0}


def test_the_resnet_has_resnet18s_shape() -> None:
    """Width 64 and 1,000 classes: torchvision's resnet18 parameter count (11,689,512), with GroupNorm's
    weight and bias where BatchNorm's were; a width its groups do not divide is refused."""
    model = ResNetGN((3, 224, 224), 1000)
    assert sum(parameter.numel() for parameter in model.parameters()) == 11_689_512
    assert sum(isinstance(layer, nn.GroupNorm) for layer in model.modules()) == 20
    assert sum(isinstance(layer, nn.ReLU) and layer.inplace for layer in model.modules()) == 9
    with pytest.raises(ConfigError, match="width 24 is not a multiple of its 32 GroupNorm groups"):
        ResNetGN(IMAGE, 10, width=24)
